"""Triton: one token per row from fp32 logits in one pass — the grammar bitmask applied, greedy
argmax, and for rows with a temperature the Gumbel-max draw argmax(logits / T + noise), the noise
hashed in registers from (seed, token index, vocab id) exactly as `sampling.gumbel_noise` does
(the row's key too, so a sampled step costs no kernel besides this one).

The torch path materializes the expanded mask, the tempered logits and five [rows, vocab] int64
tensors of hash state per step (tens of kernels over 5-20 MB each at decode batch sizes), and
sorts every row for top-k / top-p / min-p; this reads the logits and the packed mask once.
Program (row, chunk) reduces one chunk of the vocabulary to its best (value, index) pairs; the
last chunk of a row to arrive (`arrival_counters`) merges them in chunk order, keeping the lowest
index among equal values as torch.argmax does, and resets the counter. With filters the chunks
also leave their softmax max and normalizer and each block's largest tempered logit, and the last
to arrive walks from the unfiltered draw up to the filtered one (`_filter_walk`) instead of sorting
the vocabulary."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import arrival_counters

CHUNK = 8192  # vocabulary entries per program
BLOCK = 1024  # vocabulary entries per step of a program's loop (and per skippable block of the filter walk)


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
def _gumbel(key, v):
    """The Gumbel noise of vocabulary ids `v` under a row key, as sampling.gumbel_noise computes it."""
    h = _mix32(key ^ _mix32(v.to(tl.uint32) + 0x5BD1E995))
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(u))


@triton.jit
def _masked_logits(logits_ptr, mask_ptr, row, v, V, stride_l, stride_m, HAS_MASK: tl.constexpr):
    """Logits of ids `v` of a row, -inf where the bitmask clears them or past the vocabulary."""
    ok = v < V
    x = tl.load(logits_ptr + row * stride_l + v, mask=ok, other=float("-inf"))
    if HAS_MASK:
        words = tl.load(mask_ptr + row * stride_m + (v >> 5), mask=ok, other=0)
        x = tl.where(((words >> (v & 31)) & 1) != 0, x, float("-inf"))
    return x


@triton.jit
def _shift(m):
    """The exponent shift for a softmax sum whose largest term is m: m, or 0 while nothing is finite,
    so that an empty sum stays 0 instead of NaN."""
    return tl.where(m > float("-inf"), m, 0.0)


@triton.jit
def _merge_softmax(max_a, sum_a, max_b, sum_b):
    """Two (max, sum of exp(x - max)) pairs of an online softmax as one."""
    new_max = tl.maximum(max_a, max_b)
    shift = _shift(new_max)
    return new_max, sum_a * tl.exp(max_a - shift) + sum_b * tl.exp(max_b - shift)


@triton.jit
def _sample_kernel(logits_ptr, mask_ptr, temperature_ptr, seeds_ptr, token_index_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                   part_ptr, block_max_ptr, order_ptr, arrivals_ptr, out_ptr, V, stride_l, stride_m,
                   HAS_MASK: tl.constexpr, RANDOM: tl.constexpr, FILTERS: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK: tl.constexpr, MAX_BLOCKS: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n_chunks = tl.num_programs(1)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    t = tl.maximum(temperature, 1e-6)
    if RANDOM:
        key = _row_key(seeds_ptr, token_index_ptr, row)
    best_g = tl.full([BLOCK], float("-inf"), tl.float32)
    best_gi = tl.zeros([BLOCK], tl.int32)
    best_n = tl.full([BLOCK], float("-inf"), tl.float32)
    best_ni = tl.zeros([BLOCK], tl.int32)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)  # FILTERS: online softmax of the tempered logits
    lane_sum = tl.zeros([BLOCK], tl.float32)
    for start in tl.static_range(0, CHUNK, BLOCK):
        v = chunk * CHUNK + start + tl.arange(0, BLOCK)
        x = _masked_logits(logits_ptr, mask_ptr, row, v, V, stride_l, stride_m, HAS_MASK)
        take = x > best_g  # per lane: earlier blocks hold lower indices, so ties keep the earlier one
        best_g = tl.where(take, x, best_g)
        best_gi = tl.where(take, v, best_gi)
        if RANDOM:
            scaled = x / t
            noisy = scaled + _gumbel(key, v)
            take = noisy > best_n
            best_n = tl.where(take, noisy, best_n)
            best_ni = tl.where(take, v, best_ni)
            if FILTERS:
                tl.store(block_max_ptr + (row * n_chunks + chunk) * (CHUNK // BLOCK) + start // BLOCK,
                         tl.max(scaled, axis=0))
                lane_max, lane_sum = _merge_softmax(lane_max, lane_sum, scaled, 1.0)
    g_val, g_idx = _best(best_g, best_gi)
    n_val, n_idx = _best(best_n, best_ni)
    part = part_ptr + (row * n_chunks + chunk) * 6
    tl.store(part, g_val)
    tl.store(part + 1, g_idx.to(tl.float32))  # exact: vocabulary ids are below 2**24
    tl.store(part + 2, n_val)
    tl.store(part + 3, n_idx.to(tl.float32))
    if FILTERS:
        chunk_max = tl.max(lane_max, axis=0)
        tl.store(part + 4, chunk_max)
        tl.store(part + 5, tl.sum(lane_sum * tl.exp(lane_max - _shift(chunk_max)), axis=0))
    tl.debug_barrier()  # the partial is written before the arrival is counted
    if tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel") == n_chunks - 1:
        first = part_ptr + row * n_chunks * 6
        top_g, top_gi = tl.load(first, cache_modifier=".cg"), tl.load(first + 1, cache_modifier=".cg")
        top_n, top_ni = tl.load(first + 2, cache_modifier=".cg"), tl.load(first + 3, cache_modifier=".cg")
        top, total = tl.load(first + 4, cache_modifier=".cg"), tl.load(first + 5, cache_modifier=".cg")
        for c in range(1, n_chunks):
            p = first + c * 6
            val, idx = tl.load(p, cache_modifier=".cg"), tl.load(p + 1, cache_modifier=".cg")
            top_gi = tl.where(val > top_g, idx, top_gi)
            top_g = tl.maximum(val, top_g)
            val, idx = tl.load(p + 2, cache_modifier=".cg"), tl.load(p + 3, cache_modifier=".cg")
            top_ni = tl.where(val > top_n, idx, top_ni)
            top_n = tl.maximum(val, top_n)
            if FILTERS:
                c_max, c_sum = tl.load(p + 4, cache_modifier=".cg"), tl.load(p + 5, cache_modifier=".cg")
                top, total = _merge_softmax(top, total, c_max, c_sum)
        if RANDOM:
            draw = top_ni.to(tl.int32)
            if FILTERS:
                draw = _filter_walk(logits_ptr, mask_ptr, block_max_ptr + row * n_chunks * (CHUNK // BLOCK),
                                    order_ptr + row * MAX_BLOCKS, row,
                                    draw, key, t, temperature, top, total, tl.load(top_k_ptr + row),
                                    tl.load(top_p_ptr + row).to(tl.float32), tl.load(min_p_ptr + row).to(tl.float32),
                                    n_chunks * (CHUNK // BLOCK), V, stride_l, stride_m, HAS_MASK, BLOCK, MAX_BLOCKS)
            top_gi = tl.where(temperature > 0, draw.to(tl.float32), top_gi)
        tl.store(out_ptr + row, top_gi.to(tl.int64))
        tl.atomic_xchg(arrivals_ptr + row, 0)  # ready for the next launch (and graph replay)


@triton.jit
def _above(logits_ptr, mask_ptr, order_ptr, maxima, row, floor, key, t, top, V, stride_l, stride_m,
           HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, INCLUSIVE: tl.constexpr):
    """Over the tokens with tempered logit s > floor (s >= floor if INCLUSIVE): how many, their
    unnormalized probability mass, and the noisy draw among them. Only the blocks whose largest s
    (`maxima`) passes are read: the first of `order` (block ids by descending maximum), so the loop
    has no branch and no pass over blocks it skips."""
    count = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    best_n = tl.full([BLOCK], float("-inf"), tl.float32)
    best_ni = tl.zeros([BLOCK], tl.int32)
    active = tl.sum(((maxima >= floor) if INCLUSIVE else (maxima > floor)).to(tl.int32), axis=0)
    for j in range(active):
        v = tl.load(order_ptr + j) * BLOCK + tl.arange(0, BLOCK)
        scaled = _masked_logits(logits_ptr, mask_ptr, row, v, V, stride_l, stride_m, HAS_MASK) / t
        above = (scaled >= floor) if INCLUSIVE else (scaled > floor)
        count += above.to(tl.int32)
        mass += tl.where(above, tl.exp(scaled - top), 0.0)
        noisy = tl.where(above, scaled + _gumbel(key, v), float("-inf"))
        take = (noisy > best_n) | ((noisy == best_n) & (v < best_ni))  # (blocks come out of order)
        best_n = tl.where(take, noisy, best_n)
        best_ni = tl.where(take, v, best_ni)
    _, winner = _best(best_n, best_ni)
    return tl.sum(count, axis=0), tl.sum(mass, axis=0), winner


@triton.jit
def _filter_walk(logits_ptr, mask_ptr, block_max_ptr, order_ptr, row, c, key, t, temperature, top, total, top_k,
                 top_p, min_p, n_blocks, V, stride_l, stride_m, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
                 MAX_BLOCKS: tl.constexpr):
    """The draw under top-k, top-p and min-p, from the unfiltered draw c. The three keep the tokens
    whose tempered logit s is at least some threshold, and the draw is argmax(s + noise) over them,
    so: count the tokens with s > s_c and their probability mass; if c passes all three filters it
    is the draw, else the next candidate is the draw among those tokens (the same pass finds it),
    until one passes (the most likely token always does).

    A walk from a draw deep in a flat distribution would take many passes over the whole row, so
    it starts above a floor below which no token can be kept, read off the blocks' largest logits
    (distinct tokens): under the k-th largest of them at least k tokens are higher (top-k); under
    the first at which their cumulative probability exceeds top-p more than that mass is higher
    (top-p, with a margin for rounding); under top + log(min_p) min-p rejects."""
    i = tl.arange(0, MAX_BLOCKS)
    block_max = tl.load(block_max_ptr + i, mask=i < n_blocks, other=float("-inf"), cache_modifier=".cg")
    bits = block_max.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # the floats' order as int32
    keys = tl.sort((ordered.to(tl.int64) << 32) | i.to(tl.int64), descending=True)
    tl.store(order_ptr + i, (keys & 0xFFFFFFFF).to(tl.int32))
    tl.debug_barrier()  # (read back by every thread in _above)
    maxima = tl.sort(block_max, descending=True)
    k_floor = tl.max(tl.where(i == top_k - 1, maxima, float("-inf")), axis=0)
    mass = tl.cumsum(tl.exp(maxima - top), axis=0) / total
    p_floor = tl.max(tl.where(mass > top_p * 1.00001, maxima, float("-inf")), axis=0)
    m_floor = tl.where(min_p > 1e-30, top + tl.log(tl.maximum(min_p, 1e-30) * 0.99999), float("-inf"))
    floor = tl.maximum(tl.maximum(k_floor, p_floor), m_floor)  # (the 1.00001 and 0.99999: room for rounding)
    done = (temperature <= 0) | (top == float("-inf")) | ((top_k <= 0) & (top_p >= 1.0) & (min_p <= 0.0))
    if not done:
        if tl.load(logits_ptr + row * stride_l + c) / t < floor:  # (the floor itself may be kept)
            _, _, c = _above(logits_ptr, mask_ptr, order_ptr, block_max, row, floor, key, t, top, V, stride_l,
                             stride_m, HAS_MASK, BLOCK, True)
    while not done:
        s_c = tl.load(logits_ptr + row * stride_l + c) / t
        count, mass_above, winner = _above(logits_ptr, mask_ptr, order_ptr, block_max, row, s_c, key, t, top, V,
                                           stride_l, stride_m, HAS_MASK, BLOCK, False)
        kept = ((top_k <= 0) | (count < top_k)) & (mass_above / total <= top_p) & (tl.exp(s_c - top) >= min_p)
        # Finite logits always progress (the winner is higher) until the top token, which is kept;
        # NaN or infinite ones might not, and then the walk stops where it is rather than cycle.
        progress = (count > 0) & (tl.load(logits_ptr + row * stride_l + winner) / t > s_c)
        c = tl.where(kept | ~progress, c, winner)
        done = kept | ~progress
    return c


@triton.jit
def _best(vals, idx):
    """(max, lowest index holding it) over a block of per-lane bests."""
    top = tl.max(vals, axis=0)
    return top, tl.min(tl.where(vals == top, idx, 2147483647), axis=0)


def fused_sample(logits: torch.Tensor, mask_words: torch.Tensor | None, temperature: torch.Tensor,
                 seeds: torch.Tensor | None, token_index: torch.Tensor | None = None,
                 out: torch.Tensor | None = None,
                 filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """logits [rows, V] fp32 -> int64 token per row. `mask_words` [rows, ceil(V / 32)] int32 packed
    bitmask (None: all allowed); `temperature` [rows] (0: greedy); `seeds` and `token_index`
    [rows] int64 key the noise, None when every row is greedy. Rows with a temperature draw
    argmax(logits / T + Gumbel noise), the others argmax(logits). `filters`: per-row top-k,
    top-p and min-p (as sampling.apply_filters; they need seeds), applied to the tempered rows.
    Its torch reference, with the same contract, is sampling.sample_reference."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    out = torch.empty(rows, dtype=torch.int64, device=logits.device) if out is None else out
    chunks = triton.cdiv(vocab, CHUNK)
    part = torch.empty((rows, chunks, 6), dtype=torch.float32, device=logits.device)
    random = seeds is not None
    assert filters is None or random, "top-k / top-p / min-p apply to tempered rows: they need seeds"
    max_blocks = triton.next_power_of_2(chunks * CHUNK // BLOCK)
    block_max, order = (torch.empty((rows, chunks * CHUNK // BLOCK), dtype=torch.float32, device=logits.device),
                        torch.empty((rows, max_blocks), dtype=torch.int32, device=logits.device)) \
        if filters is not None else (part, part)
    top_k, top_p, min_p = filters if filters is not None else (temperature,) * 3
    _sample_kernel[(rows, chunks)](
        logits, mask_words if mask_words is not None else logits, temperature,
        seeds if random else temperature, token_index if random else temperature, top_k, top_p, min_p, part,
        block_max, order, arrival_counters(logits.device, rows), out, vocab,
        logits.stride(0), mask_words.stride(0) if mask_words is not None else 0,
        HAS_MASK=mask_words is not None, RANDOM=random, FILTERS=filters is not None, CHUNK=CHUNK, BLOCK=BLOCK,
        MAX_BLOCKS=max_blocks, num_warps=4)
    return out
