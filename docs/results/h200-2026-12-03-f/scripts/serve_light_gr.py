import os, sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import light_engine
from slipstream.server import client
client.run_engine = light_engine.run_light
from slipstream.server.app import build_app


def make_app():
    return build_app(client.EngineClient(None, {}), None, 4096)


if __name__ == "__main__":
    from granian import Granian
    from granian.constants import Interfaces, Loops
    Granian("serve_light_gr:make_app", address="127.0.0.1", port=int(sys.argv[1]), interface=Interfaces.ASGI,
            factory=True, workers=1, loop=Loops.auto, log_enabled=False).serve()
