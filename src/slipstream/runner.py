"""ModelRunner: puts a planned step on the device. It stages the step's metadata into its slot,
queues the forward, and (now or at finalize) queues sampling, the scatter of each row's token into
the device last-token table, and the device-to-host copy of the sampled tokens.

Decode rows read their input ids from the last-token table on the device (indexed by each
sequence's row), so a token never has to reach the host before the next forward can use it. A
decode step runs a captured graph per batch-size bucket; a prefill step (prompt chunks and decode
rows packed into one token dimension) runs a captured graph per token bucket, padded with tokens
that write the scratch page and whose attention output is zero."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch

from .device import DeviceLayer, SharedHost
from .kv_cache import SCRATCH_PAGE, KVCache
from .kernels import sm_count, triton_rows
from .kernels.attention import (PROGRAMS_PER_SM, AttentionInputs, num_programs, plan_programs, split_capacity,
                                tokens_per_program, triton_serves)
from .models.llama import CausalLM
from .pipeline import Step
from .sampling import SamplerInputs, SamplingParams, sample, top_logprobs
from .slot import FLOAT_SECTIONS, DecodeSlot

ALL_ALLOWED = np.int32(-1)
SIGNAL_WORDS = 8  # int64 counters in the shared host memory (constrain/matcher_process.py says which)
# (masked, any_random, any_filter) of the decode steps whose sampling is captured per batch bucket: a
# constrained step's, and a tempered one's with or without top-k / top-p / min-p (an unmasked greedy
# step samples inside its fused forward graph)
SAMPLING_VARIANTS = ((True, False, False), (True, True, False), (True, True, True), (False, True, False),
                     (False, True, True))
# SamplingParams fields staged per row, with the value that leaves a (padded) row greedy and unpenalized
_NEUTRAL = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0}
_PER_ROW_PARAMS = tuple(_NEUTRAL)


@dataclass
class SamplingFlags:
    """Host-known facts about a step's rows that let sampling skip work nobody asked for."""

    any_random: bool
    any_filter: bool
    any_penalty: bool
    logprobs: int | None  # the largest top-n asked for, None when no row wants logprobs
    any_skill: bool = False  # a Moondream skill's row: its rules run around eager sampling (heads.py)
    any_spatial: bool = False  # a point/detect row: bins are decoded and copied back with the tokens


def _largest_logprobs(asked: np.ndarray) -> int | None:
    """The largest top-n of the rows that asked for logprobs (-1: did not), None when none did."""
    largest = int(asked.max()) if asked.size else -1
    return None if largest < 0 else largest


