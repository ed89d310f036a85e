#!/usr/bin/env bash
# Drives our libneedle3.so with the official Python client (cactus-needle 3.2.8 from PyPI)
# in a private venv, on a Needle 3 fixture. Usage: tests/official_client/run3.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
venv="$here/.venv3"
if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  # --no-deps: the client's dependencies serve downloads and training we never use
  "$venv/bin/pip" install -q --no-deps "cactus-needle==3.2.8"
  "$venv/bin/pip" install -q pytest "jsonschema[format-nongpl]"
fi
export NEEDLE3_LIB_PATH="$build/libneedle3.so"
export NEEDLE3_TEST_WEIGHTS="$root/tests/fixtures/v3/v3a.cact"
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
cd "$here"
"$venv/bin/pytest" -q -p no:cacheprovider test_official_client3.py
