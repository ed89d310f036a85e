#!/usr/bin/env bash
# Regenerate the Needle 2 gradient parity fixtures in tests/fixtures/grad_v2/ (or the directory given as
# $1) from the official cactus-needle 2.0.15. Rerunnable; every random choice is seeded.
#
#   tests/reference/make_grad_v2_fixtures.sh [OUT_DIR]
#
# Uses the pinned 2.0.15 venv of scripts/reference-venv.sh (tests/reference/.venv, made the
# first time, which needs PyPI). A few minutes of CPU (eager jax: float32 and float64 runs
# of three losses for two models).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(bash "$HERE/../../scripts/reference-venv.sh")"
export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$PY" "$HERE/make_grad_v2_fixtures.py" "$@"
