"""Device kernels. Each has a plain-torch reference that runs on any device; the Triton versions
serve CUDA tensors where Triton is installed (and run on the CPU under TRITON_INTERPRET=1)."""
import functools
import os
from importlib.util import find_spec
from typing import Any

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
    import torch

    return (not INTERPRET and os.environ.get("SLIPSTREAM_PDL") != "0" and torch.cuda.is_available()
            and torch.cuda.get_device_capability()[0] >= 9)


def pdl_args() -> dict[str, Any]:
    """Launch arguments for a kernel with a `PDL` constexpr: the flag, and the launch attribute."""
    return {"PDL": True, "launch_pdl": True} if use_pdl() else {"PDL": False}
