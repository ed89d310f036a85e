# Cross build for 64-bit ARM Linux with Debian's cross compiler; ctest runs the tests
# under qemu-user. Packages (scripts/install-deps.sh installs them): gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user, and libcjson-dev:arm64 (multiarch, after
# `dpkg --add-architecture arm64`).
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
#   cmake --build build-aarch64 && (cd build-aarch64 && ctest)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(NEEDLE_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${NEEDLE_CROSS_TRIPLE}-gcc)

# Headers and libraries: the cross libc under /usr/aarch64-linux-gnu, and arm64 packages
# installed through multiarch (cJSON) under /usr/include and /usr/lib/aarch64-linux-gnu.
set(CMAKE_FIND_ROOT_PATH /usr/${NEEDLE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config must see only the arm64 .pc files (libcjson.pc of libcjson-dev:arm64).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${NEEDLE_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Test executables run under qemu-user, whose -L names the root the arm64 dynamic loader
# and libraries are taken from. The loader and libc must come from the same glibc build:
# with multiarch arm64 packages installed (libcjson1:arm64 pulls in libc6:arm64), that is
# the host root, because the loader searches /lib/aarch64-linux-gnu first and would mix
# the cross libc's loader with the multiarch libc (threads then hang); without them, the
# cross libc under /usr/aarch64-linux-gnu.
find_program(NEEDLE_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static REQUIRED)
if(EXISTS /lib/ld-linux-aarch64.so.1)
  set(NEEDLE_QEMU_ROOT /)
else()
  set(NEEDLE_QEMU_ROOT /usr/${NEEDLE_CROSS_TRIPLE})
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR ${NEEDLE_QEMU_AARCH64} -L ${NEEDLE_QEMU_ROOT})
