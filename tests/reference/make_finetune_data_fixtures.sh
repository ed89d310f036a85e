#!/usr/bin/env bash
# Regenerates the training-data encoder fixtures (tests/fixtures/finetune/) with the
# official cactus-needle 3.2.8 fine-tuner, in the pinned venv tests/reference/.venv3; see the .py.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv3"
# the venv is shared with the other v3 fixture scripts: created under a lock
(
  flock 9
  if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV" >&2
  fi
  if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("cactus-needle") != "3.2.8")' 2>/dev/null; then
    "$VENV/bin/pip" install -q --upgrade pip >&2
    "$VENV/bin/pip" install -q "cactus-needle[train]==3.2.8" "jax==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" \
      "optax==0.2.8" "numpy==2.4.6" "sentencepiece==0.2.3" "ml_dtypes==0.7.0" "safetensors==0.8.0" >&2
  fi
) 9>/tmp/venv3.lock
export JAX_PLATFORMS=cpu NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
exec "$VENV/bin/python" "$HERE/make_finetune_data_fixtures.py" "$@"
