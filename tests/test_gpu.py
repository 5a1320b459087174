"""GPU checks: the same engine on CUDA (streams, events, pinned landing buffers, CUDA graphs,
the Triton decode kernel) gives the transformers answer in both modes, and its steady-state loop
is free of synchronization (sync-debug mode, pinned buffers, flat allocator counters)."""
import importlib.util
import random

import pytest
import torch

from conftest import settled_stats, tie_aware_equal
from constraints import ForceAt, Successor
from slipstream import LLM, SamplingParams
from slipstream.runner import SAMPLING_VARIANTS
from test_engine import CHUNKED_LENS, assert_modes_agree, hf_greedy, random_workload, staggered

pytestmark = pytest.mark.gpu


def cuda_llm(model, mode="pipelined", **kw):
    opts = dict(device="cuda", dtype="float32", mode=mode, max_num_seqs=8, num_pages=128, page_size=16)
    opts.update(kw)
    return LLM(str(model.path), **opts)


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_engine_matches_transformers(tiny_llama, mode, graphs):
    prompts = [[5, 6, 7], [1], list(range(10, 30))]
    with cuda_llm(tiny_llama, mode, cuda_graphs=graphs) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=12))
        assert (llm.stats()["cuda_graphs"] > 0) == graphs
        assert all(s.meta_host.is_pinned() and s.landing.host.is_pinned() and s.mask_host.is_pinned()
                   and s.logprobs_landing.host.is_pinned() for s in llm.core.runner.slots)
    for p, o in zip(prompts, outs):
        assert tie_aware_equal(tiny_llama.hf, p, o.token_ids, hf_greedy(tiny_llama.hf, p, 12, tiny_llama.eos_id))


@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_chunked_prefill_matches_transformers(tiny_llama, graphs):
    """Long prompts prefilled in chunks of a 32-token budget beside decode rows, staggered arrivals,
    more requests than rows: the packed kernels (and their graphs per token bucket) give the
    transformers answer, and every page comes back. The 500-token prompt's last chunks walk more
    than MIN_SPLIT_BLOCKS key blocks a tile, so their keys are split over programs and merged."""
    rng = random.Random(8)
    prompts = [[rng.randrange(tiny_llama.vocab_size) for _ in range(n)] for n in CHUNKED_LENS + [500]]
    params = [SamplingParams(max_tokens=rng.randint(2, 10)) for _ in prompts]
    with cuda_llm(tiny_llama, max_num_seqs=3, max_prefill_tokens=32, cuda_graphs=graphs) as llm:
        outs = staggered(llm, prompts, params)
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]
    for p, o, sp in zip(prompts, outs, params):
        assert tie_aware_equal(tiny_llama.hf, p, o.token_ids, hf_greedy(tiny_llama.hf, p, sp.max_tokens,
                                                                          tiny_llama.eos_id))


def test_prefill_head_computes_the_sampled_rows_alone(tiny_llama):
    """A captured prefill step's LM head runs over its sampled rows' batch bucket, not over every row
    its token bucket could sample, and samples greedy rows inside its graph (fused); a prefill step
    that samples nothing (a long prompt's first chunks) runs no head."""
    calls = []
    with cuda_llm(tiny_llama, max_prefill_tokens=32) as llm:
        replay = llm.core.runner.graphs.replay_head
        llm.core.runner.graphs.replay_head = lambda *a: (calls.append(a[1:]), replay(*a))[1]
        llm.generate([[5, 6, 7], [1], [8, 9]], SamplingParams(max_tokens=2))
        llm.generate([list(range(100))], SamplingParams(max_tokens=1))
    assert calls == [(4, True), (1, True)]


def test_cuda_pipelined_equals_blocking(tiny_llama):
    reqs = random_workload(5, tiny_llama.vocab_size, tiny_llama.eos_id)
    assert_modes_agree(tiny_llama, reqs, lambda mode: cuda_llm(tiny_llama, mode, max_num_seqs=3))


def test_captured_sampling_equals_eager(tiny_llama):
    """Constrained, tempered and top-p / top-k decode steps sample through the captured sampling
    graphs (one per batch bucket and variant) and draw exactly the tokens eager sampling draws."""
    v, eos = tiny_llama.vocab_size, tiny_llama.eos_id
    batches = [[SamplingParams(max_tokens=16, constraint=lambda: Successor(v))] * 3,
               [SamplingParams(max_tokens=16, temperature=0.8, seed=i) for i in range(3)],
               [SamplingParams(max_tokens=16, temperature=0.8, top_p=0.7, top_k=20, seed=i) for i in range(3)],
               [SamplingParams(max_tokens=16, constraint=lambda: ForceAt(4, eos), temperature=0.7, seed=4),
                SamplingParams(max_tokens=16, temperature=0.9, seed=5)],
               [SamplingParams(max_tokens=16, constraint=lambda: Successor(v), temperature=0.9, top_p=0.8, seed=6),
                SamplingParams(max_tokens=16)]]
    outs, variants = {}, set()
    for graphs in (True, False):
        with cuda_llm(tiny_llama, cuda_graphs=graphs) as llm:
            if graphs:
                replay = llm.core.runner.graphs.replay_sampling
                llm.core.runner.graphs.replay_sampling = lambda *a: (variants.add(a[2]), replay(*a))
            outs[graphs] = [[o.token_ids for o in llm.generate([[i + 3, 7]] * len(b), b)]
                            for i, b in enumerate(batches)]
    assert outs[True] == outs[False]
    assert variants == set(SAMPLING_VARIANTS)


