"""Multi-LoRA end to end: adapters saved by `peft` (random weights, several ranks, all or some of
the projections) load by name, and one step serves rows under different adapters and rows under
none, each equal to transformers + peft (greedy, tie-aware) for Llama, Qwen2, Qwen3 and Phi, with
chunked prefill; pipelined equals blocking; slots are reused only when no sequence holds them; a
request whose adapter finds no free slot waits for one (never refused), and an abort takes it out
of the queue; the prefix cache keeps adapters' KV apart; Moondream's own module names apply to its
fused projections (against the checkpoint with the adapter merged in); bad adapters are refused
with errors naming what is wrong."""
from __future__ import annotations

import copy
import dataclasses
import json
import random
import shutil

import pytest
import torch

peft = pytest.importorskip("peft")

from conftest import build_tiny, settled_stats, tie_aware_equal  # noqa: E402
from slipstream import LLM, SamplingParams  # noqa: E402
from test_engine import Req, assert_modes_agree, hf_greedy, random_workload, run_workload  # noqa: E402

ALL_MODULES = {"phi": ["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"]}
LLAMA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(tm, path, rank: int, modules: list[str], seed: int, alpha: float | None = None, **config):
    """A peft adapter with random A and B (B is zero at peft's init), saved to `path`; returns the
    peft-wrapped copy of the reference model."""
    torch.manual_seed(seed)
    model = peft.get_peft_model(copy.deepcopy(tm.hf), peft.LoraConfig(
        r=rank, lora_alpha=alpha or 2 * rank, target_modules=modules, init_lora_weights=False, **config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    model.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "phi"])
def family(request, tmp_path_factory, tiny_tokenizer):
    """A tiny model and three adapters on it: ranks 4 and 16 on every projection, rank 8 on q and v."""
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    tm = build_tiny(root / "base", tiny_tokenizer, request.param, seed=5)
    every = ALL_MODULES.get(request.param, LLAMA_MODULES)
    refs = {"a": make_adapter(tm, root / "a", 4, every, 1), "b": make_adapter(tm, root / "b", 16, every, 2,
                                                                               use_rslora=True),
            "c": make_adapter(tm, root / "c", 8, ["q_proj", "v_proj"], 3)}
    return tm, root, refs


def make_llm(tm, root, mode="pipelined", **kw):
    opts = dict(device="cpu", mode=mode, max_num_seqs=6, num_pages=400, page_size=4, max_loras=3, max_lora_rank=16)
    opts.update(kw)
    llm = LLM(str(tm.path), **opts)
    for name in ("a", "b", "c"):
        llm.load_lora(name, str(root / name))
    return llm


def test_one_step_serves_rows_of_several_adapters_and_none_as_peft_does(family):
    tm, root, refs = family
    rng = random.Random(0)
    names = ["a", "b", None, "c", "a", None, "b", "c"]
    prompts = [[rng.randrange(tm.vocab_size) for _ in range(rng.choice([3, 17, 60]))] for _ in names]
    prompts[2] = prompts[0]  # (the same prompt without the adapter: it must say something else)
    params = [SamplingParams(max_tokens=8, lora=n) for n in names]
    with make_llm(tm, root, max_prefill_tokens=24) as llm:  # (prompts of 60 tokens: chunked)
        outs = llm.generate(prompts, params)
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]
        assert all(llm.core.lora.held(s) == 0 for s in range(1, 4))
    for name, p, o in zip(names, prompts, outs):
        ref = refs[name] if name else tm.hf
        with torch.no_grad():
            assert tie_aware_equal(ref, p, o.token_ids, hf_greedy(ref, p, 8, tm.eos_id))
    assert outs[0].token_ids != outs[2].token_ids


def test_a_step_without_adapter_rows_runs_as_an_engine_without_lora(family, monkeypatch):
    """The LoRA kernels run in the decode steps that hold a row under an adapter and in no other; a
    base-model row's tokens are the same, bit for bit, whether its steps ran them or not (their
    delta for it is an exact zero), so they do not depend on its batch."""
    from slipstream.runner import ModelRunner

    tm, root, _ = family
    adapted = []
    forward = ModelRunner.decode_forward
    monkeypatch.setattr(ModelRunner, "decode_forward",
                        lambda self, slot, rows, width, on: adapted.append(on) or forward(self, slot, rows, width, on))
    rng = random.Random(1)
    prompts = [[rng.randrange(tm.vocab_size) for _ in range(9)] for _ in range(3)]
    base = SamplingParams(max_tokens=12, ignore_eos=True)
    with make_llm(tm, root) as llm:
        alone = llm.generate(prompts, base)
        assert adapted and not any(adapted)
        adapted.clear()
        beside = llm.generate(prompts + prompts, [base] * 3 + [dataclasses.replace(base, lora="b")] * 3)
        assert any(adapted)
    assert [o.token_ids for o in alone] == [o.token_ids for o in beside[:3]]
    assert [o.token_ids for o in alone] != [o.token_ids for o in beside[3:]]


