#!/usr/bin/env bash
# run k, call 2: the vision encoder's parts in graphs (enc_probe2.py: attention by backend / Triton config,
# the GEMMs with and without bias, the encoder with the Triton attention and the biases in the norms).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$OUT/k2; mkdir -p $R; export R
trap 'tar czf $OUT/k2.tgz -C $OUT k2' EXIT
PYTHONPATH=src timeout 400 python3 .variants/enc_probe2.py 2>&1 | tee $R/enc_probe2.txt | grep -v Warn
date +%T