def test_steady_state_loop_never_synchronizes(tiny_llama):
    """Decode, chunked prefill beside decode rows, admissions, zombies, constrained and sampled rows, with the
    step clock reading its events at each commit, all under set_sync_debug_mode('error'): any
    synchronizing call in the loop kills it and fails the requests.
    Over a stretch of pure decode steps the allocator reserves no new memory."""
    v, eos = tiny_llama.vocab_size, tiny_llama.eos_id
    with cuda_llm(tiny_llama, max_num_seqs=8, max_prefill_tokens=16, step_timing=True) as llm:
        llm.generate([[1, 2], [3]], SamplingParams(max_tokens=4))  # warm-up outside the check
        snapshots = {}

        def watch(rid, n, delta):
            if n in (40, 140):
                s = torch.cuda.memory_stats()
                snapshots[n] = (s["segment.all.allocated"], s["reserved_bytes.all.current"])

        torch.cuda.set_sync_debug_mode("error")
        try:
            mixed = [SamplingParams(max_tokens=30, constraint=lambda: ForceAt(5, eos)),
                     SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=3, logprobs=2),
                     SamplingParams(max_tokens=30, constraint=lambda: Successor(v)),
                     SamplingParams(max_tokens=30, repetition_penalty=1.2, stop=["zz"])]
            if importlib.util.find_spec("xgrammar") is not None:  # the H200 runs carry its wheels
                mixed.append(SamplingParams(max_tokens=30, json_schema={"type": "array", "items": {"type": "integer"}}))
            prompts = [[i + 1, i + 2] * (20 if i % 4 == 0 else 1) for i in range(3 * len(mixed))]  # chunked: 40 > 16
            outs = llm.generate(prompts, mixed * 3)
            long = llm.submit([7, 7], SamplingParams(max_tokens=160, ignore_eos=True), on_token=watch)
            others = [llm.submit([8], SamplingParams(max_tokens=160, ignore_eos=True)) for _ in range(3)]
            assert len(llm.result(long).token_ids) == 160
            assert all(len(llm.result(r).token_ids) == 160 for r in others)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(o.finish_reason in ("stop", "length") for o in outs)
        assert snapshots[40] == snapshots[140], snapshots


def test_step_clock_reads_the_device_timeline(tiny_llama):
    """GPU busy time per step from the compute stream's events, every step timed, and the gap before
    each step that followed another while the loop had work counted as idle: some in the blocking
    loop, which commits between steps. (Whether the pipelined loop idles less depends on its steps
    outlasting the host's tick, which a tiny model's never do; the benchmark shapes' profiles show
    it: docs/benchmarks.md.)"""
    for mode in ("pipelined", "blocking"):
        with cuda_llm(tiny_llama, mode, step_timing=True) as llm:
            llm.generate([[5, 6, 7]] * 8, SamplingParams(max_tokens=64, ignore_eos=True))
            stats = settled_stats(llm)
        assert stats["timed_steps"] == stats["steps"] and stats["gpu_busy_seconds"] > 0
        assert 0 < sum(stats["gpu_idle_counts"]) < stats["steps"]
        if mode == "blocking":
            assert stats["gpu_idle_seconds"] > 0


def test_cuda_lora_rows_match_peft_with_and_without_graphs(tiny_llama, tmp_path):
    """Decode graphs (the rows' adapter slots a step input), prefill steps and eager forwards all
    give transformers + peft's answer for rows under an adapter beside rows under none."""
    pytest.importorskip("peft")
    from test_lora import LLAMA_MODULES, make_adapter

    ref = make_adapter(tiny_llama, tmp_path / "ad", 8, LLAMA_MODULES, seed=4)
    prompts = [[5, 6, 7], list(range(10, 40)), [9], [3, 4]]
    names = ["ad", None, "ad", None]
    for graphs in (True, False):
        with cuda_llm(tiny_llama, cuda_graphs=graphs, max_loras=2, max_lora_rank=8) as llm:
            llm.load_lora("ad", str(tmp_path / "ad"))
            outs = llm.generate(prompts, [SamplingParams(max_tokens=10, lora=n) for n in names])
        for p, n, o in zip(prompts, names, outs):
            model = ref if n else tiny_llama.hf
            with torch.no_grad():
                assert tie_aware_equal(model, p, o.token_ids, hf_greedy(model, p, 10, tiny_llama.eos_id))


def test_cuda_base_rows_are_the_same_beside_adapted_rows_or_alone(tiny_llama, tmp_path):
    """A decode step without adapter rows replays the graphs without the LoRA kernels; a base-model
    row's tokens come out the same bit for bit in those steps and in steps beside adapted rows (the
    kernels' delta for it is an exact zero in the GEMM's accumulator)."""
    pytest.importorskip("peft")
    from test_lora import LLAMA_MODULES, make_adapter

    make_adapter(tiny_llama, tmp_path / "ad", 8, LLAMA_MODULES, seed=4)
    prompts = [[5, 6, 7], list(range(10, 40)), [9], [3, 4]]
    base = SamplingParams(max_tokens=24, ignore_eos=True)
    with cuda_llm(tiny_llama, max_loras=2, max_lora_rank=8) as llm:
        llm.load_lora("ad", str(tmp_path / "ad"))
        alone = llm.generate(prompts, base)
        beside = llm.generate(prompts * 2, [base] * 4 + [SamplingParams(max_tokens=24, ignore_eos=True, lora="ad")] * 4)
    assert [o.token_ids for o in alone] == [o.token_ids for o in beside[:4]]
