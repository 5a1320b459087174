"""GPU checks of the device layer: the same engine on CUDA (streams, events, pinned landing
buffers) gives the transformers answer, pipelined and blocking alike."""
import pytest
import torch

from conftest import settled_stats, tie_aware_equal
from slipstream import LLM, SamplingParams
from test_engine import hf_greedy, random_workload, run_workload

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_cuda_engine_matches_transformers(tiny_llama, mode):
    prompts = [[5, 6, 7], [1], list(range(10, 30))]
    with LLM(str(tiny_llama.path), device="cuda", dtype="float32", mode=mode, max_num_seqs=4, num_pages=64,
             page_size=4) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=12))
        runner = llm.core.runner
        assert all(s.meta_host.is_pinned() and s.landing.host.is_pinned() and s.mask_host.is_pinned()
                   for s in runner.slots)
    for p, o in zip(prompts, outs):
        assert tie_aware_equal(tiny_llama.hf, p, o.token_ids, hf_greedy(tiny_llama.hf, p, 12, tiny_llama.eos_id))


def test_cuda_pipelined_equals_blocking(tiny_llama):
    reqs = random_workload(5, tiny_llama.vocab_size, tiny_llama.eos_id)
    results = {}
    for mode in ("blocking", "pipelined"):
        with LLM(str(tiny_llama.path), device="cuda", dtype="float32", mode=mode, max_num_seqs=3, num_pages=96,
                 page_size=4) as llm:
            results[mode] = run_workload(llm, reqs)
            stats = settled_stats(llm)
            assert stats["kv_pages_free"] == stats["kv_pages_total"]
    hf = tiny_llama.hf
    full = sum(tie_aware_equal(hf, r.prompt, results["pipelined"][i][0], results["blocking"][i][0],
                               r.params.temperature, r.params.seed) for i, r in enumerate(reqs))
    assert full >= len(reqs) - 1
