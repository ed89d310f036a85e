#!/usr/bin/env bash
# Regenerate the probe-head parity fixtures (tests/fixtures/heads/) from the official
# cactus-needle 2.0.15 package, over the committed parity models. Rerunnable; seeded.
#
#   tests/reference/make_head_fixtures.sh [FIXTURE_DIR] [--models tiny_mixed,tinyb_mixed]
#
# Needs network access to PyPI the first time (private venv in tests/reference/.venv).
# About 6 minutes per model on 2 cores (each sequence length is compiled twice).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(bash "$HERE/../../scripts/reference-venv.sh")"
export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$PY" "$HERE/make_head_fixtures.py" "$@"
