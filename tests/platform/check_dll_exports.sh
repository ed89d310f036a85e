#!/bin/sh
# Fails unless a Windows DLL's export table is exactly the NEEDLE_API functions of the
# header (the PE counterpart of tests/abi/check_exports.sh).
#   check_dll_exports.sh OBJDUMP LIBRARY.dll HEADER...
set -eu
objdump=$1
lib=$2
shift 2
public=$(sed -n 's/^NEEDLE_API .*[^a-z0-9_]\(needle_[a-z0-9_]*\)(.*/\1/p' "$@" | sort -u)
[ -n "$public" ] || { echo "FAIL: no NEEDLE_API declaration found in $*"; exit 1; }
exported=$("$objdump" -p "$lib" | sed -n '/\[Ordinal\/Name Pointer\] Table/,/^$/p' |
           sed -n 's/^[[:space:]]*\[ *[0-9]*\] \([A-Za-z0-9_]*\)$/\1/p' | sort -u)
[ -n "$exported" ] || { echo "FAIL: $lib has no export table"; exit 1; }
bad=0
for sym in $exported; do
  printf '%s\n' "$public" | grep -qx "$sym" ||
    { echo "FAIL: $lib exports $sym, which is not a NEEDLE_API function of the headers"; bad=1; }
done
for sym in $public; do
  printf '%s\n' "$exported" | grep -qx "$sym" ||
    { echo "FAIL: the headers declare $sym but $lib does not export it"; bad=1; }
done
[ "$bad" = 0 ] && echo "ok: $(printf '%s\n' "$exported" | grep -c .) exports, all NEEDLE_API in the headers"
exit "$bad"
