# Cross build for 64-bit RISC-V Linux (RV64GC) with Debian's cross compiler; ctest runs the
# tests under qemu-user. Packages (scripts/install-deps.sh --test installs them):
# gcc-riscv64-linux-gnu, libc6-dev-riscv64-cross, qemu-user. Debian 12 has no riscv64
# release architecture, hence no libcjson-dev:riscv64: scripts/cjson-source.sh unpacks
# Debian's cJSON source package, compiled into the build:
#
#   cmake -S . -B build-riscv64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-riscv64-linux-gnu.cmake \
#     -DNEEDLE_CJSON_SOURCE=$(scripts/cjson-source.sh build-riscv64)
#   cmake --build build-riscv64 && (cd build-riscv64 && ctest -L platform)
#
# The CPU backend runs the portable kernels (no RVV kernels: Debian 12's qemu and GCC 12
# support the vector extension, but nothing here is written for it yet).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR riscv64)

set(NEEDLE_CROSS_TRIPLE riscv64-linux-gnu)
set(CMAKE_C_COMPILER ${NEEDLE_CROSS_TRIPLE}-gcc)

set(CMAKE_FIND_ROOT_PATH /usr/${NEEDLE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# no host .pc file may leak in (libedit, libmicrohttpd of the host are x86-64 builds)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${NEEDLE_CROSS_TRIPLE}/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

find_program(NEEDLE_QEMU_RISCV64 NAMES qemu-riscv64 qemu-riscv64-static REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${NEEDLE_QEMU_RISCV64} -L /usr/${NEEDLE_CROSS_TRIPLE})
