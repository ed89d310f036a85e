#!/usr/bin/env bash
# Makes BUILD/wasmtime-venv with PyPI's wasmtime (pinned), the runtime ctest runs the WASI
# build's modules with (cmake/toolchain-wasm32-wasi.cmake). Idempotent.
#   scripts/wasmtime-venv.sh build-wasi
set -euo pipefail
build=${1:?usage: wasmtime-venv.sh BUILD}
version=41.0.0
venv=$build/wasmtime-venv
if "$venv/bin/python" -c "import wasmtime" >/dev/null 2>&1 &&
   "$venv/bin/pip" show wasmtime 2>/dev/null | grep -qx "Version: $version"; then
  exit 0
fi
mkdir -p "$build"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "wasmtime==$version"
