"""The OpenAI-compatible server (`slipstream serve`) through the real `openai` client, against a
server process this module starts on 127.0.0.1 with random:tiny-llama: its answers are the
offline engine's, streaming concatenates to the whole, structured output holds, bad requests get
OpenAI-shaped 400s naming the field, the API key is checked, a client that leaves mid-stream
aborts its request, and when the engine process dies requests fail at once and /health says so."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

from slipstream import LLM, SamplingParams  # noqa: E402

KEY = "sk-test"
IN_FLIGHT = 10
MODEL = "random:tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "slipstream", "serve", "--model", MODEL, "--device", "cpu",
                             "--port", str(port), "--max-num-seqs", "8", *extra], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not come up within 120 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("--api-key", KEY, "--max-in-flight", str(IN_FLIGHT))
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


def test_a_json_schema_response_is_valid_json_of_that_schema(client):
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A name as JSON."}], max_tokens=40, temperature=0.7,
        seed=3, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content)["name"], str)


@pytest.mark.parametrize("fields,param", [({"temperature": -1}, None), ({"n": 2}, "n"), ({"logprobs": 2}, "logprobs"),
                                          ({"max_tokens": 0}, "max_tokens"), ({"stop": [3]}, "stop")])
def test_bad_requests_get_a_400_naming_the_problem(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", **fields)
    body = e.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == param
    assert next(iter(fields)) in body["message"]


def test_malformed_bodies_and_missing_prompts_are_400(server):
    headers = {"authorization": f"Bearer {KEY}"}
    assert httpx.post(server + "/v1/completions", content=b"{not json", headers=headers).status_code == 400
    missing = httpx.post(server + "/v1/completions", json={"max_tokens": 3}, headers=headers)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


def test_the_api_key_is_required(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server + "/health").status_code == 200  # (health is open)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_frees_the_engine_for_others(server, client, stream):
    """Eight requests of 4,000 tokens (as many as the engine's rows; ~10 s of decoding here) are
    dropped early (a stream after its first chunk, a whole response by a 1 s client timeout); a
    request sent after them is answered within seconds, which it could not be if the dropped ones
    still held every row."""
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": stream}

    def leave(_: int) -> None:
        if stream:
            with httpx.stream("POST", server + "/v1/completions", json=body, headers=headers, timeout=30) as r:
                next(r.iter_lines())
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server + "/v1/completions", json=body, headers=headers, timeout=1)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(leave, range(8)))
    time.sleep(0.5)  # (a whole response's handler looks for its client every 0.25 s)
    start = time.monotonic()
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0, timeout=60,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and time.monotonic() - start < 3


def test_over_the_in_flight_limit_a_request_gets_429_with_retry_after(server):
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"prompt": "Once", "max_tokens": 1000, "ignore_eos": True}

    def in_flight() -> float:
        line = next(x for x in httpx.get(server + "/metrics").text.splitlines()
                    if x.startswith("slipstream_requests_in_flight "))
        return float(line.split()[1])

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        answers = [pool.submit(httpx.post, server + "/v1/completions", json=body, headers=headers, timeout=120)
                   for _ in range(IN_FLIGHT)]
        deadline = time.monotonic() + 30
        while in_flight() < IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.post(server + "/v1/completions", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert all(a.result().status_code == 200 for a in answers)


def test_metrics_count_requests_and_show_no_page_held_once_idle(server, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(server + "/metrics").text
        values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                  if line and not line.startswith("#")}
        idle = values["slipstream_kv_pages_in_use"] == 0 and values["slipstream_requests_in_flight"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert idle and values["slipstream_kv_pages_total"] > 0
    assert values['slipstream_requests_total{finish_reason="length"}'] >= 1
    assert values["slipstream_time_to_first_token_seconds_count"] >= 1
    assert values["slipstream_decode_steps"] > 0


def _engine_pid(server_pid: int) -> int:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == server_pid and b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            return int(stat.parent.name)
    raise LookupError("no engine process")


@pytest.mark.skipif(not Path("/proc").exists(), reason="finds the engine process through /proc")
def test_when_the_engine_process_dies_requests_fail_at_once_and_health_says_so():
    proc, url = start_server()
    try:
        llm = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        stream = llm.completions.create(model=MODEL, prompt="Once", max_tokens=4000, stream=True,
                                        extra_body={"ignore_eos": True})
        next(iter(stream))
        os.kill(_engine_pid(proc.pid), signal.SIGKILL)
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
