"""Device kernels. Each has a plain-torch reference that runs on any device; the Triton versions
serve CUDA tensors where Triton is installed (and run on the CPU under TRITON_INTERPRET=1)."""
import functools
import os
from importlib.util import find_spec
from typing import Any

import torch

HAS_TRITON = find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def triton_rows(x: Any) -> bool:
    """Rows of features on CUDA ([rows, D], rows may be strided, features contiguous): the form the
    row-wise Triton kernels (norms, the skinny GEMM) serve."""
    return HAS_TRITON and x.is_cuda and x.dim() == 2 and x.stride(-1) == 1


@functools.cache
def use_pdl() -> bool:
    """Programmatic dependent launch (see skinny_gemm): compiled GPU kernels on compute capability
    9.0 and later, unless SLIPSTREAM_PDL=0 (for measuring what it buys, or a driver that mishandles it)."""
    return (not INTERPRET and os.environ.get("SLIPSTREAM_PDL") != "0" and torch.cuda.is_available()
            and torch.cuda.get_device_capability()[0] >= 9)


def pdl_args() -> dict[str, Any]:
    """Launch arguments for a kernel with a `PDL` constexpr: the flag, and the launch attribute."""
    return {"PDL": True, "launch_pdl": True} if use_pdl() else {"PDL": False}


@functools.cache
def sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


_ARRIVALS: dict[tuple[torch.device, int], torch.Tensor] = {}


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters for kernels whose programs split one result (split-K GEMM tiles,
    split-context attention rows, vocabulary chunks of the sampler): the last program to arrive
    at its counter combines the partials and resets it. Shared by every such launch on the current
    stream (launches on one stream run one after another, and each leaves its counters at zero).
    Made outside graph capture: the decode graphs' warm-up calls every shape first."""
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    counters = _ARRIVALS.get(key)
    if counters is None or counters.numel() < n:
        counters = _ARRIVALS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return counters
