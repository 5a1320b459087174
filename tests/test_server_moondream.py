"""Moondream 2 through the server, on random:tiny-moondream: /v1/caption, /v1/query, /v1/point and
/v1/detect take Moondream's own fields (a base64 `image_url`, `length` / `question` / `object`,
`stream`, `settings`) and answer what the offline engine answers; a streamed caption is Moondream's
`{"chunk", "completed"}` frames and concatenates to the whole; a chat message with an image is a
query; bad images and fields get 400s naming them; no KV page is left held."""
from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from serving import start_server, stop_server, wait_idle
from slipstream import LLM

pytest.importorskip("openai")

MODEL = "random:tiny-moondream"
GREEDY = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(MODEL)
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def offline():
    with LLM(MODEL, device="cpu", max_num_seqs=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def picture() -> Image.Image:
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).resize((800, 600), Image.BILINEAR)


def data_url(img: Image.Image) -> str:
    out = io.BytesIO()
    img.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def post(url: str, route: str, **body) -> httpx.Response:
    return httpx.post(url + route, json=body, timeout=120)


def test_each_skill_answers_what_the_offline_engine_answers(server, offline, picture):
    img = data_url(picture)
    caption = post(server, "/v1/caption", image_url=img, length="short", settings=GREEDY).json()
    assert caption["caption"] == offline.caption(picture, "short", settings=GREEDY)["caption"]
    answer = post(server, "/v1/query", image_url=img, question="What is it?", settings=GREEDY).json()
    assert answer["answer"] == offline.query(picture, "What is it?", settings=GREEDY)["answer"]
    points = post(server, "/v1/point", image_url=img, object="cat", settings={"max_objects": 3}).json()
    assert points["points"] == offline.point(picture, "cat", settings={"max_objects": 3})["points"]
    boxes = post(server, "/v1/detect", image_url=img, object="cat", settings={"max_objects": 3}).json()
    assert boxes["objects"] == offline.detect(picture, "cat", settings={"max_objects": 3})["objects"]
    assert all(isinstance(r["request_id"], str) for r in (caption, answer, points, boxes))


def test_a_streamed_caption_is_moondreams_frames_and_concatenates_to_the_whole(server, picture):
    body = {"image_url": data_url(picture), "settings": GREEDY}
    whole = post(server, "/v1/caption", **body).json()["caption"]
    with httpx.stream("POST", server + "/v1/caption", json={**body, "stream": True}, timeout=120) as r:
        frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == {"chunk": "", "completed": True}
    assert not any(f["completed"] for f in frames[:-1])
    assert "".join(f["chunk"] for f in frames) == whole


def test_a_chat_message_with_an_image_is_a_query(server, offline, picture):
    import openai

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    content = [{"type": "image_url", "image_url": {"url": data_url(picture)}},
               {"type": "text", "text": "What is it?"}]
    out = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8,
                                         messages=[{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": content}])
    assert out.choices[0].message.content == offline.query(picture, "What is it?", settings=GREEDY)["answer"]
    assert out.usage.prompt_tokens > 729  # (the image's prefix counts)


@pytest.mark.parametrize("route,body,param", [
    ("/v1/query", {"image_url": "https://example.com/a.jpg", "question": "What?"}, "image_url"),
    ("/v1/query", {"image_url": "data:image/png;base64,@@@", "question": "What?"}, "image_url"),
    ("/v1/query", {"image_url": "IMAGE"}, "question"),
    ("/v1/point", {"image_url": "IMAGE", "object": "cat", "stream": True}, "stream"),
    ("/v1/caption", {"image_url": "IMAGE", "settings": {"max_objects": 0}}, None),
    ("/v1/caption", {"image_url": "IMAGE", "length": "epic"}, None),
    ("/v1/detect", {"image_url": "data:image/png;base64," + base64.b64encode(b"not an image").decode(),
                    "object": "cat"}, None),
])
def test_bad_images_and_fields_are_400s_naming_them(server, picture, route, body, param):
    body = {k: data_url(picture) if v == "IMAGE" else v for k, v in body.items()}
    r = post(server, route, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert r.json()["error"]["message"]


def test_chats_with_images_follow_moondreams_one_question_rule(server, picture):
    image = {"type": "image_url", "image_url": {"url": data_url(picture)}}
    two_turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                 {"role": "user", "content": [image, {"type": "text", "text": "What?"}]}]
    for messages, extra in ((two_turns, {}), ([{"role": "user", "content": [image]}], {}),
                            ([{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}],
                             {"logprobs": True})):
        r = post(server, "/v1/chat/completions", messages=messages, **extra)
        assert r.status_code == 400, r.text


def test_no_page_is_left_held(server, picture):
    post(server, "/v1/query", image_url=data_url(picture), question="Why?", settings=GREEDY)
    values = wait_idle(server)
    assert values["slipstream_kv_pages_in_use"] == 0 and values["slipstream_requests_running"] == 0
