"""One request at a time through the server with client-side stamps (monotonic ns), as bench-serve
sends them (aiohttp, 128 random token ids, 16 outputs, streamed); writes $TRACE_DIR/client.<pid>.txt.
Usage: python trace_client.py URL N"""
import asyncio, os, random, sys, time
import aiohttp, orjson


async def main(url, n):
    stamps = []
    rng = random.Random()
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/models") as r:
            vocab = (await r.json())["data"][0]["vocab_size"]
        for i in range(n + 5):
            body = {"prompt": [rng.randrange(vocab) for _ in range(128)], "max_tokens": 16, "ignore_eos": True,
                    "stream": True, "temperature": 0}
            data = orjson.dumps(body)
            await asyncio.sleep(0.005)
            st = [("c0_send", time.monotonic_ns())]
            async with s.post(url + "/v1/completions", data=data, headers={"content-type": "application/json"}) as r:
                st.append(("c1_headers", time.monotonic_ns()))
                got = False
                async for line in r.content:
                    if not got and line.startswith(b"data: {") and b'"text":""' not in line:
                        st.append(("c2_first", time.monotonic_ns()))
                        got = True
                st.append(("c3_done", time.monotonic_ns()))
            if i >= 5:
                stamps += st
    with open(f"{os.environ['TRACE_DIR']}/client.{os.getpid()}.txt", "w") as f:
        f.writelines(f"{l} {t}\n" for l, t in stamps)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
