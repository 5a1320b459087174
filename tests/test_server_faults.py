"""The server survives what clients and machines do: a client that leaves frees its rows, a full
server answers 429 with Retry-After, SIGTERM drains what is in flight and then exits leaving nothing
behind, the engine process's death fails requests at once and turns /health 503, SIGUSR1 prints both
processes' stacks and serving goes on, and a battery of 2,000 requests (random lengths, a fifth
leaving mid-way, a tenth malformed or impossible) leaves every request answered or its client gone,
no KV page held and the server healthy."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

from serving import engine_pid, metric_values, start_server, stop_server, wait_idle  # noqa: E402

MODEL = "random:tiny-llama"
VOCAB = 512
IN_FLIGHT = 10


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(MODEL, "--max-in-flight", str(IN_FLIGHT))
    yield url
    stop_server(proc)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_frees_the_engine_for_others(server, stream):
    """Eight requests of 4,000 tokens (as many as the engine's rows; ~10 s of decoding here) are
    dropped early (a stream after its first chunk, a whole response by a 1 s client timeout); a
    request sent after them is answered within seconds, which it could not be if the dropped ones
    still held every row."""
    body = {"prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": stream}

    def leave(_: int) -> None:
        if stream:
            with httpx.stream("POST", server + "/v1/completions", json=body, timeout=30) as r:
                next(r.iter_lines())
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server + "/v1/completions", json=body, timeout=1)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(leave, range(8)))
    time.sleep(0.5)  # (a whole response's handler looks for its client every 0.25 s)
    start = time.monotonic()
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0, timeout=60,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and time.monotonic() - start < 3


def test_over_the_in_flight_limit_a_request_gets_429_with_retry_after(server):
    body = {"prompt": "Once", "max_tokens": 1000, "ignore_eos": True}
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        answers = [pool.submit(httpx.post, server + "/v1/completions", json=body, timeout=120)
                   for _ in range(IN_FLIGHT)]
        deadline = time.monotonic() + 30
        while metric_values(server)["slipstream_requests_in_flight"] < IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.post(server + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert all(a.result().status_code == 200 for a in answers)


def test_sigterm_drains_requests_in_flight_then_exits_leaving_nothing_behind(tmp_path):
    with open(tmp_path / "stderr", "w") as log:
        proc, url = start_server(MODEL, stderr=log)
    body = {"prompt": "Once", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
    assert proc.wait(40) in (0, -signal.SIGTERM)  # (uvicorn re-raises the signal once it has drained)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
    assert "leaked" not in (tmp_path / "stderr").read_text()  # (multiprocessing's resource tracker's warning)


@pytest.mark.skipif(not Path("/proc").exists(), reason="finds the engine process through /proc")
def test_sigusr1_prints_every_threads_stack_in_both_processes_and_serving_goes_on(tmp_path):
    """What an operator asks a server that seems stuck: each process's threads, where they are."""
    with open(tmp_path / "stderr", "w") as log:
        proc, url = start_server(MODEL, stderr=log)
    try:
        for pid in (proc.pid, engine_pid(proc.pid)):
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(  # (two processes: their dumps land in either order)
                mark in (tmp_path / "stderr").read_text() for mark in ("uvicorn", "engine_process.py")):
            time.sleep(0.2)
        stacks = (tmp_path / "stderr").read_text()
        assert "uvicorn" in stacks and "engine_process.py" in stacks  # (the API process's, the engine's)
        assert stacks.count("(most recent call first)") >= 4  # (every thread: loop, sender, main, ...)
        assert httpx.get(url + "/health").status_code == 200
    finally:
        stop_server(proc)


@pytest.mark.skipif(not Path("/proc").exists(), reason="finds the engine process through /proc")
def test_when_the_engine_process_dies_requests_fail_at_once_and_health_says_so():
    """Those in flight, one sent at the moment it dies (answered, never left blocking the API
    process), and those after."""
    proc, url = start_server(MODEL)
    try:
        llm = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        stream = llm.completions.create(model=MODEL, prompt="Once", max_tokens=4000, stream=True,
                                        extra_body={"ignore_eos": True})
        next(iter(stream))
        os.kill(engine_pid(proc.pid), signal.SIGKILL)
        time.sleep(0.02)  # (the API process learns of it when the engine's end of their socket closes)
        with pytest.raises(openai.APIStatusError):  # (sent before it may know: a 500 or 503, not a hang)
            llm.completions.create(model=MODEL, prompt="x", max_tokens=2, timeout=10)
        start = time.monotonic()
        with pytest.raises(Exception):
            for _ in stream:
                pass
        assert time.monotonic() - start < 5
        time.sleep(0.5)
        assert httpx.get(url + "/health").status_code == 503
        with pytest.raises(openai.APIStatusError) as e:
            llm.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert e.value.status_code == 503
    finally:
        stop_server(proc)


BAD_BODIES = [b"{not json", b'{"prompt": "x", "temperature": -1}', b'{"prompt": "x", "max_tokens": 0}',
              b'{"prompt": [5, 1000000]}', b'{"prompt": "x", "n": 0}', b'{"prompt": "x", "stop": [3]}',
              b'{"messages": "hello"}', b"[1, 2]"]


async def _one(client: httpx.AsyncClient, rng: random.Random, i: int) -> str:
    """One request of the battery; returns what became of it."""
    kind = rng.random()
    if kind < 0.1:
        route = "/v1/chat/completions" if b"messages" in (body := rng.choice(BAD_BODIES)) else "/v1/completions"
        r = await client.post(route, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"], r.text
        return "refused"
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 200))]
    if kind < 0.3:  # leaves mid-way: a stream after its first chunk, or a whole answer by a timeout
        body = {"prompt": prompt, "max_tokens": 200, "ignore_eos": True, "stream": kind < 0.2}
        if body["stream"]:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        break
        else:
            with pytest.raises(httpx.TimeoutException):
                await client.post("/v1/completions", json=body, timeout=0.2)
        return "left"
    n, max_tokens, stream = rng.choice((1, 1, 2)), rng.randint(1, 24), rng.random() < 0.5
    body = {"prompt": prompt, "max_tokens": max_tokens, "n": n, "temperature": rng.choice((0, 0.8)), "seed": i,
            "stream": stream}
    if not stream:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert len(out["choices"]) == n and all(c["finish_reason"] in ("stop", "length") for c in out["choices"])
        assert 1 <= out["usage"]["completion_tokens"] <= n * max_tokens
        return "answered"
    finished, lines = set(), []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if line.startswith("data: {") and '"finish_reason":null' not in line:
                    finished.add(line)
    assert lines[-1] == "data: [DONE]" and len(finished) == n, lines
    return "answered"


def test_a_battery_of_2000_requests_leaves_every_one_answered_no_page_held_and_the_server_healthy():
    proc, url = start_server(MODEL, "--max-num-seqs", "32")
    try:
        rng = random.Random(0)
        seeds = [rng.random() for _ in range(2000)]

        async def battery() -> list[str]:
            limit = asyncio.Semaphore(48)
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                async def bounded(i: int) -> str:
                    async with limit:
                        return await _one(client, random.Random(seeds[i]), i)

                return await asyncio.gather(*(bounded(i) for i in range(2000)))

        start = time.monotonic()
        outcomes = asyncio.run(battery())
        took = time.monotonic() - start
        counts = {k: outcomes.count(k) for k in ("answered", "left", "refused")}
        assert sum(counts.values()) == 2000 and min(counts.values()) > 150, counts
        assert took < 300, f"the battery took {took:.0f} s"
        values = wait_idle(url)
        assert values["slipstream_kv_pages_in_use"] == 0, values
        assert values["slipstream_requests_running"] == 0 and values["slipstream_requests_waiting"] == 0
        assert values['slipstream_requests_total{finish_reason="client_gone"}'] >= counts["left"] * 0.9
        assert httpx.get(url + "/health").status_code == 200
    finally:
        stop_server(proc)
