"""slipstream: a pipelined inference engine for small language models."""
from .engine import LLM, RequestOutput
from .sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
