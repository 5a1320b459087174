"""Where a step's GPU time goes (H200): a torch.profiler kernel table of eager steps (graphs off, so
kernels are visible). Decode: `streams` rows, then the paged-decode kernel at the benchmark shape
against dense SDPA over the same keys. With `--mixed N`: steps of N tokens, `streams` decode rows
beside prompt chunks (and the same steps with nothing decoding), per-step kernel time by kernel.
Usage: python scripts/profile_step.py [random:phi-1.5] [streams] [--mixed N]"""
import sys
import threading

import torch
import torch.nn.functional as F
import triton.testing

from slipstream import LLM, SamplingParams
from slipstream.kernels.paged_decode import paged_decode_attention

mixed = int(sys.argv.pop(sys.argv.index("--mixed") + 1)) if "--mixed" in sys.argv else None
args = [a for a in sys.argv[1:] if a != "--mixed"]
model = args[0] if args else "random:phi-1.5"
streams = int(args[1]) if len(args) > 1 else 32


def mixed_steps(tokens: int, steps: int = 8) -> None:
    """Kernel time per step of `tokens` tokens: `streams` decode rows beside chunks of a long prompt,
    then the same prompt with nothing decoding."""
    from torch.profiler import ProfilerActivity, profile

    with LLM(model, max_num_seqs=streams + steps, cuda_graphs=False, max_prefill_tokens=tokens) as llm:
        llm.generate([[5] * tokens], SamplingParams(max_tokens=2))  # warm-up
        for label, decoding in (("beside decode rows", streams), ("nothing decoding", 0)):
            started, count, lock = threading.Event(), [0], threading.Lock()

            def decoding_now(rid: int, n: int, delta: str) -> None:
                with lock:
                    count[0] += n == 2
                    if count[0] == decoding:
                        started.set()

            runners = [llm.submit([i + 1] * 64, SamplingParams(max_tokens=3000, ignore_eos=True),
                                  on_token=decoding_now) for i in range(decoding)]
            if decoding:
                started.wait()
            prompts = [[(i * 31 + j * 13) % 1000 for j in range(tokens - decoding)] for i in range(steps)]
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                llm.generate(prompts, SamplingParams(max_tokens=1))
            for rid in runners:
                llm.abort(rid)
            for rid in runners:
                llm.result(rid)
            events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
            total = sum(e.device_time_total for e in events) / steps / 1e3
            print(f"\n{tokens}-token steps, {label}: {total:.3f} ms of kernels per step")
            for e in events[:16]:
                print(f"  {e.device_time_total / steps / 1e3:7.3f} ms  {e.count / steps:6.1f}/step  {e.key[:90]}")


if mixed is not None:
    mixed_steps(mixed)
    sys.exit(0)

with LLM(model, max_num_seqs=streams, cuda_graphs=False) as llm:
    prompts = [[(i * 7 + j) % 1000 for j in range(64)] for i in range(streams)]
    llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))

cfg = dict(h=32, kvh=32, d=64) if "phi" in model else dict(h=14, kvh=2, d=64)
b, page = streams, 16
for ctx in (128, 192):
    q = torch.randn(b, cfg["h"], cfg["d"], device="cuda", dtype=torch.bfloat16)
    pages = b * ctx // page + 1
    kp = torch.randn(pages, page, cfg["kvh"], cfg["d"], device="cuda", dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    table = torch.arange(1, pages, device="cuda").view(b, -1)
    lens = torch.full((b,), ctx, device="cuda")
    for dot in ((True, False) if cfg["h"] == cfg["kvh"] else (True,)):
        for ppb in (2, 4, 8):
            for warps in (2, 4, 8):
                ms = triton.testing.do_bench(
                    lambda: paged_decode_attention(q, kp, vp, table, lens, 0.125, pages_per_block=ppb, num_warps=warps,
                                                   dot=dot), return_mode="median")
                print(f"ctx {ctx} paged_decode dot={dot} pages_per_block={ppb} num_warps={warps}: {ms * 1e3:.1f} us")
    k = kp[1:].reshape(b, ctx, cfg["kvh"], cfg["d"]).transpose(1, 2)
    v = vp[1:].reshape(b, ctx, cfg["kvh"], cfg["d"]).transpose(1, 2)
    ms = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=cfg["h"] != cfg["kvh"]),
                                 return_mode="median")
    print(f"ctx {ctx} dense SDPA over the same keys: {ms * 1e3:.1f} us; KV bytes {2 * kp[1:].numel() * 2 / 1e6:.1f} MB")
