"""The vision tower's add + LayerNorm (kernels.norm.add_layer_norm: one read of the residual and the
delta, writes of the sum and the normed row) by warps a program, at 5 and 9 crops of rows, in CUDA
graphs: µs and effective TB/s, against a plain copy of the same bytes."""
import json, os, sys

import torch
import triton

sys.path.insert(0, "src")
from slipstream.bench.decode import median_cuda_ms
from slipstream.kernels import norm as N
from slipstream.kernels import pdl_args

out_dir = os.environ.get("R", ".")
res = {}


def graph_us(fn, reps=20):
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return 1000 * median_cuda_ms(g.replay, repeats=20) / reps


def launch(residual, delta, w, b, total, out, warps):
    rows, d = residual.shape
    N._norm_kernel[(rows, 1)](residual, w, b, out, delta[None], w, total, residual, residual, residual[None],
                              residual[None], residual, residual[None], residual, residual, rows, d, 16, 1, 1e-5,
                              residual.stride(0), out.stride(0), 0, 0, 0, 0, 0, 0, 0, 0, 0,
                              RMS=False, SPLITS=1, PART_BIAS=False, BLOCK_D=triton.next_power_of_2(d),
                              PREV_LORA=False, PREV_PARTS=False, BLOCK_KP=16, BLOCK_PR=16, NEXT_LORA=False,
                              num_warps=warps, **pdl_args())


for crops in (5, 9):
    rows, d = 729 * crops, 1152
    r = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    ref_total, ref_out = N.add_layer_norm(r, x, w, b, 1e-5)
    nbytes = 4 * rows * d * 2
    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us = graph_us(lambda: dst.copy_(src))
    row = {"copy_us_same_bytes": copy_us, "copy_tb_s": nbytes / copy_us / 1e6}
    print(f"{crops} crops ({rows} rows): a copy of the same {nbytes / 1e6:.1f} MB {copy_us:.1f} us", flush=True)
    row["engine_us"] = graph_us(lambda: N.add_layer_norm(r, x, w, b, 1e-5))
    print(f"  engine's add_layer_norm: {row['engine_us']:.1f} us, {nbytes / row['engine_us'] / 1e6:.2f} TB/s", flush=True)
    for warps in (1, 2, 4, 8, 16):
        total, out = torch.empty_like(r), torch.empty_like(r)
        launch(r, x, w, b, total, out, warps)
        same = torch.equal(total, ref_total) and torch.equal(out, ref_out)
        us = graph_us(lambda: launch(r, x, w, b, total, out, warps))
        row[f"warps {warps}"] = {"us": us, "tb_s": nbytes / us / 1e6, "bitwise_equal": same}
        print(f"  {warps:2d} warps: {us:6.1f} us, {nbytes / us / 1e6:.2f} TB/s, equal to the engine's: {same}", flush=True)
    res[f"{crops} crops"] = row
json.dump(res, open(f"{out_dir}/ln_probe.json", "w"), indent=1)
