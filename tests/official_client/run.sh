#!/usr/bin/env bash
# Drives our libneedle.so with the official Python client (cactus-needle 2.0.15 from PyPI)
# in a private venv. Usage: tests/official_client/run.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  # --no-deps: the client's only dependency (huggingface_hub) serves downloads we never make
  "$venv/bin/pip" install -q --no-deps "cactus-needle==2.0.15"
  "$venv/bin/pip" install -q pytest "jsonschema[format-nongpl]"
fi
export NEEDLE_LIB_PATH="$build/libneedle.so"
export NEEDLE_TEST_WEIGHTS="$root/tests/fixtures/tiny_cq4.cact"
export NEEDLE_TELEMETRY=0
cd "$here"
"$venv/bin/pytest" -q -p no:cacheprovider test_official_client.py test_schemas.py
