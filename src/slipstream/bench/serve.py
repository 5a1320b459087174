"""`slipstream bench-serve`: traffic through the real HTTP path of a running `slipstream serve`,
streamed, at Poisson arrivals (or all at once), as vLLM's serving benchmark measures a server.

- mixed: the offline `bench --workload mixed` requests (prompts of random token ids, lengths
  uniform in `prompt_range`, outputs uniform in `output_range`, EOS ignored, greedy), by
  /v1/completions.
- short: prompts of 16-64 random tokens, 1-4 output tokens (the point-and-detect case).
- md2-query (a Moondream 2 server): a question about a new synthetic 800x600 image (JPEG, a
  base64 data URL) per request, by /v1/chat/completions with the image (so usage counts tokens),
  answers of at most 8 tokens.

Per rate: requests/s, output and total tok/s, TTFT, TPOT, ITL and end-to-end p50/p90/p99, and
goodput (requests/s that met the SLO flags). TTFT is the first chunk with text, ITL the gaps
between chunks with text (a chunk holds what the engine committed since the last: one token, or
more when the server's writer fell behind), TPOT (last - first) / (tokens - 1) from the usage.

Where the TTFT goes, as means over each run from the server's /metrics before and after it (so
bench-serve should be the server's only client): the client and HTTP (the client's TTFT less the
API process's), the API process to the engine process's receipt, the engine (tokenizing, queueing,
prefill, the commit of the first text), and back to the API process."""
from __future__ import annotations

import asyncio
import base64
import io
import itertools
import random
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

from .decode import write_report
from .traffic import at_rates, parse_rates, plot_latencies

WORKLOADS = ("mixed", "short", "md2-query")
QUESTION = "What is the main object in this picture, what color is it, and where is it? Answer briefly."


@dataclass
class Timing:
    """One request as the client saw it."""
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival of each chunk with text
    prompt_tokens: int = 0
    output_tokens: int = 0
    done: float = 0.0
    error: str | None = None


@dataclass
class ServeResult:
    workload: str
    mode: str  # the --label (the server's mode, say)
    rate: float
    requests: int
    failed: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    requests_s: float
    output_tok_s: float
    total_tok_s: float
    goodput_s: float  # requests/s that met the SLO (every request, without SLO flags)
    ttft_ms: list[float]  # p50, p90, p99
    tpot_ms: list[float]
    itl_ms: list[float]
    e2e_ms: list[float]
    ttft_ms_quantiles: list[float]  # at 0, 1, ..., 100 %: the CDFs the plot draws
    itl_ms_quantiles: list[float]
    ttft_path_ms: dict[str, float] = field(default_factory=dict)  # mean TTFT by hop (see ttft_path)


def _requests(workload: str, count: int, prompt_range: tuple[int, int], output_range: tuple[int, int],
              model: dict, seed: int, draw: int) -> list[tuple[str, dict]]:
    """(route, body) of each request, made before the clock starts. `seed` draws the lengths, the
    same for every `draw`; the prompts' tokens and the images are new for each `draw`, so a rate's
    requests are never served from the prefix cache an earlier rate, an earlier run (`run` draws
    from a random start) or the warm-up filled."""
    rng, fresh = random.Random(seed), random.Random(f"{seed}:{draw}")
    if workload == "md2-query":
        if not model.get("moondream"):
            raise ValueError("md2-query needs a Moondream 2 server (slipstream serve --model random:moondream2)")
        from .moondream import synthetic_images

        out = []
        for img in synthetic_images(count, fresh.getrandbits(32)):
            jpeg = io.BytesIO()
            img.save(jpeg, format="JPEG", quality=90)
            url = "data:image/jpeg;base64," + base64.b64encode(jpeg.getvalue()).decode()
            content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
            out.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                                 "max_tokens": 8, "temperature": 0}))
        return out
    if workload == "short":
        prompt_range, output_range = (16, 64), (1, 4)
    longest = model["max_model_len"] - output_range[1]
    if prompt_range[1] > longest:
        raise ValueError(f"prompts of up to {prompt_range[1]} tokens and outputs of {output_range[1]} do not fit the "
                         f"server's context of {model['max_model_len']}")
    out = []
    for _ in range(count):
        n, m = rng.randint(*prompt_range), rng.randint(*output_range)
        out.append(("/v1/completions", {"prompt": [fresh.randrange(model["vocab_size"]) for _ in range(n)],
                                        "max_tokens": m, "ignore_eos": True, "temperature": 0}))
    return out


