#!/usr/bin/env bash
# Regenerate the parity fixtures in tests/fixtures/ (or the directory given as $1)
# from the official cactus-needle package. Rerunnable; every random choice is seeded.
#
#   tests/reference/make_fixtures.sh [OUT_DIR] [--only tiny,tinyb,full,fullwork,tok]
#
# Needs network access to PyPI the first time (private venv in tests/reference/.venv).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(bash "$HERE/../../scripts/reference-venv.sh")"

export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
# The 27-layer cached forward is one large XLA program; the default LLVM pipeline takes
# many minutes to compile it on a small machine. These flags only cut compile time.
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true}"
exec "$PY" "$HERE/make_fixtures.py" "$@"
