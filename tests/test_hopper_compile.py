"""Every Triton kernel compiles for Hopper (sm_90), as the H200 compiles it, here on the CPU.

The kernel tests run under TRITON_INTERPRET=1, which never compiles: a type error in a branch the
interpreter does not take (a bf16 tensor passed where a branch loads fp32 partials, once) shows only
on the GPU. This test calls each kernel's Python wrapper on CPU tensors in a subprocess without
the interpreter, with programmatic dependent launch on, and compiles every launch down to a cubin
with Triton's ptxas instead of running it."""
import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


SHARED_MEMORY = 232448  # bytes of shared memory a block may take on an H100 / H200 (227 KB)


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    compiled = run.stdout.split()
    for kernel in ("_skinny_linear_kernel", "_paged_decode_kernel", "_norm_kernel", "_sample_kernel",
                   "_store_kv_kernel", "_packed_attention_kernel", "_swiglu_kernel", "_gelu_columns_kernel",
                   "_shrink_kernel", "_expand_kernel", "_rotary_kernel", "_resample_kernel"):
        assert kernel in compiled, compiled


def _compile_instead_of_launching() -> None:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction, mangle_type

    def run(self, *args, grid, warmup, **kwargs):
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        kwargs.pop("launch_pdl", None)
        bound = {**dict(zip(self.arg_names, args)), **kwargs}
        signature, constexprs, attrs = {}, {}, {}
        for i, param in enumerate(self.params):
            value = bound[param.name]
            if param.is_constexpr:
                signature[param.name], constexprs[param.name] = "constexpr", value
                continue
            signature[param.name] = mangle_type(value)
            aligned = value.data_ptr() % 16 == 0 if isinstance(value, torch.Tensor) else (
                isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0)
            if aligned:  # what the JIT specializes on
                attrs[(i,)] = [["tt.divisibility", 16]]
        kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                                options=options)
        # (a launch asking more shared memory than an H200 block gets fails on the GPU only)
        assert kernel.metadata.shared <= SHARED_MEMORY, (self.fn.__name__, kernel.metadata.shared)
        print(self.fn.__name__, flush=True)

    JITFunction.run = run


