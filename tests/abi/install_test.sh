#!/bin/sh
# Installs a built libneedle into a temporary prefix and builds tests/abi/consumer.c
# against it twice, with pkg-config (needle.pc) and with CMake's find_package(needle)
# (needle::needle), then runs both. Usage: install_test.sh BUILD_DIR CC [EXTRA_CFLAGS]
# (EXTRA_CFLAGS: the sanitizer flags of a sanitized build). Exit 77 (ctest: skipped)
# without cmake; the pkg-config half is skipped, with a note, without pkg-config.
set -eu
build=$(cd "$1" && pwd)
cc=$2
extra=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
command -v cmake >/dev/null 2>&1 || { echo "SKIP: cmake not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name 'libneedle.so*' -o -name 'libneedle*.dylib' | head -n 1)")
[ -f "$prefix/include/needle.h" ] || { echo "FAIL: needle.h not installed"; exit 1; }
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DYLD_LIBRARY_PATH="$libdir"

if command -v pkg-config >/dev/null 2>&1; then
  export PKG_CONFIG_PATH="$libdir/pkgconfig"
  flags=$(pkg-config --cflags --libs needle)
  # shellcheck disable=SC2086 # word splitting of the flags is intended
  "$cc" -std=c99 -Wall -Werror $extra "$here/consumer.c" -o "$tmp/consumer_pc" $flags
  "$tmp/consumer_pc"
  [ "$(pkg-config --modversion needle)" = "$("$tmp/consumer_pc" | cut -d' ' -f2)" ] ||
    { echo "FAIL: needle.pc version differs from the library"; exit 1; }
else
  echo "note: pkg-config not found; the pkg-config consumer is not built"
fi

mkdir "$tmp/cm"
cat >"$tmp/cm/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(needle_consumer C)
find_package(needle REQUIRED)
add_executable(consumer_cmake $here/consumer.c)
target_link_libraries(consumer_cmake PRIVATE needle::needle)
CMAKE
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="$extra" >"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log"; exit 1; }
cmake --build "$tmp/cm/build" >>"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log"; exit 1; }
"$tmp/cm/build/consumer_cmake"
echo "ok: pkg-config and find_package consumers ran against the installed library"
