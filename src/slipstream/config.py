"""EngineConfig: every knob of an engine instance, validated once at construction."""
from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
MODES = ("pipelined", "blocking")
DEFAULT_STEP_TOKENS = 8192  # the per-step token budget (tuned on the H200: docs/benchmarks.md)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is bf16 on a GPU and fp32 on the CPU (CPU bf16 matmuls are slow and imprecise)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use one of float32, float16, bfloat16")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"unsupported device {device}; use 'cuda' or 'cpu'")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but torch sees no CUDA device; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass
class EngineConfig:
    """How one engine runs. `mode` picks the pipeline depth: 'pipelined' keeps two steps in flight,
    'blocking' commits each step before launching the next (the A/B baseline and the oracle)."""

    model: str | None = None
    tokenizer: str | None = None  # a tokenizer.json instead of the model's own (Moondream 2 ships none)
    device: str | torch.device | None = None
    dtype: str | torch.dtype = "auto"
    mode: str = "pipelined"
    max_num_seqs: int = 256  # rows: running sequences and zombies (tuned on the H200: docs/benchmarks.md)
    max_model_len: int | None = None
    page_size: int = 16
    num_pages: int | None = None
    kv_memory_fraction: float = 0.5
    max_prefill_tokens: int | None = None  # a step's token budget: decode rows + prompt chunks (vLLM's
    # max_num_batched_tokens); None: DEFAULT_STEP_TOKENS, or max_num_seqs if that is larger
    max_prefill_chunk: int = 320  # prompt tokens a step carries beside decode rows reading less KV than
    # weights, scaled by their ratio beyond (Scheduler.prefill_chunk): bounds the running requests'
    # inter-token latency while prompts arrive (steps with nothing decoding use the whole budget);
    # 320 keeps 32 rows' ITL within 3x their step on both H200 shapes (docs/benchmarks.md, run r)
    cpu_kv_bytes: int = 1 << 30
    cuda_graphs: bool = True
    max_loras: int = 0  # LoRA adapter slots on the device (0: no LoRA); one step serves rows of any of them
    max_lora_rank: int = 16  # the largest rank an adapter's module may have
    enable_prefix_caching: bool = True  # full pages of KV found by a hash of their tokens and reused (kv_cache.py)
    step_timing: bool = False  # GPU busy and idle time per step in stats() (profiler.StepClock; the server's
    # /metrics): two timing events a step

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (one is the scratch page), got {self.num_pages}")
        if not 0.0 < self.kv_memory_fraction < 1.0:
            raise ValueError(f"kv_memory_fraction must be in (0, 1), got {self.kv_memory_fraction}")
        if self.max_loras < 0 or self.max_lora_rank < 1:
            raise ValueError(f"max_loras must be >= 0 and max_lora_rank >= 1, got {self.max_loras} and "
                             f"{self.max_lora_rank}")
        if self.max_prefill_chunk < 1:
            raise ValueError(f"max_prefill_chunk must be >= 1, got {self.max_prefill_chunk}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < self.max_num_seqs:
            raise ValueError(f"max_prefill_tokens (the per-step token budget) must be >= max_num_seqs "
                             f"({self.max_num_seqs}), so every running sequence fits one step; got "
                             f"{self.max_prefill_tokens}")
        self.device = resolve_device(self.device)
        self.dtype = resolve_dtype(self.dtype, self.device)

    @property
    def step_tokens(self) -> int:
        """The per-step token budget."""
        return self.max_prefill_tokens or max(DEFAULT_STEP_TOKENS, self.max_num_seqs)

    @property
    def depth(self) -> int:
        return 2 if self.mode == "pipelined" else 1
