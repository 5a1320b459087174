"""slipstream on Ray Serve (`slipstream.ray:app`), on the CPU: two replicas of a tiny model behind
Ray's proxy answer the real `openai` client; a replica killed while requests run fails the ones it
held cleanly (an error, never a hang) while the other serves on, and Ray replaces it."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")

from serving import free_port  # noqa: E402

MODEL = "random:tiny-llama"


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    from slipstream.ray import Args, app

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(app(Args(model=MODEL, num_replicas=2, num_gpus=0, num_cpus=1, device="cpu", max_num_seqs=8)),
              name="slipstream", route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def replicas() -> list[str]:
    """The named actors of the deployment's live replicas."""
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if "SERVE_REPLICA" in a["name"] and "slipstream" in a["name"])


def running(count: int) -> bool:
    from ray import serve

    status = serve.status().applications["slipstream"].deployments["slipstream"]
    return status.replica_states.get("RUNNING", 0) == count and len(replicas()) == count


def test_two_replicas_answer_the_openai_client(cluster):
    client = openai.OpenAI(base_url=cluster + "/v1", api_key="none", max_retries=0, timeout=60)
    assert client.models.list().data[0].id == MODEL
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: client.completions.create(model=MODEL, prompt=f"{i} and", max_tokens=4,
                                                                 temperature=0), range(16)))
    assert all(o.usage.completion_tokens >= 1 for o in outs)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True) if c.choices)
    assert isinstance(text, str)


def test_a_replica_killed_mid_load_fails_its_requests_cleanly_and_is_replaced(cluster):
    client = openai.OpenAI(base_url=cluster + "/v1", api_key="none", max_retries=0, timeout=60)
    victim = replicas()[0]

    def ask(i: int) -> str:
        try:
            stream = client.completions.create(model=MODEL, prompt=f"{i} once", max_tokens=300, stream=True,
                                               extra_body={"ignore_eos": True})
            chunks = [c for c in stream]
            return "answered" if chunks and chunks[-1].choices[0].finish_reason == "length" else "cut"
        except (openai.APIError, openai.APIConnectionError):
            return "failed"

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(ask, i) for i in range(12)]
        time.sleep(3)  # (every request running)
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        outcomes = [f.result(timeout=120) for f in futures]
    assert set(outcomes) <= {"answered", "failed", "cut"} and outcomes.count("answered") >= 1, outcomes
    deadline = time.monotonic() + 120
    while not (running(2) and victim not in replicas()) and time.monotonic() < deadline:
        time.sleep(1)
    assert running(2) and victim not in replicas()
    with ThreadPoolExecutor(4) as pool:  # (the replacement serves too)
        outs = list(pool.map(lambda i: client.completions.create(model=MODEL, prompt=f"{i}", max_tokens=2), range(8)))
    assert len(outs) == 8
