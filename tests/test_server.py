"""The OpenAI-compatible server (`slipstream serve`) through the real `openai` client, against a
server process this module starts on 127.0.0.1 with random:tiny-llama: its answers are the offline
engine's (text, n choices and their seeds, logprobs), streaming concatenates to the whole,
structured output holds, bad requests get OpenAI-shaped 400s naming the field before any
tokenization work, the API key is checked, and /metrics counts requests, pages and GPU time (its
latency histograms as prometheus_client's would). A stream starts when the engine queues its
request, not at its first token; generation routes skip the app's middleware; with `--busy-poll` the
answers are the same and the engine's intake polls only while the engine is idle.
Faults (disconnects, the engine's death, SIGTERM, a battery of mixed traffic): test_server_faults.py."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from serving import metric_values, start_server, stop_server, wait_idle  # noqa: E402
from slipstream import LLM, SamplingParams  # noqa: E402
from slipstream.server.app import EventStream, _App, build_app  # noqa: E402
from slipstream.server.engine_process import _Server  # noqa: E402
from slipstream.server.protocol import Delta, Generate, Ready  # noqa: E402

KEY = "sk-test"
MODEL = "random:tiny-llama"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(MODEL, "--api-key", KEY)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def offline():
    with LLM(MODEL, device="cpu", max_num_seqs=2) as llm:
        yield llm


def test_models_lists_the_served_model(client):
    (model,) = client.models.list().data
    assert model.id == MODEL


def test_a_greedy_completion_is_the_offline_engines(client, offline):
    out = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=12, temperature=0)
    want = offline.generate("The sea is", SamplingParams(max_tokens=12))[0]
    assert out.choices[0].text == want.text and out.choices[0].finish_reason == want.finish_reason
    assert out.usage.prompt_tokens == len(want.prompt_token_ids)
    assert out.usage.completion_tokens == len(want.token_ids)


def test_streamed_chat_concatenates_to_the_whole_and_reports_usage(client):
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10


def test_n_choices_are_the_offline_engines_with_seeds_seed_plus_index(client, offline):
    out = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8, temperature=1.0, seed=7, n=3,
                                    extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2]
    for i, choice in enumerate(out.choices):
        want = offline.generate("Once upon", SamplingParams(max_tokens=8, temperature=1.0, seed=7 + i,
                                                            ignore_eos=True))[0]
        assert choice.text == want.text
    assert len({c.text for c in out.choices}) > 1
    assert out.usage.completion_tokens == 24


def test_streamed_n_choices_each_concatenate_to_the_whole(client):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0.8, seed=2,
                n=2, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**body)
    texts = {0: "", 1: ""}
    for chunk in client.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {c.index: c.message.content for c in whole.choices}


def test_completion_logprobs_are_the_offline_engines(client, offline):
    out = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=5, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    want = offline.generate("The sea is", SamplingParams(max_tokens=5, logprobs=3, ignore_eos=True))[0]
    lp = out.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e[t] for t, e in zip(want.token_ids, want.logprobs)], abs=1e-4)
    assert [len(top) for top in lp.top_logprobs] == [3] * 5
    pieces = [offline.tokenizer.decode([t]) for t in want.token_ids]
    assert [t for t, p in zip(lp.tokens, pieces) if "\ufffd" not in p] == [p for p in pieces if "\ufffd" not in p]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_carry_bytes_and_stream_as_they_come(client):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0,
                logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**body).choices[0].logprobs.content
    assert len(whole) == 6 and all(len(t.top_logprobs) == 2 for t in whole)
    assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in whole)
    assert all(t.logprob == pytest.approx(max(t.logprob, t.top_logprobs[0].logprob)) for t in whole)  # (greedy)
    streamed = [t for chunk in client.chat.completions.create(stream=True, **body) if chunk.choices
                and chunk.choices[0].logprobs for t in chunk.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in whole]


def test_a_json_schema_response_is_valid_json_of_that_schema(client):
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A name as JSON."}], max_tokens=40, temperature=0.7,
        seed=3, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content)["name"], str)


@pytest.mark.parametrize("fields,param", [({"temperature": -1}, None), ({"n": 0}, "n"), ({"logprobs": 21}, "logprobs"),
                                          ({"max_tokens": 0}, "max_tokens"), ({"stop": [3]}, "stop"),
                                          ({"logit_bias": {"1": 2}}, "logit_bias")])
def test_bad_requests_get_a_400_naming_the_problem(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", **fields)
    body = e.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == param
    assert next(iter(fields)) in body["message"]


@pytest.mark.parametrize("fields,param", [({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 3}, "logprobs")])
def test_chat_logprob_fields_are_checked(server, fields, param):
    r = httpx.post(server + "/v1/chat/completions", headers=AUTH,
                   json={"messages": [{"role": "user", "content": "x"}], **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_malformed_bodies_and_missing_prompts_are_400(server):
    assert httpx.post(server + "/v1/completions", content=b"{not json", headers=AUTH).status_code == 400
    missing = httpx.post(server + "/v1/completions", json={"max_tokens": 3}, headers=AUTH)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"
    for ids in ([1, True, 2], [1, 2.0], [1, "2"], [[1, 2], [3]]):  # (a token id is an int; one prompt a request)
        bad = httpx.post(server + "/v1/completions", json={"prompt": ids}, headers=AUTH)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt", ids


def test_prompts_longer_than_the_context_are_refused_before_tokenization(server):
    """4,096 tokens of at most 13 bytes each: a longer text cannot fit, and is refused on its size."""
    text = httpx.post(server + "/v1/completions", headers=AUTH, json={"prompt": "a" * (4096 * 13 + 1)})
    assert text.status_code == 400 and text.json()["error"]["param"] == "prompt"
    assert "bytes" in text.json()["error"]["message"]
    ids = httpx.post(server + "/v1/completions", headers=AUTH, json={"prompt": [1] * 4096})
    assert ids.status_code == 400 and "4096 tokens" in ids.json()["error"]["message"]
    chat = httpx.post(server + "/v1/chat/completions", headers=AUTH,
                      json={"messages": [{"role": "user", "content": "é" * 30_000}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"


def test_a_body_over_the_limit_is_413(server):
    r = httpx.post(server + "/v1/completions", headers=AUTH, content=b"x" * (33 << 20))
    assert r.status_code == 413


def test_image_parts_and_skills_need_a_moondream_model(server):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    r = httpx.post(server + "/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]})
    assert r.status_code == 400 and "Moondream" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/caption", headers=AUTH, json={"image_url": image["image_url"]["url"]})
    assert r.status_code == 404 and "Moondream" in r.json()["error"]["message"]


def test_the_api_key_is_required(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server + "/health").status_code == 200  # (health is open)


def test_a_repeated_prompt_is_found_in_the_prefix_cache_and_usage_says_so(client):
    prompt = "the kernel " * 40
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.choices[0].text == again.choices[0].text
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= again.usage.prompt_tokens - 16 and cached % 16 == 0  # (full pages of 16, the last token computed)


def test_metrics_count_requests_steps_and_gpu_time_and_show_no_page_held_once_idle(server, client):
    for _ in range(2):  # (the second finds the first's pages in the prefix cache)
        client.completions.create(model=MODEL, prompt="the page " * 30, max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    values = wait_idle(server)
    assert 0 < values["slipstream_cached_prompt_tokens_total"] < values["slipstream_prompt_tokens_total"]
    assert values["slipstream_kv_pages_cached"] > 0
    assert values["slipstream_kv_pages_in_use"] == 0 and values["slipstream_kv_pages_total"] > 0
    assert values['slipstream_requests_total{finish_reason="length"}'] >= 1
    assert values["slipstream_time_to_first_token_seconds_count"] >= 1
    steps = values["slipstream_decode_steps_total"] + values["slipstream_prefill_steps_total"]
    assert values["slipstream_decode_steps_total"] > 0 and values["slipstream_timed_steps_total"] == steps
    assert values["slipstream_gpu_busy_seconds_total"] > 0
    # idle is counted between consecutive steps only: fewer gaps than steps, summing to the idle total
    gaps = values["slipstream_gpu_idle_per_step_seconds_count"]
    assert 0 < gaps < steps
    assert values["slipstream_gpu_idle_per_step_seconds_sum"] == pytest.approx(
        values["slipstream_gpu_idle_seconds_total"])
    assert values['slipstream_gpu_idle_per_step_seconds_bucket{le="+Inf"}'] == gaps


def test_ttft_splits_along_the_first_tokens_path_into_hops_that_sum_to_it(server, client):
    """Each streamed request's TTFT, as the API process measures it, is the sum of its three hops (to
    the engine process, in it, back), each positive; bench-serve reads their means from here."""
    before = wait_idle(server)
    for stream in (False, True):
        out = client.completions.create(model=MODEL, prompt="A hop", max_tokens=4, temperature=0, stream=stream)
        list(out) if stream else out
    after = metric_values(server)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("slipstream_first_token_path_requests_total") == 2
    hops = [grew(f'slipstream_first_token_path_seconds_total{{hop="{hop}"}}')
            for hop in ("api_to_engine", "engine", "engine_to_api")]
    assert all(seconds > 0 for seconds in hops)
    assert sum(hops) == pytest.approx(grew("slipstream_time_to_first_token_seconds_sum"), abs=1e-6)


def test_latency_histograms_render_as_prometheus_clients_own():
    """The lock-free histogram that counts a delta's tokens in one call renders as
    prometheus_client's Histogram observing each token, bucket for bucket (bounds included)."""
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from slipstream.server.metrics import LATENCY_BUCKETS, LatencyHistogram, _Histograms

    reference, ours = CollectorRegistry(), CollectorRegistry()
    theirs = Histogram("x_seconds", "x", registry=reference, buckets=LATENCY_BUCKETS)
    mine = LatencyHistogram("x_seconds", "x")
    ours.register(_Histograms([mine]))
    rng = random.Random(0)
    for _ in range(500):
        seconds = rng.choice([0.001, 0.0025, 1, 30, 500]) if rng.random() < 0.3 else rng.expovariate(50)
        times = rng.randint(1, 3)
        for _ in range(times):
            theirs.observe(seconds)
        mine.observe(seconds, times)
    lines = [[line for line in generate_latest(r).decode().splitlines() if not line.startswith("#")]
             for r in (reference, ours)]
    assert [line.split()[0] for line in lines[0]] == [line.split()[0] for line in lines[1]]
    assert [float(line.split()[1]) for line in lines[0]] == pytest.approx([float(line.split()[1]) for line in lines[1]])


