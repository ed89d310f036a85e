# Cross build for 32-bit ARM Linux (ARMv7-A, hard float) with Debian's cross compiler; ctest
# runs the tests under qemu-user. Packages (scripts/install-deps.sh --test installs them):
# gcc-arm-linux-gnueabihf, libc6-dev-armhf-cross, qemu-user, and libcjson-dev:armhf
# (multiarch, after `dpkg --add-architecture armhf`).
#
#   cmake -S . -B build-armv7 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-armv7-linux-gnueabihf.cmake
#   cmake --build build-armv7 && (cd build-armv7 && ctest)
#
# The target that matters here is the 32-bit one: size_t and pointers of 4 bytes while
# the .cact file's offsets and sizes are 64-bit, so the loader's range checks are what
# this build tests. The library is built for the armhf baseline (no NEON); the NEON
# kernels are built for NEON + VFPv4 (CMakeLists.txt) and chosen at run time when the CPU
# has both (kernels/cpu/neon.h; qemu-arm's default CPU does).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR armv7l)

set(NEEDLE_CROSS_TRIPLE arm-linux-gnueabihf)
set(CMAKE_C_COMPILER ${NEEDLE_CROSS_TRIPLE}-gcc)

set(CMAKE_FIND_ROOT_PATH /usr/${NEEDLE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config must see only the armhf .pc files (libcjson.pc of libcjson-dev:armhf).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${NEEDLE_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# The same loader/libc pairing rule as cmake/toolchain-aarch64-linux-gnu.cmake: with
# multiarch armhf packages installed (libc6:armhf), the host root; else the cross libc.
find_program(NEEDLE_QEMU_ARM NAMES qemu-arm qemu-arm-static REQUIRED)
if(EXISTS /lib/ld-linux-armhf.so.3)
  set(NEEDLE_QEMU_ROOT /)
else()
  set(NEEDLE_QEMU_ROOT /usr/${NEEDLE_CROSS_TRIPLE})
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR ${NEEDLE_QEMU_ARM} -L ${NEEDLE_QEMU_ROOT})
