#!/usr/bin/env bash
# run n, on the CPU machine: registers and SASS counts of the LoRA GEMMs compiled for sm_90 from the source tree
# SRC_DIR. /tmp/regs/regs.py is run m's sass_counts.py with sass_counts_n.patch (it also writes the TTGIR, and
# takes 132 SMs for the configs). The "noshare" counts: the shares' lora_shrink_part line replaced by zeros (as
# call_n5.sh's shares() sed).
# usage: count.sh SRC_DIR TAG -> registers/shared and SASS instruction counts for the LoRA GEMMs
set -e
cd /tmp/regs && rm -f *.cubin *.sass
PYTHONPATH=$1 TRITON_CACHE_DIR=/tmp/sass/cache_$2 /work/main/.venv/bin/python /tmp/regs/regs.py 2>&1 | grep -E "gate_up|qkv" 
B=/work/main/.venv/lib/python3.11/site-packages/triton/backends/nvidia/bin
for f in qkv_lora_expand gate_up_lora_+_shares gate_up_plain; do
  $B/cuobjdump -sass $f.cubin > /tmp/sass/$2.$f.sass
  echo "$f: instr $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' /tmp/sass/$2.$f.sass) LDS $(grep -c 'LDS' /tmp/sass/$2.$f.sass) STS $(grep -c 'STS' /tmp/sass/$2.$f.sass) BAR $(grep -c 'BAR' /tmp/sass/$2.$f.sass) HMMA $(grep -c 'HMMA' /tmp/sass/$2.$f.sass) LDG $(grep -c 'LDG' /tmp/sass/$2.$f.sass) SHFL $(grep -c SHFL /tmp/sass/$2.$f.sass)"
done
