"""`slipstream bench-serve` drives a running server through HTTP: every request of the mixed
workload is answered with the tokens it asked for, percentages of the capacity measured all at once
set the Poisson rates, goodput counts the requests within the SLO, the short and md2-query workloads
and one-at-a-time runs work (with the TTFT split by hop), a burst streams on connections opened
before its clock starts (unless asked for cold ones), and a missing server or the wrong model is an error message."""
from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("aiohttp")

from serving import free_port, start_server, stop_server, wait_idle  # noqa: E402
from slipstream.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("random:tiny-llama", "--max-num-seqs", "16")
    yield url
    stop_server(proc)


def test_the_mixed_workload_at_rates_of_its_capacity(server, tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["bench-serve", "--url", server, "--requests", "24", "--prompt-range", "5,60", "--output-range",
                 "2,6", "--request-rate", "inf,50%", "--slo-ttft-ms", "1e9", "--slo-tpot-ms", "1e9",
                 "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    first, second = saved["results"]
    rng = random.Random(0)  # (the lengths are drawn as bench/serve.py draws them)
    asked = sum([rng.randint(5, 60), rng.randint(2, 6)][1] for _ in range(24))
    for r in (first, second):
        assert r["requests"] == 24 and r["failed"] == 0 and r["output_tokens"] == asked
        assert 0 < r["ttft_ms"][0] <= r["ttft_ms"][2] <= r["e2e_ms"][2] and r["itl_ms"][0] > 0
        assert r["goodput_s"] == pytest.approx(r["requests_s"])  # (an SLO every request meets)
    assert first["rate"] == float("inf") and second["rate"] == pytest.approx(first["requests_s"] / 2)
    assert out.with_suffix(".png").exists() and "TTFT p50/p90/p99" in capsys.readouterr().out


def test_each_rate_sends_new_prompts_of_the_same_lengths():
    """A rate's prompts are never found in the prefix cache an earlier rate filled."""
    from slipstream.bench.serve import _requests

    model = {"max_model_len": 512, "vocab_size": 1000}
    first, second = (_requests("mixed", 8, (5, 60), (2, 6), model, 0, draw) for draw in (0, 1))
    assert [(len(a["prompt"]), a["max_tokens"]) for _, a in first] == [(len(b["prompt"]), b["max_tokens"])
                                                                       for _, b in second]
    assert all(a["prompt"] != b["prompt"] for (_, a), (_, b) in zip(first, second))


@pytest.mark.parametrize("warm", [True, False])
def test_a_burst_streams_on_connections_opened_before_its_clock(warm):
    """Each request of a rate-inf run arrives on a connection that already served a GET /health,
    or, cold, on a new one."""
    import asyncio

    from aiohttp import web

    from slipstream.bench.serve import _run_rate

    served_health, fresh = set(), []

    async def health(request):
        served_health.add(id(request.transport))
        return web.json_response({"status": "ok"})

    async def completions(request):
        fresh.append(id(request.transport) not in served_health)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "a"}], "usage": {"prompt_tokens": 1, '
                             b'"completion_tokens": 1}}\n\ndata: [DONE]\n\n')
        return response

    async def run():
        app = web.Application()
        app.add_routes([web.get("/health", health), web.post("/v1/completions", completions)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            requests = [("/v1/completions", {"prompt": [1], "max_tokens": 1})] * 6
            return await _run_rate(f"http://127.0.0.1:{port}", {}, requests, float("inf"), 0, warm_connections=warm)
        finally:
            await runner.cleanup()

    timings, _ = asyncio.run(run())
    assert [t.error for t in timings] == [None] * 6 and all(t.chunks for t in timings)
    assert fresh == [not warm] * 6


def test_two_runs_with_one_seed_send_prompts_the_prefix_cache_never_held(server):
    """Run twice against one server, the same seed draws the same lengths but new tokens: the
    second run's throughput is not inflated by the first one's cached pages."""
    from slipstream.bench.serve import _scrape

    before = wait_idle(server)["slipstream_cached_prompt_tokens_total"]
    for _ in range(2):
        assert main(["bench-serve", "--url", server, "--requests", "6", "--prompt-range", "40,60",
                     "--output-range", "2,2"]) == 0
    after = wait_idle(server)["slipstream_cached_prompt_tokens_total"]  # (the engine's figures, refreshed)
    assert _scrape(server, {})["ttft_count"] > 0 and after == before


def test_short_requests_one_at_a_time_an_slo_none_meets_and_where_their_ttft_went(server, tmp_path, capsys):
    out = tmp_path / "short.json"
    assert main(["bench-serve", "--url", server, "--workload", "short", "--requests", "6", "--max-concurrency", "1",
                 "--slo-ttft-ms", "0", "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["requests"] == 6 and r["failed"] == 0 and r["goodput_s"] == 0
    assert 6 <= r["output_tokens"] <= 24
    path = r["ttft_path_ms"]  # (means from the server's /metrics: client and HTTP, then the three hops)
    assert set(path) == {"client_and_http", "api_to_engine", "engine", "engine_to_api"}
    assert all(ms > 0 for ms in path.values()) and sum(path.values()) <= r["ttft_ms"][2]
    assert "TTFT path, mean ms" in capsys.readouterr().out


def test_md2_query_through_a_moondream_server(tmp_path):
    proc, url = start_server("random:tiny-moondream")
    try:
        out = tmp_path / "md2.json"
        assert main(["bench-serve", "--url", url, "--workload", "md2-query", "--requests", "4", "--out", str(out)]) == 0
        (r,) = json.loads(out.read_text())["results"]
        assert r["requests"] == 4 and r["failed"] == 0 and r["prompt_tokens"] > 4 * 729
    finally:
        stop_server(proc)


def test_no_server_and_the_wrong_model_are_error_messages(server, capsys):
    assert main(["bench-serve", "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "no slipstream server answers" in capsys.readouterr().err
    assert main(["bench-serve", "--url", server, "--workload", "md2-query"]) == 2
    assert "needs a Moondream 2 server" in capsys.readouterr().err
    assert main(["bench-serve", "--url", server, "--prompt-range", "10,5000"]) == 2
    assert "do not fit" in capsys.readouterr().err
