#!/usr/bin/env bash
# Regenerate the parity fixtures in tests/fixtures/ (or the directory given as $1)
# from the official cactus-needle package. Rerunnable; every random choice is seeded.
#
#   tests/reference/make_fixtures.sh [OUT_DIR] [--only tiny,tinyb,full,fullwork,tok]
#
# Needs network access to PyPI the first time (private venv in tests/reference/.venv).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
PY="${PYTHON:-python3}"

# Pinned so the fixtures are reproducible (numpy's Generator streams, XLA numerics).
REQS=(
  "cactus-needle[train]==2.0.15"
  "jax==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" "optax==0.2.8"
  "numpy==2.4.6" "sentencepiece==0.2.3"
)

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("cactus-needle") != "2.0.15")' 2>/dev/null; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "${REQS[@]}"
fi

export JAX_PLATFORMS=cpu
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1
# The 27-layer cached forward is one large XLA program; the default LLVM pipeline takes
# many minutes to compile it on a small machine. These flags only cut compile time.
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true}"
exec "$VENV/bin/python" "$HERE/make_fixtures.py" "$@"