def test_pipelined_equals_blocking_with_adapters(family):
    tm, root, refs = family
    reqs = random_workload(7, tm.vocab_size, tm.eos_id, n=12)
    names = ["a", None, "b", "c"]
    for i, r in enumerate(reqs):
        r.params = dataclasses.replace(r.params, lora=names[i % 4])
    results = {}
    for mode in ("blocking", "pipelined"):
        with make_llm(tm, root, mode) as llm:
            results[mode] = run_workload(llm, reqs)
            assert all(llm.core.lora.held(s) == 0 for s in range(1, 4))
    for i, r in enumerate(reqs):
        ref = refs[r.params.lora] if r.params.lora else tm.hf
        assert tie_aware_equal(ref, r.prompt, results["pipelined"][i][0], results["blocking"][i][0],
                               r.params.temperature, r.params.seed)


def test_slots_are_reused_only_when_nobody_holds_them(family, monkeypatch):
    tm, root, refs = family
    prompt = [5, 6, 7, 8]
    with make_llm(tm, root, max_loras=2) as llm:  # three adapters, two slots: "c" waits on the host
        bank = llm.core.lora
        copies = []
        real = bank._copy
        monkeypatch.setattr(bank, "_copy", lambda adapter, slot: (copies.append((adapter.name, slot)),
                                                                   real(adapter, slot)))
        long = [llm.submit(prompt, SamplingParams(max_tokens=300, ignore_eos=True, lora=n)) for n in ("a", "b")]
        held = {bank._slot_of["a"], bank._slot_of["b"]}
        copies.clear()
        waits = llm.submit(prompt, SamplingParams(max_tokens=6, lora="c"))  # (not refused: it waits for a slot)
        leaves = llm.submit(prompt, SamplingParams(max_tokens=6, lora="c"))
        assert bank.waiting() == 2 and llm.stats()["waiting"] >= 2
        llm.abort(leaves)  # (aborted while it waits: it ends at once, holding nothing)
        left = llm.result(leaves, timeout=30)
        assert (left.finish_reason, left.token_ids, bank.waiting()) == ("abort", [], 1)
        for name in ("a", "c"):  # (a running request holds "a", a waiting one "c")
            with pytest.raises(ValueError, match="serves requests still running"):
                llm.unload_lora(name)
        assert copies == []  # (nothing was copied over a slot in use)
        for rid in long:
            llm.abort(rid)
            llm.result(rid)
        out = llm.result(waits, timeout=60)  # (a slot fell idle: "c" evicted the least recently idle, "a")
        assert copies == [("c", bank._slot_of["c"])] and held == {1, 2} and "a" not in bank._slot_of
        again = llm.generate(prompt, SamplingParams(max_tokens=6, lora="a"))[0]
        settled_stats(llm)
        llm.unload_lora("b")
        assert llm.stats()["loras"] == ["a", "c"] and all(bank.held(s) == 0 for s in (1, 2))
    for name, o in (("c", out), ("a", again)):
        with torch.no_grad():
            assert tie_aware_equal(refs[name], prompt, o.token_ids, hf_greedy(refs[name], prompt, 6, tm.eos_id))


def test_a_reused_slot_holds_zeros_past_what_its_adapter_fills(family):
    """The decode kernels read a slot's whole width, whatever its adapter's rank (kernels.lora.lora_b):
    a slot that served a rank-16 adapter on every projection, then one of rank 8 on q and v, holds
    zeros past the second one's packed rank and in the projections it leaves out."""
    tm, root, refs = family
    with make_llm(tm, root, max_loras=1) as llm:
        for name in ("b", "c"):
            llm.generate([5, 6, 7], SamplingParams(max_tokens=2, lora=name))
        bank = llm.core.lora
        assert bank._slot_of == {"c": 1}
        for layer in bank.stacks:
            for target, (a, b, rank) in layer.items():
                r = int(rank[1])
                assert r == (16 if target in ("qkv", "in") else 0), (target, r)  # (q and v: 8 + 8)
                assert not a[1, r:].any() and not b[1, :, r:].any(), target
                assert a[1, :r].any() == b[1, :, :r].any() == (r > 0), target


