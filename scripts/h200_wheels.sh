#!/usr/bin/env bash
# The wheels the H200's image lacks, for Python 3.12 on x86-64, into .whl (git-ignored; carry it to
# the device): the server's stack, bench-serve's client (aiohttp) and XGrammar. --no-deps throughout,
# so nothing pulls a second torch; what the image already has (numpy, jinja2, ...) is left out, but for
# typing-extensions, which pydantic and opentelemetry-api (fastapi 0.165 imports it) want newer.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl \
  fastapi opentelemetry-api typing-extensions starlette pydantic pydantic-core annotated-types annotated-doc \
  typing-inspection anyio idna certifi h11 click uvicorn uvloop httptools msgspec orjson prometheus-client httpx httpcore \
  aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl \
  xgrammar==0.2.9 apache-tvm-ffi
du -sh .whl
