#!/usr/bin/env bash
# The Python distribution as a user gets it, in a temporary folder:
#   1. `python -m build --sdist` of python/: the sdist must carry the C sources, the CMake
#      files and the demo model (csrc/);
#   2. a wheel built from that sdist by pip in a fresh venv (the default build: CPU-only,
#      cJSON bundled), installed there; readelf/ldd: no libcudart, RUNPATH $ORIGIN, and
#      libcjson resolved inside the package; then a tool call on the bundled demo model;
#      `python -m needle serve` from that venv, with no NEEDLE_CLI and no build folder on
#      PATH: the wheel's own needle-serve answers /health and drains on SIGTERM;
#   3. `pip install -e` of a copy of python/: the package imported from the source folder
#      finds the library the install put there (built by CMake; here NEEDLE_LIB_PATH gives
#      it the wheel's library, so that CMake runs once in this script).
# Usage: python/test_wheel.sh [PYTHON]   PYTHON: an interpreter with build, setuptools and
# wheel (default python/.venv/bin/python, made by run_tests.sh). Needs PyPI for pip's
# isolated build environment. About a minute: one CMake build of the library.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
py="${1:-$here/.venv/bin/python}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unset NEEDLE_LIB_PATH NEEDLE_SKIP_CMAKE NEEDLE_CMAKE_ARGS NEEDLE_BUILD_CUDA NEEDLE_MODEL
fail() { echo "test_wheel: FAIL: $*" >&2; exit 1; }

echo "== sdist"
"$py" -m build --sdist --no-isolation -o "$tmp/sdist" "$here" > "$tmp/sdist.log" 2>&1 ||
  { cat "$tmp/sdist.log"; fail "python -m build --sdist"; }
sdist="$(ls "$tmp"/sdist/libneedle-*.tar.gz)"
tar tzf "$sdist" > "$tmp/sdist.txt"
for f in csrc/CMakeLists.txt csrc/include/needle.h csrc/src/grammar/compiler.c csrc/cmake/libneedle.map \
         csrc/tools/needle.c csrc/models/needle-demo.cact setup.py needle/agent.py; do
  grep -q "^libneedle-[^/]*/$f\$" "$tmp/sdist.txt" || fail "the sdist lacks $f"
done
if grep -q "needle/libneedle.so\|needle/libcjson.so" "$tmp/sdist.txt"; then fail "the sdist carries a built library"; fi

echo "== wheel from the sdist, in a fresh venv"
python3 -m venv "$tmp/venv"
(cd "$tmp" && "$tmp/venv/bin/pip" wheel -q --no-deps -w "$tmp/wheel" "$sdist") ||
  fail "pip wheel of the sdist"
whl="$(ls "$tmp"/wheel/libneedle-*.whl)"
"$tmp/venv/bin/pip" install -q --no-deps --no-index "$whl"
pkg="$(cd "$tmp" && "$tmp/venv/bin/python" -c 'import needle, os; print(os.path.dirname(needle.__file__))')"
case "$pkg" in "$tmp/venv/"*) ;; *) fail "needle imported from $pkg, not the venv" ;; esac
lib="$pkg/libneedle.so"
readelf -d "$lib" > "$tmp/dynamic.txt"
if grep -q "cudart" "$tmp/dynamic.txt"; then fail "$lib needs libcudart"; fi
grep -q 'RUNPATH.*\[\$ORIGIN\]' "$tmp/dynamic.txt" || fail "$lib has no RUNPATH \$ORIGIN: $(grep -i path "$tmp/dynamic.txt")"
ldd "$lib" > "$tmp/ldd.txt"
if grep -q "not found" "$tmp/ldd.txt"; then fail "unresolved: $(grep 'not found' "$tmp/ldd.txt")"; fi
if grep -q "libcjson" "$tmp/dynamic.txt"; then
  grep -q "libcjson.so.1 => $pkg/libcjson.so.1" "$tmp/ldd.txt" ||
    fail "libcjson resolves outside the wheel: $(grep cjson "$tmp/ldd.txt")"
  [ -f "$pkg/libcjson.LICENSE" ] || fail "the bundled libcjson has no license file"
fi
(cd "$tmp" && "$tmp/venv/bin/python" - "$pkg") <<'EOF' || fail "tool call with the installed wheel"
import json, os, sys
import needle, needle._lib as L
pkg = sys.argv[1]
import needle.environments._harness  # the package's subpackage is in the wheel
with needle.Needle() as agent:  # the bundled demo model and its tools
    env = agent.complete("What's the weather in Paris?")
assert L.library_path == os.path.join(pkg, "libneedle.so"), L.library_path
assert agent.weights.startswith(pkg), agent.weights
calls = env["function_calls"]
assert calls and all(c["name"] for c in calls), env
print("   call:", json.dumps(calls[0]))
EOF

echo "== python -m needle serve from the installed wheel (no NEEDLE_CLI, no build folder on PATH)"
[ -x "$pkg/needle-serve" ] || fail "the wheel carries no needle-serve"
(cd "$tmp" && env -u NEEDLE_CLI PATH=/usr/bin:/bin "$tmp/venv/bin/python" -) <<'EOF' ||
import re, signal, subprocess, sys, urllib.request
p = subprocess.Popen([sys.executable, "-m", "needle", "serve", "--port", "0", "--parallel", "1"],
                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
try:
    line = p.stderr.readline()
    port = re.search(r"listening on http://\S+:(\d+) ", line)
    assert port, line
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/health", timeout=30) as r:
        assert r.status == 200
finally:
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
assert p.returncode == 0, p.returncode
print("   serve: /health answered, drained on SIGTERM")
EOF
  fail "python -m needle serve from the installed wheel"

echo "== editable install"
mkdir -p "$tmp/repo"
cp -r "$root/include" "$tmp/repo/include"
(cd "$here" && tar cf - --exclude=.venv --exclude=__pycache__ --exclude='*.egg-info' --exclude=build \
   --exclude=dist --exclude='needle/libneedle.so' --exclude='needle/libcjson*' \
   --exclude='needle/needle-serve' .) |
  (mkdir -p "$tmp/repo/python" && cd "$tmp/repo/python" && tar xf -)
NEEDLE_LIB_PATH="$lib" "$tmp/venv/bin/pip" install -q --no-deps -e "$tmp/repo/python" ||
  fail "pip install -e"
out="$(cd "$tmp" && "$tmp/venv/bin/python" -c 'import needle, needle._lib as L; L.lib(); print(needle.__file__); print(L.library_path)')"
[ "$(echo "$out" | sed -n 1p)" = "$tmp/repo/python/needle/__init__.py" ] || fail "editable: needle imported from $out"
[ "$(echo "$out" | sed -n 2p)" = "$tmp/repo/python/needle/libneedle.so" ] || fail "editable: library $out"
echo "test_wheel: ok"