def test_more_adapters_than_slots_take_turns_and_every_request_finishes(family):
    """As vLLM's scheduler does: a request whose adapter finds no free slot waits for one; none is refused."""
    tm, root, refs = family
    rng = random.Random(3)
    names = ["a", "b", "c", None] * 3
    prompts = [[rng.randrange(tm.vocab_size) for _ in range(rng.randint(3, 30))] for _ in names]
    with make_llm(tm, root, max_loras=1) as llm:
        outs = llm.generate(prompts, [SamplingParams(max_tokens=6, lora=n) for n in names])
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"] and llm.core.lora.held(1) == 0
        assert llm.core.lora.waiting() == 0
    for name, p, o in zip(names, prompts, outs):
        ref = refs[name] if name else tm.hf
        with torch.no_grad():
            assert tie_aware_equal(ref, p, o.token_ids, hf_greedy(ref, p, 6, tm.eos_id))


def test_the_bank_under_concurrent_requests_never_copies_over_a_held_slot(monkeypatch):
    """Eight threads acquire, wait for, release and cancel slots of five adapters in three slots:
    a copy only ever goes into a slot nobody else holds, a slot is held only once its copy ended
    and keeps its adapter until released, every waiter is granted or cancelled, and every slot
    ends unheld."""
    import threading
    import time
    from types import SimpleNamespace

    from slipstream.lora.adapter import PackedAdapter
    from slipstream.lora.bank import LoraBank

    bank = LoraBank([SimpleNamespace(lora_targets=dict)], 3, 4, torch.float32, torch.device("cpu"))
    names = [f"n{i}" for i in range(5)]
    for name in names:
        bank._adapters[name], bank._uids[name] = PackedAdapter(name, "", 4, {}), name.encode()
    problems, copies, copying = [], [], set()

    def copy(adapter, slot):
        if bank._refs[slot] != 1 or bank._holder[slot] != adapter.name:
            problems.append(("copied over a held slot", slot, adapter.name))
        copies.append(slot)
        copying.add(slot)
        time.sleep(0.0005)
        copying.discard(slot)

    monkeypatch.setattr(bank, "_copy", copy)

    def hold(slot, name):
        if slot in copying:
            problems.append(("held before its copy ended", slot, name))
        time.sleep(0.0002)
        if bank._holder[slot] != name:
            problems.append(("slot changed adapter while held", slot, name))
        bank.release(slot)

    def client(seed):
        rng = random.Random(seed)
        for key in range(seed * 1000, seed * 1000 + 150):
            name = rng.choice(names)
            slot, _ = bank.acquire(name, wait=True)
            if slot:
                hold(slot, name)
                continue
            granted = threading.Event()
            bank.wait(key, name, lambda slot, name=name, granted=granted: (hold(slot, name), granted.set()))
            if rng.random() < 0.2 and bank.cancel(key):
                continue
            if not granted.wait(10):
                problems.append(("never granted", key, name))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bank.close()
    assert problems == [] and bank.waiting() == 0 and copies
    assert all(bank.held(s) == 0 for s in range(1, 4))


def test_a_request_refused_part_way_leaves_no_slot_held(family):
    tm, root, refs = family
    with make_llm(tm, root) as llm:
        with pytest.raises(ValueError, match="prompt is empty"):
            llm.generate([[1, 2], []], SamplingParams(max_tokens=2, lora="a"))
        assert all(llm.core.lora.held(s) == 0 for s in range(1, 4))
        llm.unload_lora("a")  # (nothing holds it)


