#!/usr/bin/env bash
# Compile-and-link check of libneedle for aarch64 macOS, without an Apple SDK: PyPI's
# ziglang (pinned, private venv in BUILD) cross-compiles C for aarch64-macos with its own
# libc headers. Builds libneedle.dylib from the library's sources (the CPU backend; no
# Metal: its host code needs the Apple frameworks) with -Werror, and checks that it exports
# exactly the NEEDLE_API functions of needle.h and needle2.h. Nothing runs: there is no macOS here.
#   scripts/macos-link-check.sh build-macos
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: macos-link-check.sh BUILD}
mkdir -p "$build"
venv=$build/zig-venv
version=0.13.0
if ! "$venv/bin/python" -m ziglang version 2>/dev/null | grep -qx "$version"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "ziglang==$version"
fi
cjson=$(bash scripts/cjson-source.sh "$build")
mkdir -p "$build/include/cjson"
cp "$cjson/cJSON.h" "$build/include/cjson/"
lib=$build/libneedle.dylib
# the library's folders, as CMakeLists.txt globs them
"$venv/bin/python" -m ziglang cc -target aarch64-macos -std=c11 -O2 -D_POSIX_C_SOURCE=200809L \
  -D_DARWIN_C_SOURCE -fvisibility=hidden -Wall -Wextra -Wshadow -Wstrict-prototypes \
  -Wno-unused-parameter -Werror -Iinclude -Isrc -I"$build/include" -shared -o "$lib" \
  src/util/*.c src/format/*.c src/tokenizer/*.c src/model/*.c src/kernels/cpu/*.c \
  src/api/*.c src/grammar/*.c src/agent/*.c src/backend/*.c src/backend/cpu/*.c \
  src/compat/official_abi2.c "$cjson/cJSON.c"
# MH_MAGIC_64 then CPU_TYPE_ARM64, little-endian
head=$(od -An -tx1 -N8 "$lib" | tr -d ' \n')
[ "$head" = cffaedfe0c000001 ] || { echo "FAIL: $lib is not an arm64 Mach-O (starts $head)"; exit 1; }
nm=$(command -v llvm-nm || ls /usr/bin/llvm-nm-* 2>/dev/null | head -n1 || true)
[ -n "$nm" ] || { echo "FAIL: no llvm-nm to read the Mach-O export table"; exit 1; }
public=$(sed -n 's/^NEEDLE_API .*[^a-z0-9_]\(needle_[a-z0-9_]*\)(.*/\1/p' include/needle.h include/needle2.h | sort -u)
exported=$("$nm" -gU "$lib" | awk 'NF == 3 { sub(/^_/, "", $3); print $3 }' | sort -u)
if [ "$public" != "$exported" ]; then
  echo "FAIL: $lib exports differ from the NEEDLE_API functions of needle.h and needle2.h:"
  diff <(printf '%s\n' "$public") <(printf '%s\n' "$exported") || true
  exit 1
fi
echo "ok: $lib (arm64 Mach-O) links and exports the $(printf '%s\n' "$public" | grep -c .) NEEDLE_API functions"
