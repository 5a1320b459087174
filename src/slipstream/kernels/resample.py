"""Triton: Pillow's 8-bit separable resampling along one axis, bit for bit, from its integer taps.

A plan (models.moondream.image.resize_plan) gives each output sample its taps: the input index and
a fixed-point weight (22 fraction bits). Each output byte is Pillow's clip8 of one half plus the
taps' sum: the sum an int32 (every partial sum of 8-bit samples by those weights stays below 2^31),
shifted down, clamped to a byte. One launch a pass over strided uint8 views, so an image's crops
(two resizes of two passes, then the tiles) are a handful of launches where the float64 matrix
products (the torch reference, image.resize) took ~51, ~1.9 ms of the loop thread's time at one
md2-query client on the H200's host (docs/benchmarks.md, run e)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

PRECISION_BITS = 22
BLOCK_LINES, BLOCK_OUT = 32, 128


@triton.jit
def _resample_kernel(src_ptr, dst_ptr, plan_ptr, LINES, OUT, TAPS, s_c, s_line, s_pos, d_c, d_line, d_pos,
                     PRECISION: tl.constexpr, BLOCK_LINES: tl.constexpr, BLOCK_OUT: tl.constexpr):
    lines = tl.program_id(0) * BLOCK_LINES + tl.arange(0, BLOCK_LINES)
    outs = tl.program_id(1) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    c = tl.program_id(2)
    line_ok, out_ok = lines < LINES, outs < OUT
    acc = tl.full([BLOCK_LINES, BLOCK_OUT], 1 << (PRECISION - 1), tl.int32)
    for t in range(TAPS):
        index = tl.load(plan_ptr + outs * TAPS + t, mask=out_ok, other=0)
        weight = tl.load(plan_ptr + OUT * TAPS + outs * TAPS + t, mask=out_ok, other=0).to(tl.int32)
        sample = tl.load(src_ptr + c * s_c + lines[:, None] * s_line + index[None, :] * s_pos,
                         mask=line_ok[:, None] & out_ok[None, :], other=0)
        acc += sample.to(tl.int32) * weight[None, :]
    byte = tl.minimum(tl.maximum(acc >> PRECISION, 0), 255)  # (an arithmetic shift: the floor, as Pillow's clip8)
    tl.store(dst_ptr + c * d_c + lines[:, None] * d_line + outs[None, :] * d_pos, byte.to(tl.uint8),
             mask=line_ok[:, None] & out_ok[None, :])


def resample(src: torch.Tensor, plan: torch.Tensor, dst: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [C, lines, n] (any strides) -> [C, lines, out] along the last axis by `plan` (int64 [2,
    out, taps]: each output's input indices, then their weights), into `dst` (any strides) if given.
    A pass along another axis is this on a transposed view."""
    channels, lines, _ = src.shape
    out, taps = plan.shape[1], plan.shape[2]
    if dst is None:
        dst = torch.empty(channels, lines, out, dtype=torch.uint8, device=src.device)
    grid = (triton.cdiv(lines, BLOCK_LINES), triton.cdiv(out, BLOCK_OUT), channels)
    _resample_kernel[grid](src, dst, plan.contiguous(), lines, out, taps, *src.stride(), *dst.stride(),
                           PRECISION=PRECISION_BITS, BLOCK_LINES=BLOCK_LINES, BLOCK_OUT=BLOCK_OUT, num_warps=4)
    return dst
