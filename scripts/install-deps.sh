#!/usr/bin/env bash
# Installs what needle needs on a fresh Debian/Ubuntu machine. Idempotent: installs only
# what is missing; needs root (or sudo) when something is.
#
#   scripts/install-deps.sh          building and running: a C compiler, make, CMake,
#                                    pkg-config and cJSON (the library's one dependency);
#                                    libedit (line editing in `needle chat`, optional:
#                                    without it chat reads plain lines), libmicrohttpd
#                                    (`needle serve`; optional in CMake), libcurl
#                                    (`needle download`; optional in CMake)
#   scripts/install-deps.sh --test   also what the tests need (scripts/test.sh passes it):
#                                    Python 3 with venv (the Python suites), the aarch64
#                                    cross compiler, qemu-user and arm64 cJSON (the NEON
#                                    build under emulation), clang with libFuzzer (the fuzz
#                                    targets), Chromium (the serve playground test),
#                                    the armv7, riscv64 and mingw-w64 cross compilers,
#                                    armhf cJSON, wine64, lld + wasi-libc + clang's
#                                    wasm32 builtins, and a deb-src entry for
#                                    scripts/cjson-source.sh (issue 36's targets).
#                                    ThreadSanitizer comes with gcc's runtime.
set -euo pipefail

with_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) with_tests=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
[ -f /usr/include/histedit.h ] || need+=(libedit-dev)
# `needle serve` (optional in CMake: without it the command says it has no HTTP support)
[ -f /usr/include/microhttpd.h ] || need+=(libmicrohttpd-dev)
# `needle download` (optional in CMake: without it only cached models are found)
[ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] ||
  [ -n "$(find /usr/include -path '*/curl/curl.h' -print -quit 2>/dev/null)" ] ||
  need+=(libcurl4-openssl-dev)

# Tests only. cross: installed without recommends (qemu-user's would register binfmt
# handlers system-wide, which the tests do not need: ctest calls qemu-aarch64 itself).
cross=()
if [ "$with_tests" = 1 ]; then
  if ! command -v python3 >/dev/null 2>&1; then
    need+=(python3 python3-venv)
  elif ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    need+=(python3-venv) # Debian splits `python3 -m venv` out of python3
  fi
  # libFuzzer ships with clang's runtime (a recommended package, so pulled in here)
  fuzzer_links() {
    command -v clang >/dev/null 2>&1 || return 1
    local dir
    dir=$(mktemp -d)
    printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$dir/f.c"
    clang -fsanitize=fuzzer "$dir/f.c" -o "$dir/f" >/dev/null 2>&1
    local rc=$?
    rm -rf "$dir"
    return $rc
  }
  if ! command -v clang >/dev/null 2>&1; then
    need+=(clang)
  elif ! fuzzer_links; then
    major=$(clang -dumpversion | cut -d. -f1)
    need+=("libclang-rt-$major-dev")
  fi
  # The aarch64 (NEON) cross build that scripts/test.sh runs under qemu-user (see
  # cmake/toolchain-aarch64-linux-gnu.cmake): Debian's cross compiler and libc, qemu-user,
  # and cJSON for arm64 through multiarch (on Ubuntu, arm64 packages come from
  # ports.ubuntu.com, which needs its own apt source).
  command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || cross+=(gcc-aarch64-linux-gnu)
  [ -f /usr/aarch64-linux-gnu/include/stdio.h ] || cross+=(libc6-dev-arm64-cross)
  command -v qemu-aarch64 >/dev/null 2>&1 || command -v qemu-aarch64-static >/dev/null 2>&1 ||
    cross+=(qemu-user)
  [ -f /usr/lib/aarch64-linux-gnu/pkgconfig/libcjson.pc ] || cross+=(libcjson-dev:arm64)
  # The other cross targets of scripts/test.sh (issue 36): armv7 (cJSON through multiarch
  # armhf), riscv64 and Windows (mingw-w64 + wine; Debian 12 has no riscv64 or mingw
  # cJSON, so scripts/cjson-source.sh unpacks its source package, which needs a deb-src
  # entry and dpkg-dev).
  command -v arm-linux-gnueabihf-gcc >/dev/null 2>&1 || cross+=(gcc-arm-linux-gnueabihf)
  [ -f /usr/arm-linux-gnueabihf/include/stdio.h ] || cross+=(libc6-dev-armhf-cross)
  [ -f /usr/lib/arm-linux-gnueabihf/pkgconfig/libcjson.pc ] || cross+=(libcjson-dev:armhf)
  command -v riscv64-linux-gnu-gcc >/dev/null 2>&1 || cross+=(gcc-riscv64-linux-gnu)
  [ -f /usr/riscv64-linux-gnu/include/stdio.h ] || cross+=(libc6-dev-riscv64-cross)
  command -v x86_64-w64-mingw32-gcc-posix >/dev/null 2>&1 || cross+=(gcc-mingw-w64-x86-64-posix)
  [ -x /usr/lib/wine/wine64 ] || command -v wine64 >/dev/null 2>&1 || cross+=(wine64)
  command -v dpkg-source >/dev/null 2>&1 || cross+=(dpkg-dev)
  # WebAssembly (cmake/toolchain-wasm32-wasi.cmake): clang (above), lld, wasi-libc and
  # clang's wasm32 runtime builtins
  command -v wasm-ld >/dev/null 2>&1 || cross+=(lld)
  [ -f /usr/lib/wasm32-wasi/libc.a ] || cross+=(wasi-libc)
  # scripts/macos-link-check.sh reads the Mach-O export table with llvm-nm
  command -v llvm-nm >/dev/null 2>&1 || cross+=(llvm)
  if command -v clang >/dev/null 2>&1; then
    major=$(clang -dumpversion | cut -d. -f1)
    ls /usr/lib/llvm-"$major"/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1 ||
      cross+=("libclang-rt-$major-dev-wasm32")
  fi
  # the playground page of `needle serve` in a real browser (tests/serve/test_playground.py)
  command -v chromium >/dev/null 2>&1 || cross+=(chromium)
