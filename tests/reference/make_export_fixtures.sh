#!/usr/bin/env bash
# Regenerates tests/fixtures/export/ (checkpoints + official exporter outputs for
# `needle export`) from the pinned official cactus-needle package; see the .py file.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$(bash "$HERE/../../scripts/reference-venv.sh")"
export JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$PY" "$HERE/make_export_fixtures.py" "$@"
