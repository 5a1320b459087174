# run o, on the CPU machine: the deferred GEMMs with and without their shrink tiles and the norms after them,
# compiled for sm_90. /tmp/regs/regs.py: run m's sass_counts.py with run n's sass_counts_n.patch (see run n's
# scripts/sass_counts.sh, which also counts the SASS instructions of the .cubin files this writes).
exec(open('/tmp/regs/regs.py').read().split("LABEL[0] = \"plain add_rms_norm\"")[0])
from slipstream.kernels.linear import LoraShrunk
qkv_lora = LoraWeights(mk(S, 48, 896), mk(S, 1152, 48), mk(S, dtype=torch.int32), torch.arange(32))
gu_lora = LoraWeights(mk(S, 32, 896), mk(S, 9728, 32), mk(S, dtype=torch.int32), torch.arange(32))
for name, k, cfg, nxt in (("o", 896, Config(16, 128, 4, 4, 2), gu_lora), ("down", 4864, Config(32, 128, 4, 4, 4), qkv_lora)):
    w = LoraWeights(mk(S, 16, k), mk(S, 896, 16), mk(S, dtype=torch.int32), torch.arange(32))
    LABEL[0] = f"{name} plain defer"; skinny_linear(mk(32, k), mk(896, k), defer=True, config=cfg)
    LABEL[0] = f"{name} defer + shrink tiles"; p, sp = skinny_linear(mk(32, k), mk(896, k), defer=True, shrink=w, config=cfg)
    LABEL[0] = f"norm after {name}"; rms_norm_shrink(PendingSum(p, None, res, LoraShrunk(sp, w)), mk(896), 1e-6, nxt)
LABEL[0] = "plain add_rms_norm"; add_rms_norm(PendingSum(mk(4, 32, 896, dtype=torch.float32), None, res), mk(896), 1e-6)
