"""`slipstream serve --model MODEL` as _serve builds it, under granian instead of uvicorn. Usage: serve_real_gr.py MODEL PORT"""
import sys
from slipstream.server.app import build_app
from slipstream.server.client import EngineClient

MODEL = sys.argv[1] if __name__ == "__main__" else None


def make_app():
    import os
    options = {"mode": "pipelined", "device": None, "dtype": "auto", "max_num_seqs": 256, "step_timing": True,
               "cuda_graphs": True, "enable_prefix_caching": True, "max_loras": 0, "max_lora_rank": 64}
    return build_app(EngineClient(os.environ["GR_MODEL"], options, {}), None, 4096)


if __name__ == "__main__":
    import os
    from granian import Granian
    from granian.constants import Interfaces
    os.environ["GR_MODEL"] = sys.argv[1]
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    Granian("serve_real_gr:make_app", address="127.0.0.1", port=int(sys.argv[2]), interface=Interfaces.ASGI,
            factory=True, workers=1, log_enabled=False).serve()
