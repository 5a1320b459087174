import asyncio, os, subprocess, sys, time, urllib.request
import aiohttp
port = 8131
env = {**os.environ, "RECEIPTS": "/tmp/r.conn"}
srv = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "serve_fake.py"), str(port)], env=env)
url = f"http://127.0.0.1:{port}"
for _ in range(200):
    try:
        urllib.request.urlopen(url + "/health", timeout=1); break
    except Exception:
        time.sleep(0.1)

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

async def main():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one():
            async with s.get(url + "/health") as r:
                await r.read()
        for rnd in range(3):
            t = time.perf_counter(); c = cpu(srv.pid); m = time.process_time()
            await asyncio.gather(*(one() for _ in range(384)))
            print(f"round {rnd}: 384 concurrent GET /health {1e3 * (time.perf_counter() - t):.1f} ms; server CPU {1e3 * (cpu(srv.pid) - c):.0f} ms, client CPU {1e3 * (time.process_time() - m):.0f} ms")
try:
    asyncio.run(main())
finally:
    srv.terminate(); srv.wait()
