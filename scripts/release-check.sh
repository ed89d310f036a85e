#!/usr/bin/env bash
# Checks that the version is written consistently before a release is tagged:
#   - include/needle.h (NEEDLE_VERSION_MAJOR/MINOR/PATCH): the one place it is set;
#   - python/pyproject.toml: either a static `version = "X.Y.Z"` equal to it, or
#     `dynamic = ["version"]` with python/setup.py reading those same header lines;
#   - CHANGELOG.md: the top "## X.Y.Z" entry;
#   - the git tag at HEAD, if there is one: vX.Y.Z.
# With --release (what the coordinator runs before `git tag vX.Y.Z`) the top CHANGELOG
# entry must also not say "(unreleased)". Exit 0 when consistent, 1 with the reasons.
# Usage: scripts/release-check.sh [--release] [REPO_ROOT]
set -euo pipefail
release=0
root=""
for arg in "$@"; do
  case "$arg" in
    --release) release=1 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "release-check: unknown option '$arg' (try --help)" >&2; exit 2 ;;
    *) root="$arg" ;;
  esac
done
root="${root:-$(cd "$(dirname "$0")/.." && pwd)}"
errors=0
fail() { echo "release-check: $*" >&2; errors=$((errors + 1)); }

header="$root/include/needle.h"
part() { sed -n "s/^#define NEEDLE_VERSION_$1 \([0-9][0-9]*\)\$/\1/p" "$header"; }
major="$(part MAJOR)" minor="$(part MINOR)" patch="$(part PATCH)"
if [ -z "$major" ] || [ -z "$minor" ] || [ -z "$patch" ]; then
  echo "release-check: $header has no NEEDLE_VERSION_MAJOR/MINOR/PATCH lines" >&2
  exit 1
fi
version="$major.$minor.$patch"
echo "include/needle.h:      $version"

pyproject="$root/python/pyproject.toml"
static="$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$pyproject")"
if [ -n "$static" ]; then
  echo "python/pyproject.toml: $static"
  [ "$static" = "$version" ] || fail "python/pyproject.toml says $static, include/needle.h $version"
elif grep -q '^dynamic *= *\[.*"version"' "$pyproject"; then
  if grep -q 'NEEDLE_VERSION_{p}' "$root/python/setup.py" && grep -q '"include", "needle.h"' "$root/python/setup.py"; then
    echo "python/pyproject.toml: dynamic, from include/needle.h (python/setup.py)"
  else
    fail "python/pyproject.toml has a dynamic version, but python/setup.py does not read include/needle.h"
  fi
else
  fail "python/pyproject.toml has neither a version nor a dynamic one"
fi

top="$(grep -m1 '^## ' "$root/CHANGELOG.md" || true)"
changelog="$(echo "$top" | sed -n 's/^## \([0-9][0-9.]*[0-9]\).*/\1/p')"
echo "CHANGELOG.md:          ${top#\#\# }"
if [ "$changelog" != "$version" ]; then
  fail "CHANGELOG.md's top entry is '${top#\#\# }', not $version"
elif [ "$release" = 1 ] && echo "$top" | grep -qi "unreleased"; then
  fail "CHANGELOG.md's $version entry still says unreleased"
fi

if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  for tag in $(git -C "$root" tag --points-at HEAD 2>/dev/null); do
    case "$tag" in
      v[0-9]*) echo "git tag at HEAD:       $tag"
               [ "$tag" = "v$version" ] || fail "HEAD is tagged $tag, but the version is $version" ;;
    esac
  done
fi

if [ "$errors" -gt 0 ]; then
  echo "release-check: FAILED ($errors problem(s))" >&2
  exit 1
fi
echo "release-check: ok ($version)"
