#!/usr/bin/env bash
# Regenerate the W·A8 parity fixtures in tests/fixtures/a8/ (see make_a8_fixtures.py) from
# the float fixtures' .cact files and cases. Rerunnable and deterministic; about 5 minutes
# on 2 cores. Needs the private venv of make_fixtures.sh (PyPI the first time).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(bash "$HERE/../../scripts/reference-venv.sh")"
export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true}"
exec "$PY" "$HERE/make_a8_fixtures.py" "$@"