def test_step_timing_can_be_left_out():
    proc, url = start_server(MODEL, "--no-step-timing")
    try:
        httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        values = wait_idle(url)
        assert values["slipstream_decode_steps_total"] > 0 and values["slipstream_timed_steps_total"] == 0
        assert "slipstream_gpu_idle_per_step_seconds_count" not in metric_values(url)
    finally:
        stop_server(proc)


def test_a_lora_adapter_is_served_as_a_model_of_its_name(tmp_path):
    from slipstream.lora.adapter import write_random_adapter

    with LLM(MODEL, device="cpu", max_num_seqs=2, max_loras=1) as offline:
        path = write_random_adapter(offline.core.lora.targets, tmp_path / "ad", rank=8, scale=0.3)
        offline.load_lora("ad", str(path))
        want = offline.generate("The sea is", SamplingParams(max_tokens=8, lora="ad"))[0].text
        base = offline.generate("The sea is", SamplingParams(max_tokens=8))[0].text
    assert want != base
    proc, url = start_server(MODEL, "--lora", f"ad={path}")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL, "ad"]
        for model, text in (("ad", want), (MODEL, base)):
            out = client.completions.create(model=model, prompt="The sea is", max_tokens=8, temperature=0)
            assert out.choices[0].text == text
        with pytest.raises(openai.NotFoundError) as e:
            client.completions.create(model="nope", prompt="x", max_tokens=2)
        assert e.value.body["param"] == "model"
    finally:
        stop_server(proc)


