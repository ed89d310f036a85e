#!/usr/bin/env bash
# Regenerate the Needle 3 gradient parity fixtures in tests/fixtures/grad_v3/ (or the directory given as
# $1) from the official cactus-needle 3.2.8. Rerunnable; every random choice is seeded.
#
#   tests/reference/make_grad_v3_fixtures.sh [OUT_DIR]
#
# Makes its private venv (tests/reference/.venv3, pinned versions) the first time, which
# needs PyPI; set PYTHON_V3 to an existing interpreter with those pins to skip that.
# About 5 minutes of CPU (eager jax: the float32 and float64 runs of three losses).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv3"
REQS=(
  "cactus-needle[train]==3.2.8"
  "jax==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" "optax==0.2.8"
  "numpy==2.4.6" "sentencepiece==0.2.3" "ml_dtypes==0.7.0"
)
PY="${PYTHON_V3:-}"
if [ -z "$PY" ]; then
  # one creator at a time: other make_*_v3 scripts may be creating the same venv
  exec 9>/tmp/venv3.lock
  flock 9
  if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV" >&2
  fi
  if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("cactus-needle") != "3.2.8")' 2>/dev/null; then
    "$VENV/bin/pip" install -q --upgrade pip >&2
    "$VENV/bin/pip" install -q "${REQS[@]}" >&2
  fi
  PY="$VENV/bin/python"
  flock -u 9
fi
export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$PY" "$HERE/make_grad_v3_fixtures.py" "$@"