@pytest.mark.parametrize("family", ["llama"], indirect=True)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_feature_at_once_pipelined_equals_blocking_and_nothing_leaks(family, seed):
    """Adapters taking turns in fewer slots than there are adapters, prompts on shared prefixes in a
    small cache, chunked prefill, JSON schema, stop strings, top-k/top-p, penalties, logprobs,
    seeded sampling, aborts and arrivals during others' decoding, in one engine."""
    tm, root, refs = family
    rng = random.Random(seed)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 6}},
              "required": ["n", "s"]}
    shared = [[rng.randrange(tm.vocab_size) for _ in range(rng.randint(8, 40))] for _ in range(3)]
    reqs = []
    for i in range(24):
        prompt = (rng.choice(shared) if rng.random() < 0.7 else []) + [rng.randrange(tm.vocab_size)
                                                                      for _ in range(rng.randint(1, 30))]
        fields = dict(max_tokens=rng.randint(1, 30), temperature=rng.choice([0.0, 0.0, 0.9]),
                      seed=rng.randrange(1 << 30), lora=rng.choice([None, None, "a", "b", "c"]))
        fields.update(rng.choice([{}, {}, {"json_schema": schema, "max_tokens": 40},
                                  {"stop": [rng.choice(["the", "a", "page", "\n"])]},
                                  {"top_p": 0.7, "top_k": 5, "temperature": 0.8}, {"repetition_penalty": 1.3},
                                  {"logprobs": 3}]))
        reqs.append(Req(prompt, SamplingParams(**fields),
                        abort_at=rng.randint(1, fields["max_tokens"]) if rng.random() < 0.15 else None,
                        parent=(rng.randrange(i), rng.randint(1, 5)) if i >= 6 and rng.random() < 0.6 else None))
    reasons = assert_modes_agree(
        tm, reqs, lambda mode: make_llm(tm, root, mode, max_num_seqs=5, num_pages=48, max_prefill_tokens=24,
                                        max_prefill_chunk=12, max_loras=2),
        reference=lambda r: refs[r.params.lora] if r.params.lora else tm.hf)
    assert reasons >= {"stop", "length"}


def test_the_prefix_cache_keeps_each_adapters_kv_apart(family):
    tm, root, refs = family
    prompt = [random.Random(1).randrange(tm.vocab_size) for _ in range(41)]
    with make_llm(tm, root) as llm:
        runs = [(n, llm.generate(prompt, SamplingParams(max_tokens=5, lora=n))[0]) for n in ("a", "b", None, "a")]
    assert [o.cached_tokens for _, o in runs] == [0, 0, 0, 40]
    for name, o in runs:
        ref = refs[name] if name else tm.hf
        with torch.no_grad():
            assert tie_aware_equal(ref, prompt, o.token_ids, hf_greedy(ref, prompt, 5, tm.eos_id))


