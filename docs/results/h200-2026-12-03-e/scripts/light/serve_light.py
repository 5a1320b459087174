import os, sys, uvicorn
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import light_engine, spin
from slipstream.server import client
client.run_engine = light_engine.run_light
from slipstream.server.app import build_app

if __name__ == "__main__":
    app = build_app(client.EngineClient(None, {}), None, 4096)
    if os.environ.get("API_SPIN") == "1":
        app = spin.SpinningApp(app)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