async def _send(session, url: str, body: dict, timing: Timing) -> None:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with session.post(url, data=orjson.dumps(body), headers={"content-type": "application/json"}) as r:
            if r.status != 200:
                timing.error = f"{r.status}: {(await r.read()).decode(errors='replace')[:200]}"
                return
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    timing.error = str(chunk["error"])
                    return
                choice = chunk["choices"][0] if chunk.get("choices") else {}
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    timing.chunks.append(time.perf_counter())
                if chunk.get("usage"):
                    timing.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    timing.output_tokens = chunk["usage"]["completion_tokens"]
        timing.done = time.perf_counter()
    except Exception as e:  # (a refused connection, a reset: counted as failed, not fatal to the run)
        timing.error = f"{type(e).__name__}: {e}"


async def _run_rate(url: str, headers: dict, requests: list[tuple[str, dict]], rate: float, seed: int,
                    max_concurrency: int | None = None, warm_connections: bool = True) -> tuple[list[Timing], float]:
    """Every request streamed at its arrival time. aiohttp, not httpx: httpx's connection pool
    scans every connection on each event, so a few hundred concurrent streams cost the client more
    CPU than the server (docs/server.md, "The benchmark's client"). `warm_connections` with rate inf:
    the connections the requests will stream on are opened before the clock starts, as clients
    that keep their connections alive hold them; otherwise every request of a burst opens one after
    it, and a one-process client's TCP handshakes then delay the burst's last requests by hundreds of
    milliseconds on the CPU machine (docs/server.md, "All at once")."""
    import aiohttp

    rng = random.Random(seed)
    due, arrivals = 0.0, []
    for _ in requests:
        arrivals.append(due)
        if rate != float("inf"):
            due += rng.expovariate(rate)
    base = url.rstrip("/")
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None), read_bufsize=1 << 20) as session:
        if warm_connections and rate == float("inf"):
            await _open_connections(session, base, min(len(requests), max_concurrency or len(requests)))
        bar = tqdm(total=len(requests), desc=f"rate {rate:g}", unit="req", leave=False)
        start = time.perf_counter()

        slots = asyncio.Semaphore(max_concurrency or len(requests))

        async def one(i: int) -> Timing:
            delay = start + arrivals[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with slots:  # (a request waiting for a slot is sent, and timed, once it has one)
                timing = Timing(time.perf_counter())
                route, body = requests[i]
                await _send(session, base + route, body, timing)
            bar.update()
            return timing

        timings = await asyncio.gather(*(one(i) for i in range(len(requests))))
        wall = time.perf_counter() - start
        bar.close()
    return list(timings), wall


async def _open_connections(session, base: str, count: int) -> None:
    """`count` connections in the session's pool, each having served a GET /health (kept alive)."""
    async def health() -> None:
        async with session.get(base + "/health") as r:
            await r.read()

    await asyncio.gather(*(health() for _ in range(count)))


PATH_HOPS = ("api_to_engine", "engine", "engine_to_api")


def _scrape(url: str, headers: dict) -> dict[str, float]:
    """The server's TTFT sum and count and its first-token path counters ({} from a server without them)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/metrics", headers=headers),
                                timeout=10) as r:
        text = r.read().decode()
    wanted = {"slipstream_time_to_first_token_seconds_sum": "ttft_sum",
              "slipstream_time_to_first_token_seconds_count": "ttft_count",
              "slipstream_first_token_path_requests_total": "paths"}
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                values[wanted[sample.name]] = sample.value
            elif sample.name == "slipstream_first_token_path_seconds_total":
                values[sample.labels["hop"]] = sample.value
    return values


def ttft_path(before: dict[str, float], after: dict[str, float], client_ttft_ms: list[float]) -> dict[str, float]:
    """Mean TTFT by hop over a run (ms): `client_and_http` is the client's mean less the API process's."""
    paths = after.get("paths", 0) - before.get("paths", 0)
    counted = after.get("ttft_count", 0) - before.get("ttft_count", 0)
    if paths <= 0 or counted <= 0 or not client_ttft_ms:
        return {}
    api_ms = (after["ttft_sum"] - before["ttft_sum"]) / counted * 1e3
    return {"client_and_http": float(np.mean(client_ttft_ms)) - api_ms,
            **{hop: (after[hop] - before.get(hop, 0.0)) / paths * 1e3 for hop in PATH_HOPS}}


def summarize(workload: str, label: str, rate: float, timings: list[Timing], wall: float,
              slo_ttft_ms: float | None, slo_tpot_ms: float | None,
              scraped: tuple[dict[str, float], dict[str, float]] = ({}, {})) -> ServeResult:
    """`scraped`: the server's counters before and after the run (`_scrape`), for the TTFT by hop."""
    ok = [t for t in timings if t.error is None and t.chunks]
    ttft = [(t.chunks[0] - t.sent) * 1e3 for t in ok]
    per_token = [(t.chunks[-1] - t.chunks[0]) * 1e3 / (t.output_tokens - 1) if t.output_tokens > 1 else None
                 for t in ok]  # (TPOT; None for a one-token answer)
    tpot = [x for x in per_token if x is not None]
    itl = [g * 1e3 for t in ok for g in np.diff(t.chunks)]
    e2e = [(t.done - t.sent) * 1e3 for t in ok]
    good = sum(1 for first, each in zip(ttft, per_token)
               if (slo_ttft_ms is None or first <= slo_ttft_ms)
               and (slo_tpot_ms is None or each is None or each <= slo_tpot_ms))

    def pct(xs: list[float], qs) -> list[float]:
        return [round(float(x), 4) for x in np.percentile(xs, qs)] if xs else [float("nan")] * len(qs)

    prompt, output = sum(t.prompt_tokens for t in ok), sum(t.output_tokens for t in ok)
    return ServeResult(workload, label, rate, len(timings), len(timings) - len(ok), prompt, output, wall,
                       len(ok) / wall, output / wall, (prompt + output) / wall, good / wall, pct(ttft, [50, 90, 99]),
                       pct(tpot, [50, 90, 99]), pct(itl, [50, 90, 99]), pct(e2e, [50, 90, 99]),
                       pct(ttft, np.arange(101)), pct(itl, np.arange(101)), ttft_path(*scraped, ttft))


def format_table(results: list[ServeResult]) -> str:
    cols = ("workload", "label", "rate", "req", "failed", "req/s", "out tok/s", "total tok/s", "goodput/s",
            "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "ITL p50/p90/p99 ms", "e2e p50/p90/p99 ms")
    lines = [" | ".join(cols)]
    for r in results:
        lines.append(" | ".join([r.workload, r.mode, f"{r.rate:g}", str(r.requests), str(r.failed),
                                 f"{r.requests_s:,.1f}", f"{r.output_tok_s:,.0f}", f"{r.total_tok_s:,.0f}",
                                 f"{r.goodput_s:,.1f}", *("/".join(f"{x:.2f}" for x in xs)
                                                         for xs in (r.ttft_ms, r.tpot_ms, r.itl_ms, r.e2e_ms))]))
    paths = [r for r in results if r.ttft_path_ms]
    if paths:
        lines.append("TTFT path, mean ms: client and HTTP | API process -> engine | engine | engine -> API process")
        lines += [f"  rate {r.rate:g}: " + " | ".join(f"{r.ttft_path_ms[k]:.2f}"
                                                       for k in ("client_and_http", *PATH_HOPS)) for r in paths]
    return "\n".join(lines)


def run(url: str, api_key: str | None, workload: str, rates: list[str], count: int, prompt_range: tuple[int, int],
        output_range: tuple[int, int], slo_ttft_ms: float | None, slo_tpot_ms: float | None, label: str,
        out: Path | None, seed: int = 0, max_concurrency: int | None = None,
        warm_connections: bool = True) -> list[ServeResult]:
    """Each rate in turn ('inf' first where percentages of its capacity are asked for), at most
    `max_concurrency` requests in flight (1 with rate inf: one at a time, light load); print a
    table, write JSON and a PNG of the latency CDFs."""
    if workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/v1/models", headers=headers),
                                    timeout=10) as listed:
            model = orjson.loads(listed.read())["data"][0]
    except urllib.error.HTTPError as e:
        raise ValueError(f"{url}/v1/models answered {e.code}: {e.read().decode(errors='replace')[:200]}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ValueError(f"no slipstream server answers at {url} ({e}); start one with `slipstream serve`") from None
    draws = itertools.count(random.SystemRandom().getrandbits(64))  # (a new run draws new prompts too)
    warm_up = _requests(workload, min(8, count), prompt_range, output_range, model, seed, next(draws))
    asyncio.run(_run_rate(url, headers, warm_up, float("inf"), seed))

    def at(rate: float) -> ServeResult:
        requests = _requests(workload, count, prompt_range, output_range, model, seed, next(draws))
        before = _scrape(url, headers)
        timings, wall = asyncio.run(_run_rate(url, headers, requests, rate, seed + 1, max_concurrency,
                                              warm_connections))
        return summarize(workload, label, rate, timings, wall, slo_ttft_ms, slo_tpot_ms,
                         (before, _scrape(url, headers)))

    results = at_rates(parse_rates(rates), at)
    print(format_table(results))
    write_report(out, {"url": url, "model": model, "workload": workload, "max_concurrency": max_concurrency,
                       "warm_connections": warm_connections,
                       "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "results": [asdict(r) for r in results]},
                 lambda png: plot_latencies(results, png))
    return results
