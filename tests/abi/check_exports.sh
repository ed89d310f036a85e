#!/bin/sh
# Fails if libneedle exports a symbol that is not a public function of its headers
# (include/needle.h, include/needle2.h), or does not export one.
# Usage: check_exports.sh LIBRARY HEADER... Exit 77 (ctest: skipped) without nm.
set -eu
lib=$1
shift
command -v nm >/dev/null 2>&1 || { echo "SKIP: nm not found"; exit 77; }
# the functions needle.h exports: every NEEDLE_API declaration
public=$(sed -n 's/^NEEDLE_API .*[^a-z0-9_]\(needle_[a-z0-9_]*\)(.*/\1/p' "$@" | sort -u)
[ -n "$public" ] || { echo "FAIL: no NEEDLE_API declaration found in $*"; exit 1; }
case "$(uname -s)" in
  Darwin) exported=$(nm -gU "$lib" | awk 'NF == 3 { sub(/^_/, "", $3); print $3 }' | sort -u) ;;
  *) exported=$(nm -D --defined-only "$lib" | awk 'NF == 3 { print $3 }' | sort -u) ;;
esac
bad=0
for sym in $exported; do
  if ! printf '%s\n' "$public" | grep -qx "$sym"; then
    echo "FAIL: $lib exports $sym, which is not a NEEDLE_API function of the headers"
    bad=1
  fi
done
for sym in $public; do
  if ! printf '%s\n' "$exported" | grep -qx "$sym"; then
    echo "FAIL: the headers declare $sym but $lib does not export it"
    bad=1
  fi
done
n=$(printf '%s\n' "$exported" | grep -c . || true)
[ "$bad" = 0 ] && echo "ok: $n exported symbols, all declared NEEDLE_API in the headers"
exit "$bad"