def corrupt(root, tmp_path, edit):
    """A copy of adapter "a" changed by `edit(config, tensors)`."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(root / "a", bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    tensors = load_file(str(bad / "adapter_model.safetensors"))
    edit(config, tensors)
    (bad / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(bad / "adapter_model.safetensors"))
    return bad


def _rename(tensors, old, new):
    key = next(k for k in tensors if old in k)
    tensors[key.replace(old, new)] = tensors.pop(key)


@pytest.mark.parametrize("edit,message", [
    (lambda c, t: t.update({k: v[:, :-1].contiguous() for k, v in t.items() if "q_proj.lora_A" in k}),
     "model.s shapes need"),
    (lambda c, t: _rename(t, "q_proj.lora_A", "q_norm.lora_A"), "does not serve"),
    (lambda c, t: t.pop(next(k for k in t if "lora_B" in k)), "without lora_B"),
    (lambda c, t: c.update(use_dora=True), "DoRA"),
    (lambda c, t: c.update(bias="all"), "bias"),
    (lambda c, t: c.update(modules_to_save=["lm_head"]), "modules_to_save"),
    (lambda c, t: t.update({"base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight": torch.zeros(4, 8)}),
     "for layer 9"),
    (lambda c, t: next(v for k, v in t.items() if "v_proj.lora_B" in k).view(-1)[3].fill_(float("nan")),
     "lora_B holds NaN or inf"),
    (lambda c, t: c.update(lora_alpha=1e300), "overflow"),
])
def test_bad_adapters_are_refused_with_errors_naming_the_problem(family, tmp_path, edit, message):
    tm, root, refs = family
    bad = corrupt(root, tmp_path, edit)
    with make_llm(tm, root) as llm:
        with pytest.raises(ValueError, match=message):
            llm.load_lora("bad", str(bad))
        assert "bad" not in llm.stats()["loras"]
        assert len(llm.generate([5, 6], SamplingParams(max_tokens=3, lora="a"))[0].token_ids) == 3  # (serving on)


def test_limits_and_names_are_checked(family, tmp_path):
    tm, root, refs = family
    make_adapter(tm, tmp_path / "big", 32, ["q_proj"], 9)
    with make_llm(tm, root) as llm:
        with pytest.raises(ValueError, match="rank 32, above max_lora_rank=16"):
            llm.load_lora("big", str(tmp_path / "big"))
        with pytest.raises(ValueError, match="loaded already"):
            llm.load_lora("a", str(root / "a"))
        with pytest.raises(ValueError, match="no LoRA adapter named 'zz' is loaded"):
            llm.submit([1, 2], SamplingParams(lora="zz"))
        with pytest.raises(ValueError, match="no adapter_config.json"):
            llm.load_lora("none", str(tmp_path))
    with LLM(str(tm.path), device="cpu", num_pages=64) as plain:
        with pytest.raises(ValueError, match="no LoRA slots"):
            plain.submit([1, 2], SamplingParams(lora="a"))
        with pytest.raises(ValueError, match="no LoRA slots"):
            plain.load_lora("a", str(root / "a"))


def test_moondreams_modules_apply_to_its_fused_projections_as_if_merged(tmp_path):
    """An adapter on Moondream's own modules (text.blocks.i.attn.qkv, attn.proj, mlp.fc1, mlp.fc2),
    image prefix included, answers as the checkpoint with the adapter merged into its weights."""
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file, save_file

    from slipstream.models.random_checkpoint import write_checkpoint

    base = write_checkpoint("tiny-moondream", tmp_path / "base")
    weights = load_file(str(base / "model.safetensors"))
    rank, alpha, g = 4, 8.0, torch.Generator().manual_seed(4)
    adapter, merged = {}, dict(weights)
    for name, w in weights.items():
        module = name.removeprefix("model.").removesuffix(".weight")
        if name.startswith("model.text.blocks.") and name.endswith(("qkv.weight", "proj.weight", "fc1.weight",
                                                                      "fc2.weight")):
            a = torch.randn(rank, w.shape[1], generator=g) * 0.2
            b = torch.randn(w.shape[0], rank, generator=g) * 0.2
            adapter[f"base_model.model.model.{module}.lora_A.weight"] = a
            adapter[f"base_model.model.model.{module}.lora_B.weight"] = b
            merged[name] = (w.float() + alpha / rank * b @ a).to(w.dtype)
    assert len(adapter) == 2 * 4 * sum(1 for n in weights if n.startswith("model.text.") and n.endswith("qkv.weight"))
    (tmp_path / "ad").mkdir()
    save_file(adapter, str(tmp_path / "ad" / "adapter_model.safetensors"))
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": ["qkv", "proj", "fc1", "fc2"]}))
    shutil.copytree(base, tmp_path / "merged")
    save_file(merged, str(tmp_path / "merged" / "model.safetensors"))
    rng = np.random.default_rng(5)
    img = Image.fromarray(rng.integers(0, 255, (15, 20, 3), dtype=np.uint8)).resize((500, 375))
    greedy = {"temperature": 0.0, "max_tokens": 6}
    answers = {}
    for which, path, settings in (("adapter", base, {**greedy, "lora": "m"}), ("merged", tmp_path / "merged", greedy)):
        with LLM(str(path), device="cpu", max_num_seqs=4, max_loras=1, max_lora_rank=rank) as llm:
            if which == "adapter":
                llm.load_lora("m", str(tmp_path / "ad"))
                plain = llm.caption(img, settings=greedy)["caption"]
            spatial = {"max_objects": 2, "lora": settings.get("lora")}
            answers[which] = [llm.caption(img, settings=settings)["caption"],
                              llm.query(img, "What is it?", settings=settings)["answer"],
                              llm.point(img, "cat", settings=spatial)["points"]]
    assert answers["adapter"] == answers["merged"] and plain != answers["adapter"][0]


def test_a_short_answer_pages_are_cached_under_their_adapter_only(family):
    """A prompt shorter than a page: its answer's pages are keyed from the adapter's root too."""
    tm, root, refs = family
    with make_llm(tm, root) as llm:
        first = llm.generate([7, 8], SamplingParams(max_tokens=12, ignore_eos=True, lora="a"))[0]
        settled_stats(llm)
        turn = [7, 8] + first.token_ids + [9]
        other = llm.generate(turn, SamplingParams(max_tokens=3, lora="b"))[0]
        same = llm.generate(turn, SamplingParams(max_tokens=3, lora="a"))[0]
    assert other.cached_tokens == 0 and same.cached_tokens == 12
