"""Device kernels. Each has a plain-torch reference that runs on any device; the Triton versions
serve CUDA tensors where Triton is installed."""
from importlib.util import find_spec

HAS_TRITON = find_spec("triton") is not None
