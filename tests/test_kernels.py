"""Kernels against their torch references on fresh random inputs, with outputs poisoned first so
an unwritten element shows: the paged-decode attention (Triton; interpreted on the CPU) and the
reference paged attention against plain dense attention."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slipstream.kernels.attention import decode_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def dense_reference(q, k_pages, v_pages, page_table, context_lens, scale):
    """float64 attention over each row's gathered keys: the higher-precision reference."""
    out = torch.empty(q.shape, dtype=torch.float64)
    kvh = k_pages.shape[2]
    for b in range(q.shape[0]):
        n = int(context_lens[b])
        pages = page_table[b, : math.ceil(n / k_pages.shape[1])]
        k = k_pages[pages].reshape(-1, kvh, q.shape[-1])[:n].double().cpu()
        v = v_pages[pages].reshape(-1, kvh, q.shape[-1])[:n].double().cpu()
        for h in range(q.shape[1]):
            s = (k[:, h // (q.shape[1] // kvh)] @ q[b, h].double().cpu()) * scale
            out[b, h] = s.softmax(0) @ v[:, h // (q.shape[1] // kvh)]
    return out


def random_case(b, h, kvh, d, page, dtype, seed, ctx=None):
    """Rows with random (or the given) context lengths, each over its own pages in random order."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(1, 200, (b,), generator=g) if ctx is None else torch.tensor(ctx)
    width = math.ceil(int(ctx.max()) / page)
    num_pages = b * width + 1  # (page 0 unused, as the engine keeps it for scratch)
    table = (torch.randperm(b * width, generator=g) + 1).view(b, width)
    def mk(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)

    return (mk(b, h, d), mk(num_pages, page, kvh, d), mk(num_pages, page, kvh, d), table.to(DEVICE), ctx.to(DEVICE),
            d ** -0.5)


@pytest.mark.parametrize("b,h,kvh,d", [(3, 4, 4, 64), (2, 8, 2, 64), (2, 14, 2, 64), (1, 4, 1, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pages_per_block", [1, 2, 4])
@pytest.mark.parametrize("dot,blocks_per_split", [(None, None), (None, 8), (True, 8), (True, 1), (False, None)])
def test_paged_decode_kernel_matches_reference(b, h, kvh, d, dtype, pages_per_block, dot, blocks_per_split):
    """Both forms; with one block per split, rows longer than one block are split and merged (the
    second launch checks that the first left its arrival counters reset)."""
    from slipstream.kernels.paged_decode import paged_decode_attention

    if dot is False and h != kvh:
        with pytest.raises(ValueError, match="one query head per KV head"):
            paged_decode_attention(*random_case(b, h, kvh, d, 16, dtype, 0), dot=False)
        return
    for seed in range(2):
        q, kp, vp, table, ctx, scale = random_case(b, h, kvh, d, 16, dtype, seed)
        out = torch.full_like(q, float("nan"))
        paged_decode_attention(q, kp, vp, table, ctx, scale, out=out, pages_per_block=pages_per_block, dot=dot,
                               blocks_per_split=blocks_per_split)
        ref = dense_reference(q, kp, vp, table, ctx, scale)
        err = (out.double().cpu() - ref).norm() / ref.norm()
        assert torch.isfinite(out).all() and err < (1e-5 if dtype == torch.float32 else 1e-2), err


def test_reduction_form_takes_smaller_blocks_and_fewer_warps_when_its_programs_fill_the_gpu():
    """Measured on the H200 (paged_decode.WIDE_PROGRAMS_PER_SM): 48 or more Phi-1.5 rows of 32 heads
    read K/V faster 2 pages and 2 warps a program, 32 rows or fewer 4 and 4."""
    from slipstream.kernels.paged_decode import reduction_config

    assert reduction_config(32 * 32) == (4, 4)
    assert reduction_config(48 * 32) == (2, 2)
    assert reduction_config(256 * 32) == (2, 2)


@pytest.mark.parametrize("b,h,kvh", [(3, 8, 2), (2, 4, 4)])
def test_paged_decode_too_many_rows_to_split_walks_each_whole_context(monkeypatch, b, h, kvh):
    """Where the (row, KV head) pairs fill the GPU the launch does not split, and each program walks
    its row's whole context, however many splits of blocks_per_split blocks that context spans (it
    once stopped after the first split and left a partial nobody merged, out of bounds)."""
    from slipstream.kernels import paged_decode

    monkeypatch.setattr(paged_decode, "_split_below", lambda: 1)
    q, kp, vp, table, ctx, scale = random_case(b, h, kvh, 64, 16, torch.float32, 3, ctx=[150, 37, 200][:b])
    out = torch.full_like(q, float("nan"))
    paged_decode.paged_decode_attention(q, kp, vp, table, ctx, scale, out=out, pages_per_block=1, dot=True,
                                        blocks_per_split=2)
    ref = dense_reference(q, kp, vp, table, ctx, scale)
    assert torch.isfinite(out).all() and (out.double().cpu() - ref).norm() / ref.norm() < 1e-5


@pytest.mark.parametrize("page", [4, 16])
def test_reference_decode_attention_matches_dense(page):
    q, kp, vp, table, ctx, scale = random_case(3, 8, 2, 64, page, torch.float32, 7)
    out = decode_attention(q, kp, vp, table, ctx, scale)
    ref = dense_reference(q, kp, vp, table, ctx, scale)
    assert (out.double().cpu() - ref).norm() / ref.norm() < 1e-5


BLOCK_EDGES = [1, 2, 16, 17, 64, 65, 128, 129]  # contexts at page and 64-token block boundaries


@pytest.mark.parametrize("b,h,kvh,d,rot,ctx", [(3, 4, 4, 64, 32, None), (2, 14, 2, 64, 64, None),
                                               (2, 8, 2, 64, 32, None), (1, 4, 1, 128, 128, None),
                                               (8, 8, 2, 64, 32, BLOCK_EDGES), (8, 4, 4, 64, 64, BLOCK_EDGES)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("blocks_per_split", [None, 8, 1])
def test_paged_decode_with_the_new_token_is_rotary_then_write_then_attention(b, h, kvh, d, rot, ctx, dtype,
                                                                              blocks_per_split):
    """The decode step's fused form: q and the step's k rotated (over `rot` features, by the rotary
    tables' entries at the row's position, rounded to the dtype as the torch path rounds its rows), k
    and v written into their slot (poisoned first, so a read before the write shows), then attention over the
    row's pages; against the torch path's three steps. Rows split over one block per program write
    the token from the split that holds it."""
    from slipstream.kernels.attention import apply_rotary, write_kv
    from slipstream.kernels.paged_decode import paged_decode_attention

    q, kp, vp, table, ctx, scale = random_case(b, h, kvh, d, 16, dtype, seed=rot, ctx=ctx)
    g = torch.Generator().manual_seed(d + h)
    kv = torch.randn(b, 2 * kvh + 1, d, generator=g).to(dtype).to(DEVICE)
    k, v = kv[:, 1:1 + kvh], kv[:, 1 + kvh:]  # strided views, as the models pass them
    # fp32 tables read at each row's last position; their values exact in `dtype` (the interpreter
    # truncates where the GPU rounds, so the rounding itself is left to the GPU model tests)
    angles = torch.rand(256, rot // 2, generator=g) * 6
    cos_table = torch.cat([angles.cos()] * 2, -1).to(dtype).float().to(DEVICE)
    sin_table = torch.cat([angles.sin()] * 2, -1).to(dtype).float().to(DEVICE)
    last = ctx - 1
    cos, sin = (t[last][:, None, :].to(dtype) for t in (cos_table, sin_table))  # the torch path's rows
    slots = table[torch.arange(b), last // 16] * 16 + last % 16
    ref_kp, ref_vp = kp.clone(), vp.clone()
    write_kv(ref_kp, ref_vp, apply_rotary(k.double(), cos.double(), sin.double()).to(dtype), v, slots)
    for pages in (kp, vp):
        pages.view(-1, kvh, d)[slots] = float("nan")
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, kp, vp, table, ctx, scale, out=out, new_token=(k, v, cos_table, sin_table, slots),
                           blocks_per_split=blocks_per_split)
    # bf16: 1.5%, as the interpreter truncates the rotated q and k where the GPU (and the reference) rounds
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    for got, want in ((kp, ref_kp), (vp, ref_vp)):
        assert ((got.double() - want.double()).norm() / want.double().norm()) < tol
    q_rot = apply_rotary(q.double(), cos.double(), sin.double()).to(dtype)
    ref = dense_reference(q_rot, ref_kp, ref_vp, table, ctx, scale)
    err = (out.double().cpu() - ref).norm() / ref.norm()
    assert torch.isfinite(out).all() and err < tol, err


@pytest.mark.parametrize("m,n,k", [(1, 48, 64), (5, 32, 192), (16, 40, 96), (33, 64, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias,act,residual", [(False, None, False), (True, "gelu_tanh", False), (True, "gelu", True),
                                              (True, None, True), (True, "swiglu", False), (False, "swiglu", True)])
@pytest.mark.parametrize("split_k", [1, 3])
def test_skinny_linear_matches_reference(m, n, k, dtype, bias, act, residual, split_k):
    """Uneven N and K exercise the masked tiles, a strided x (a column slice) the row stride, split-K
    (3 ranges, the last one short) the partial sums and the arrival counters; the second launch
    checks that the first left its counters reset."""
    from slipstream.kernels.linear import linear_reference
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    g = torch.Generator().manual_seed(m * 1000 + n + k)
    def mk(*shape):
        return (torch.randn(*shape, generator=g) / 4).to(dtype).to(DEVICE)

    n_out = n // 2 if act == "swiglu" else n
    x = mk(m, k + 8)[:, 8:]
    w, b, r = mk(n, k), mk(n) if bias else None, mk(m, n_out) if residual else None
    ref = linear_reference(x.double(), w.double(), None if b is None else b.double(), act,
                           None if r is None else r.double())
    for out_dtype in (None, torch.float32):
        out = torch.full((m, n_out), float("nan"), dtype=out_dtype or dtype, device=DEVICE)
        skinny_linear(x, w, b, act, r, config=Config(16, 32, 4, 1, split_k), out=out)
        err = (out.double() - ref).norm() / ref.norm()
        bf16_tol = 2e-2 if act == "swiglu" else 1e-2  # (SwiGLU rounds four times in bf16, as torch does)
        assert torch.isfinite(out).all() and err < (1e-5 if dtype == torch.float32 else bf16_tol), err


def test_linear_dispatch_agrees_with_reference_in_bf16():
    """The fused kernel rounds where torch rounds (after the GEMM, the activation, the residual add), so
    the two paths differ only by accumulation order."""
    from slipstream.kernels.linear import linear_reference
    from slipstream.kernels.skinny_gemm import skinny_linear

    g = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(*s, generator=g).to(torch.bfloat16).to(DEVICE) for s in ((4, 64), (32, 64), (32,), (4, 32)))
    got = skinny_linear(x, w, b, "gelu_tanh", r)
    want = linear_reference(x, w, b, "gelu_tanh", r)
    assert (got.float() - want.float()).abs().max() <= 2 * want.float().abs().max() * 2 ** -8


@pytest.mark.parametrize("rot", [64, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_in_place_matches_the_torch_rotary(rot, dtype):
    """The image prefix's rotary (all features, or Phi's first half): each token's heads of a strided
    view rotated in place at its position as apply_rotary rotates them; the buffer's other heads
    are left as they were."""
    from slipstream.kernels.attention import Rope, apply_rotary
    from slipstream.kernels.packed_attention import rotary_

    g = torch.Generator().manual_seed(rot)
    buf = torch.randn(37, 7, 64, generator=g).to(dtype)
    positions = torch.randint(0, 100, (37,), generator=g)
    angles = torch.arange(100)[:, None] * torch.rand(rot // 2, generator=g)[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    want = apply_rotary(buf[:, :5], *Rope(cos, sin, positions, dtype).rows)
    dev = buf.to(DEVICE)
    got = rotary_(dev[:, :5], cos.to(DEVICE), sin.to(DEVICE), positions.to(DEVICE))
    assert got.data_ptr() == dev.data_ptr()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dev[:, :5].cpu(), want, **tol)
    assert torch.equal(dev[:, 5:].cpu(), buf[:, 5:])


def lora_case(t: int, k: int, n: int, dtype: torch.dtype, seed: int):
    """Stacks of three adapters (ranks 16, 5 and 33 of width 48; past a rank, and in slot 0, zeros, as
    the bank keeps them: the decode kernels read a slot's whole width) and rows of each and of none,
    in random order."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(4, 48, k, generator=g) * 0.1).to(dtype)
    b = (torch.randn(4, n, 48, generator=g) * 0.1).to(dtype)
    ranks = torch.tensor([0, 16, 5, 33], dtype=torch.int32)
    for s, r in enumerate(ranks.tolist()):
        a[s, r:] = 0
        b[s, :, r:] = 0
    slots = torch.randint(0, 4, (t,), generator=g)
    slots[0] = 0
    return a, b, ranks, slots


def lora_delta_reference(x, a, b, ranks, slots) -> torch.Tensor:
    """float64 [T, N]: each row's (x @ A.T, rounded to x's dtype) @ B.T over its slot's rank."""
    delta = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    for i, s in enumerate(slots.tolist()):
        r = int(ranks[s])
        if s:
            v = (x[i].double().cpu() @ a[s, :r].double().T).to(x.dtype).double()
            delta[i] = v @ b[s, :, :r].double().T
    return delta


@pytest.mark.parametrize("m,n,k", [(5, 32, 192), (33, 64, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias,act,residual", [(True, None, False), (True, "gelu_tanh", False), (False, None, True),
                                              (True, "swiglu", False)])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("columns", [512, 64])
def test_skinny_linear_adds_each_rows_adapter_before_the_epilogue(m, n, k, dtype, bias, act, residual, split_k,
                                                                  columns, monkeypatch):
    """The decode form of an adapted projection: the shrink's launch, then the GEMM whose epilogue adds
    each row's delta before the bias, the activation (GELU from a column, SwiGLU over interleaved
    rows) and the residual, as an fp64 reference computes it; the slots' B in one product or, past
    `columns` rank columns, a product per slot. Rows without an adapter come out bit for bit as the
    GEMM without LoRA gives them, so a base-model row's tokens do not depend on its batch. The
    shrink's buffers start as NaN: no program reads what none wrote."""
    from slipstream.kernels import lora
    from slipstream.kernels.linear import _activate_reference
    from slipstream.kernels.lora import LoraDelta, shrink
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    monkeypatch.setattr(lora.torch, "empty", lambda *shape, **kw: torch.full(*shape, float("nan"), **kw))
    monkeypatch.setattr(lora, "ONE_PRODUCT_COLUMNS", columns)
    assert lora.one_product(3, 48) == (columns == 512)
    g = torch.Generator().manual_seed(m + n + k)
    def mk(*shape):
        return (torch.randn(*shape, generator=g) / 4).to(dtype)

    a, lb, ranks, slots = lora_case(m, k, n, dtype, m)
    x, w = mk(m, k + 8)[:, 8:], mk(n, k)
    bb, r = mk(n) if bias else None, mk(m, n // 2 if act == "swiglu" else n) if residual else None
    pre = x.double() @ w.double().T + lora_delta_reference(x, a, lb, ranks, slots) + (0 if bb is None else bb.double())
    want = _activate_reference(pre, act, 32) if act else pre
    want = want + r.double() if r is not None else want
    dev = [None if t is None else t.to(DEVICE) for t in (x, w, bb, r, a, lb, ranks, slots)]
    x, w, bb, r, a, lb, ranks, slots = dev
    delta = LoraDelta(shrink(x, a, ranks, slots), lb, ranks, slots)
    config = Config(16, 32, 4, 1, split_k)
    got = skinny_linear(x, w, bb, act, r, act_from=32, config=config, lora=delta)
    plain = skinny_linear(x, w, bb, act, r, act_from=32, config=config)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    err = (got.double().cpu() - want).norm() / want.norm()
    assert torch.isfinite(got).all() and err < tol, err
    base_rows = slots == 0
    assert torch.equal(got[base_rows], plain[base_rows])
    if act is None and not residual:  # deferred: the partials carry the delta, once
        partials = skinny_linear(x, w, config=config, defer=True, lora=delta)
        summed = partials.sum(0).double().cpu() + (0 if bb is None else bb.double().cpu())
        assert (summed - want).norm() / want.norm() < tol


@pytest.mark.parametrize("rows,d", [(1, 64), (7, 96), (32, 896)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kernel_matches_transformers_formula(rows, d, dtype):
    from slipstream.kernels.norm import rms_norm

    g = torch.Generator().manual_seed(rows + d)
    x = (torch.randn(rows, d + 16, generator=g) * 3).to(dtype).to(DEVICE)[:, 16:]  # strided rows
    w = torch.randn(d, generator=g).to(dtype).to(DEVICE)
    xf = x.float()
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    got = torch.full_like(want, float("nan"), dtype=dtype)
    rms_norm(x, w, 1e-6, out=got)
    err = (got.double() - want.double()).norm() / want.double().norm()
    assert got.dtype == dtype and err < (1e-6 if dtype == torch.float32 else 1e-2), err


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_deferred_sum_finished_by_the_norm_is_the_gemm_epilogue_bit_for_bit(split_k, bias, dtype):
    """linear.PendingSum: the GEMM leaves its split-K partials and the next RMSNorm sums them. The
    residual stream it writes equals the GEMM's own epilogue (same order, same roundings) exactly,
    and the norm equals rms_norm of it; the residual is left as it was. (The deferred path runs
    first, so no buffer it allocates can hold the expected values from an earlier call.)"""
    from slipstream.kernels.linear import PendingSum
    from slipstream.kernels.norm import add_rms_norm, rms_norm
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    g = torch.Generator().manual_seed(split_k)
    def mk(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)

    m, n, k = 5, 40, 96
    x, w, r, nw = mk(m, k), mk(n, k) / 4, mk(m, n), mk(n)
    b = mk(n) if bias else None
    config = Config(16, 32, 4, 1, split_k)
    before = r.clone()
    partials = skinny_linear(x, w, config=config, defer=True)
    assert partials.shape == (split_k, m, n) and partials.dtype == torch.float32
    total, normed = add_rms_norm(PendingSum(partials, b, r), nw, 1e-6)
    want = skinny_linear(x, w, b, residual=r, config=config)
    assert torch.equal(total, want) and torch.equal(r, before)
    assert torch.equal(normed, rms_norm(want, nw, 1e-6))


@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_norm_adds_the_gemm_befores_adapter_delta_and_shrinks_for_the_gemm_after(pending, dtype):
    """kernels.norm.rms_norm_shrink: a norm finishing a PendingSum whose GEMM left its adapter too
    (`lora_in_norm`: the shrink from that GEMM's grid) adds each row's delta to the partials before
    the bias, as the GEMM's epilogue would; and it computes the shrink of the projection after it
    (v = out @ A[slot].T, rounded),
    which the skinny GEMM then expands: together, the fp64 reference of both adapted projections.
    Rows without an adapter are the plain norm's, bit for bit."""
    from slipstream.kernels.linear import LoraShrunk, PendingSum
    from slipstream.kernels.lora import LoraWeights
    from slipstream.kernels.norm import add_rms_norm, rms_norm, rms_norm_shrink
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    m, k, d, n = 9, 80, 96, 40
    g = torch.Generator().manual_seed(7)
    a0, b0, ranks, slots = lora_case(m, k, d, dtype, 1)  # (the GEMM before: x [m, k] -> [m, d])
    a1, b1, _, _ = lora_case(m, d, n, dtype, 2)  # (the GEMM after: [m, d] -> [m, n])
    x = torch.randn(m, k, generator=g).to(dtype)
    w0 = (torch.randn(d, k, generator=g) / 4).to(dtype)
    bias, r = torch.randn(d, generator=g).to(dtype), torch.randn(m, d, generator=g).to(dtype)
    nw, w1 = torch.randn(d, generator=g).to(dtype), (torch.randn(n, d, generator=g) / 4).to(dtype)
    on = [t.to(DEVICE) for t in (x, w0, bias, r, nw, w1, a0, b0, a1, b1, ranks, slots)]
    dx, dw0, dbias, dr, dnw, dw1, da0, db0, da1, db1, dranks, dslots = on
    config = Config(16, 32, 4, 1, 2)
    if pending:  # (what linear(..., defer=True, lora=, lora_in_norm=True) leaves where the skinny GEMM runs)
        adapter = LoraWeights(da0, db0, dranks, dslots)
        partials, parts = skinny_linear(dx, dw0, config=config, defer=True, shrink=adapter)
        before = PendingSum(partials, dbias, dr, LoraShrunk(parts, adapter))
    else:
        before = dr
    total, normed, delta = rms_norm_shrink(before, dnw, 1e-6, LoraWeights(da1, db1, dranks, dslots))
    out = skinny_linear(normed, dw1, lora=delta)

    want_total = r.double()
    if pending:
        want_total = r.double() + (x.double() @ w0.double().T + lora_delta_reference(x, a0, b0, ranks, slots)
                                   + bias.double())
    tf = want_total.float()
    want_normed = nw.double() * (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype).double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = (total.double().cpu() - want_total).norm() / want_total.norm()
    assert err < tol, err
    err = (normed.double().cpu() - want_normed).norm() / want_normed.norm()
    assert err < tol, err
    want = normed.double().cpu() @ w1.double().T + lora_delta_reference(normed.cpu(), a1, b1, ranks, slots)
    assert (out.double().cpu() - want).norm() / want.norm() < tol
    plain = slots == 0
    if pending:
        ref_total, ref_normed = add_rms_norm(PendingSum(skinny_linear(dx, dw0, config=config, defer=True), dbias, dr),
                                             dnw, 1e-6)
    else:
        ref_total, ref_normed = dr, rms_norm(dr, dnw, 1e-6)
    assert torch.equal(total[plain], ref_total[plain]) and torch.equal(normed[plain], ref_normed[plain])


@pytest.mark.parametrize("adapters", [1, 3])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("block_n", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_deferred_gemms_grid_shrinks_for_every_slot_and_the_norm_after_it_adds_the_delta(block_n, split_k, dtype,
                                                                                          adapters):
    """linear.LoraShrunk: a deferred GEMM's extra column tiles multiply its rows by every slot's A
    (each row by every slot: [splits, rows, slots * width] partials, the last tile short of its
    columns at 3 adapters of width 48 in tiles of 32); the RMSNorm that finishes its sum takes each
    row's slot's columns, sums them in split order, rounds v and adds the delta: the fp64 reference
    of the adapted projection, for inputs wider than the norm's row (a down projection). Rows
    without an adapter are the plain path's, bit for bit."""
    from slipstream.kernels.linear import LoraShrunk, PendingSum
    from slipstream.kernels.lora import LoraWeights
    from slipstream.kernels.norm import add_rms_norm
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    m, d, inter = 9, 64, 160
    g = torch.Generator().manual_seed(3)
    a, b, ranks, slots = lora_case(m, inter, d, dtype, 4)
    a, b, ranks, slots = a[:adapters + 1], b[:adapters + 1], ranks[:adapters + 1], slots.clamp(max=adapters)
    h = torch.randn(m, inter, generator=g).to(dtype)
    w = (torch.randn(d, inter, generator=g) / 4).to(dtype)
    r, nw = torch.randn(m, d, generator=g).to(dtype), torch.randn(d, generator=g).to(dtype)
    dh, dw, dr, dnw, da, db, dranks, dslots = (t.to(DEVICE) for t in (h, w, r, nw, a, b, ranks, slots))
    down = LoraWeights(da, db, dranks, dslots)
    config = Config(block_n, 32, 4, 1, split_k)
    partials, parts = skinny_linear(dh, dw, defer=True, shrink=down, config=config)
    assert parts.shape == (split_k, m, adapters * 48)
    assert torch.equal(partials, skinny_linear(dh, dw, defer=True, config=config))
    every_slot = h.double() @ a[1:].flatten(0, 1).double().T
    assert torch.allclose(parts.sum(0).double().cpu(), every_slot, rtol=1e-3, atol=1e-3)
    total, _ = add_rms_norm(PendingSum(partials, None, dr, LoraShrunk(parts, down)), dnw, 1e-6)
    want = r.double() + h.double() @ w.double().T + lora_delta_reference(h, a, b, ranks, slots)
    err = (total.double().cpu() - want).norm() / want.norm()
    assert err < (1e-5 if dtype == torch.float32 else 2e-2), err
    plain_total, _ = add_rms_norm(PendingSum(partials, None, dr), dnw, 1e-6)
    assert torch.equal(total[slots == 0], plain_total[slots == 0])


@pytest.mark.parametrize("split_k", [1, 2])
def test_skinny_linear_activation_from_a_column_into_a_wider_buffer(split_k):
    """Phi's fused [qkv; fc1] GEMM: GELU only on the columns from `act_from`, written into the left part
    of a wider activation buffer whose other columns stay untouched."""
    from slipstream.kernels.linear import linear_reference
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    g = torch.Generator().manual_seed(split_k)
    x, w, b = (torch.randn(*s, generator=g).to(DEVICE) for s in ((3, 64), (48, 64), (48,)))
    buf = torch.full((3, 48 + 16), float("nan"), device=DEVICE)
    skinny_linear(x, w, b, "gelu_tanh", act_from=32, out=buf[:, :48], config=Config(16, 32, 4, 1, split_k))
    ref = linear_reference(x.double(), w.double(), b.double(), "gelu_tanh", act_from=32)
    assert torch.allclose(buf[:, :32].double(), ref[:, :32], atol=1e-5)  # no activation on the first 32
    assert torch.allclose(buf[:, 32:48].double(), ref[:, 32:], atol=1e-5)
    assert torch.isnan(buf[:, 48:]).all()


@pytest.mark.parametrize("rows,d", [(1, 64), (5, 2048)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_kernel_matches_torch(rows, d, dtype):
    from slipstream.kernels.norm import layer_norm

    g = torch.Generator().manual_seed(rows + d)
    x = (torch.randn(rows, d + 8, generator=g) * 3 + 1).to(dtype).to(DEVICE)[:, 8:]
    w, b = (torch.randn(d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    want = torch.nn.functional.layer_norm(x.double(), (d,), w.double(), b.double(), 1e-5)
    got = torch.full((rows, d), float("nan"), dtype=dtype, device=DEVICE)
    layer_norm(x, w, b, 1e-5, out=got)
    err = (got.double() - want).norm() / want.norm()
    assert err < (1e-6 if dtype == torch.float32 else 1e-2), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layer_norm_is_torchs_add_then_norm(dtype):
    from slipstream.kernels.norm import add_layer_norm

    g = torch.Generator().manual_seed(3)
    x, delta = ((torch.randn(9, 1152, generator=g) * 3).to(dtype).to(DEVICE) for _ in range(2))
    w, b = (torch.randn(1152, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    total, normed = add_layer_norm(x, delta, w, b, 1e-5)
    if DEVICE == "cuda":
        assert torch.equal(total, x + delta)
    else:  # (the interpreter rounds to bf16 toward zero, the GPU to nearest even)
        assert torch.allclose(total.float(), (x + delta).float(), rtol=2 ** -7, atol=0)
    want = torch.nn.functional.layer_norm((x + delta).double(), (1152,), w.double(), b.double(), 1e-5)
    err = (normed.double() - want).norm() / want.norm()
    assert err < (1e-6 if dtype == torch.float32 else 1e-2), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pending_bias_layer_norm_is_torchs_bias_add_then_norm(dtype):
    """A PendingSum without partials (a Phi wide step's output bias left to the next norm): the
    residual stream written out is residual + bias as torch adds them, and its norm beside it."""
    from slipstream.kernels.linear import PendingSum
    from slipstream.kernels.norm import pending_layer_norm

    g = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 1152, generator=g) * 3).to(dtype).to(DEVICE)
    w, b, bias = (torch.randn(1152, generator=g).to(dtype).to(DEVICE) for _ in range(3))
    total, normed = pending_layer_norm(PendingSum(None, bias, x), w, b, 1e-5)
    if DEVICE == "cuda":
        assert torch.equal(total, x + bias)
    else:  # (the interpreter rounds to bf16 toward zero, the GPU to nearest even)
        assert torch.allclose(total.float(), (x + bias).float(), rtol=2 ** -7, atol=0)
    want = torch.nn.functional.layer_norm((x + bias).double(), (1152,), w.double(), b.double(), 1e-5)
    assert (normed.double() - want).norm() / want.norm() < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("masked", [False, True])
def test_fused_sample_matches_the_torch_sampler(masked):
    """Greedy and tempered rows side by side over a vocabulary of three chunks: the kernel's token is
    the torch path's (bitmask, argmax, Gumbel noise from the same counter hash); the second launch
    checks that the first left its arrival counters reset."""
    from slipstream.kernels.sample import CHUNK, fused_sample
    from slipstream.sampling import sample_reference

    rows, vocab = 6, 2 * CHUNK + 1234
    g = torch.Generator().manual_seed(int(masked))
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(DEVICE)
    words = torch.randint(-2**31, 2**31 - 1, (rows, -(-vocab // 32)), generator=g, dtype=torch.int32).to(DEVICE)
    mask = words if masked else None
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.0, 1.5, 0.3], dtype=torch.float64, device=DEVICE)
    seeds = torch.randint(0, 2**63 - 1, (rows,), generator=g).to(DEVICE)
    token_index = torch.arange(rows, device=DEVICE) * 5
    want = sample_reference(logits, mask, temperature, seeds, token_index)
    for _ in range(2):
        out = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
        fused_sample(logits, mask, temperature, seeds, token_index, out=out)
        assert out.tolist() == want.tolist()
    greedy = fused_sample(logits, mask, torch.zeros_like(temperature), None)
    assert greedy.tolist() == sample_reference(logits, mask, temperature, None).tolist()


@pytest.mark.parametrize("masked", [False, True])
def test_fused_sample_with_filters_matches_the_torch_sampler(masked):
    """top-k, top-p and min-p, alone and together, on tempered and greedy rows: the kernel's draw
    is the torch path's (sort, softmax, cumulative mass, then Gumbel-max over the kept tokens) for
    several keys, over a vocabulary of three chunks, including top-k 1 (the most likely token) and
    filters so tight the unfiltered winner is almost never kept (the kernel then walks its
    candidates up, skipping blocks of lower logits)."""
    from slipstream.kernels.sample import CHUNK, fused_sample
    from slipstream.sampling import sample_reference

    rows, vocab = 9, 2 * CHUNK + 1234
    g = torch.Generator().manual_seed(7 + int(masked))
    logits = (torch.randn(rows, vocab, generator=g) * 2).to(DEVICE)
    words = torch.randint(-2**31, 2**31 - 1, (rows, -(-vocab // 32)), generator=g, dtype=torch.int32).to(DEVICE)
    temperature = torch.tensor([0.8, 1.0, 1.5, 0.7, 1.2, 1.0, 0.0, 2.0, 1.0], dtype=torch.float64, device=DEVICE)
    filters = (torch.tensor([0, 5, 0, 0, 50, 1, 5, 0, 0], device=DEVICE),
               torch.tensor([1.0, 1.0, 0.5, 1.0, 0.9, 1.0, 1.0, 0.99, 0.3], dtype=torch.float64, device=DEVICE),
               torch.tensor([0.0, 0.0, 0.0, 0.1, 0.05, 0.0, 0.0, 0.0, 0.2], dtype=torch.float64, device=DEVICE))
    mask = words if masked else None
    for trial in range(3):
        seeds = torch.randint(0, 2**63 - 1, (rows,), generator=g).to(DEVICE)
        token_index = torch.arange(rows, device=DEVICE) + trial
        want = sample_reference(logits, mask, temperature, seeds, token_index, filters)
        out = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
        fused_sample(logits, mask, temperature, seeds, token_index, out=out, filters=filters)
        assert out.tolist() == want.tolist()


def test_fused_sample_with_filters_ends_on_non_finite_logits():
    """NaN or infinite logits (a broken model) give some token under filters rather than a walk
    that never ends; a finite row beside them is unaffected."""
    from slipstream.kernels.sample import fused_sample

    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    logits[0] = float("nan")
    logits[1, 17] = float("inf")
    logits[2, ::2] = float("nan")
    ones = torch.ones(4, dtype=torch.float64, device=DEVICE)  # temperature 1; scaled for top-p and min-p
    seeds, index = torch.arange(4, device=DEVICE), torch.zeros(4, dtype=torch.int64, device=DEVICE)
    filters = (torch.full((4,), 5, device=DEVICE), ones * 0.5, ones * 0.1)
    tokens = fused_sample(logits, None, ones, seeds, index, filters=filters)
    assert tokens.shape == (4,) and bool(((tokens >= 0) & (tokens < 3000)).all())
    assert int(tokens[3]) in logits[3].topk(5).indices.tolist()


def test_fused_sample_breaks_ties_and_empty_masks_like_torch_argmax():
    """Equal maxima in different chunks give the lowest index; a row whose mask allows nothing gives 0."""
    from slipstream.kernels.sample import CHUNK, fused_sample

    vocab = 2 * CHUNK + 5
    logits = torch.zeros(3, vocab, device=DEVICE)
    logits[0, [CHUNK + 7, 3, 2 * CHUNK + 1]] = 2.0
    logits[1, [2 * CHUNK + 4, CHUNK]] = 1.0
    words = torch.full((3, -(-vocab // 32)), -1, dtype=torch.int32, device=DEVICE)
    words[2] = 0
    tokens = fused_sample(logits, words, torch.zeros(3, device=DEVICE), None)
    assert tokens.tolist() == [3, CHUNK, 0] == logits.masked_fill(words[:, :1] == 0, float("-inf")).argmax(-1).tolist()


def packed_case(chunks, h, kvh, d, page, dtype, seed, rot):
    """Sequences with (chunk tokens, context) each, their pages scattered; the chunk's K/V not yet
    stored (returned beside the pages with each token's slot and position)."""
    g = torch.Generator().manual_seed(seed)
    widths = [math.ceil(ctx / page) for _, ctx in chunks]
    order = (torch.randperm(sum(widths), generator=g) + 1).tolist()
    table = torch.zeros(len(chunks), max(widths), dtype=torch.int64)
    for s, w in enumerate(widths):
        table[s, :w] = torch.tensor(order[:w])
        del order[:w]
    tokens = sum(n for n, _ in chunks)

    def mk(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    kp, vp = mk(sum(widths) + 1, page, kvh, d), mk(sum(widths) + 1, page, kvh, d)
    positions = torch.tensor([p for n, ctx in chunks for p in range(ctx - n, ctx)])
    seq_of = torch.tensor([s for s, (n, _) in enumerate(chunks) for _ in range(n)])
    slots = table[seq_of, positions // page] * page + positions % page
    angles = torch.rand(1100, rot // 2, generator=g) * 6
    cos_table = torch.cat([angles.cos()] * 2, -1).to(dtype).float()  # values exact in dtype (see above)
    sin_table = torch.cat([angles.sin()] * 2, -1).to(dtype).float()
    query_start = torch.tensor([0] + [n for n, _ in chunks]).cumsum(0)
    return dict(q=mk(tokens, h, d), k=mk(tokens, kvh, d), v=mk(tokens, kvh, d), kp=kp, vp=vp, table=table,
                positions=positions, slots=slots, cos=cos_table, sin=sin_table, query_start=query_start,
                ctx=torch.tensor([ctx for _, ctx in chunks]))


# (chunk tokens, context): whole prompts, later chunks of a prompt on and off page and block edges,
# decode rows (chunks of one token), and chunks longer than a program's block of tokens
PACKED_CHUNKS = [[(5, 5), (1, 40), (17, 17), (16, 48), (1, 1), (70, 135)],
                 [(64, 64), (33, 97), (1, 129), (9, 200)]]
LONG_CHUNKS = [(1, 390), (1, 40), (3, 3), (40, 700)]  # decode rows first; tiles past MIN_SPLIT_BLOCKS key blocks


@pytest.mark.parametrize("h,kvh,d,rot", [(4, 4, 64, 32), (14, 2, 64, 64), (8, 2, 32, 32), (4, 1, 128, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunks,padding,parallel", [(c, p, 1) for c in PACKED_CHUNKS for p in (0, 11)]
                         + [(LONG_CHUNKS, 0, 1), (LONG_CHUNKS, 5, 1 << 20)])
def test_packed_attention_is_rotary_then_write_then_causal_attention_over_the_pages(h, kvh, d, rot, dtype, chunks,
                                                                                     padding, parallel):
    """packed_step (store_kv, the decode kernel over the leading decode rows, packed_attention over
    the chunks after them) against the torch path (rotary, write_kv, the reference over the pages)
    and float64 dense attention; the chunk's slots are poisoned first, so attention that reads a key
    before store_kv wrote it shows. The decode kernel's launch spans two rows past the decode rows,
    which it must leave to the packed kernel. Padding tokens after the last chunk get zeros. With
    `parallel` (tiles the GPU runs at once) huge the planner splits every tile past MIN_SPLIT_BLOCKS
    key blocks over programs whose partials the last to arrive merges; with it 1 nothing splits."""
    from slipstream.kernels.attention import (AttentionInputs, Rope, apply_rotary, packed_attention_reference,
                                              program_list, write_kv)
    from slipstream.kernels.packed_attention import packed_step

    c = packed_case(chunks, h, kvh, d, 16, dtype, seed=h + d, rot=rot)
    pad = lambda x: torch.cat([x, x[:1].expand(padding, *x.shape[1:])]) if padding else x
    q, k, v = (pad(c[n]).to(DEVICE) for n in "qkv")
    positions, slots = pad(c["positions"]).to(DEVICE), pad(c["slots"]).to(DEVICE)
    kp, vp = c["kp"].clone().to(DEVICE), c["vp"].clone().to(DEVICE)
    for pages in (kp, vp):
        pages.view(-1, kvh, d)[slots] = float("nan")
    cos, sin = c["cos"].to(DEVICE), c["sin"].to(DEVICE)
    lens, ends = np.array([n for n, _ in chunks]), c["ctx"].numpy()
    decode = next(i for i, n in enumerate(lens) if n > 1)
    plan = torch.tensor(program_list(lens[decode:], ends[decode:], q.shape[0], h, kvh, parallel, decode))
    assert (plan[4] >= 0).any() == (parallel > 1 and max(ctx for _, ctx in chunks[decode:]) > 256)
    decode_lens = torch.tensor(list(ends[:decode]) + [0, 0])
    attn = AttentionInputs(slots, c["table"].to(DEVICE), c["ctx"].to(DEVICE), c["query_start"].to(DEVICE),
                           plan.to(DEVICE), decode_lens.to(DEVICE))
    out = torch.full_like(q, float("nan"))
    packed_step(q, k, v, Rope(cos, sin, positions, dtype), attn, (kp, vp), d ** -0.5, out)

    real = len(c["positions"])
    ref_kp, ref_vp = c["kp"].clone(), c["vp"].clone()
    cos_r, sin_r = (t[c["positions"]][:, None, :].to(dtype).double() for t in (c["cos"], c["sin"]))
    write_kv(ref_kp, ref_vp, apply_rotary(c["k"].double(), cos_r, sin_r).to(dtype), c["v"], c["slots"])
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    for got, want in ((kp, ref_kp), (vp, ref_vp)):
        assert ((got.double().cpu() - want.double()).norm() / want.double().norm()) < tol
    q_rot = apply_rotary(c["q"].double(), cos_r, sin_r).to(dtype)
    host_lens = [(n, ctx) for n, ctx in chunks]
    ref = packed_attention_reference(q_rot.double(), ref_kp.double(), ref_vp.double(), c["table"], host_lens,
                                     d ** -0.5)
    got = out[:real].double().cpu()
    assert torch.isfinite(got).all()
    assert (got - ref).norm() / ref.norm() < (1e-5 if dtype == torch.float32 else 2e-2)
    assert (out[real:] == 0).all()


def test_reference_packed_attention_is_each_token_attending_up_to_its_position():
    """The torch path against float64 dense attention, one query token at a time (its context ends
    at its own position); padding tokens after the last chunk, and a step of padding alone, get zeros."""
    from slipstream.kernels.attention import packed_attention_reference

    chunks = PACKED_CHUNKS[0]
    c = packed_case(chunks, 8, 2, 32, 16, torch.float32, seed=5, rot=32)
    real = len(c["positions"])
    q = torch.cat([c["q"], torch.randn(7, 8, 32)])
    out = packed_attention_reference(q, c["kp"], c["vp"], c["table"], chunks, 0.2)
    seq_of = torch.tensor([s for s, (n, _) in enumerate(chunks) for _ in range(n)])
    ref = dense_reference(c["q"], c["kp"], c["vp"], c["table"][seq_of], c["positions"] + 1, 0.2)
    assert (out[:real].double() - ref).norm() / ref.norm() < 1e-5
    assert (out[real:] == 0).all()
    assert (packed_attention_reference(q, c["kp"], c["vp"], c["table"], [], 0.2) == 0).all()


@pytest.mark.parametrize("seed", range(40))
def test_packed_plan_covers_every_tile_key_block_once_and_splits_only_long_tiles(seed):
    """plan_programs on random steps (chunks of long prompts and of one token after the decode rows,
    which the plan leaves to the decode kernel; padding): each tile's key blocks up to its last
    token's position are walked by exactly one program; a tile is split only where it walks more
    blocks than the split size; all of a tile's splits name the same first partial and count,
    partials are numbered densely below the capacity, and padding programs follow the real tokens."""
    from slipstream.kernels.attention import (KEY_BLOCK, program_list, split_blocks, split_capacity,
                                              tokens_per_program)

    rng = np.random.default_rng(seed)
    n, decode = int(rng.integers(1, 12)), int(rng.integers(0, 4))
    lens = np.where(rng.random(n) < 0.3, 1, rng.integers(1, 600, n))
    contexts = lens + rng.integers(0, 3000, n)
    heads, kv_heads = [(14, 2), (32, 32), (8, 8), (16, 2)][seed % 4]
    per_program, parallel = tokens_per_program(heads // kv_heads), int(rng.choice([1, 20, 500]))
    tokens = decode + int(lens.sum() + rng.integers(0, 40))
    plan = program_list(lens, contexts, tokens, heads, kv_heads, parallel, decode)
    seq, first, begin, end, part, first_part, count = plan
    real = seq >= 0
    walked: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for p in np.flatnonzero(real):
        walked.setdefault((seq[p] - decode, first[p]), []).append((begin[p], end[p]))
    tiles = [(s, f) for s in range(n) for f in range(0, lens[s], per_program)]
    assert sorted(walked) == tiles
    blocks = {(s, f): -(-min(contexts[s], contexts[s] - lens[s] + f + per_program) // KEY_BLOCK) for s, f in tiles}
    per = split_blocks(np.array(list(blocks.values())), parallel, split_capacity(kv_heads))
    for tile, spans in walked.items():
        assert [b for a, z in sorted(spans) for b in range(a, z)] == list(range(blocks[tile]))
        assert len(spans) == (1 if blocks[tile] <= per else -(-blocks[tile] // per))
    split = real & (part >= 0)
    assert sorted(part[split]) == list(range(int(split.sum()))) and split.sum() <= split_capacity(kv_heads)
    for p in np.flatnonzero(split):
        mates = split & (seq == seq[p]) & (first == first[p])
        assert (first_part[mates] == part[mates].min()).all() and (count[mates] == mates.sum()).all()
    pad_first = first[~real & (first >= 0)]
    assert list(pad_first) == list(range(decode + int(lens.sum()), tokens, per_program))


@pytest.mark.parametrize("rows,n", [(3, 40), (70, 1100)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_kernel_is_silu_of_gate_times_up_over_interleaved_columns(rows, n, dtype):
    """The prefill steps' SwiGLU after cuBLAS: what the torch path computes (up to the exp's last bit,
    which may flip a bf16 rounding; the CPU interpreter truncates where the GPU rounds), from a
    strided view (a GEMM output's rows), across a partial column block."""
    from slipstream.kernels.activation import swiglu
    from slipstream.kernels.linear import interleave_gate_up

    g = torch.Generator().manual_seed(rows)
    gate, up = torch.randn(2, rows, n, generator=g).to(dtype) * 3
    wide = torch.randn(rows, 2 * n + 5, generator=g).to(dtype)
    wide[:, : 2 * n] = interleave_gate_up(gate.T, up.T).T  # columns g0, u0, g1, u1, ...
    out = swiglu(wide.to(DEVICE)[:, : 2 * n])
    want = torch.nn.functional.silu(gate) * up
    bf16_tol = 8e-3 if DEVICE == "cuda" else 2e-2
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5 if dtype == torch.float32 else bf16_tol, atol=1e-5)


@pytest.mark.parametrize("rows,n,act_from", [(3, 40, 0), (70, 1100, 300)])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_columns_kernel_is_gelu_of_the_trailing_columns_into_a_strided_buffer(rows, n, act_from, act, dtype):
    """Phi's prefill GELU after cuBLAS: the columns from act_from on are torch's GELU (up to the
    exp/erf's last bit, which may flip a bf16 rounding), the others copied, written into a view of
    a wider buffer whose other columns stay untouched, across a partial column block."""
    from slipstream.kernels.activation import gelu_columns

    g = torch.Generator().manual_seed(rows + n)
    y = (torch.randn(rows, n, generator=g) * 3).to(dtype)
    wide = torch.full((rows, n + 7), 5.0, dtype=dtype, device=DEVICE)
    gelu_columns(y.to(DEVICE), act, act_from, out=wide[:, :n])
    want = y.clone()
    want[:, act_from:] = torch.nn.functional.gelu(y[:, act_from:], approximate="tanh" if act == "gelu_tanh" else "none")
    bf16_tol = 8e-3 if DEVICE == "cuda" else 2e-2
    torch.testing.assert_close(wide[:, :n].cpu(), want, rtol=1e-5 if dtype == torch.float32 else bf16_tol, atol=1e-5)
    assert (wide[:, n:] == 5).all()


@pytest.mark.parametrize("t,k,n", [(5, 64, 96), (70, 100, 300), (3, 1000, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_kernels_add_each_rows_adapter_and_leave_rows_without_one(t, k, n, dtype, monkeypatch):
    """Rows of three adapters (ranks 16, 5 and 33 of stacks sized 48) and rows of none, in any
    order, x a strided view, the features split over programs or not: the shrink and expand add
    what the torch reference adds, over each slot's own rank, and rows of slot 0 are left as
    they were; given a base, the output is base + delta and the base is untouched. The partials
    buffer starts as NaN: no program reads a part of it that none wrote."""
    from slipstream.kernels import lora
    from slipstream.kernels.lora import feature_split, lora_add_reference, lora_add_triton

    monkeypatch.setattr(lora.torch, "empty", lambda *shape, **kw: torch.full(*shape, float("nan"), **kw))

    a, b, ranks, slots = lora_case(t, k, n, dtype, t)
    g = torch.Generator().manual_seed(t + 1)
    wide = torch.randn(t, k + 9, generator=g).to(dtype)
    base = torch.randn(t, n, generator=g).to(dtype)
    want = lora_add_reference(base.clone(), wide[:, :k], a, b, ranks, slots)
    dev = [tensor.to(DEVICE) for tensor in (wide, a, b, ranks, slots, base)]
    got = lora_add_triton(dev[5].clone(), dev[0][:, :k], *dev[1:5]).cpu()
    into = torch.full_like(dev[5], 7.0)
    got_into = lora_add_triton(into, dev[0][:, :k], *dev[1:5], base=dev[5]).cpu()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got_into, want, **tol)
    assert torch.equal(got[slots == 0], base[slots == 0]) and torch.equal(got_into[slots == 0], base[slots == 0])
    assert torch.equal(dev[5].cpu(), base)
    assert not torch.isnan(got).any()
    if k == 1000:
        assert feature_split(t, k, 3) < k  # (a few rows: the features are split)
