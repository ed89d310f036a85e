#!/usr/bin/env bash
# `needle download` and `needle models` against a loopback stand-in hub (standin.py): first
# huggingface_hub's own client (pinned in requirements.txt, in a private venv) shows that
# the stand-in speaks the hub's protocol, then our client is tested on it, and the cache is
# shared both ways. No network beyond 127.0.0.1 (the venv's first creation aside).
# Usage: tests/hub/run.sh BUILD_DIR   (about 20 s on 2 cores)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/pytest" ] || ! cmp -s "$here/requirements.txt" "$venv/requirements.txt"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$venv/requirements.txt"
fi
export NEEDLE_CLI="$build/needle"
export NEEDLE_LIB_PATH="$build/libneedle.so"
if ! "$NEEDLE_CLI" download --help >/dev/null 2>&1; then
  echo "tests/hub: $NEEDLE_CLI has no download command" >&2
  exit 1
fi
cd "$here"
export PYTHONDONTWRITEBYTECODE=1
"$venv/bin/pytest" -q -p no:cacheprovider test_hub.py