def test_an_event_stream_sends_each_frame_and_stops_at_the_next_frame_once_its_client_has_gone():
    """EventStream (the SSE responses): frames go out as the generator yields them, then the end of
    the body; a client gone (http.disconnect) stops it after the frame in flight and closes the
    generator, whose `finally` is where a request is aborted."""
    async def run(leave_after: int | None) -> tuple[list[dict], list[str]]:
        sent, trace, gone = [], [], asyncio.Event()

        async def frames():
            try:
                for i in range(5):
                    trace.append(f"yield {i}")
                    yield f"data: {i}\n\n".encode()
                    await asyncio.sleep(0)
            finally:
                trace.append("closed")

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if leave_after is not None and len(sent) == 1 + leave_after:
                gone.set()
                await asyncio.sleep(0)

        await EventStream(frames())({"type": "http"}, receive, send)
        return sent, trace

    sent, trace = asyncio.run(run(None))
    assert sent[0]["type"] == "http.response.start" and (b"content-type", b"text/event-stream; charset=utf-8") in \
        sent[0]["headers"]
    assert [m["body"] for m in sent[1:]] == [f"data: {i}\n\n".encode() for i in range(5)] + [b""]
    assert [m["more_body"] for m in sent[1:]] == [True] * 5 + [False] and trace[-1] == "closed"

    sent, trace = asyncio.run(run(2))
    assert [m["body"] for m in sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n"]
    assert trace == ["yield 0", "yield 1", "closed"]


class _QueuingEngine:
    """An engine stand-in: it queues each request at once and gives its first token when told."""

    ready = Ready(model="m", max_model_len=256, vocab_size=100, max_prompt_bytes=4096)
    dead, stats, in_flight, started = None, None, 0, 0

    def __init__(self) -> None:
        self.token = asyncio.Event()

    async def request(self, message, choices=1):
        yield [Delta(message.id, queued=True)]
        await self.token.wait()
        yield [Delta(message.id, text="hi", completion_tokens=1, finish_reason="length", prompt_tokens=2)]


@pytest.mark.parametrize("chat", [False, True])
def test_a_stream_starts_when_the_engine_queues_the_request_not_at_its_first_token(chat):
    """The response's headers (and a chat's role chunk) go out while the engine prefills, so that
    only the first token's own chunk is left on its path; a completion sends no empty chunk."""
    async def run() -> tuple[list[dict], list[dict]]:
        engine, sent = _QueuingEngine(), []
        body = {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": [1, 2]}
        raw = json.dumps({**body, "max_tokens": 1, "stream": True}).encode()
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions" if chat else "/v1/completions",
                 "headers": [(b"content-length", str(len(raw)).encode())], "query_string": b"", "root_path": ""}
        messages = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # (the client stays)

        async def send(message: dict) -> None:
            sent.append(message)

        serving = asyncio.ensure_future(build_app(engine)(scope, receive, send))
        for _ in range(20):
            await asyncio.sleep(0)
        before_token = list(sent)
        engine.token.set()
        await serving
        return before_token, sent

    before_token, sent = asyncio.run(run())
    assert before_token[0]["type"] == "http.response.start" and before_token[0]["status"] == 200
    frames = [json.loads(m["body"][6:]) for m in before_token[1:]]
    if chat:
        assert [f["choices"][0]["delta"] for f in frames] == [{"role": "assistant", "content": ""}]
    else:
        assert frames == []
    texts = [m["body"] for m in sent[len(before_token):] if b'"hi"' in m.get("body", b"")]
    assert len(texts) == 1 and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_the_engine_process_answers_each_request_queued_or_refused_at_once():
    """Its main thread's word on a request: queued once its sequences are in the engine, or refused
    with the reason; never both."""
    replies: list[Delta] = []
    with LLM(MODEL, device="cpu", max_num_seqs=2) as llm:
        server = _Server(llm, replies.append, lambda batch: None)
        server.handle(Generate("ok", prompt=[1, 2, 3], params={"max_tokens": 2}, n=2))
        assert replies == [Delta("ok", queued=True)] and len(server.running.engine_ids("ok")) == 2
        server.handle(Generate("bad", prompt=[1, 10**9], params={"max_tokens": 2}))
        assert len(replies) == 2 and replies[1].id == "bad" and replies[1].invalid and not replies[1].queued
        assert "outside the vocabulary" in replies[1].error


def test_the_intake_polls_while_the_engine_is_idle_and_waits_in_the_kernel_while_it_runs():
    """`serve --busy-poll`: while the loop is idle the intake thread polls without sleeping (thousands
    of looks a second); while it runs, the intake waits in the kernel, looking again each
    millisecond, so that it never holds the interpreter lock the loop wants; either way a request
    that lands is read."""
    import socket
    import threading

    from slipstream.server.engine_process import _next_chunk

    class Engine:
        def __init__(self, idle: bool) -> None:
            self._idle, self.looks = idle, 0

        @property
        def idle(self) -> bool:
            self.looks += 1
            return self._idle

    for idle, fewest, most in ((True, 500, None), (False, 5, 150)):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            engine, got = Engine(idle), []
            reader = threading.Thread(target=lambda: got.append(_next_chunk(theirs, engine)), daemon=True)
            reader.start()
            time.sleep(0.1)
            looks = engine.looks
            ours.sendall(b"request")
            reader.join(5)
            assert got == [b"request"]
            assert looks >= fewest and (most is None or looks <= most), (idle, looks)


def test_a_busy_polling_server_answers_as_the_offline_engine(offline):
    proc, url = start_server(MODEL, "--busy-poll")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        want = offline.generate("The sea is", SamplingParams(max_tokens=8))[0].text
        assert client.completions.create(model=MODEL, prompt="The sea is", max_tokens=8, temperature=0).choices[0].text \
            == want
        stream = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=8, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want
        assert wait_idle(url)["slipstream_kv_pages_in_use"] == 0
    finally:
        stop_server(proc)


def test_generation_routes_skip_the_middleware_yet_still_route_under_a_root_path():
    """A POST to a direct route reaches its handler past the app's middleware; other methods, and
    the app mounted under a root path, go through the middleware and router as any route does."""
    from starlette.responses import PlainTextResponse

    seen: list[str] = []
    app = _App()

    @app.middleware("http")
    async def note(request, call_next):
        seen.append(request.url.path)
        return await call_next(request)

    async def handler(request) -> PlainTextResponse:
        return PlainTextResponse(f"handled {request.method}")

    app.add_direct_route("/v1/x", handler)

    async def run(root_path: str = "") -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://t" + root_path) as http:
            return [await http.post("/v1/x"), await http.get("/v1/x")]

    posted, got = asyncio.run(run())
    assert posted.text == "handled POST" and got.status_code == 405 and seen == ["/v1/x"]
    posted, _ = asyncio.run(run("/api"))
    assert posted.text == "handled POST" and len(seen) == 3
