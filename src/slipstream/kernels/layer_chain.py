"""Triton: the rest of a Llama-family decoder layer after its attention, and the start of the
next layer, as one launch of six chained stages:

    h   = o @ Wo.T (+ bo) + h           O projection, residual added in the epilogue
    x   = rms_norm(h) * w_post          post-attention norm
    a   = swiglu(x @ Wgu.T (+ bgu))     [gate; up] with interleaved rows
    h   = a @ Wd.T (+ bd) + h           down projection, residual added
    x   = rms_norm(h) * w_next          the next layer's input norm      } absent after
    qkv = x @ Wqkv.T (+ bqkv)           the next layer's QKV projection  } the last layer

Why: at decode batch sizes each of these streams a few MB of weights in a few microseconds, and
a kernel launch costs ~3 us before its first weight byte arrives, even with PDL (variants 5-8 in
docs/kernel-notes.md); for the Qwen2.5-0.5B shape that fixed cost, not bandwidth, was most of the
step. Here one grid holds every stage's programs, in order of program id. A program of stage s
asks L2 for its weight rows, waits until every program of stage s - 1 has counted itself done
(an acquire load spinning on a counter), then runs exactly the code of the standalone kernel
(`skinny_gemm.gemm_program`, `norm.norm_row`): the same arithmetic as six launches.
The GPU hands out a grid's programs in order of id (the assumption CUB's single-pass scan makes),
so every program a waiting one depends on is already running: no deadlock. The CPU interpreter
runs programs one after another in id order, where each wait is already met."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRET, arrival_counters, pdl_args
from .norm import norm_row
from .skinny_gemm import default_config, gemm_program


@triton.jit
def _prefetch_rows(w_ptr, pid_n, pid_k, N, K, K_SPLIT, BLOCK_N: tl.constexpr, ELEM_BYTES: tl.constexpr):
    """Ask L2 for the weight rows of GEMM program (n, s): one bulk prefetch per row, thread t taking
    row t, so each byte is asked for once. The weight is [N, K], contiguous."""
    k_start = pid_k * K_SPLIT
    one = tl.zeros([1], tl.int32)
    rows = one + tl.minimum(N - pid_n * BLOCK_N, BLOCK_N)
    nbytes = one + (tl.minimum(K_SPLIT, K - k_start) * ELEM_BYTES) // 16 * 16
    row_bytes = one + K * ELEM_BYTES
    first = w_ptr + (pid_n * BLOCK_N * K + k_start).to(tl.int64) + one
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; .reg .u64 a; mov.u32 t, %tid.x; setp.lt.u32 p, t, $2; "
        "mul.wide.u32 a, t, $3; add.u64 a, a, $1; @p cp.async.bulk.prefetch.L2.global [a], $4; mov.u32 $0, 0; }",
        "=r,l,r,r,r", [first, rows, row_bytes, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_for(counter_ptr, count, COMPILED: tl.constexpr):
    """Spin until `count` programs have counted themselves done at `counter_ptr`, then acquire, so
    their stores are visible to the loads after. The polls are relaxed loads with a short sleep
    between them (inline PTX, so COMPILED only: not in the CPU interpreter): an acquire per poll
    would invalidate the L1 of an SM whose other programs are working, and hundreds of waiting
    programs would crowd the counter's L2 slice."""
    while tl.load(counter_ptr, volatile=True) < count:
        if COMPILED:
            tl.inline_asm_elementwise("nanosleep.u32 100; mov.u32 $0, 0;", "=r,r", [tl.zeros([1], tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=1)
    while tl.atomic_add(counter_ptr, 0, sem="acquire") < count:  # one acquiring load (a bare one is dropped)
        pass


@triton.jit
def _count_done(counter_ptr):
    tl.debug_barrier()  # every thread's stores are issued before the program counts itself done
    tl.atomic_add(counter_ptr, 1, sem="release")


@triton.jit
def _enter(w_ptr, pid_n, pid_k, N, K, K_SPLIT, done_ptr, waits_for, BLOCK_N: tl.constexpr,
           ELEM_BYTES: tl.constexpr, PREFETCH: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr):
    """A GEMM program's start: prefetch its weights, wait for the kernel before (PDL) and, unless it
    is in the first stage (waits_for = 0), for the stage before."""
    if PREFETCH:
        _prefetch_rows(w_ptr, pid_n, pid_k, N, K, K_SPLIT, BLOCK_N, ELEM_BYTES)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if waits_for > 0:
        _wait_for(done_ptr, waits_for, COMPILED)


@triton.jit
def _finish(done_ptr, stage, count):
    """The last stage's count; its last program resets every stage's counter for the next launch
    (all waits of this launch are over by then: each stage completes only after the one before)."""
    tl.debug_barrier()
    if tl.atomic_add(done_ptr + stage, 1, sem="acq_rel") == count - 1:
        i = tl.arange(0, 8)
        tl.store(done_ptr + i, tl.zeros([8], tl.int32), mask=i < 6)


@triton.jit
def _layer_chain_kernel(o_ptr, h_ptr, h_mid_ptr, x1_ptr, act_ptr, h_out_ptr, x2_ptr, qkv_ptr,
                        wo_ptr, bo_ptr, post_w_ptr, wgu_ptr, bgu_ptr, wd_ptr, bd_ptr, next_w_ptr, wq_ptr, bq_ptr,
                        part_o_ptr, part_gu_ptr, part_d_ptr, part_q_ptr, arrivals_ptr,
                        M, D, DA, I2, NQ, eps_post, eps_next, KS_O, KS_GU, KS_D, KS_Q,
                        HAS_BO: tl.constexpr, HAS_BGU: tl.constexpr, HAS_BD: tl.constexpr, HAS_BQ: tl.constexpr,
                        NEXT: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_D: tl.constexpr,
                        BN_O: tl.constexpr, SPLIT_O: tl.constexpr, EK_O: tl.constexpr, EN_O: tl.constexpr,
                        BN_GU: tl.constexpr, SPLIT_GU: tl.constexpr, EK_GU: tl.constexpr, EN_GU: tl.constexpr,
                        BN_D: tl.constexpr, SPLIT_D: tl.constexpr, EK_D: tl.constexpr, EN_D: tl.constexpr,
                        BN_Q: tl.constexpr, SPLIT_Q: tl.constexpr, EK_Q: tl.constexpr, EN_Q: tl.constexpr,
                        ELEM_BYTES: tl.constexpr, PREFETCH: tl.constexpr, COMPILED: tl.constexpr,
                        PDL: tl.constexpr):
    """Stages by program id: O GEMM, norm (one program per row), gate-up GEMM, down GEMM, then with
    NEXT the next norm and QKV GEMM. EK_*, EN_*: K divisible by BLOCK_K, N by the stage's BLOCK_N."""
    pid = tl.program_id(0)
    done = arrivals_ptr
    tiles_o, tiles_gu = tl.cdiv(D, BN_O), tl.cdiv(I2, BN_GU)
    tiles_d, tiles_q = tl.cdiv(D, BN_D), tl.cdiv(NQ, BN_Q)
    arr_o = arrivals_ptr + 6  # after the six stages' done counters: split-K tile counters, stage after stage
    arr_gu = arr_o + tiles_o
    arr_d = arr_gu + tiles_gu
    arr_q = arr_d + tiles_d
    end_o = tiles_o * SPLIT_O
    end_n1 = end_o + M
    end_gu = end_n1 + tiles_gu * SPLIT_GU
    end_d = end_gu + tiles_d * SPLIT_D
    end_n2 = end_d + M
    if pid < end_o:
        n, s = pid % tiles_o, pid // tiles_o
        _enter(wo_ptr, n, s, D, DA, KS_O, done, 0, BN_O, ELEM_BYTES, PREFETCH, COMPILED, PDL)
        gemm_program(o_ptr, wo_ptr, bo_ptr, h_ptr, h_mid_ptr, part_o_ptr, arr_o, n, s, M, D, DA, KS_O, 0, DA, DA,
                     D, D, HAS_BO, True, 0, UPCAST, BLOCK_M, BN_O, BLOCK_K, EK_O, EN_O, SPLIT_O, False)
        _count_done(done)
    elif pid < end_n1:
        if PDL:
            tl.extra.cuda.gdc_wait()
        _wait_for(done, end_o, COMPILED)
        norm_row(h_mid_ptr, post_w_ptr, post_w_ptr, x1_ptr, pid - end_o, D, eps_post, D, D, True, BLOCK_D, False)
        _count_done(done + 1)
    elif pid < end_gu:
        n, s = (pid - end_n1) % tiles_gu, (pid - end_n1) // tiles_gu
        _enter(wgu_ptr, n, s, I2, D, KS_GU, done + 1, M, BN_GU, ELEM_BYTES, PREFETCH, COMPILED, PDL)
        gemm_program(x1_ptr, wgu_ptr, bgu_ptr, x1_ptr, act_ptr, part_gu_ptr, arr_gu, n, s, M, I2, D, KS_GU, 0, D, D,
                     0, I2 // 2, HAS_BGU, False, 3, UPCAST, BLOCK_M, BN_GU, BLOCK_K, EK_GU, EN_GU,
                     SPLIT_GU, False)
        _count_done(done + 2)
    elif pid < end_d:
        n, s = (pid - end_gu) % tiles_d, (pid - end_gu) // tiles_d
        _enter(wd_ptr, n, s, D, I2 // 2, KS_D, done + 2, end_gu - end_n1, BN_D, ELEM_BYTES, PREFETCH, COMPILED, PDL)
        gemm_program(act_ptr, wd_ptr, bd_ptr, h_mid_ptr, h_out_ptr, part_d_ptr, arr_d, n, s, M, D, I2 // 2, KS_D,
                     0, I2 // 2, I2 // 2, D, D, HAS_BD, True, 0, UPCAST, BLOCK_M, BN_D, BLOCK_K, EK_D,
                     EN_D, SPLIT_D, PDL and not NEXT)
        if NEXT:
            _count_done(done + 3)
        else:
            _finish(done, 3, end_d - end_gu)
    elif pid < end_n2:
        if PDL:
            tl.extra.cuda.gdc_wait()
        _wait_for(done + 3, end_d - end_gu, COMPILED)
        norm_row(h_out_ptr, next_w_ptr, next_w_ptr, x2_ptr, pid - end_d, D, eps_next, D, D, True, BLOCK_D, False)
        _count_done(done + 4)
    else:
        n, s = (pid - end_n2) % tiles_q, (pid - end_n2) // tiles_q
        _enter(wq_ptr, n, s, NQ, D, KS_Q, done + 4, M, BN_Q, ELEM_BYTES, PREFETCH, COMPILED, PDL)
        gemm_program(x2_ptr, wq_ptr, bq_ptr, x2_ptr, qkv_ptr, part_q_ptr, arr_q, n, s, M, NQ, D, KS_Q, 0, D, D, 0,
                     NQ, HAS_BQ, False, 0, UPCAST, BLOCK_M, BN_Q, BLOCK_K, EK_Q, EN_Q, SPLIT_Q, PDL)
        _finish(done, 5, tiles_q * SPLIT_Q)


def _can_prefetch(*weights: torch.Tensor) -> bool:
    """Bulk prefetches (Hopper and later) need 16-byte aligned rows."""
    return (not INTERPRET and weights[0].is_cuda and torch.cuda.get_device_capability(weights[0].device)[0] >= 9
            and all(w.data_ptr() % 16 == 0 and w.shape[1] * w.element_size() % 16 == 0 for w in weights))


def layer_chain(o: torch.Tensor, h: torch.Tensor, o_proj: tuple[torch.Tensor, torch.Tensor | None],
                post_norm: tuple[torch.Tensor, float], gate_up: tuple[torch.Tensor, torch.Tensor | None],
                down: tuple[torch.Tensor, torch.Tensor | None], next_norm: tuple[torch.Tensor, float] | None = None,
                next_qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """o [M, DA] (attention output), h [M, D] (the layer's input), M <= 64, all contiguous; weights
    [N, K] with optional biases; gate_up's rows interleave gate and up (linear.interleave_gate_up).
    Returns (the layer's output h, the next layer's qkv), qkv None without next_norm / next_qkv."""
    m, da = o.shape
    d = h.shape[1]
    (wo, bo), (wgu, bgu), (wd, bd) = o_proj, gate_up, down
    i2 = wgu.shape[0]
    nxt = next_qkv is not None
    wq, bq = next_qkv if nxt else (wo, None)
    nq = wq.shape[0] if nxt else 0
    assert m <= 64 and o.is_contiguous() and h.is_contiguous(), (o.shape, h.shape)
    assert all(w.is_contiguous() for w in (wo, wgu, wd, wq)) and (next_norm is not None) == nxt
    shapes = {"o": (d, da), "gu": (i2, d), "d": (d, i2 // 2), "q": (max(nq, 1), d)}
    cfgs = {name: default_config(m, n, k) for name, (n, k) in shapes.items()}
    cfg0 = cfgs["o"]
    assert all(c[1:4] == cfg0[1:4] for c in cfgs.values()) and cfgs["gu"].block_n % 2 == 0, cfgs

    def new(width: int) -> torch.Tensor:
        return torch.empty((m, width), dtype=o.dtype, device=o.device)

    h_mid, x1, act, h_out = new(d), new(d), new(i2 // 2), new(d)
    x2, qkv = (new(d), new(nq)) if nxt else (h_out, h_out)

    def k_split(name: str) -> int:
        cfg, k = cfgs[name], shapes[name][1]
        return triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k) * cfg.block_k

    def partials(name: str) -> torch.Tensor:
        cfg = cfgs[name]
        return torch.empty((cfg.split_k, m, shapes[name][0]), dtype=torch.float32, device=o.device) \
            if cfg.split_k > 1 else h_out

    def stage(name: str, arg: str) -> dict[str, int | bool]:
        """A GEMM stage's constexprs: tile width, K splits, whether K and N divide evenly into tiles."""
        cfg, (n, k) = cfgs[name], shapes[name]
        return {f"BN_{arg}": cfg.block_n, f"SPLIT_{arg}": cfg.split_k, f"EK_{arg}": k % cfg.block_k == 0,
                f"EN_{arg}": n % cfg.block_n == 0}

    tiles = {name: triton.cdiv(shapes[name][0], cfgs[name].block_n) for name in shapes}
    programs = (tiles["o"] * cfgs["o"].split_k + m + tiles["gu"] * cfgs["gu"].split_k + tiles["d"] * cfgs["d"].split_k
                + (m + tiles["q"] * cfgs["q"].split_k if nxt else 0))
    arrivals = arrival_counters(o.device, 6 + sum(tiles.values()))  # six stage counters, then the tiles'
    post_w, eps_post = post_norm
    next_w, eps_next = next_norm if nxt else post_norm
    _layer_chain_kernel[(programs,)](
        o, h, h_mid, x1, act, h_out, x2, qkv, wo, bo if bo is not None else wo, post_w, wgu,
        bgu if bgu is not None else wgu, wd, bd if bd is not None else wd, next_w, wq, bq if bq is not None else wq,
        partials("o"), partials("gu"), partials("d"), partials("q"), arrivals,
        m, d, da, i2, nq, eps_post, eps_next, k_split("o"), k_split("gu"), k_split("d"), k_split("q"),
        HAS_BO=bo is not None, HAS_BGU=bgu is not None, HAS_BD=bd is not None, HAS_BQ=bq is not None, NEXT=nxt,
        UPCAST=INTERPRET or o.dtype == torch.float32, BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_K=cfg0.block_k, BLOCK_D=triton.next_power_of_2(d),
        **stage("o", "O"), **stage("gu", "GU"), **stage("d", "D"), **stage("q", "Q"), ELEM_BYTES=wo.element_size(),
        PREFETCH=_can_prefetch(wo, wgu, wd, wq), COMPILED=not INTERPRET,
        num_warps=cfg0.num_warps, num_stages=cfg0.num_stages, **pdl_args())
    return h_out, (qkv if nxt else None)
