"""Multi-LoRA: adapters in PEFT's format (adapter.py), served from fixed GPU slots that one step's
rows share, each row under its own adapter or none (bank.py; the kernels: kernels/lora.py)."""
