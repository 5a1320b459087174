"""Triton: `y = act(x @ W.T + bias) + residual` for decode's few rows (M <= 64), with the epilogue
(bias, GELU or SwiGLU, residual add, the cast to the output dtype) fused in.

At decode batch sizes a linear layer is a stream over its weights: each program owns BLOCK_N
output features for all M rows and walks K (or a slice of it: split-K), so every weight byte is
read once; x (a few KB) stays in L2. cuBLAS reaches ~60% of copy bandwidth at these shapes and
needs separate kernels for the activation and the residual add; fusing them removes launches,
which at ~3 us each are most of a small model's step. Intermediate results are rounded to the
activation dtype where the unfused torch path rounds them, so both paths give the same numbers up
to accumulation order.

On Hopper the kernels of a step launch with programmatic dependent launch (PDL): once every
program of a kernel has finished its main loop (`gdc_launch_dependents`), the next kernel's
programs are launched and wait (`gdc_wait`) for the grid's completion before reading anything,
which hides most of the launch gap between dependent kernels. Triggering only after the main
loop keeps waiting programs from taking SM slots a many-wave grid still needs."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import INTERPRET, arrival_counters, pdl_args, sm_count
from .lora import (LoraDelta, LoraWeights, lora_b, lora_delta, lora_delta_by_slot, lora_rows, lora_spread_rows,
                   one_product, rank_block)

ACTIVATIONS = {None: 0, "gelu_tanh": 1, "gelu": 2, "swiglu": 3}


class Config(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1


@triton.jit
def _gelu(y, ACT: tl.constexpr):
    if ACT == 1:  # tanh approximation (HF gelu_new / gelu_pytorch_tanh)
        inner = tl.minimum(tl.maximum(0.7978845608028654 * (y + 0.044715 * y * y * y), -20.0), 20.0)
        t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0  # tanh (saturated well before exp overflows)
        y = 0.5 * y * (1.0 + t)
    elif ACT == 2:
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    return y


@triton.jit
def _epilogue(acc, bias_ptr, res_ptr, out_ptr, rm, rn, M, N, ACT_FROM, stride_rm, stride_om, act_dtype: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """The output tile (bias, activation, residual, rounding), stored."""
    row_ok = rm < M
    y = acc
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    y = y.to(act_dtype).to(tl.float32)
    if ACT == 3:  # SwiGLU over interleaved [gate, up] weight rows: output column j = silu(y[2j]) * y[2j+1]
        gate, up = tl.split(tl.reshape(y, [BLOCK_M, BLOCK_N // 2, 2]))
        silu = (gate / (1.0 + tl.exp(-gate))).to(act_dtype).to(tl.float32)
        y = silu * up
        rn = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        N = N // 2
    elif ACT != 0:
        y = tl.where(rn[None, :] >= ACT_FROM, _gelu(y, ACT).to(act_dtype).to(tl.float32), y)
    mask = row_ok[:, None] & (rn < N)[None, :]
    if HAS_RES:
        y = y.to(act_dtype).to(tl.float32)
        y += tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _skinny_linear_kernel(x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, partial_ptr, arrivals_ptr, v_ptr, lb_ptr,
                          rank_ptr, slot_ptr, M, N, K, K_SPLIT, ACT_FROM, V_WIDTH, stride_xm, stride_wn, stride_rm,
                          stride_om, stride_v, stride_lbs, stride_lbn,
                          HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, UPCAST: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, SPLIT_K: tl.constexpr, DEFER: tl.constexpr,
                          LORA_SLOTS: tl.constexpr, SLOTS_P2: tl.constexpr, ONE_PRODUCT: tl.constexpr,
                          BLOCK_R: tl.constexpr, sa_ptr, sparts_ptr, NA, SHRINK_TILES: tl.constexpr,
                          EARLY_DEPENDENTS: tl.constexpr, PDL: tl.constexpr):
    """Program (n, s) computes columns [n * BLOCK_N, +BLOCK_N) over the s-th K range. With SPLIT_K > 1
    each program leaves its fp32 partial in `partial_ptr`; the last to arrive at the tile's counter
    sums the partials in split order (deterministic), runs the epilogue and resets the counter.
    DEFER: every program only leaves its partial; the next kernel sums them (linear.PendingSum).
    LORA_SLOTS > 0: the programs of the first K range add each row's adapter delta (kernels.lora), in
    one product over all slots, their B loaded before the wait, that the main loop accumulates onto
    (ONE_PRODUCT), or one a slot after it.
    SHRINK_TILES > 0 (DEFER): the last SHRINK_TILES column tiles multiply x by the NA rows at sa_ptr
    instead (every slot's A rows of this GEMM's adapter, with W's row stride), leaving their partials
    at sparts_ptr ([SPLIT_K, M, NA] fp32): the shrink, which the norm finishing the sum takes at each
    row's slot's rank columns (kernels.norm).
    EARLY_DEPENDENTS: the next kernel's launch is triggered right after the wait, not after the main
    loop (a one-wave grid whose next kernel has work to do before its own wait: an RMSNorm adding an
    adapter's delta, kernels.norm)."""
    act_dtype = x_ptr.dtype.element_ty
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    if SHRINK_TILES > 0:  # (a program past N's tiles: the shrink's, on A's rows into the shrink's partials)
        shrink_tile = pid_n >= tl.num_programs(0) - SHRINK_TILES
        pid_n -= shrink_tile.to(tl.int32) * (tl.num_programs(0) - SHRINK_TILES)
        w_ptr = tl.where(shrink_tile, sa_ptr, w_ptr)
        partial_ptr = tl.where(shrink_tile, sparts_ptr, partial_ptr)
        N = tl.where(shrink_tile, NA, N)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm < M
    col_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = pid_k * K_SPLIT
    if LORA_SLOTS > 0:  # (the rows' slots, a step input, and the adapters' stacks: read before the wait)
        # (only the first K range adds the delta: the others' rows and columns count as none, so they
        # load nothing and their product is zero)
        first = (pid_k == 0).to(tl.int32)
        rows = M * first
        slots = tl.load(slot_ptr + rm, mask=rm < rows, other=0)
        if ONE_PRODUCT:
            lb = lora_b(lb_ptr, rn, N * first, V_WIDTH, stride_lbs, stride_lbn, LORA_SLOTS, SLOTS_P2, BLOCK_R)
    if PDL:  # x, v (and the arrival counters) come from earlier kernels
        tl.extra.cuda.gdc_wait()
        if EARLY_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
    if LORA_SLOTS > 0:
        if ONE_PRODUCT:  # (the delta first: the main loop accumulates onto it. After the loop, the product
            # and its operands' layout changes lengthened every program's tail: 0.025 ms a step on the
            # H200, docs/benchmarks.md 2026-12-04 run n)
            v = lora_spread_rows(v_ptr, slots, rm, V_WIDTH, stride_v, SLOTS_P2, BLOCK_R)
            acc = lora_delta(v, lb, UPCAST)
        else:
            v = lora_rows(v_ptr, rm, rows, V_WIDTH, stride_v, BLOCK_R)
    for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
        kk = k0 + rk
        w_ptrs = w_ptr + rn[:, None] * stride_wn + kk[None, :]
        x_ptrs = x_ptr + rm[:, None] * stride_xm + kk[None, :]
        if EVEN_K:
            w = tl.load(w_ptrs) if EVEN_N else tl.load(w_ptrs, mask=col_ok[:, None], other=0.0)
            x = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs, mask=col_ok[:, None] & (kk[None, :] < K), other=0.0)
            x = tl.load(x_ptrs, mask=row_ok[:, None] & (kk[None, :] < K), other=0.0)
        if UPCAST:  # fp32 inputs, or bf16 in the CPU interpreter
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    if PDL and not EARLY_DEPENDENTS:  # the next kernel may start its launch now; it waits for this grid to
        tl.extra.cuda.gdc_launch_dependents()  # finish before it reads
    if LORA_SLOTS > 0 and not ONE_PRODUCT:
        if pid_k == 0:
            acc += lora_delta_by_slot(slots, v, lb_ptr, rank_ptr, rn, N, stride_lbs, stride_lbn, LORA_SLOTS,
                                      BLOCK_M, BLOCK_N, BLOCK_R, UPCAST)
    tile = rm[:, None] * N + rn[None, :]
    tile_ok = row_ok[:, None] & col_ok[None, :]
    if DEFER:
        tl.store(partial_ptr + pid_k * M * N + tile, acc, mask=tile_ok)
    elif SPLIT_K == 1:
        _epilogue(acc, bias_ptr, res_ptr, out_ptr, rm, rn, M, N, ACT_FROM, stride_rm, stride_om, act_dtype, HAS_BIAS,
                  HAS_RES, ACT, BLOCK_M, BLOCK_N)
    else:
        tl.store(partial_ptr + pid_k * M * N + tile, acc, mask=tile_ok)
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        if tl.atomic_add(arrivals_ptr + pid_n, 1, sem="acq_rel") == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(partial_ptr + s * M * N + tile, mask=tile_ok, other=0.0, cache_modifier=".cg")
            _epilogue(acc, bias_ptr, res_ptr, out_ptr, rm, rn, M, N, ACT_FROM, stride_rm, stride_om, act_dtype,
                      HAS_BIAS, HAS_RES, ACT, BLOCK_M, BLOCK_N)
            tl.atomic_xchg(arrivals_ptr + pid_n, 0)  # ready for the next launch (and graph replay)


def grid_can_shrink(weight: torch.Tensor, adapters: LoraWeights) -> bool:
    """Whether `skinny_linear`'s grid can take these adapters' shrink (`shrink`): their A stacks
    contiguous, each rank row streaming with W's row stride."""
    return adapters.a.is_contiguous() and adapters.a.stride(1) == weight.stride(0)


def default_config(m: int, n: int, k: int, defer: bool = False) -> Config:
    """The launch configuration for an (M, N, K) problem, from `scripts/gemm_sweep.py` and the decode
    step on the H200 (docs/kernel-notes.md). Enough programs must stream weights at once to cover
    the SMs: wide layers get there with BLOCK_N tiles alone (32 wide from N = 8192, 64 where that
    would make more than three waves: LM heads, Phi's [qkv; fc1]); narrow-and-deep ones (down
    projections, Phi's [fc2 | dense]) split K up to 4 ways, keeping 4 K blocks a split, or 3 where
    the split costs no fix-up (`defer`: Qwen's o projection splits then)."""
    if INTERPRET:
        return Config(16, 32, 4, 1, 2 if k >= 64 else 1)
    sms = sm_count()
    block_n = 32 if n >= 8192 or k >= 2048 else 16
    if triton.cdiv(n, block_n) > 3 * sms:
        block_n = 64
    block_k = 128
    tiles = triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, block_k) // (3 if defer else 4)
    split = 1 if tiles >= sms else max(1, min(4, triton.cdiv(4 * sms, tiles), k_blocks))
    return Config(block_n, block_k, 4, 4, split)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None,
                  residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, act_from: int = 0,
                  out: torch.Tensor | None = None, config: Config | None = None, defer: bool = False,
                  lora: LoraDelta | None = None, early_dependents: bool = False,
                  shrink: LoraWeights | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [M, K], weight [N, K] -> [M, N] with M <= 64 ([M, N / 2] for "swiglu", whose weight rows
    interleave gate and up); GELU applies to output columns from `act_from` on. Rows of x,
    residual and out may be strided; features must be contiguous. `defer`: x @ W.T only, returned as
    its split-K partials [splits, M, N] (fp32) for the next kernel to sum (see linear.PendingSum).
    `lora`: each row's adapter delta, added to x @ W.T (before the bias and the activation).
    `early_dependents`: the next kernel launches once this one's programs have waited for theirs (its
    work before its own wait then runs beside this GEMM's main loop; for one-wave grids).
    `shrink` (with `defer`): also x @ A[s].T for every slot s of these adapters, in column tiles of
    the same grid, returned beside the partials as their own [splits, M, slots * width] fp32."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= 64 and weight.shape[1] == k, (x.shape, weight.shape)
    assert x.stride(-1) == 1 and weight.stride(-1) == 1 and (out is None or out.stride(-1) == 1)
    assert not defer or (bias is None and act is None and residual is None and out is None)
    cfg = config or default_config(m, n, k, defer)
    assert act != "swiglu" or cfg.block_n % 2 == 0
    tiles = triton.cdiv(n, cfg.block_n)
    k_split = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k) * cfg.block_k
    if out is None:
        shape = (cfg.split_k, m, n) if defer else (m, n // 2 if act == "swiglu" else n)
        out = torch.empty(shape, dtype=torch.float32 if defer else out_dtype or x.dtype, device=x.device)
    partial, arrivals = out, out
    if cfg.split_k > 1 and not defer:
        partial = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device)
        arrivals = arrival_counters(x.device, tiles)
    v, lb, ranks, slots = lora if lora is not None else (x, weight[None], x, x)
    block_r = rank_block(v.shape[1]) if lora is not None else 16
    slots_p2 = triton.next_power_of_2(max(1, lb.shape[0] - 1))
    sa, sparts, shrink_tiles = x, out, 0
    if shrink is not None:
        assert defer and lora is None and grid_can_shrink(weight, shrink)
        sa = shrink.a[1:].flatten(0, 1)  # (every slot's rank rows, slot 0's left out)
        sparts = torch.empty((cfg.split_k, m, sa.shape[0]), dtype=torch.float32, device=x.device)
        shrink_tiles = triton.cdiv(sa.shape[0], cfg.block_n)
    _skinny_linear_kernel[(tiles + shrink_tiles, cfg.split_k)](
        x, weight, bias if bias is not None else weight, residual if residual is not None else out, out,
        partial, arrivals, v, lb, ranks, slots, m, n, k, k_split, act_from, v.shape[1],
        x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        v.stride(0), lb.stride(0), lb.stride(1), LORA_SLOTS=lb.shape[0] - 1, SLOTS_P2=slots_p2,
        ONE_PRODUCT=lora is not None and one_product(lb.shape[0] - 1, v.shape[1]), BLOCK_R=block_r, sa_ptr=sa,
        sparts_ptr=sparts, NA=sa.shape[0], SHRINK_TILES=shrink_tiles, EARLY_DEPENDENTS=early_dependents,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=ACTIVATIONS[act],
        UPCAST=INTERPRET or x.dtype == torch.float32, BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0,
        EVEN_N=n % cfg.block_n == 0 and (shrink is None or sa.shape[0] % cfg.block_n == 0),
        SPLIT_K=cfg.split_k, DEFER=defer, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args())
    return (out, sparts) if shrink is not None else out
