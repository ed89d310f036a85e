#!/usr/bin/env bash
# The drop-in test (issue 30): the official cactus-needle 3.2.8 Python code runs unchanged on
# our package. Takes the pinned wheel from PyPI into a private venv (never committed), then
#  1. schemas: dropin/dump_schemas.py under the official package and under ours must print
#     the same bytes (the six environments' 30 tools and SYSTEM texts, and the corpus of
#     dropin/schema_corpus.py: 58 functions and pydantic v1/v2 models);
#  2. environments: the six official environment modules, run by their own run_tests()
#     on our package and the default (demo) model: validation in every response, every call
#     valid against its schema, no exception; the pass rate is printed; and the validation
#     rule against the suites' labels (negation on exactly the 18 negation cases, none of
#     the expected calls flagged ungrounded);
#  3. the official README's example runs unchanged.
# About 5 s on 2 cores once the venvs exist (a minute to make them). Usage: tests/official_client/dropin.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
official="$here/.venv3"   # the official client's venv, shared with run3.sh
if [ ! -x "$official/bin/pytest" ]; then
  python3 -m venv "$official"
  "$official/bin/pip" install -q --no-deps "cactus-needle==3.2.8"
  "$official/bin/pip" install -q pytest "jsonschema[format-nongpl]"
fi
"$official/bin/python" -c "import pydantic" 2>/dev/null || "$official/bin/pip" install -q "pydantic>=2"
ours="$root/python/.venv"  # the package's test venv (python/run_tests.sh makes the same)
if [ ! -x "$ours/bin/python" ]; then
  python3 -m venv "$ours"
  "$ours/bin/pip" install -q pytest setuptools wheel build "pydantic>=2"
fi
"$ours/bin/python" -c "import jsonschema" 2>/dev/null || "$ours/bin/pip" install -q jsonschema
export NEEDLE_TELEMETRY=0 DO_NOT_TRACK=1 PYTHONDONTWRITEBYTECODE=1
# NEEDLE_DROPIN_MODEL: run the environments on that model instead (train/run3.sh's eval)
if [ -n "${NEEDLE_DROPIN_MODEL:-}" ]; then export NEEDLE_MODEL="$NEEDLE_DROPIN_MODEL"; else unset NEEDLE_MODEL; fi
site="$("$official/bin/python" -c 'import os, needle; print(os.path.dirname(needle.__file__))')"
export NEEDLE_ENVIRONMENTS="$site/environments"
run_ours() { NEEDLE_LIB_PATH="$build/libneedle.so" "$ours/bin/python" -c \
  'import sys, runpy; sys.path[:0] = [sys.argv[1], sys.argv[2]]; sys.argv = sys.argv[3:]; runpy.run_path(sys.argv[0], run_name="__main__")' \
  "$root/python" "$here/dropin" "$@"; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "-- 1. schemas: the official builder and ours over the corpus"
(cd "$tmp" && "$official/bin/python" "$here/dropin/dump_schemas.py" > official.txt)
(cd "$tmp" && run_ours "$here/dropin/dump_schemas.py" > ours.txt)
if ! cmp -s "$tmp/official.txt" "$tmp/ours.txt"; then
  diff "$tmp/official.txt" "$tmp/ours.txt" | head -40
  echo "FAIL: the schemas differ from the official builder's"
  exit 1
fi
echo "ok: $(wc -l < "$tmp/ours.txt") schemas byte-identical"

echo "-- 2. the six official environments on our package (default model)"
(cd "$tmp" && run_ours "$here/dropin/run_environments.py")

echo "-- 3. the official README example, unchanged"
(cd "$tmp" && run_ours "$here/dropin/run_readme_example.py" \
  "$(ls -d "$site"/../cactus_needle-3.2.8.dist-info)/METADATA")
echo "ok: the official code ran unchanged"
