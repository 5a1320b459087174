import cProfile, os, pstats, sys
sys.argv = [sys.argv[0], sys.argv[1]]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_fake, uvicorn
from slipstream.server import client
from slipstream.server.app import build_app
if __name__ == "__main__":
    app = build_app(client.EngineClient(None, {}), None, 4096)
    pr = cProfile.Profile()
    pr.enable()
    try:
        uvicorn.run(serve_fake.Stamped(app, os.environ["RECEIPTS"] + ".api"), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    finally:
        pr.disable()
        pr.dump_stats("/tmp/api.prof")
