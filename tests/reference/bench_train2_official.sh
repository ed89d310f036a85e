#!/usr/bin/env bash
# The official 2.0.15 LoRA training step's speed on the released Needle 2 geometry (see
# bench_train2_official.py), to compare with needle-train2-bench. Figures only.
#
#   tests/reference/bench_train2_official.sh [--batch B] [--tokens T] [--rank R] [--steps S]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(bash "$HERE/../../scripts/reference-venv.sh")"
export JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$PY" "$HERE/bench_train2_official.py" "$@"
