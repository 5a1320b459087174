"""Triton: one token per row from fp32 logits in one pass — the grammar bitmask applied, greedy
argmax, and for rows with a temperature the Gumbel-max draw argmax(logits / T + noise), the noise
hashed in registers from (seed, token index, vocab id) exactly as `sampling.gumbel_noise` does
(the row's key too, so a sampled step costs no kernel besides this one).

The torch path materializes the expanded mask, the tempered logits and five [rows, vocab] int64
tensors of hash state per step (tens of kernels over 5-20 MB each at decode batch sizes); this
reads the logits and the packed mask once. Program (row, chunk) reduces one chunk of the
vocabulary to its best (value, index) pairs; the last chunk of a row to arrive (`arrival_counters`)
merges them in chunk order, keeping the lowest index among equal values as
torch.argmax does, and resets the counter."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import arrival_counters

CHUNK = 8192  # vocabulary entries per program


@triton.jit
def _mix32(x):
    """sampling._mix32 in uint32 arithmetic (its int64 products, masked to 32 bits, are these)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x2C1B3C6D
    x = x ^ (x >> 16)
    x = x * 0x297A2D39
    return x ^ (x >> 15)


@triton.jit
def _row_key(seeds_ptr, token_index_ptr, row):
    """The row key of sampling.gumbel_noise (int64 products may wrap; their low 32 bits are exact)."""
    seed = tl.load(seeds_ptr + row)
    index = tl.load(token_index_ptr + row)
    from_seed = _mix32(((seed ^ (seed >> 32)) & 0xFFFFFFFF).to(tl.uint32))
    from_index = _mix32(((index * 0x1B873593 + 0x68E31DA4) & 0xFFFFFFFF).to(tl.uint32))
    return _mix32(from_seed ^ from_index)


@triton.jit
def _sample_kernel(logits_ptr, mask_ptr, temperature_ptr, seeds_ptr, token_index_ptr, part_ptr, arrivals_ptr,
                   out_ptr, V, stride_l, stride_m, HAS_MASK: tl.constexpr, RANDOM: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n_chunks = tl.num_programs(1)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    if RANDOM:
        key = _row_key(seeds_ptr, token_index_ptr, row)
    best_g = tl.full([BLOCK], float("-inf"), tl.float32)
    best_gi = tl.zeros([BLOCK], tl.int32)
    best_n = tl.full([BLOCK], float("-inf"), tl.float32)
    best_ni = tl.zeros([BLOCK], tl.int32)
    for start in tl.static_range(0, CHUNK, BLOCK):
        v = chunk * CHUNK + start + tl.arange(0, BLOCK)
        ok = v < V
        x = tl.load(logits_ptr + row * stride_l + v, mask=ok, other=float("-inf"))
        if HAS_MASK:
            words = tl.load(mask_ptr + row * stride_m + (v >> 5), mask=ok, other=0)
            x = tl.where(((words >> (v & 31)) & 1) != 0, x, float("-inf"))
        take = x > best_g  # per lane: earlier blocks hold lower indices, so ties keep the earlier one
        best_g = tl.where(take, x, best_g)
        best_gi = tl.where(take, v, best_gi)
        if RANDOM:
            h = _mix32(key ^ _mix32(v.to(tl.uint32) + 0x5BD1E995))
            u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            noisy = x / tl.maximum(temperature, 1e-6) - tl.log(-tl.log(u))
            take = noisy > best_n
            best_n = tl.where(take, noisy, best_n)
            best_ni = tl.where(take, v, best_ni)
    g_val, g_idx = _best(best_g, best_gi)
    n_val, n_idx = _best(best_n, best_ni)
    part = part_ptr + (row * n_chunks + chunk) * 4
    tl.store(part, g_val)
    tl.store(part + 1, g_idx.to(tl.float32))  # exact: vocabulary ids are below 2**24
    tl.store(part + 2, n_val)
    tl.store(part + 3, n_idx.to(tl.float32))
    tl.debug_barrier()  # the partial is written before the arrival is counted
    if tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel") == n_chunks - 1:
        first = part_ptr + row * n_chunks * 4
        top_g, top_gi = tl.load(first, cache_modifier=".cg"), tl.load(first + 1, cache_modifier=".cg")
        top_n, top_ni = tl.load(first + 2, cache_modifier=".cg"), tl.load(first + 3, cache_modifier=".cg")
        for c in range(1, n_chunks):
            p = first + c * 4
            val, idx = tl.load(p, cache_modifier=".cg"), tl.load(p + 1, cache_modifier=".cg")
            top_gi = tl.where(val > top_g, idx, top_gi)
            top_g = tl.maximum(val, top_g)
            val, idx = tl.load(p + 2, cache_modifier=".cg"), tl.load(p + 3, cache_modifier=".cg")
            top_ni = tl.where(val > top_n, idx, top_ni)
            top_n = tl.maximum(val, top_n)
        if RANDOM:
            top_gi = tl.where(temperature > 0, top_ni, top_gi)
        tl.store(out_ptr + row, top_gi.to(tl.int64))
        tl.atomic_xchg(arrivals_ptr + row, 0)  # ready for the next launch (and graph replay)


@triton.jit
def _best(vals, idx):
    """(max, lowest index holding it) over a block of per-lane bests."""
    top = tl.max(vals, axis=0)
    return top, tl.min(tl.where(vals == top, idx, 2147483647), axis=0)


def fused_sample(logits: torch.Tensor, mask_words: torch.Tensor | None, temperature: torch.Tensor,
                 seeds: torch.Tensor | None, token_index: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """logits [rows, V] fp32 -> int64 token per row. `mask_words` [rows, ceil(V / 32)] int32 packed
    bitmask (None: all allowed); `temperature` [rows] (0: greedy); `seeds` and `token_index`
    [rows] int64 key the noise, None when every row is greedy. Rows with a temperature draw
    argmax(logits / T + Gumbel noise), the others argmax(logits)."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    chunks = triton.cdiv(vocab, CHUNK)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device) if out is None else out
    part = torch.empty((rows, chunks, 4), dtype=torch.float32, device=logits.device)
    random = seeds is not None
    _sample_kernel[(rows, chunks)](
        logits, mask_words if mask_words is not None else logits, temperature,
        seeds if random else temperature, token_index if random else temperature, part,
        arrival_counters(logits.device, rows), out, vocab,
        logits.stride(0), mask_words.stride(0) if mask_words is not None else 0,
        HAS_MASK=mask_words is not None, RANDOM=random, CHUNK=CHUNK, BLOCK=1024, num_warps=4)
    return out
