"""DecodeSlot: every buffer one in-flight step needs, allocated once and reused.

A step's host-side metadata (input ids, positions, KV slots, LoRA slots, rows, page-table rows, the packed
attention's sequence starts, decode rows and program list, sampling parameters) is staged in one
pinned int64 buffer and sent in one non-blocking copy; the device copy is cut into views at fixed
offsets, and the logits land in a buffer of the slot's own, so the addresses never change between
steps (what a CUDA graph needs, and why every graph can share one memory pool)."""
from __future__ import annotations

import numpy as np
import torch

from .device import DeviceLayer, SharedHost
from .kernels.attention import PROGRAM_FIELDS
from .sampling import MAX_LOGPROBS

# (name, length in units of: T = max tokens per step, B = max rows (sequences) per step, B1 = B + 1,
# G = the packed attention's program list (PROGRAM_FIELDS x its most programs), BP = B * max pages per row)
_SECTIONS = (("ids", "T"), ("positions", "T"), ("slot_mapping", "T"), ("lora", "T"), ("rows", "B"),
             ("context_lens", "B"),
             ("decode_lens", "B"), ("query_start", "B1"), ("logits_index", "B"), ("seeds", "B"), ("token_index", "B"),
             ("top_k", "B"), ("temperature", "B"), ("top_p", "B"), ("min_p", "B"), ("repetition_penalty", "B"),
             ("presence_penalty", "B"), ("frequency_penalty", "B"), ("skill", "B"), ("programs", "G"),
             ("page_table", "BP"))
FLOAT_SECTIONS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def _sizes(max_tokens: int, max_rows: int, max_pages: int, max_programs: int) -> dict[str, int]:
    return {"T": max_tokens, "B": max_rows, "B1": max_rows + 1, "G": PROGRAM_FIELDS * max_programs,
            "BP": max_rows * max_pages}


def _views(buf: torch.Tensor, max_tokens: int, max_rows: int, max_pages: int,
           max_programs: int) -> dict[str, torch.Tensor]:
    sizes = _sizes(max_tokens, max_rows, max_pages, max_programs)
    out, off = {}, 0
    for name, unit in _SECTIONS:
        n = sizes[unit]
        out[name] = buf[off:off + n]
        off += n
    for name in FLOAT_SECTIONS:
        out[name] = out[name].view(torch.float64)
    out["page_table"] = out["page_table"].view(max_rows, max_pages)
    out["programs"] = out["programs"].view(PROGRAM_FIELDS, -1)
    return out


def meta_size(max_tokens: int, max_rows: int, max_pages: int, max_programs: int) -> int:
    sizes = _sizes(max_tokens, max_rows, max_pages, max_programs)
    return sum(sizes[unit] for _, unit in _SECTIONS)


class DecodeSlot:
    def __init__(self, index: int, layer: DeviceLayer, shared: SharedHost, max_tokens: int, max_rows: int,
                 max_pages: int, max_programs: int, vocab_size: int, hidden_size: int,
                 dtype: torch.dtype = torch.float32, keep_hidden: bool = False) -> None:
        """`shared` holds the bitmask and the landed tokens (`shared_parts`: the matcher process's view);
        `keep_hidden` keeps each step's hidden states of its sampled rows (Moondream's region heads)."""
        self.index = index
        size = meta_size(max_tokens, max_rows, max_pages, max_programs)
        self.meta_host = layer.pinned(size, torch.int64)
        self.meta_dev = torch.zeros(size, dtype=torch.int64, device=layer.device)
        host = _views(self.meta_host, max_tokens, max_rows, max_pages, max_programs)
        self.host: dict[str, np.ndarray] = {k: v.numpy() for k, v in host.items()}
        self.dev = _views(self.meta_dev, max_tokens, max_rows, max_pages, max_programs)
        (tokens, tokens_dtype), (masks, masks_dtype) = self.shared_parts(max_rows, vocab_size)
        self.mask_host = shared.take(masks, masks_dtype)
        self.mask_host_np = self.mask_host.numpy()
        self.mask_dev = torch.zeros(masks, dtype=masks_dtype, device=layer.device)
        self.sampled = torch.zeros(max_rows, dtype=torch.int64, device=layer.device)
        self.sampled_event = layer.event()
        self.uploaded_event = layer.event()  # the step's metadata has reached the device
        self.mask_uploaded_event = layer.event()  # the step's bitmask has reached the device
        self.landing = layer.landing(tokens, tokens_dtype, shared)
        self.logprobs = torch.zeros((max_rows, 1 + 2 * MAX_LOGPROBS), dtype=torch.float64, device=layer.device)
        self.logprobs_landing = layer.landing((max_rows, 1 + 2 * MAX_LOGPROBS), torch.float64)
        self.logits_buffer = torch.zeros((max_rows, vocab_size), dtype=torch.float32, device=layer.device)
        self.hidden = torch.zeros((max_rows, hidden_size), dtype=dtype, device=layer.device) if keep_hidden else None
        # a prefill step's sampled rows after the final norm, which its LM head reads (ModelRunner.head_forward)
        self.normed = torch.zeros((max_rows, hidden_size), dtype=dtype, device=layer.device)
        self.values = torch.zeros((max_rows, 3), dtype=torch.int64, device=layer.device)  # point/detect bins
        self.values_landing = layer.landing((max_rows, 3), torch.int64)
        self.flags = None  # the runner's per-step sampling flags, set at launch
        self.fused = False  # this step's graph (decode forward, or a prefill step's head) sampled greedily
        self.adapted = False  # a decode step with a row under a LoRA adapter: its forward runs the LoRA kernels
        self.logits: torch.Tensor | None = None  # this step's rows of logits_buffer
        self.host_lens: list[tuple[int, int]] = []  # a prefill step's (tokens, context) per sequence (torch path)

    @staticmethod
    def shared_parts(max_rows: int, vocab_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """What a slot takes from the shared host memory: its landed tokens and its bitmask."""
        return [((max_rows,), torch.int64), ((max_rows, -(-vocab_size // 32)), torch.int32)]

    def release(self) -> None:
        """Called after the commit that read this slot: its landing buffer may be reused now."""
        self.logits = None
        self.landing.poison()
        self.logprobs_landing.poison()
        self.values_landing.poison()