fi

# scripts/cjson-source.sh runs `apt-get source cjson` (Debian's archive): a deb-src entry
need_src=0
if [ "$with_tests" = 1 ] && ! grep -rqs '^Types: deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/ &&
   [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && grep -qs '^ID=debian' /etc/os-release; then
  need_src=1
fi

if [ ${#need[@]} -gt 0 ] || [ ${#cross[@]} -gt 0 ] || [ "$need_src" = 1 ]; then
  echo "install-deps: installing ${need[*]} ${cross[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  for arch in arm64 armhf; do
    if [[ " ${cross[*]} " == *":$arch "* ]] && ! dpkg --print-foreign-architectures | grep -qx $arch; then
      $SUDO dpkg --add-architecture $arch
    fi
  done
  if [ "$need_src" = 1 ]; then
    # the deb-src twin of the machine's own Debian archive entry (same mirror, suites and
    # key, whatever this machine is set up with): its first deb822 stanza, else its first
    # one-line `deb` entry
    twin=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      twin=$(awk 'BEGIN { RS = "" } /(^|\n)Types:[^\n]*deb/ { print; exit }' \
        /etc/apt/sources.list.d/debian.sources | grep -v '^#' | sed 's/^Types:.*/Types: deb-src/')
    fi
    if [ -n "$twin" ]; then
      printf '%s\n' "$twin" | $SUDO tee /etc/apt/sources.list.d/needle-deb-src.sources >/dev/null
    elif line=$(grep -m1 '^deb ' /etc/apt/sources.list 2>/dev/null); then
      printf '%s\n' "deb-src ${line#deb }" | $SUDO tee /etc/apt/sources.list.d/needle-deb-src.list >/dev/null
    else
      echo "install-deps: no Debian archive entry to add a deb-src twin of" >&2
    fi
  fi
  $SUDO apt-get update -qq
  [ ${#need[@]} -eq 0 ] || $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  [ ${#cross[@]} -eq 0 ] || $SUDO apt-get install -y -qq --no-install-recommends "${cross[@]}" >/dev/null
fi
