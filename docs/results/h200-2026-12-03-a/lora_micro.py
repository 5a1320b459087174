"""The LoRA kernels one at a time on the Qwen2.5-0.5B shapes (32 rows, 8 adapters of rank 16 over the
rows, stacks as the bench builds them: max_lora_rank 16), each in a CUDA graph of 50 calls:
µs per call for the shrink, the expand, the pair, the skinny GEMM of the same shape, and the pair
with no row under an adapter. Usage: python lora_micro.py"""
import json, os
import torch, triton
from slipstream.kernels import lora as L
from slipstream.kernels.skinny_gemm import skinny_linear

dev = torch.device("cuda")
torch.manual_seed(0)
SHAPES = {"qkv": (896, 1152, 3), "o": (896, 896, 1), "gate_up": (896, 9728, 2), "down": (4864, 896, 1)}  # (K, N, capacity)
ROWS, SLOTS, RANK = 32, 8, int(os.environ.get("RANK", 16))


def timed(fn, reps=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(ts)[3]


out = {}
print(f"{'target':8s} {'K':>5s} {'N':>5s} {'gemm':>7s} {'shrink':>7s} {'expand':>7s} {'pair':>7s} {'pair, no rows':>13s} µs")
for name, (k, n, cap) in SHAPES.items():
    MAXR = cap * RANK  # (the stack's width; each adapter packs q, k, v (gate, up) side by side)
    x = torch.randn(ROWS, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    a = torch.randn(SLOTS + 1, MAXR, k, device=dev, dtype=torch.bfloat16) * 0.02
    b = torch.randn(SLOTS + 1, n, MAXR, device=dev, dtype=torch.bfloat16) * 0.02
    ranks = torch.full((SLOTS + 1,), MAXR, dtype=torch.int32, device=dev); ranks[0] = 0
    slots = (torch.arange(ROWS, device=dev) % SLOTS + 1).to(torch.int64)
    none = torch.zeros_like(slots)
    y = torch.empty(ROWS, n, device=dev, dtype=torch.bfloat16)
    t_gemm = timed(lambda: skinny_linear(x, w, out=y))
    t_pair = timed(lambda: L.lora_add_triton(y, x, a, b, ranks, slots))
    t_none = timed(lambda: L.lora_add_triton(y, x, a, b, ranks, none))
    # the two kernels apart
    k_split = L.feature_split(ROWS, k, SLOTS)
    splits = triton.cdiv(k, k_split)
    part = torch.empty((splits, ROWS, MAXR), dtype=torch.float32, device=dev)
    def shrink():
        L._shrink_kernel[(triton.cdiv(ROWS, L.BLOCK_M), splits, SLOTS)](
            x, a, ranks, slots, part, ROWS, k, MAXR, k_split, x.stride(0), a.stride(0), a.stride(1), part.stride(0),
            part.stride(1), BLOCK_R=max(16, triton.next_power_of_2(MAXR)), BLOCK_K=L.BLOCK_K, BLOCK_M=L.BLOCK_M,
            UPCAST=False, num_warps=4)
    def expand():
        L._expand_kernel[(triton.cdiv(ROWS, L.BLOCK_M), triton.cdiv(n, L.BLOCK_N))](
            part, b, ranks, slots, y, y, ROWS, n, splits, part.stride(0), part.stride(1), b.stride(0), b.stride(1),
            y.stride(0), y.stride(0), NUM_SLOTS=SLOTS, BLOCK_N=L.BLOCK_N, BLOCK_R=L.BLOCK_R, BLOCK_M=L.BLOCK_M,
            UPCAST=False, num_warps=4)
    t_shrink, t_expand = timed(shrink), timed(expand)
    out[name] = dict(k=k, n=n, gemm=t_gemm, shrink=t_shrink, expand=t_expand, pair=t_pair, pair_no_rows=t_none,
                     splits=splits)
    print(f"{name:8s} {k:5d} {n:5d} {t_gemm:7.2f} {t_shrink:7.2f} {t_expand:7.2f} {t_pair:7.2f} {t_none:13.2f}")
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"lora_micro_r{RANK}.json"), "w"), indent=1)
