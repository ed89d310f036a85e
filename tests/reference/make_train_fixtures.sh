#!/usr/bin/env bash
# Regenerate the training-core fixtures in tests/fixtures/train/ (see
# make_train_fixtures.py) from the official cactus-needle 3.2.8, safetensors and optax.
# Rerunnable and deterministic; under a minute on 2 cores. Uses the private venv of
# make_v3_fixtures.sh (tests/reference/.venv3, pinned; PyPI the first time), or PYTHON_V3.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv3"
PY="${PYTHON_V3:-}"
if [ -z "$PY" ]; then
  # make_v3_fixtures.sh builds the venv; --help makes it do only that
  bash "$HERE/make_v3_fixtures.sh" --help >/dev/null
  PY="$VENV/bin/python"
fi
export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$PY" "$HERE/make_train_fixtures.py" "$@"