def main() -> None:
    """The launches of a Qwen-shaped and a Phi-shaped decode step and prefill step, bf16, on CPU tensors."""
    _compile_instead_of_launching()
    import torch

    import slipstream.kernels as kernels
    from slipstream.kernels import paged_decode
    from slipstream.kernels.linear import LoraShrunk, PendingSum
    from slipstream.kernels.lora import LoraDelta, LoraWeights, lora_add_triton, shrink
    from slipstream.kernels.activation import gelu_columns, swiglu
    from slipstream.kernels.norm import add_rms_norm, layer_norm, rms_norm, rms_norm_shrink
    from slipstream.kernels.packed_attention import packed_attention, rotary_, store_kv
    from slipstream.kernels.resample import resample
    from slipstream.kernels.sample import fused_sample
    from slipstream.kernels.skinny_gemm import Config, skinny_linear

    kernels.use_pdl = lambda: True
    paged_decode.sm_count = lambda: 132  # the H200's SMs
    bf16 = torch.bfloat16

    def mk(*shape, dtype=bf16):
        return torch.zeros(*shape, dtype=dtype)

    x, res = mk(32, 896), mk(32, 896)
    for act, split in ((None, 1), ("swiglu", 1), ("gelu_tanh", 1), (None, 4)):
        n = 1152 if act != "swiglu" else 9728
        skinny_linear(x, mk(n, 896), mk(n), act, res if act is None else None, act_from=128,
                      config=Config(16, 128, 4, 4, split))
    skinny_linear(x, mk(4096, 896), out_dtype=torch.float32, config=Config(64, 128, 4, 4, 1))
    rms_norm(x, mk(896), 1e-6)
    partials = skinny_linear(mk(32, 4864), mk(896, 4864), defer=True, config=Config(32, 128, 4, 4, 4))
    add_rms_norm(PendingSum(partials, None, res), mk(896), 1e-6)
    layer_norm(x, mk(896), mk(896), 1e-5)
    cos, sin = mk(4096, 64, dtype=torch.float32), mk(4096, 64, dtype=torch.float32)
    pages = mk(300, 16, 2, 64), mk(300, 16, 2, 64)
    slots, lens = torch.arange(32), torch.full((32,), 128)
    table = torch.arange(32 * 8).view(32, 8)
    new_token = (mk(32, 2, 64), mk(32, 2, 64), cos, sin, slots)
    paged_decode.paged_decode_attention(mk(32, 14, 64), *pages, table, lens, 0.125, new_token=new_token)  # GQA, split
    paged_decode.paged_decode_attention(mk(32, 14, 64), *pages, table, lens, 0.125)  # (the token already stored)
    paged_decode.paged_decode_attention(mk(140, 14, 64), *pages, torch.zeros(140, 8, dtype=torch.int64),
                                        torch.full((140,), 128), 0.125)  # enough rows not to split
    mha_pages = mk(300, 16, 32, 64), mk(300, 16, 32, 64)
    paged_decode.paged_decode_attention(mk(32, 32, 64), *mha_pages, table, lens, 0.125,
                                        new_token=(mk(32, 32, 64), mk(32, 32, 64), cos[..., :32], sin[..., :32], slots))
    paged_decode.paged_decode_attention(mk(64, 32, 64), *mha_pages, torch.zeros(64, 8, dtype=torch.int64),
                                        torch.full((64,), 128), 0.125)  # MHA, enough rows for 2 pages, 2 warps
    swiglu(mk(512, 9728))
    lora_add_triton(mk(32, 1152), x, mk(9, 48, 896), mk(9, 1152, 48), mk(9, dtype=torch.int32), torch.arange(32))
    down = LoraDelta(mk(32, 16), mk(9, 896, 16), mk(9, dtype=torch.int32), torch.arange(32))
    gate_up = LoraDelta(mk(32, 32), mk(9, 9728, 32), mk(9, dtype=torch.int32), torch.arange(32))
    skinny_linear(x, mk(9728, 896), act="swiglu", lora=gate_up, config=Config(32, 128, 4, 4, 1))
    skinny_linear(mk(32, 4864), mk(896, 4864), defer=True, lora=down, config=Config(16, 128, 4, 4, 4))
    wide = LoraDelta(mk(32, 192), mk(33, 1152, 192), mk(33, dtype=torch.int32), torch.arange(32))  # (32 slots, rank 64)
    skinny_linear(x, mk(1152, 896), mk(1152), lora=wide, config=Config(16, 128, 4, 4, 4))
    shrink(mk(32, 4864), mk(9, 16, 4864), mk(9, dtype=torch.int32), torch.arange(32))
    qkv_lora = LoraWeights(mk(9, 48, 896), mk(9, 1152, 48), mk(9, dtype=torch.int32), torch.arange(32))
    rms_norm_shrink(x, mk(896), 1e-6, qkv_lora)  # (the first layer's norm)
    # (o's and down's shrinks in their GEMMs' grids, finished by the norm after them)
    for k, config in ((896, Config(16, 128, 4, 4, 2)), (4864, Config(32, 128, 4, 4, 4))):
        adapter = LoraWeights(mk(9, 16, k), mk(9, 896, 16), mk(9, dtype=torch.int32), torch.arange(32))
        partials, parts = skinny_linear(mk(32, k), mk(896, k), defer=True, shrink=adapter, config=config)
        rms_norm_shrink(PendingSum(partials, None, res, LoraShrunk(parts, adapter)), mk(896), 1e-6, qkv_lora)
    gelu_columns(mk(512, 14336), "gelu_tanh", 6144, out=mk(512, 16384)[:, :14336])
    pixels = mk(600, 800, 3, dtype=torch.uint8).permute(2, 0, 1)  # (an 800x600 image's global crop: two passes)
    crop = mk(3, 378, 378, dtype=torch.uint8)
    resample(resample(pixels, mk(2, 378, 15, dtype=torch.int64)).transpose(1, 2), mk(2, 378, 11, dtype=torch.int64),
             crop.transpose(1, 2))
    tokens, programs = torch.arange(512), torch.zeros(7, 600, dtype=torch.int64)
    qkv = mk(512, 18, 64)  # a Qwen prefill step's projected q/k/v: strided views
    store_kv(qkv[:, 14:16], qkv[:, 16:], cos, sin, tokens, tokens, *pages)
    packed_attention(qkv[:, :14], *pages, table, lens, torch.arange(33), programs, 0.125, cos, sin)  # GQA
    rotary_(mk(730, 96, 64)[:, :64], cos[:, :32], sin[:, :32], torch.arange(730))  # (Moondream's image prefix:
    store_kv(qkv[:, 14:16], qkv[:, 16:], cos[:, :0], sin[:, :0], tokens, tokens, *pages)  # k rotated before)
    mha = mk(512, 96, 64)
    store_kv(mha[:, 32:64], mha[:, 64:], cos[..., :32], sin[..., :32], tokens, tokens, *mha_pages)
    packed_attention(mha[:, :32], *mha_pages, table, lens, torch.arange(33), programs, 0.125, cos[..., :32],
                     sin[..., :32], out=mk(512, 32, 64))
    logits, words = mk(32, 151936, dtype=torch.float32), mk(32, 4748, dtype=torch.int32)
    temperature, seeds = mk(32, dtype=torch.float64), torch.arange(32)
    fused_sample(logits, None, temperature, None)
    fused_sample(logits, words, temperature, seeds, seeds)
    fused_sample(logits, None, temperature, seeds, seeds, filters=(seeds, temperature, temperature))  # top-k/p, min-p


if __name__ == "__main__":
    main()
