#!/usr/bin/env bash
# needle serve with real clients: the official `openai` Python client (pinned in
# requirements.txt, in a private venv) and the playground in headless Chromium.
# Usage: tests/serve/run.sh BUILD_DIR   (the fuzzer and a short load test are ctest entries)
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
cd "$here"
"$venv/bin/pytest" -q -p no:cacheprovider test_openai_client.py test_server_behaviour.py test_playground.py
