"""Split-context paged-decode attention at long contexts (H200): the Qwen2.5-0.5B shape's attention
(14 query heads on 2 KV heads, head dim 64, bf16) at few rows, split (the default, 8 blocks of
64 tokens per program) against one program per (row, KV head), each timed as CUDA-graph replays
(no launch overhead). Usage: python scripts/split_attention.py"""
import torch
import triton.testing

from slipstream.kernels.paged_decode import paged_decode_attention

page, h, kvh, d = 16, 14, 2, 64
print(f"{'rows':>4} {'context':>7} {'KV MB':>6} {'split us':>9} {'TB/s':>5} {'unsplit us':>10}")
for b in (1, 8):
    for ctx in (256, 1024, 4096, 16384):
        pages = b * ctx // page + 1
        q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
        kp = torch.randn(pages, page, kvh, d, device="cuda", dtype=torch.bfloat16)
        vp = torch.randn_like(kp)
        table = torch.arange(1, pages, device="cuda").view(b, -1)
        lens = torch.full((b,), ctx, device="cuda")
        split = triton.testing.do_bench_cudagraph(lambda: paged_decode_attention(q, kp, vp, table, lens, 0.125),
                                                  return_mode="median")
        whole = triton.testing.do_bench_cudagraph(
            lambda: paged_decode_attention(q, kp, vp, table, lens, 0.125, blocks_per_split=1 << 20),
            return_mode="median")
        kv_mb = 2 * b * ctx * kvh * d * 2 / 1e6
        print(f"{b:>4} {ctx:>7} {kv_mb:>6.1f} {split * 1e3:>9.1f} {kv_mb / split / 1e3:>5.2f} {whole * 1e3:>10.1f}",
              flush=True)
