"""LoRA adapters in PEFT's format: `adapter_config.json` and `adapter_model.safetensors` with
`...layers.{i}.{module}.lora_A.weight` [r, in] and `lora_B.weight` [out, r] (Moondream's modules
under `text.blocks.{i}`), read and checked against the model's fused projections
(targets.LoraTarget), then packed: per layer and fused projection one A [rank, K] and one B
[N, rank], the scaling (alpha / r, or alpha / sqrt(r) with rsLoRA) folded into B. Anything the
engine cannot apply — DoRA, bias terms, modules_to_save, an unknown module, a misshapen tensor, a
rank above max_lora_rank — is a ValueError naming it."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .targets import LoraTarget

_KEY = re.compile(r"(?:^|\.)(?:layers|blocks)\.(\d+)\.(.+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass
class PackedAdapter:
    """An adapter ready for a slot: per (layer, fused projection) its packed A, B and rank."""
    name: str
    path: str
    rank: int  # the largest module rank
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, int]]


def read_adapter(name: str, path: str | Path, targets: list[dict[str, LoraTarget]], max_rank: int,
                 dtype: torch.dtype) -> PackedAdapter:
    """Read, check and pack the adapter at `path` for a model whose layer i has `targets[i]`."""
    from safetensors import safe_open

    path = Path(path).expanduser()
    cfg_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_file.is_file():
        raise ValueError(f"LoRA adapter {name!r}: {path} has no adapter_config.json (PEFT's format)")
    if not weights_file.is_file():
        extra = " (adapter_model.bin: save it with safe_serialization=True)" if (path / "adapter_model.bin").exists() \
            else ""
        raise ValueError(f"LoRA adapter {name!r}: {path} has no adapter_model.safetensors{extra}")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file}: malformed JSON ({e})") from None
    _check_config(cfg, cfg_file)
    try:
        with safe_open(str(weights_file), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{weights_file}: cannot read safetensors file ({e})") from None
    modules: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    paths: dict[tuple[int, str], str] = {}  # (the module's full name, which alpha_pattern matches)
    for key, t in tensors.items():
        m = _KEY.search(key)
        if m is None:
            raise ValueError(f"{weights_file}: tensor {key!r} is not a LoRA A or B weight of a decoder layer")
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if layer >= len(targets):
            raise ValueError(f"{weights_file}: tensor {key!r} is for layer {layer}; the model has {len(targets)}")
        if not any(module in target.parts for target in targets[layer].values()):
            known = sorted({p for target in targets[layer].values() for p in target.parts})
            raise ValueError(f"{weights_file}: tensor {key!r} adapts module {module!r}, which this model's LoRA "
                             f"does not serve; it adapts {', '.join(known)}")
        modules.setdefault((layer, module), {})[which] = t
        paths[(layer, module)] = key[:m.start(3) - len(".lora_")]
    if not modules:
        raise ValueError(f"{weights_file}: no LoRA weights in it")
    packed, rank = {}, 0
    for (layer, target_name), target in sorted(((i, n), t) for i, ts in enumerate(targets) for n, t in ts.items()):
        parts = [(m, modules[(layer, m)]) for m in target.parts if (layer, m) in modules]
        if not parts:
            continue
        a = torch.zeros(target.capacity * max_rank, target.in_features)
        b = torch.zeros(target.out_features, target.capacity * max_rank)
        at = 0
        for module, ab in parts:
            where = f"{weights_file}: {module} of layer {layer}"
            if set(ab) != {"A", "B"}:
                raise ValueError(f"{where} has lora_{next(iter(ab))} without lora_{'B' if 'A' in ab else 'A'}")
            r = ab["A"].shape[0]
            want_a, want_b = (r, target.cols(module)), (target.rows(module), r)
            if tuple(ab["A"].shape) != want_a or tuple(ab["B"].shape) != want_b:
                raise ValueError(f"{where}: lora_A is {tuple(ab['A'].shape)} and lora_B {tuple(ab['B'].shape)}, the "
                                 f"model's shapes need {want_a} and {want_b}")
            if r > max_rank:
                raise ValueError(f"{where} has rank {r}, above max_lora_rank={max_rank}; raise it when building the "
                                 f"engine (LLM(..., max_lora_rank={r}))")
            if at + r > a.shape[0]:
                raise ValueError(f"{where}: the adapter's ranks of this projection add up to more than "
                                 f"{target.capacity} x max_lora_rank")
            # (the expand multiplies every present slot's B in one product: a NaN or inf in one adapter
            # would reach the other rows of its steps, 0 * inf being NaN)
            for which, t in ab.items():
                if not torch.isfinite(t).all():
                    raise ValueError(f"{where}: lora_{which} holds NaN or inf values")
            part = target.parts[module]
            a[at:at + r, part.inputs] = ab["A"].float()
            b[part.outputs, at:at + r] = ab["B"].float() * _scaling(cfg, paths[(layer, module)], r)
            at += r
            rank = max(rank, r)
        a, b = a.to(dtype), b.to(dtype)
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise ValueError(f"{weights_file}: the {target_name} weights of layer {layer}, scaled by lora_alpha / r, "
                             f"overflow {dtype}: check lora_alpha in adapter_config.json (in float16, or serve in "
                             "bfloat16)")
        packed[(layer, target_name)] = (a, b, at)
    return PackedAdapter(name, str(path), rank, packed)


def _check_config(cfg: dict, source: Path) -> None:
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{source}: peft_type {cfg.get('peft_type')!r}; slipstream serves LoRA adapters")
    for flag, why in (("use_dora", "DoRA adapters"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D) weights")):
        if cfg.get(flag):
            raise ValueError(f"{source}: {flag} is set; slipstream does not serve {why}")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"{source}: bias {cfg['bias']!r}; slipstream serves adapters without bias terms")
    if cfg.get("modules_to_save"):
        raise ValueError(f"{source}: modules_to_save {cfg['modules_to_save']}; slipstream applies LoRA deltas only")


def _scaling(cfg: dict, module: str, r: int) -> float:
    """PEFT's: lora_alpha (or its alpha_pattern entry for the module) over r, or over sqrt(r) with rsLoRA."""
    alpha = cfg.get("lora_alpha", 8)
    for pattern, value in (cfg.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
            break
    return alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)


def write_random_adapter(targets: list[dict[str, LoraTarget]], path: str | Path, rank: int, seed: int = 0,
                         scale: float = 0.02) -> Path:
    """A random adapter in PEFT's format over every module of the model's fused projections (HF's
    names), for benchmarks and tests that have no trained one."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors, modules = {}, set()
    for i, layer in enumerate(targets):
        for target in layer.values():
            for module in target.parts:
                if module in target.aliases:
                    continue
                key = f"base_model.model.model.layers.{i}.{module}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, target.cols(module), generator=g) * scale
                tensors[f"{key}.lora_B.weight"] = torch.randn(target.rows(module), rank, generator=g) * scale
                modules.add(module.rsplit(".", 1)[-1])
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                          "target_modules": sorted(modules)}))
    return path
