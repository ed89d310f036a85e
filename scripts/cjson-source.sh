#!/usr/bin/env bash
# Unpacks cJSON's Debian source package (with Debian's patches applied) into DIR/cjson and
# prints that folder, for builds whose target has no cJSON package (Windows, WASI,
# riscv64 on Debian 12): cmake -DNEEDLE_CJSON_SOURCE=DIR/cjson compiles it into the build.
# Nothing is vendored: the source comes from the Debian archive at test time, through
# `apt-get source` (scripts/install-deps.sh --test enables the deb-src entry and installs
# dpkg-dev). Idempotent: an unpacked copy is reused.
#
#   scripts/cjson-source.sh build-mingw     -> build-mingw/cjson
set -euo pipefail
dir=${1:?usage: cjson-source.sh DIR}
mkdir -p "$dir"
out=$(cd "$dir" && pwd)/cjson
if [ -f "$out/cJSON.c" ] && [ -f "$out/cJSON.h" ]; then
  echo "$out"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the same version as the host's libcjson-dev, so every target parses alike
version=$(dpkg-query -W -f='${Version}\n' libcjson-dev 2>/dev/null | head -n1 || true)
spec=cjson${version:+=$version}
if ! (cd "$work" && apt-get source -qq --download-only "$spec" >/dev/null 2>&1); then
  echo "cjson-source: 'apt-get source $spec' failed: no deb-src entry? (scripts/install-deps.sh --test adds one)" >&2
  exit 1
fi
# (the .dsc's own signature needs Debian's keyring for gpgv; apt already checked the files
# against the signed archive index, so dpkg-source's warning about it is dropped)
if ! dpkg-source -x "$work"/cjson_*.dsc "$work/src" >"$work/log" 2>&1; then
  cat "$work/log" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
cp "$work/src/cJSON.c" "$work/src/cJSON.h" "$work/src/LICENSE" "$out/"
echo "$out"
