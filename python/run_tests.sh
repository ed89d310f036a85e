#!/usr/bin/env bash
# Runs the Python package's tests against a built libneedle.
# Usage: python/run_tests.sh BUILD_DIR   (BUILD_DIR holds libneedle.so; default: build)
# Creates python/.venv the first time (pytest, build, and pydantic when PyPI has it), then
# runs test_wheel.sh: the sdist, a wheel built from it in a fresh venv, an editable install
# (about a minute: one CMake build).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build_arg="${1:-build}"
case "$build_arg" in /*) ;; *) [ -d "$build_arg" ] || build_arg="$root/$build_arg" ;; esac
build="$(cd "$build_arg" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q pytest setuptools wheel build
  "$venv/bin/pip" install -q "pydantic>=2" || echo "pydantic not available; its tests are skipped"
fi
# venvs made before test_wheel.sh existed lack `build`
"$venv/bin/python" -I -c "import build" 2>/dev/null || "$venv/bin/pip" install -q build
export NEEDLE_LIB_PATH="$build/libneedle.so"
export NEEDLE_TEST_FIXTURES="$root/tests/fixtures"
unset NEEDLE_MODEL
cd "$here"
export PYTHONDONTWRITEBYTECODE=1
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests
"$here/test_wheel.sh" "$venv/bin/python"