def decode_bucket(n: int, max_rows: int) -> int:
    """Decode batches are padded to 1, 2, 4, 8, then multiples of 8 (the CUDA-graph buckets)."""
    for b in (1, 2, 4, 8):
        if n <= b:
            return min(b, max_rows)
    return min(-(-n // 8) * 8, max_rows)


def token_buckets(max_tokens: int) -> list[int]:
    """Prefill steps are padded to 16, 48 or a multiple of 32 up to 1,024, then steps of about 1.25x
    (multiples of 128), up to the step budget (the CUDA-graph buckets). A step beside decode rows
    (their rows and a prompt chunk: a few hundred tokens) pads by at most 31 tokens; with steps of
    1.5x, 32 rows + 512 prompt tokens padded to 576, and + 256 to 384."""
    buckets = [16, 48, *range(32, 1024, 32)]
    b = 1024
    while b < max_tokens:
        buckets.append(b)
        b = -(-b * 5 // 4 // 128) * 128
    buckets.append(max_tokens)
    return sorted({min(b, max_tokens) for b in buckets})


class ModelRunner:
    def __init__(self, model: CausalLM, kv: KVCache, layer: DeviceLayer, max_num_seqs: int,
                 max_step_tokens: int, max_pages_per_seq: int, cuda_graphs: bool, heads=None, lora=None) -> None:
        """`heads`: Moondream 2's vision and region work (models/moondream/heads.py), None for text models;
        `lora`: the engine's LoraBank, None without LoRA slots."""
        self.model = model
        self.heads = heads
        self.lora = lora
        self.kv = kv
        self.layer = layer
        self.page_size = kv.page_size
        cfg = model.config
        self.vocab_size = cfg.vocab_size
        self.max_rows = max_num_seqs
        self.scratch_row = max_num_seqs
        self.kv_heads = cfg.num_kv_heads
        # an MHA model's decode rows in a packed step run the decode kernel (packed_attention.packed_step);
        # a GQA group's fill a tile well enough (run m: Qwen shape slower apart, Phi much faster)
        self.decode_rows_apart = cfg.num_heads == cfg.num_kv_heads
        self.tokens_per_program = tokens_per_program(cfg.num_heads // cfg.num_kv_heads)
        # the packed attention's tiles running at once, which its planner balances long tiles' splits over
        self.parallel_tiles = max(1, PROGRAMS_PER_SM * sm_count() // self.kv_heads) if layer.is_cuda else 1
        # the slots' landed tokens and bitmasks, and counters the matcher process publishes, in host memory
        # that process maps too (constrain/matcher_process.py)
        self.shared = SharedHost(layer, SharedHost.size([((SIGNAL_WORDS,), torch.int64)]
                                                        + 2 * DecodeSlot.shared_parts(max_num_seqs, self.vocab_size)))
        self.signals = self.shared.take(SIGNAL_WORDS, torch.int64).numpy()
        self.slots = [DecodeSlot(i, layer, self.shared, max_step_tokens, max_num_seqs, max_pages_per_seq,
                                 self._grid(max_step_tokens), self.vocab_size, cfg.hidden_size,
                                 model.lm_head.weight.dtype, keep_hidden=heads is not None)
                      for i in range(2)]
        self.last_tokens = torch.zeros(max_num_seqs + 1, dtype=torch.int64, device=layer.device)
        # each row's pages (allocated in full at admission, so fixed while the row is held), on the host
        self.row_pages = np.full((max_num_seqs + 1, max_pages_per_seq), SCRATCH_PAGE, dtype=np.int64)
        # each row's sampling parameters (bind_row), the scratch row's neutral: greedy, unpenalized
        self.row_params = {name: np.full(max_num_seqs + 1, value, dtype=np.float64 if name in FLOAT_SECTIONS
                                         else np.int64) for name, value in {**_NEUTRAL, "seeds": 0}.items()}
        self.row_filtered = np.zeros(max_num_seqs + 1, dtype=bool)
        self.row_penalized = np.zeros(max_num_seqs + 1, dtype=bool)
        self.row_logprobs = np.full(max_num_seqs + 1, -1, dtype=np.int64)  # top-n asked for, -1: none
        self.row_skill = np.zeros(max_num_seqs + 1, dtype=np.int64)  # Moondream skill codes (skills.Skill)
        self.row_lora = np.zeros(max_num_seqs + 1, dtype=np.int64)  # each row's LoRA slot (0: none)
        # penalty state per row, kept on the device and advanced by sampling itself (see apply_penalties)
        self.counts = torch.zeros(max_num_seqs + 1, self.vocab_size, dtype=torch.int32, device=layer.device)
        self.prompt_mask = torch.zeros(max_num_seqs + 1, self.vocab_size, dtype=torch.bool, device=layer.device)
        self.ones = torch.ones(max_num_seqs, dtype=torch.int32, device=layer.device)
        self.max_pages_per_seq = max_pages_per_seq
        self.profiler = None  # a StepProfiler while `bench --profile` measures
        self.clock = None  # a StepClock where EngineConfig.step_timing asks for one
        self.graphs = None
        if cuda_graphs and layer.is_cuda:
            from .cuda_graphs import StepGraphs

            buckets = sorted({decode_bucket(n, max_num_seqs) for n in range(1, max_num_seqs + 1)})
            # prefill steps are captured only where the packed kernel serves them (the torch path
            # reads host lengths); otherwise they run eagerly
            packed = token_buckets(max_step_tokens) if triton_serves(True, cfg.head_dim, self.page_size) else []
            self.graphs = StepGraphs(self, buckets, packed)
        self.prefill_captured = self.graphs is not None and bool(self.graphs.token_buckets)
        self.image_graphs = None
        if cuda_graphs and layer.is_cuda and heads is not None:
            from .models.moondream.graphs import ImageGraphs

            self.image_graphs = ImageGraphs(heads, kv, layer.compute_stream, lora)
        if layer.is_cuda and not self.prefill_captured:
            self._warm_up(token_buckets(max_step_tokens)[:4])

    def shared_layout(self) -> tuple[int, list[tuple[int, int]]]:
        """Where the signals, and each slot's landed tokens and bitmask, start in the shared host memory."""
        return (self.shared.offset(self.signals),
                [(self.shared.offset(s.landing.host), self.shared.offset(s.mask_host)) for s in self.slots])

    def _warm_up(self, token_counts: list[int]) -> None:
        """Run padding-only prefill steps of these sizes so the kernels they use (the skinny GEMM
        compiles per block of 16/32/64 rows) are compiled at start-up, not at the first request."""
        with torch.cuda.stream(self.layer.compute_stream):
            for n in token_counts:
                self.stage_padding(self.slots[0], n, packed=True)
                self.packed_forward(self.slots[0], n, self.logit_rows(n))
        torch.cuda.synchronize()

    def bind_row(self, row: int, pages: list[int], params: SamplingParams, seed: int, skill: int = 0,
                 lora: int = 0) -> None:
        """A sequence admitted at `row` holds these pages until the row is released; its sampling
        parameters (Moondream skill code, LoRA slot) are fixed, so each step stages its rows' by one
        gather a field."""
        self.row_pages[row, : len(pages)] = pages
        self.row_skill[row] = skill
        self.row_lora[row] = lora
        for name in _PER_ROW_PARAMS:
            self.row_params[name][row] = getattr(params, name)
        self.row_params["seeds"][row] = seed
        self.row_filtered[row], self.row_penalized[row] = params.filtered, params.penalized
        self.row_logprobs[row] = -1 if params.logprobs is None else params.logprobs

    def logit_rows(self, tokens: int) -> int:
        """Rows a captured prefill step of `tokens` tokens carries to its final norm (its sampled rows at
        most; its head then computes the logits of those it samples)."""
        return min(tokens, self.max_rows)

    def launch_forward(self, step: Step) -> None:
        """Stage metadata for `step` (sequences as planned, before their counters advance) and queue
        its forward on the compute stream."""
        slot = self.slots[step.slot]
        h = slot.host
        sampled = step.sampled
        n = len(sampled)
        if step.kind == "prefill":
            tokens = step.num_tokens
            padded = self.graphs.token_bucket(tokens) if self.prefill_captured else tokens
            # (a captured head runs per batch-size bucket of the sampled rows, as a decode step's forward)
            rows = step.num_rows = decode_bucket(n, self.max_rows) if self.prefill_captured and n else n
            self._stage_packed(step, slot, padded)
            h["rows"][n:rows] = self.scratch_row
        else:
            rows = step.num_rows = decode_bucket(n, self.max_rows)
            width = self._stage_decode(step.seqs, h)
            self._pad_rows(h, slice(n, rows), width)
        h["rows"][:n] = np.fromiter((s.row for s in sampled), np.int64, n)
        h["token_index"][:n] = np.fromiter((s.sampled_launched for s in sampled), np.int64, n)
        held = h["rows"][:rows]  # (padded rows: the scratch row, whose parameters are neutral)
        for name, table in self.row_params.items():
            h[name][:rows] = table[held]
        skills = self.row_skill[held]
        slot.adapted = False
        if self.lora is not None and step.kind == "decode":
            h["lora"][:rows] = self.row_lora[held]
            slot.adapted = bool(h["lora"][:rows].any())
        h["skill"][:rows] = skills
        slot.flags = SamplingFlags(bool((h["temperature"][:rows] > 0).any()), bool(self.row_filtered[held].any()),
                                   bool(self.row_penalized[held].any()), _largest_logprobs(self.row_logprobs[held]),
                                   bool(skills.any()), bool((skills >= 2).any()))
        flags = slot.flags
        captured = self.graphs is not None and (step.kind == "decode" or (self.prefill_captured and rows > 0))
        slot.fused = (captured and not step.constrained and not (flags.any_random or flags.any_penalty or flags.any_skill)
                      and flags.logprobs is None)
        if self.profiler is not None:
            self.profiler.mark(step, 0)
        if self.clock is not None:
            self.clock.started(step)
        # (the slot's previous step has committed, so nothing queued still reads its metadata)
        self.layer.upload_ahead(slot.meta_dev, slot.meta_host, slot.uploaded_event)
        if step.kind == "prefill":
            self._reset_penalty_rows(step, slot.dev["ids"])
            if step.images or step.page_copies:
                self._prefill_images(step)
            if self.prefill_captured:
                self.graphs.replay_packed(slot.index, padded)
                slot.logits = self.graphs.replay_head(slot.index, rows, slot.fused) if rows else None
            else:
                self.packed_forward(slot, padded, max(1, rows))
                slot.logits = self.head_forward(slot, rows) if rows else None
        elif self.graphs is not None:
            slot.logits = self.graphs.replay_decode(slot.index, rows, slot.fused, slot.adapted)
        else:
            slot.logits = self.decode_forward(slot, rows, width, slot.adapted)
        if self.profiler is not None:
            self.profiler.mark(step, 1)

    def _prefill_images(self, step: Step) -> None:
        """The step's new image prefixes (each image's crops made on the device, then its captured
        graph, or eagerly one encoder forward over all their crops), then its sequences' copies of
        their prefix's partial last page, before its packed forward, whose chunks of their prompts
        attend to them."""
        from .models.moondream.config import PREFIX_LEN
        from .models.moondream.heads import prefix_slots
        from .models.moondream.image import make_crops

        prefixes = step.images
        if prefixes:
            slots = torch.from_numpy(prefix_slots([p.pages for p in prefixes], self.page_size))
            if self.layer.is_cuda:
                slots = slots.pin_memory()
            step.uploads = (slots, prefixes)  # (kept until the step commits: the copies read them asynchronously)
            dev = self.layer.device
            slots = slots.to(dev, non_blocking=True)
            vision = self.heads.cfg.vision
            images = [replace(p.crops, pixels=p.crops.pixels.to(dev, non_blocking=True),
                              plans=tuple(plan.to(dev, non_blocking=True) for plan in p.crops.plans))
                      for p in prefixes]
            if self.image_graphs is not None:
                for i, (image, prefix) in enumerate(zip(images, prefixes)):
                    make_crops(image, vision, out=self.image_graphs.crops[:image.count])
                    own = slots[i * PREFIX_LEN:(i + 1) * PREFIX_LEN]
                    self.image_graphs.prefill(image.tiling, own, prefix.lora_slot)
            else:
                lora = None
                if self.lora is not None:  # (each prefix under its requests' adapter; filled on the device)
                    slots_of = torch.empty(len(prefixes) * PREFIX_LEN, dtype=torch.int64, device=dev)
                    for i, p in enumerate(prefixes):
                        slots_of[i * PREFIX_LEN:(i + 1) * PREFIX_LEN].fill_(p.lora_slot)
                    lora = self.lora.rows(slots_of)
                self.heads.prefill_images(torch.cat([make_crops(image, vision) for image in images]),
                                          [image.tiling for image in images], slots, self.kv, lora)
        for src, dst in step.page_copies:
            self.kv.data[:, :, dst].copy_(self.kv.data[:, :, src])

    def _stage_decode(self, seqs: list, h: dict[str, np.ndarray]) -> int:
        """One token per row, at each sequence's next position; returns the page-table width used."""
        n, ps = len(seqs), self.page_size
        rows = np.fromiter((s.row for s in seqs), np.int64, n)
        pos = np.fromiter((s.kv_len for s in seqs), np.int64, n)
        h["positions"][:n] = pos
        h["slot_mapping"][:n] = self.row_pages[rows, pos // ps] * ps + pos % ps
        h["context_lens"][:n] = pos + 1
        width = int(pos.max()) // ps + 1
        h["page_table"][:n, :width] = self.row_pages[rows, :width]
        return width

    def _stage_packed(self, step: Step, slot: DecodeSlot, padded: int) -> None:
        """Decode rows (one token each, its id read from the last-token table: staged as -1 - row),
        then the chunks' prompt tokens, then padding up to `padded` tokens; the packed attention's
        sequence starts and program list; the logits rows of the sampled sequences."""
        h, seqs, n_dec, ps = slot.host, step.seqs, step.num_decode, self.page_size
        n_seqs = len(seqs)
        rows = np.fromiter((s.row for s in seqs), np.int64, n_seqs)
        starts = np.fromiter(itertools.chain((s.kv_len for s in seqs[:n_dec]), (a for a, _ in step.chunks)),
                             np.int64, n_seqs)
        lens = np.fromiter(itertools.chain(itertools.repeat(1, n_dec), (n for _, n in step.chunks)), np.int64,
                           n_seqs)
        ends = starts + lens
        query_start = np.zeros(n_seqs + 1, np.int64)
        np.cumsum(lens, out=query_start[1:])
        tokens = int(query_start[-1])
        pos = np.arange(tokens) + np.repeat(starts - query_start[:-1], lens)
        h["positions"][:tokens] = pos
        h["slot_mapping"][:tokens] = self.row_pages[np.repeat(rows, lens), pos // ps] * ps + pos % ps
        h["query_start"][: n_seqs + 1] = query_start
        h["context_lens"][:n_seqs] = ends
        width = int(ends.max() - 1) // ps + 1
        h["page_table"][:n_seqs, :width] = self.row_pages[rows, :width]
        h["ids"][:n_dec] = -1 - rows[:n_dec]
        for s, (a, n), t in zip(seqs[n_dec:], step.chunks, query_start[n_dec:-1]):
            h["ids"][t:t + n] = s.prompt_ids[a:a + n]
        self._pad_tokens(h, slice(tokens, padded))
        if self.lora is not None:
            h["lora"][:tokens] = np.repeat(self.row_lora[rows], lens)
        final = np.ones(n_seqs, bool)
        final[n_dec:] = [a + n == len(s.prompt_ids) for s, (a, n) in zip(seqs[n_dec:], step.chunks)]
        n_sampled = len(step.sampled)
        h["logits_index"][:n_sampled] = query_start[1:][final] - 1
        h["logits_index"][n_sampled:self.logit_rows(padded)] = 0
        apart = n_dec if self.decode_rows_apart else 0
        self._plan_programs(h, lens[apart:], ends[apart:], padded, apart)
        h["decode_lens"][:apart] = ends[:apart]
        h["decode_lens"][apart:self.logit_rows(padded)] = 0
        slot.host_lens = list(zip(lens.tolist(), ends.tolist()))

    def _grid(self, tokens: int) -> int:
        """The packed attention's programs for a prefill step of `tokens` tokens (padding included)."""
        return num_programs(tokens, self.logit_rows(tokens), self.tokens_per_program, self.kv_heads)

    def _plan_programs(self, h: dict[str, np.ndarray], chunk_lens: np.ndarray, contexts: np.ndarray, padded: int,
                       decode_rows: int) -> None:
        plan_programs(chunk_lens, contexts, self.tokens_per_program, padded, h["programs"][:, :self._grid(padded)],
                      self.parallel_tiles, split_capacity(self.kv_heads), decode_rows)

    def packed_forward(self, slot: DecodeSlot, tokens: int, logit_rows: int) -> torch.Tensor:
        """The forward of a prefill step of `tokens` tokens (padding included) over the slot's staged
        metadata (eager, or inside a graph capture), up to the final norm of its first `logit_rows`
        sampled rows, into the slot's `normed` buffer: `head_forward` takes them from there."""
        d = slot.dev
        ids = d["ids"][:tokens]
        ids = torch.where(ids >= 0, ids, self.last_tokens[(-1 - ids).clamp(min=0)])
        attn = AttentionInputs(d["slot_mapping"][:tokens], d["page_table"], d["context_lens"], d["query_start"],
                               d["programs"][:, :self._grid(tokens)],
                               d["decode_lens"][:self.logit_rows(tokens) if self.decode_rows_apart else 0],
                               slot.host_lens)
        return self.model(ids, d["positions"][:tokens], attn, self.kv, d["logits_index"][:logit_rows],
                          hidden_out=slot.hidden, lora=self._lora_rows(d, tokens), normed_out=slot.normed)

    def head_forward(self, slot: DecodeSlot, rows: int) -> torch.Tensor:
        """A prefill step's LM head over its first `rows` normed rows (the step's sampled rows, not every
        row its forward computes), into the slot's logits buffer: eager, or captured per batch-size
        bucket, where the fused capture adds greedy sampling after it as for a decode forward."""
        return self.model.logits(slot.normed[:rows], slot.logits_buffer)

    def decode_forward(self, slot: DecodeSlot, rows: int, width: int, adapted: bool) -> torch.Tensor:
        """The decode forward over the slot's staged metadata (eager, or inside a graph capture); with
        the LoRA kernels where `adapted` (a row under an adapter), else as an engine without LoRA runs
        it. A row without an adapter gets the same bits either way (the kernels add an exact zero to
        its GEMM accumulators), so a base-model row's tokens do not depend on its batch."""
        d = slot.dev
        attn = AttentionInputs(d["slot_mapping"][:rows], d["page_table"][:rows, :width], d["context_lens"][:rows])
        return self.model(self.last_tokens[d["rows"][:rows]], d["positions"][:rows], attn, self.kv, None,
                          slot.logits_buffer, slot.hidden, self._lora_rows(d, rows) if adapted else None)

    def _lora_rows(self, d: dict[str, torch.Tensor], tokens: int):
        """Each token's adapter slot, on the device (a step input of the captured graphs too)."""
        return None if self.lora is None else self.lora.rows(d["lora"][:tokens])

    def greedy_tail(self, slot: DecodeSlot, rows: int, logits: torch.Tensor) -> None:
        """Greedy sampling as captured in the fused graphs: argmax (on CUDA the sampling kernel, half
        the time of torch's argmax over a large vocabulary; every row's temperature is 0 here),
        last-token scatter, sampled copy."""
        if triton_rows(logits):
            from .kernels.sample import fused_sample

            tokens = fused_sample(logits, None, slot.dev["temperature"][:rows], None)
        else:
            tokens = logits.argmax(dim=-1)
        self.last_tokens.index_copy_(0, slot.dev["rows"][:rows], tokens)
        slot.sampled[:rows].copy_(tokens)

    def stage_padding(self, slot: DecodeSlot, rows: int, packed: bool = False) -> None:
        """Stage a step of padding alone and upload it (graph capture and warm-up input): `rows`
        decode rows (scratch row, scratch page), or a prefill step of `rows` padding tokens."""
        h = slot.host
        self._pad_rows(h, slice(0, min(rows, self.max_rows)), self.max_pages_per_seq)
        if packed:
            self._pad_tokens(h, slice(0, rows))
            h["logits_index"][: self.logit_rows(rows)] = 0
            self._plan_programs(h, np.zeros(0, np.int64), np.zeros(0, np.int64), rows, 0)
            h["decode_lens"][: self.logit_rows(rows)] = 0
            slot.host_lens = []
        for name in _PER_ROW_PARAMS:
            h[name][: min(rows, self.max_rows)] = _NEUTRAL[name]
        h["skill"][: min(rows, self.max_rows)] = 0
        self.layer.upload(slot.meta_dev, slot.meta_host)

    def _pad_tokens(self, h: dict[str, np.ndarray], pad: slice) -> None:
        """Padding tokens of a prefill step: token 0 at position 0, its KV into the scratch page, no adapter."""
        h["ids"][pad], h["positions"][pad], h["slot_mapping"][pad] = 0, 0, SCRATCH_PAGE * self.page_size
        h["lora"][pad] = 0

    def _pad_rows(self, h: dict[str, np.ndarray], pad: slice, width: int) -> None:
        h["positions"][pad] = 0
        h["slot_mapping"][pad] = SCRATCH_PAGE * self.page_size
        h["context_lens"][pad] = 1
        h["page_table"][pad, :width] = SCRATCH_PAGE
        h["rows"][pad] = self.scratch_row

    def _reset_penalty_rows(self, step: Step, ids: torch.Tensor) -> None:
        """A penalized prompt's rows of the penalty state: cleared at its first chunk, and its tokens
        marked in the prompt mask chunk by chunk (from the device ids: no host scalar copy)."""
        t = step.num_decode
        for s, (start, n) in zip(step.seqs[step.num_decode:], step.chunks):
            if s.params.penalized:
                if start == 0:
                    self.counts[s.row].zero_()
                    self.prompt_mask[s.row].zero_()
                self.prompt_mask[s.row].index_fill_(0, ids[t:t + n], True)
            t += n

    def mask_rows(self, step: Step) -> np.ndarray:
        """The slot's pinned bitmask rows for `step`, to be filled at finalize."""
        return self.slots[step.slot].mask_host_np[: step.num_rows]

    def launch_sampling(self, step: Step, masked: bool) -> None:
        """Queue sampling, the last-token scatter, the penalty counts, and the host copies of the
        sampled tokens (and their logprobs where asked for). A step without penalties or logprobs
        replays its captured sampling, a prefill step's too where its head is captured (`sample_rows`:
        a few launches of host work less, which a constrained step's critical path pays after its mask
        fill)."""
        slot = self.slots[step.slot]
        rows, flags = step.num_rows, slot.flags
        if not slot.fused and rows:  # (a fused graph already sampled greedily)
            if masked:  # (on the upload stream: the copy runs under the forward when the fill ends first)
                self.layer.upload_ahead(slot.mask_dev[:rows], slot.mask_host[:rows], slot.mask_uploaded_event)
            variant = (masked, flags.any_random, flags.any_filter)
            if (self.graphs is not None and (step.kind == "decode" or self.prefill_captured) and not flags.any_penalty
                    and flags.logprobs is None and not flags.any_skill and variant in SAMPLING_VARIANTS):
                self.graphs.replay_sampling(slot.index, rows, variant)
            else:
                self.sample_rows(slot, rows, masked, flags, slot.logits)
        if self.clock is not None:  # (before sampled_event: the commit's wait then covers it)
            self.clock.ended(step)
        self.layer.record(slot.sampled_event)
        if self.profiler is not None:
            self.profiler.mark(step, 2)
        slot.landing.start(slot.sampled[:rows], slot.sampled_event, unlanded=masked)  # (the matcher process waits)
        if flags.logprobs is not None:
            slot.logprobs_landing.start(slot.logprobs[:rows], slot.sampled_event)
        if flags.any_spatial:
            slot.values_landing.start(slot.values[:rows], slot.sampled_event)

    def sample_rows(self, slot: DecodeSlot, rows: int, masked: bool, flags: SamplingFlags,
                    logits: torch.Tensor) -> None:
        """A token for each of `rows` rows of `logits` (under the slot's device bitmask where `masked`),
        scattered into the last-token table and copied into the slot's sampled buffer; the penalty
        counts and the logprobs rows where `flags` ask for them (eager, or inside a graph capture)."""
        d = slot.dev
        mask = slot.mask_dev[:rows] if masked else None
        row_ids = d["rows"][:rows]
        inputs = SamplerInputs(seeds=d["seeds"][:rows], token_index=d["token_index"][:rows],
                               **{name: d[name][:rows] for name in _PER_ROW_PARAMS}, any_random=flags.any_random,
                               any_filter=flags.any_filter, any_penalty=flags.any_penalty)
        counts = self.counts[row_ids] if flags.any_penalty else None
        prompt_mask = self.prompt_mask[row_ids] if flags.any_penalty else None
        if flags.any_skill:
            self.heads.ban_answer(logits, d["skill"][:rows], d["token_index"][:rows])
        tokens = sample(logits, inputs, mask, counts, prompt_mask)
        next_ids = tokens
        if flags.any_spatial:
            tokens, next_ids, bins = self.heads.spatial(tokens, slot.hidden[:rows], d["skill"][:rows],
                                                        d["token_index"][:rows], row_ids)
            slot.values[:rows].copy_(bins)
        self.last_tokens.index_copy_(0, row_ids, next_ids)
        if flags.any_penalty:
            self.counts.index_put_((row_ids, tokens), self.ones[:rows], accumulate=True)
        slot.sampled[:rows].copy_(tokens)
        if flags.logprobs is not None:
            slot.logprobs[:rows, : 1 + 2 * flags.logprobs].copy_(top_logprobs(logits, tokens, flags.logprobs))

    def wait_tokens(self, step: Step) -> tuple[list[int], np.ndarray | None, np.ndarray | None]:
        """Block until `step`'s sampled tokens (and logprobs rows, if any row asked, and the bins of
        point/detect rows) have landed on the host; one entry per live row."""
        slot = self.slots[step.slot]
        landed = slot.landing.wait()[: len(step.sampled)].numpy()
        if landed.size and (landed.min() < 0 or landed.max() >= self.vocab_size):
            raise RuntimeError(f"step {step.index}: landing buffer holds {landed.tolist()}, not token ids; "
                               f"it was read before its copy completed or after its slot was released")
        logprobs = None
        if slot.flags.logprobs is not None:
            logprobs = slot.logprobs_landing.wait()[: len(step.sampled), : 1 + 2 * slot.flags.logprobs].numpy()
        bins = slot.values_landing.wait()[: len(step.sampled)].numpy() if slot.flags.any_spatial else None
        return landed.tolist(), logprobs, bins

    def release(self, step: Step) -> None:
        self.slots[step.slot].release()
