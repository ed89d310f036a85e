#!/usr/bin/env bash
# Installs what building and testing needle needs on a fresh Debian/Ubuntu machine.
# Idempotent: installs only what is missing. Needs root (or sudo) when something is.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
command -v python3 >/dev/null 2>&1 || need+=(python3)

# The aarch64 (NEON) cross build that scripts/test.sh runs under qemu-user (see
# cmake/toolchain-aarch64-linux-gnu.cmake): Debian's cross compiler and libc, qemu-user,
# and cJSON for arm64 through multiarch (on Ubuntu, arm64 packages come from
# ports.ubuntu.com, which needs its own apt source).
cross=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || cross+=(gcc-aarch64-linux-gnu)
[ -f /usr/aarch64-linux-gnu/include/stdio.h ] || cross+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || command -v qemu-aarch64-static >/dev/null 2>&1 ||
  cross+=(qemu-user)
[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libcjson.pc ] || cross+=(libcjson-dev:arm64)

if [ ${#need[@]} -gt 0 ] || [ ${#cross[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]} ${cross[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if [[ " ${cross[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  [ ${#need[@]} -eq 0 ] || $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  # no recommends: qemu-user's would register binfmt handlers system-wide, which the
  # tests do not need (ctest calls qemu-aarch64 itself)
  [ ${#cross[@]} -eq 0 ] || $SUDO apt-get install -y -qq --no-install-recommends "${cross[@]}" >/dev/null
fi
