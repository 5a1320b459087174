import os, sys, time, uvicorn
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import fake_engine
from slipstream.server import client
client.run_engine = fake_engine.run_fake
from slipstream.server.app import build_app


class Stamped:
    def __init__(self, app, path):
        self.app, self.log = app, open(path, "a")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/completions"):
            self.log.write(f"{time.monotonic()}\n"); self.log.flush()
        await self.app(scope, receive, send)


if __name__ == "__main__":
  app = build_app(client.EngineClient(None, {}), None, 4096)
  uvicorn.run(Stamped(app, os.environ["RECEIPTS"] + ".api"), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
              **({"loop": os.environ["LOOP"]} if "LOOP" in os.environ else {}))
