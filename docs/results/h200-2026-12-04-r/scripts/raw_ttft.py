"""TTFT through the server with a client that adds almost nothing: one kept-alive blocking socket,
each request's bytes built before its clock starts (a fresh 128-token prompt, 16 outputs, streamed),
the clock from the send to the arrival of the first chunk with text. Usage: raw_ttft.py PORT N SEED (a seed of its own per run: the prefix cache would serve a repeated prompt)"""
import json, random, socket, sys, time
import numpy as np

port, n, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
reqs = []
for _ in range(n + 5):
    body = json.dumps({"prompt": [rng.randrange(30000) for _ in range(128)], "max_tokens": 16, "ignore_eos": True,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    reqs.append(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
out = []
for i, req in enumerate(reqs):
    time.sleep(0.002)
    t0 = time.perf_counter()
    s.sendall(req)
    buf, first = b"", None
    while not buf.endswith(b"0\r\n\r\n"):
        data = s.recv(1 << 16)
        if not data:
            raise SystemExit("connection closed")
        if first is None:
            k = data.find(b'"text":"')
            if k >= 0 and data[k + 8:k + 9] != b'"':
                first = time.perf_counter()
        buf += data
    if i >= 5:
        out.append((first - t0) * 1e3)
v = np.array(out)
print(f"raw client TTFT ms p10 {np.percentile(v, 10):.2f} p50 {np.median(v):.2f} p90 {np.percentile(v, 90):.2f} "
      f"mean {v.mean():.2f} (n={len(v)})")
