"""Moondream 2 end to end on random:tiny-moondream (the release's layout, small dims): every skill
equals an independent plain-torch reading of the spec (tests/moondream_reference.py) on images of
one, eight and twelve local crops, in batches shared with text requests, pipelined == blocking, and
no KV page is left behind; bad images are refused at submit without harming the engine."""
from __future__ import annotations

import io
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from conftest import settled_stats
from moondream_reference import Moondream
from slipstream import LLM, SamplingParams
from slipstream.models.random_checkpoint import write_checkpoint

SIZES = ((500, 375), (800, 600), (1024, 768))  # tilings 1x1, 2x4, 3x4 (spec §3's table)
MAX_TOKENS, MAX_OBJECTS = 8, 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint("tiny-moondream", tmp_path_factory.mktemp("md") / "tiny-moondream")


@pytest.fixture(scope="module")
def reference(checkpoint):
    return Moondream(checkpoint)


def image(size: tuple[int, int], seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    w, h = size
    smooth = rng.integers(0, 255, (h // 25 + 1, w // 25 + 1, 3), dtype=np.uint8)
    return Image.fromarray(smooth).resize((w, h), Image.BILINEAR)


def make_llm(checkpoint, mode: str = "pipelined", **kw) -> LLM:
    opts = dict(device="cpu", mode=mode, max_num_seqs=6, num_pages=400, page_size=16)
    opts.update(kw)
    return LLM(str(checkpoint), **opts)


def requests(llm: LLM) -> list:
    """Every skill on every image, with text requests among them, all submitted at once."""
    greedy = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
    calls = []
    for i, size in enumerate(SIZES):
        img = image(size, i)
        calls += [("caption", lambda img=img: llm.caption(img, settings=greedy)["caption"]),
                  ("query", lambda img=img: llm.query(img, "What is in the picture?", settings=greedy)["answer"]),
                  ("point", lambda img=img: llm.point(img, "red box", settings={"max_objects": MAX_OBJECTS})["points"]),
                  ("detect", lambda img=img: llm.detect(img, "cat", settings={"max_objects": MAX_OBJECTS})["objects"]),
                  ("text", lambda i=i: llm.generate([5 + i, 9, 40], SamplingParams(max_tokens=6))[0].token_ids)]
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for _, call in calls]
        return [f.result() for f in futures]


def expected(reference: Moondream, llm: LLM) -> list:
    out = []
    question, obj_cat, obj_box = (llm.tokenizer.encode(t) for t in ("What is in the picture?", " cat", " red box"))
    for i, size in enumerate(SIZES):
        img = image(size, i)
        out += [llm.tokenizer.decode(reference.caption(img, "normal", MAX_TOKENS)),
                llm.tokenizer.decode(reference.query(img, question, MAX_TOKENS)),
                reference.objects(img, obj_box, False, MAX_OBJECTS),
                reference.objects(img, obj_cat, True, MAX_OBJECTS),
                None]
    return out


def test_every_skill_equals_the_reference_beside_text_requests_pipelined_and_blocking(checkpoint, reference):
    results = {}
    for mode in ("pipelined", "blocking"):
        with make_llm(checkpoint, mode) as llm:
            results[mode] = requests(llm)
            want = expected(reference, llm)
            stats = settled_stats(llm)
            assert stats["kv_pages_free"] == stats["kv_pages_total"], "a KV page was leaked"
        for got, ref in zip(results[mode], want):
            if ref is not None:
                assert got == ref
    assert results["pipelined"] == results["blocking"]
    assert any(len({o["x_min"] for o in boxes}) > 1 for boxes in results["pipelined"][3::5])  # (not degenerate)


def test_streamed_caption_and_answer_concatenate_to_the_whole(checkpoint):
    img = image((640, 480), 7)
    with make_llm(checkpoint) as llm:
        settings = {"temperature": 0.0, "max_tokens": 12}
        whole = llm.caption(img, length="short", settings=settings)["caption"]
        assert "".join(llm.caption(img, length="short", stream=True, settings=settings)["caption"]) == whole
        answer = llm.query(img, "Why?", settings=settings)["answer"]
        assert "".join(llm.query(img, "Why?", stream=True, settings=settings)["answer"]) == answer


def test_an_image_given_as_path_bytes_handle_or_any_mode_is_the_same_image(checkpoint, tmp_path):
    img = image((500, 400), 3)
    path = tmp_path / "img.png"
    img.save(path)
    with make_llm(checkpoint) as llm:
        want = llm.detect(img, "dog")
        assert llm.detect(str(path), "dog") == want
        assert llm.detect(path.read_bytes(), "dog") == want
        handle = llm.encode_image(img)
        assert llm.detect(handle, "dog") == want
        rgba = img.convert("RGBA")
        assert llm.detect(rgba, "dog") == want  # (alpha dropped, as the reference does)
        for mode in ("L", "P", "CMYK"):
            converted = img.convert(mode)
            assert llm.detect(converted, "dog") == llm.detect(converted.convert("RGB"), "dog")


def test_max_objects_caps_point_and_detect(checkpoint):
    img = image((800, 600), 1)
    with make_llm(checkpoint) as llm:
        assert len(llm.point(img, "a", settings={"max_objects": 1})["points"]) == 1
        assert len(llm.detect(img, "a", settings={"max_objects": 5})["objects"]) == 5


def biased(checkpoint, folder, token: int):
    """A copy of the checkpoint whose LM head always prefers `token`."""
    shutil.copytree(checkpoint, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.text.lm_head.bias"][token] = 1e4
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_eos_from_the_prefill_means_no_objects_and_an_empty_caption(checkpoint, tmp_path):
    img = image((400, 300), 2)
    with make_llm(biased(checkpoint, tmp_path / "eos", 0)) as llm:
        assert llm.point(img, "a") == {"points": []}
        assert llm.detect(img, "a") == {"objects": []}
        assert llm.caption(img) == {"caption": ""}


def test_the_answer_id_is_banned_after_the_first_token(checkpoint, tmp_path):
    from slipstream.models.moondream.skills import Skill

    img = image((400, 300), 5)
    with make_llm(biased(checkpoint, tmp_path / "answer", 3)) as llm:
        seq = llm.core.make_image_sequence(llm._prefix(img), [1, 300, 2, 302, 3],
                                           SamplingParams(max_tokens=5), Skill.TEXT)
        out = llm._run(seq)
    assert out.token_ids[0] == 3 and 3 not in out.token_ids[1:] and len(out.token_ids) == 5


def test_bad_images_and_settings_are_refused_at_submit_and_the_engine_goes_on(checkpoint, tmp_path):
    img = image((400, 300), 4)
    with make_llm(checkpoint) as llm:
        want = llm.point(img, "a")
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        with pytest.raises(ValueError, match="not a readable image"):
            llm.caption(buf.getvalue()[:40])
        with pytest.raises(ValueError, match="empty"):
            llm.caption(b"")
        with pytest.raises(ValueError, match="does not exist"):
            llm.caption(str(tmp_path / "missing.png"))
        with pytest.raises(ValueError, match="more than"):
            llm.caption(Image.new("RGB", (9000, 9000)))
        with pytest.raises(TypeError, match="PIL image, a path or bytes"):
            llm.caption(12)
        with pytest.raises(ValueError, match="caption length"):
            llm.caption(img, length="medium")
        with pytest.raises(ValueError, match="unknown setting 'topp'"):
            llm.caption(img, settings={"topp": 0.5})
        with pytest.raises(ValueError, match="max_objects"):
            llm.point(img, "a", settings={"max_objects": 0})
        with pytest.raises(ValueError, match="object must be"):
            llm.detect(img, "  ")
        assert llm.point(img, "a") == want
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_an_image_prompt_rides_in_the_step_of_its_prefix_beside_decode_rows(checkpoint, monkeypatch):
    """Scheduler invariant 3: a new image's prefix (730 positions, over the chunk cap) and its whole
    prompt go into one step while another request decodes; that step samples the image request."""
    with make_llm(checkpoint, max_prefill_chunk=64) as llm:
        scheduler, steps = llm.core.scheduler, []

        def plan():  # (a record of each step as planned: sequences are cleared when released)
            step = scheduler._real_plan()
            if step is not None:
                decode = len(step.seqs) - len(step.chunks)
                steps.append((step.kind, len(step.images), decode, [
                    (start, n, len(s.prompt_ids), s in step.sampled) for s, (start, n) in zip(step.seqs[decode:],
                                                                                         step.chunks)]))
            return step

        monkeypatch.setattr(scheduler, "_real_plan", scheduler._plan, raising=False)
        monkeypatch.setattr(scheduler, "_plan", plan)
        text = llm.submit([5, 9, 40], SamplingParams(max_tokens=40, ignore_eos=True))
        while not any(kind == "decode" for kind, *_ in steps):
            time.sleep(0.001)
        llm.query(image((800, 600), 1), "What is in the picture?", settings={"temperature": 0.0, "max_tokens": 2})
        llm.result(text)
    (step,) = [s for s in steps if s[1]]
    _, images, decode, chunks = step
    assert images == 1 and decode == 1
    ((start, n, prompt, sampled),) = chunks
    assert start == 730 and start + n == prompt and sampled


def test_a_text_model_has_no_skills(tiny_llama):
    with LLM(str(tiny_llama.path), device="cpu", num_pages=32, page_size=4, max_num_seqs=2) as llm:
        with pytest.raises(ValueError, match="not Moondream 2"):
            llm.caption(image((100, 100), 0))


@pytest.mark.gpu
def test_full_size_preset_matches_the_reference_in_bf16():
    """random:moondream2 (1.93B parameters) on the H200 in bf16 against the reference in bf16, tie-aware
    in the sense that the caption may part from it only where bf16 rounding decides a near-tie."""
    from slipstream.models.random_checkpoint import cached_checkpoint

    path = cached_checkpoint("moondream2")
    ref = Moondream(path, dtype=torch.bfloat16, device="cuda")
    img = image((800, 600), 0)
    with LLM(str(path), device="cuda", max_num_seqs=8) as llm:
        points = llm.point(img, "a", settings={"max_objects": 2})["points"]
        caption = llm.caption(img, settings={"temperature": 0.0, "max_tokens": 4})["caption"]
    assert points == ref.objects(img, llm.tokenizer.encode(" a"), False, 2)
    assert caption == llm.tokenizer.decode(ref.caption(img, "normal", 4))


@pytest.mark.gpu
def test_captured_image_prefills_equal_the_eager_ones(checkpoint):
    """On CUDA each image's prefix prefill replays its tiling's graph (models/moondream/graphs.py):
    every skill on the three tilings, beside text requests, gives what eager steps give."""
    results = []
    for graphs in (True, False):
        with make_llm(checkpoint, device="cuda", cuda_graphs=graphs) as llm:
            assert (llm.core.runner.image_graphs is not None) == graphs
            results.append(requests(llm))
            stats = settled_stats(llm)
            assert stats["kv_pages_free"] == stats["kv_pages_total"]
    assert results[0] == results[1]


def count_encodes(llm: LLM, monkeypatch) -> list[int]:
    """The images of each step that runs the vision encoder, as the test goes on."""
    heads, encoded = llm.core.runner.heads, []
    real = heads.prefill_images
    monkeypatch.setattr(heads, "prefill_images", lambda crops, tilings, *a: (encoded.append(len(tilings)),
                                                                            real(crops, tilings, *a)))
    return encoded


def test_an_encoded_image_is_encoded_once_and_its_pages_freed_when_closed(checkpoint, monkeypatch):
    img = image((800, 600), 9)
    settings = {"temperature": 0.0, "max_tokens": 6}
    with make_llm(checkpoint, enable_prefix_caching=False) as llm:
        separate = [llm.caption(img, settings=settings)["caption"]]
        separate += [llm.query(img, q, settings=settings)["answer"] for q in ("Why?", "Who?", "Where?", "When?")]
        encoded = count_encodes(llm, monkeypatch)
        with llm.encode_image(img) as handle:
            shared = [llm.caption(handle, settings=settings)["caption"]]
            with ThreadPoolExecutor(4) as pool:
                shared += list(pool.map(lambda q: llm.query(handle, q, settings=settings)["answer"],
                                        ("Why?", "Who?", "Where?", "When?")))
            assert shared == separate and encoded == [1]
            stats = settled_stats(llm)
            assert stats["kv_pages_total"] - stats["kv_pages_free"] == 46  # (730 positions in pages of 16)
        deadline = time.monotonic() + 10  # (closing posts the release to the loop, as an abort is)
        while llm.stats()["kv_pages_free"] < stats["kv_pages_total"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert llm.stats()["kv_pages_free"] == stats["kv_pages_total"]
        with pytest.raises(ValueError, match="closed"):
            llm.caption(handle)
