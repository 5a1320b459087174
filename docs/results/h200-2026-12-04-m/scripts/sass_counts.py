"""Compile the LoRA decode step's kernels for sm_90 here and print ptxas -v (registers, spills)."""
import os, subprocess, sys, tempfile
sys.path.insert(0, "/work/main/tests")
import test_hopper_compile as thc
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, mangle_type
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
LABEL = [""]

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
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(self, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    out = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    info = [l.split("info    : ")[-1] for l in out.stderr.splitlines() if "registers" in l or "spill" in l]
    import re
    open(f"/tmp/regs/{LABEL[0].replace(' ','_').replace(':','')}.cubin","wb").write(k.asm["cubin"])
    print(f"{LABEL[0]:40s} {self.fn.__name__:24s} grid={grid} warps={options.get('num_warps')} shared={k.metadata.shared} | " + " | ".join(info), flush=True)
JITFunction.run = run
import slipstream.kernels as kernels
kernels.use_pdl = lambda: True
from slipstream.kernels.linear import PendingSum
from slipstream.kernels.lora import LoraDelta, LoraWeights
from slipstream.kernels.norm import add_rms_norm, rms_norm, rms_norm_shrink
from slipstream.kernels.skinny_gemm import Config, skinny_linear
bf16 = torch.bfloat16
def mk(*shape, dtype=bf16): return torch.zeros(*shape, dtype=dtype)
x, res = mk(32, 896), mk(32, 896)
S = 9
partials = mk(4, 32, 896, dtype=torch.float32)
qkv_lora = LoraWeights(mk(S, 48, 896), mk(S, 1152, 48), mk(S, dtype=torch.int32), torch.arange(32))
gu_lora = LoraWeights(mk(S, 32, 896), mk(S, 9728, 32), mk(S, dtype=torch.int32), torch.arange(32))
o_w = LoraWeights(mk(S, 16, 896), mk(S, 896, 16), mk(S, dtype=torch.int32), torch.arange(32))
down_w = LoraWeights(mk(S, 16, 4864), mk(S, 896, 16), mk(S, dtype=torch.int32), torch.arange(32))
parts = mk(304, 32, 16, dtype=torch.float32)
LABEL[0] = "plain add_rms_norm"; add_rms_norm(PendingSum(partials[:3], None, res), mk(896), 1e-6)
LABEL[0] = "norm2: o delta + gate_up shrink"; rms_norm_shrink(PendingSum(partials[:3], None, res, (x, o_w)), mk(896), 1e-6, gu_lora)
LABEL[0] = "norm1: down parts + qkv shrink"; rms_norm_shrink(PendingSum(partials, None, res, (parts, down_w)), mk(896), 1e-6, qkv_lora)
qkv_d = LoraDelta(mk(32, 48), mk(S, 1152, 48), mk(S, dtype=torch.int32), torch.arange(32))
gu_d = LoraDelta(mk(32, 32), mk(S, 9728, 32), mk(S, dtype=torch.int32), torch.arange(32))
LABEL[0] = "qkv plain"; skinny_linear(x, mk(1152, 896), mk(1152), config=Config(16, 128, 4, 4, 1))
LABEL[0] = "qkv lora expand"; skinny_linear(x, mk(1152, 896), mk(1152), lora=qkv_d, config=Config(16, 128, 4, 4, 1))
LABEL[0] = "gate_up plain"; skinny_linear(x, mk(9728, 896), act="swiglu", config=Config(32, 128, 4, 4, 1))
LABEL[0] = "gate_up lora + shares"; skinny_linear(x, mk(9728, 896), act="swiglu", lora=gu_d, shrink_next=down_w, next_parts=parts, config=Config(32, 128, 4, 4, 1))
