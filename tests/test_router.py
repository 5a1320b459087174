"""Data parallelism (`slipstream serve --data-parallel N`): requests go to the replica that served
their prompt's start lately while it is not much busier than the least busy one, else to the
least busy; a replica whose engine process dies fails its requests in flight at once, the others
serve on, and it is restarted; /metrics says which rule routed what."""
from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from slipstream.server.protocol import Generate, Skill
from slipstream.server.router import BALANCE, MIN_BLOCKS, PrefixIndex, Replicas

openai = pytest.importorskip("openai")

from serving import engine_pids, metric_values, start_server, stop_server  # noqa: E402

MODEL = "random:tiny-llama"


class FakeClient:
    def __init__(self, in_flight: int = 0) -> None:
        self.in_flight, self.ready, self.dead = in_flight, object(), None


def replicas(*loads: int) -> Replicas:
    r = Replicas(MODEL, {}, None, ["cpu"] * len(loads))
    r.clients = [FakeClient(n) for n in loads]
    return r


def test_the_index_finds_the_longest_start_a_replica_served():
    index = PrefixIndex()
    system = "You are a careful assistant. " * 40
    a, b = index.keys(Generate("a", prompt=system + "Hi")), index.keys(Generate("b", prompt=system + "Bye"))
    assert len(a) >= MIN_BLOCKS and a == b[:len(a)]
    index.record(a, 1)
    assert index.best(b) == (1, len(a))
    assert index.best(index.keys(Generate("c", prompt="x" * 2000))) == (None, 0)
    ids = index.keys(Generate("d", prompt=list(range(300))))
    assert len(ids) == 300 // 64
    chat = index.keys(Generate("e", messages=[{"role": "system", "content": system}, {"role": "user", "content": "x"}]))
    assert len(chat) >= MIN_BLOCKS
    image = index.keys(Skill("f", "query", b"\x89PNG" * 10, "What?"))
    assert image == index.keys(Skill("g", "caption", b"\x89PNG" * 10, "short"))


def test_prefix_affinity_while_balanced_else_the_least_busy():
    r = replicas(3, 0)
    shared = Generate("a", prompt="The same long system prompt. " * 40)
    assert r._pick(shared) == 1  # (least busy; the index learns it)
    r.clients[1].in_flight = 2
    assert r._pick(Generate("b", prompt=shared.prompt + "more")) == 1  # (its prefix, not the least busy)
    r.clients[1].in_flight = 3 + BALANCE + 1
    assert r._pick(Generate("c", prompt=shared.prompt + "again")) == 0  # (too busy: by load)
    assert r._pick(Generate("d", prompt="short")) == 0
    assert dict(r.decisions) == {"prefix": 1, "least_outstanding": 3}
    r.clients[0].dead = "gone"
    assert r._pick(Generate("e", prompt="short")) == 1
    r.clients[1].dead = "gone"
    assert r.dead is not None


@pytest.mark.skipif(not Path("/proc").exists(), reason="finds the engine processes through /proc")
def test_two_replicas_share_the_load_survive_one_dying_and_restart_it():
    proc, url = start_server(MODEL, "--data-parallel", "2")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        system = "You are a careful assistant who answers briefly. " * 12

        def ask(i: int) -> str:
            return client.completions.create(model=MODEL, prompt=f"{i} " * 30, max_tokens=4, temperature=0).id

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, range(16)))
        for q in ("Why?", "How?", "When?"):
            client.completions.create(model=MODEL, prompt=system + q, max_tokens=2, temperature=0)
        values = metric_values(url)
        assert [values[f'slipstream_replica_up{{replica="{i}"}}'] for i in (0, 1)] == [1.0, 1.0]
        assert min(values[f'slipstream_replica_requests_total{{replica="{i}"}}'] for i in (0, 1)) >= 4
        assert values['slipstream_router_decisions_total{rule="prefix"}'] >= 2
        pids = engine_pids(proc.pid)
        assert len(pids) == 2
        stream = client.completions.create(model=MODEL, prompt="Once", max_tokens=4000, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        values = metric_values(url)
        serving = next(i for i in (0, 1) if values[f'slipstream_replica_requests_in_flight{{replica="{i}"}}'] == 1)
        os.kill(pids[serving], signal.SIGKILL)  # (replicas start in order: their pids too)
        start = time.monotonic()
        with pytest.raises(Exception):
            for _ in stream:
                pass
        assert time.monotonic() - start < 5
        assert httpx.get(url + "/health").status_code == 200  # (the other serves on)
        time.sleep(1.0)  # (the dead replica's replacement is loading now: the API serves on without it)
        assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            values = metric_values(url)
            if values["slipstream_replica_restarts_total"] >= 1 and values['slipstream_replica_up{replica="0"}'] \
                    + values['slipstream_replica_up{replica="1"}'] == 2:
                break
            time.sleep(0.5)
        assert values["slipstream_replica_restarts_total"] >= 1
        assert len(engine_pids(proc.pid)) == 2
    finally:
        stop_server(proc)
