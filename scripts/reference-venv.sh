#!/usr/bin/env bash
# Makes sure the private venv with the official cactus-needle package (and the JAX stack
# it runs on) exists, then prints its python. Used by the parity fixture generator
# (tests/reference/make_fixtures.sh) and the demo-model training (train/run.sh).
# Needs PyPI the first time. Pinned so fixtures and training are reproducible.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/tests/reference/.venv"
PY="${PYTHON:-python3}"
REQS=(
  "cactus-needle[train]==2.0.15"
  "jax==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" "optax==0.2.8"
  "numpy==2.4.6" "sentencepiece==0.2.3"
)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2
fi
if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("cactus-needle") != "2.0.15")' 2>/dev/null; then
  "$VENV/bin/pip" install -q --upgrade pip >&2
  "$VENV/bin/pip" install -q "${REQS[@]}" >&2
fi
echo "$VENV/bin/python"
