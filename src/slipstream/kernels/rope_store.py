"""Triton: rotary embedding of q and k plus the KV-cache write, in one launch for a decode step.

The plain path spends ~8 small kernels per layer on this (slices, a negation, two concatenations,
multiplies, two index_copy writes); here one program per (token, head) loads its head once,
rotates it (rotate-half layout over the first `rotary_dim` features, in fp32) and stores it: q
heads into a fresh q tensor, k heads (rotated) and v heads into their page slots."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args


@triton.jit
def _rope_store_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, k_pages_ptr, v_pages_ptr, slot_ptr,
                       stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct,
                       stride_ot, stride_oh, stride_ps, stride_ph,
                       NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROT: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0)
    head = tl.program_id(1)
    if PDL:  # everything it reads comes from earlier kernels (see skinny_gemm)
        tl.extra.cuda.gdc_wait()
    i = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = ROT // 2
    rotated = i < ROT
    partner = tl.where(i < half, i + half, i - half)
    sign = tl.where(i < half, -1.0, 1.0)
    if PDL:  # (programs are tiny: let the next kernel launch once all have started)
        tl.extra.cuda.gdc_launch_dependents()
    cos = tl.load(cos_ptr + t * stride_ct + i, mask=rotated, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_ct + i, mask=rotated, other=0.0).to(tl.float32)
    if head < NUM_Q_HEADS:
        src = q_ptr + t * stride_qt + head * stride_qh
        x = tl.load(src + i).to(tl.float32)
        xp = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
        out = tl.where(rotated, x * cos + sign * xp * sin, x)
        tl.store(q_out_ptr + t * stride_ot + head * stride_oh + i, out.to(q_out_ptr.dtype.element_ty))
    else:
        kv_head = head - NUM_Q_HEADS
        slot = tl.load(slot_ptr + t).to(tl.int64)
        src = k_ptr + t * stride_kt + kv_head * stride_kh
        x = tl.load(src + i).to(tl.float32)
        xp = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
        out = tl.where(rotated, x * cos + sign * xp * sin, x)
        dst = slot * stride_ps + kv_head * stride_ph + i
        tl.store(k_pages_ptr + dst, out.to(k_pages_ptr.dtype.element_ty))
        v = tl.load(v_ptr + t * stride_vt + kv_head * stride_vh + i)
        tl.store(v_pages_ptr + dst, v.to(v_pages_ptr.dtype.element_ty))


def supported(head_dim: int) -> bool:
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def rope_and_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_pages: torch.Tensor, v_pages: torch.Tensor, slot_mapping: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D] (any token/head strides, contiguous features); cos/sin [T, ..., ROT];
    pages [num_pages, page_size, KVH, D]. Writes rotated k and v at `slot_mapping`; returns rotated q."""
    t, h, d = q.shape
    kvh = k.shape[1]
    rot = cos.shape[-1]
    cos2, sin2 = cos.reshape(t, rot), sin.reshape(t, rot)
    kp, vp = k_pages.view(-1, kvh, d), v_pages.view(-1, kvh, d)
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device) if out is None else out
    _rope_store_kernel[(t, h + kvh)](
        q, k, v, cos2, sin2, out, kp, vp, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos2.stride(0),
        out.stride(0), out.stride(1), kp.stride(0), kp.stride(1),
        NUM_Q_HEADS=h, HEAD_DIM=d, ROT=rot, **pdl_args())
    return out
