"""When do 384 all-at-once requests reach the (fake) engine, against when the client sent them."""
import asyncio, json, os, subprocess, sys, time, urllib.request, resource
import numpy as np
from slipstream.bench import serve as bs
import aiohttp
if os.environ.get("PREWARM"):
    _Orig = aiohttp.ClientSession
    class Warm(_Orig):
        async def __aenter__(self):
            s = await super().__aenter__()
            async def one():
                async with s.get(url + "/health") as r:
                    await r.read()
            await asyncio.gather(*(one() for _ in range(int(os.environ["PREWARM"]))))
            return s
    aiohttp.ClientSession = Warm

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

port = int(sys.argv[1]) if len(sys.argv) > 1 else 8123
rec = f"/tmp/receipts.{port}"
open(rec, "w").close()
env = {**os.environ, "RECEIPTS": rec}
srv = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), os.environ.get("SERVE", "serve_fake.py")), str(port)], env=env)
url = f"http://127.0.0.1:{port}"
for _ in range(200):
    try:
        urllib.request.urlopen(url + "/health", timeout=1); break
    except Exception:
        time.sleep(0.1)
try:
    model = {"vocab_size": 49152, "max_model_len": 4096}
    warm = bs._requests("mixed", 8, (16, 1024), (16, 384), model, 0, 0)
    asyncio.run(bs._run_rate(url, {}, warm, float("inf"), 0))
    for trial in range(int(os.environ.get("TRIALS", "2"))):
        open(rec, "w").close(); open(rec + ".api", "w").close()
        reqs = bs._requests("mixed", 384, (16, 1024), (16, 384), model, 0, trial + 1)
        s0 = cpu(srv.pid)
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        timings, wall = asyncio.run(bs._run_rate(url, {}, reqs, float("inf"), 1))
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        errs = [t.error for t in timings if t.error]; print("errors", len(errs), errs[:1])
        sent = np.sort([t.sent for t in timings])
        got = np.sort([json.loads(l)[1] for l in open(rec)])
        t0 = sent[0]
        api = np.sort([float(l) for l in open(rec + ".api")])
        print("  API receipts k=64,128,256,384: " + ", ".join(f"{1e3 * (api[k - 1] - t0):.1f}" for k in (64, 128, 256, 384) if k <= len(api)))
        first = np.array([t.chunks[0] for t in timings if t.chunks])
        print(f"trial {trial}: wall {wall:.2f} s, server CPU {cpu(srv.pid) - s0:.2f} s, client CPU {c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime:.2f} s;"
              f" sent span {1e3 * (sent[-1] - t0):.1f} ms; engine receipts k=64,128,256,384: "
              + ", ".join(f"{1e3 * (got[k - 1] - t0):.1f}" for k in (64, 128, 256, 384) if k <= len(got))
              + f" ms; mean receipt delay {1e3 * np.mean(got - sent[:len(got)]):.1f} ms; first chunk p50 {1e3*np.median(first - t0):.1f} ms")
finally:
    srv.send_signal(2); srv.wait()
