"""Model definitions and the checkpoint loader."""
from .llama import CausalLM, LlamaForCausalLM
from .phi import PhiForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "PhiForCausalLM": PhiForCausalLM,
}
