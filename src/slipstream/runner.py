"""ModelRunner: puts a planned step on the device. It stages the step's metadata into its slot,
queues the forward, and (now or at finalize) queues sampling, the scatter of each row's token into
the device last-token table, and the device-to-host copy of the sampled tokens.

Decode steps read their input ids from the last-token table on the device (indexed by each
sequence's row), so a token never has to reach the host before the next forward can use it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .device import DeviceLayer
from .kv_cache import SCRATCH_PAGE, KVCache
from .kernels import triton_rows
from .kernels.attention import AttentionInputs
from .models.llama import CausalLM
from .pipeline import Step
from .sampling import SamplerInputs, sample, top_logprobs
from .slot import DecodeSlot

ALL_ALLOWED = np.int32(-1)
# SamplingParams fields staged per row, with the value that leaves a (padded) row greedy and unpenalized
_NEUTRAL = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0}
_PER_ROW_PARAMS = tuple(_NEUTRAL)


@dataclass
class _StepFlags:
    """Host-known facts about a step's rows that let sampling skip work nobody asked for."""

    any_random: bool
    any_filter: bool
    any_penalty: bool
    logprobs: int | None  # the largest top-n asked for, None when no row wants logprobs


def decode_bucket(n: int, max_rows: int) -> int:
    """Decode batches are padded to 1, 2, 4, 8, then multiples of 8 (the CUDA-graph buckets)."""
    for b in (1, 2, 4, 8):
        if n <= b:
            return min(b, max_rows)
    return min(-(-n // 8) * 8, max_rows)


class ModelRunner:
    def __init__(self, model: CausalLM, kv: KVCache, layer: DeviceLayer, max_num_seqs: int,
                 max_step_tokens: int, max_pages_per_seq: int, cuda_graphs: bool) -> None:
        self.model = model
        self.kv = kv
        self.layer = layer
        self.page_size = kv.page_size
        self.vocab_size = model.config.vocab_size
        self.max_rows = max_num_seqs
        self.scratch_row = max_num_seqs
        self.slots = [DecodeSlot(i, layer, max(max_step_tokens, max_num_seqs), max_num_seqs, max_pages_per_seq,
                                 self.vocab_size) for i in range(2)]
        self.last_tokens = torch.zeros(max_num_seqs + 1, dtype=torch.int64, device=layer.device)
        # penalty state per row, kept on the device and advanced by sampling itself (see apply_penalties)
        self.counts = torch.zeros(max_num_seqs + 1, self.vocab_size, dtype=torch.int32, device=layer.device)
        self.prompt_mask = torch.zeros(max_num_seqs + 1, self.vocab_size, dtype=torch.bool, device=layer.device)
        self.ones = torch.ones(max_num_seqs, dtype=torch.int32, device=layer.device)
        self.max_pages_per_seq = max_pages_per_seq
        self.profiler = None  # a StepProfiler while `bench --profile` measures
        self.graphs = None
        if layer.is_cuda:
            self._warm_up_prefill(max_step_tokens)
        if cuda_graphs and layer.is_cuda:
            from .cuda_graphs import DecodeGraphs

            buckets = sorted({decode_bucket(n, max_num_seqs) for n in range(1, max_num_seqs + 1)})
            self.graphs = DecodeGraphs(self, buckets)

    def _warm_up_prefill(self, max_step_tokens: int) -> None:
        """Run a prefill of 16, 32 and 64 tokens (KV into the scratch page) so the kernels a short
        prompt uses (the skinny GEMM compiles per block of 16/32/64 rows) are compiled at start-up,
        not at the first request that needs them."""
        device, ps = self.layer.device, self.page_size
        torch.cuda.synchronize()
        with torch.cuda.stream(self.layer.compute_stream):
            for n in (16, 32, 64):
                if n > max_step_tokens:
                    break
                positions = torch.arange(n, device=device)
                attn = AttentionInputs(True, SCRATCH_PAGE * ps + positions % ps, seq_lens=[n])
                self.model(torch.zeros(n, dtype=torch.int64, device=device), positions, attn, self.kv,
                           positions[-1:])
        torch.cuda.synchronize()

    def launch_forward(self, step: Step) -> None:
        """Stage metadata for `step` (sequences as planned, before their counters advance) and queue
        its forward on the compute stream."""
        slot = self.slots[step.slot]
        h = slot.host
        seqs = step.seqs
        ps = self.page_size
        if step.kind == "prefill":
            t = 0
            for i, s in enumerate(seqs):
                n = len(s.prompt_ids)
                pos = np.arange(n)
                pages = np.asarray(s.pages)
                h["ids"][t:t + n] = s.prompt_ids
                h["positions"][t:t + n] = pos
                h["slot_mapping"][t:t + n] = pages[pos // ps] * ps + pos % ps
                t += n
                h["logits_index"][i] = t - 1
            rows = step.num_rows = len(seqs)
        else:
            rows = step.num_rows = decode_bucket(len(seqs), self.max_rows)
            width = 1
            for i, s in enumerate(seqs):
                pos = s.kv_len
                h["positions"][i] = pos
                h["slot_mapping"][i] = s.pages[pos // ps] * ps + pos % ps
                h["context_lens"][i] = pos + 1
                n = pos // ps + 1
                h["page_table"][i, :n] = s.pages[:n]
                width = max(width, n)
            self._pad_rows(h, slice(len(seqs), rows), width)
        live = slice(0, len(seqs))
        h["rows"][live] = [s.row for s in seqs]
        h["seeds"][live] = [s.seed for s in seqs]
        h["token_index"][live] = [s.sampled_launched for s in seqs]
        params = [s.params for s in seqs]
        for name in _PER_ROW_PARAMS:
            h[name][len(seqs):rows] = _NEUTRAL[name]  # padded rows: greedy, unpenalized
            h[name][live] = [getattr(p, name) for p in params]
        slot.flags = _StepFlags(any(p.temperature > 0 for p in params), any(p.filtered for p in params),
                                any(p.penalized for p in params),
                                max((p.logprobs for p in params if p.logprobs is not None), default=None))
        flags = slot.flags
        slot.fused = (self.graphs is not None and step.kind == "decode" and not step.constrained
                      and not (flags.any_random or flags.any_penalty) and flags.logprobs is None)
        if self.profiler is not None:
            self.profiler.mark(step, 0)
        self.layer.upload(slot.meta_dev, slot.meta_host)
        d = slot.dev
        if step.kind == "prefill":
            if flags.any_penalty:
                self._reset_penalty_rows(seqs, d["ids"])
            attn = AttentionInputs(True, d["slot_mapping"][:t], seq_lens=[len(s.prompt_ids) for s in seqs])
            slot.logits = self.model(d["ids"][:t], d["positions"][:t], attn, self.kv, d["logits_index"][:rows])
        elif self.graphs is not None:
            slot.logits = self.graphs.replay(slot.index, rows, slot.fused)
        else:
            slot.logits = self.decode_forward(slot, rows, width)
        if self.profiler is not None:
            self.profiler.mark(step, 1)

    def decode_forward(self, slot: DecodeSlot, rows: int, width: int) -> torch.Tensor:
        """The decode forward over the slot's staged metadata (eager, or inside a graph capture)."""
        d = slot.dev
        attn = AttentionInputs(False, d["slot_mapping"][:rows], page_table=d["page_table"][:rows, :width],
                               context_lens=d["context_lens"][:rows])
        return self.model(self.last_tokens[d["rows"][:rows]], d["positions"][:rows], attn, self.kv, None)

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

    def stage_padding(self, slot: DecodeSlot, rows: int) -> None:
        """Stage `rows` padded rows (scratch row, scratch page) and upload them: graph capture input."""
        h = slot.host
        self._pad_rows(h, slice(0, rows), self.max_pages_per_seq)
        for name in _PER_ROW_PARAMS:
            h[name][:rows] = _NEUTRAL[name]
        self.layer.upload(slot.meta_dev, slot.meta_host)

    def _pad_rows(self, h: dict[str, np.ndarray], pad: slice, width: int) -> None:
        h["positions"][pad] = 0
        h["slot_mapping"][pad] = SCRATCH_PAGE * self.page_size
        h["context_lens"][pad] = 1
        h["page_table"][pad, :width] = SCRATCH_PAGE
        h["rows"][pad] = self.scratch_row

    def _reset_penalty_rows(self, seqs: list, ids: torch.Tensor) -> None:
        start = 0
        for s in seqs:
            n = len(s.prompt_ids)
            if s.params.penalized:
                self.counts[s.row].zero_()
                self.prompt_mask[s.row].zero_()
                self.prompt_mask[s.row].index_fill_(0, ids[start:start + n], True)  # (no host scalar copy)
            start += n

    def mask_rows(self, step: Step) -> np.ndarray:
        """The slot's pinned bitmask rows for `step`, to be filled at finalize."""
        return self.slots[step.slot].mask_host_np[: step.num_rows]

    def launch_sampling(self, step: Step, masked: bool) -> None:
        """Queue sampling, the last-token scatter, the penalty counts, and the host copies of the
        sampled tokens (and their logprobs where asked for)."""
        slot = self.slots[step.slot]
        rows, d, flags = step.num_rows, slot.dev, slot.flags
        if not slot.fused:  # (a fused graph already sampled greedily)
            mask = None
            if masked:
                self.layer.upload(slot.mask_dev[:rows], slot.mask_host[:rows])
                mask = slot.mask_dev[:rows]
            row_ids = d["rows"][:rows]
            inputs = SamplerInputs(seeds=d["seeds"][:rows], token_index=d["token_index"][:rows],
                                   **{name: d[name][:rows] for name in _PER_ROW_PARAMS}, any_random=flags.any_random,
                                   any_filter=flags.any_filter, any_penalty=flags.any_penalty)
            counts = self.counts[row_ids] if flags.any_penalty else None
            prompt_mask = self.prompt_mask[row_ids] if flags.any_penalty else None
            tokens = sample(slot.logits, inputs, mask, counts, prompt_mask)
            self.last_tokens.index_copy_(0, row_ids, tokens)
            if flags.any_penalty:
                self.counts.index_put_((row_ids, tokens), self.ones[:rows], accumulate=True)
            slot.sampled[:rows].copy_(tokens)
            if flags.logprobs is not None:
                slot.logprobs[:rows, : 1 + 2 * flags.logprobs].copy_(
                    top_logprobs(slot.logits, tokens, flags.logprobs))
        self.layer.record(slot.sampled_event)
        if self.profiler is not None:
            self.profiler.mark(step, 2)
        slot.landing.start(slot.sampled[:rows], slot.sampled_event)
        if flags.logprobs is not None:
            slot.logprobs_landing.start(slot.logprobs[:rows], slot.sampled_event)

    def wait_tokens(self, step: Step) -> tuple[list[int], np.ndarray | None]:
        """Block until `step`'s sampled tokens (and logprobs rows, if any row asked) have landed
        on the host; one entry per live row."""
        slot = self.slots[step.slot]
        landed = slot.landing.wait()[: len(step.seqs)].numpy()
        if landed.size and (landed.min() < 0 or landed.max() >= self.vocab_size):
            raise RuntimeError(f"step {step.index}: landing buffer holds {landed.tolist()}, not token ids; "
                               f"it was read before its copy completed or after its slot was released")
        logprobs = None
        if slot.flags.logprobs is not None:
            logprobs = slot.logprobs_landing.wait()[: len(step.seqs), : 1 + 2 * slot.flags.logprobs].numpy()
        return landed.tolist(), logprobs

    def release(self, step: Step) -> None:
        self.slots[step.slot].release()
