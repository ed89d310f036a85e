# Cross build for 64-bit Windows with Debian's mingw-w64 (the posix-threads variant:
# winpthreads gives the library the pthreads it uses everywhere); ctest runs the tests
# under wine. Packages (scripts/install-deps.sh --test installs them):
# gcc-mingw-w64-x86-64-posix, wine64. Debian has no mingw cJSON: scripts/cjson-source.sh
# unpacks Debian's cJSON source package, compiled into the build:
#
#   cmake -S . -B build-mingw -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-x86_64-w64-mingw32.cmake \
#     -DNEEDLE_CJSON_SOURCE=$(scripts/cjson-source.sh build-mingw)
#   cmake --build build-mingw && (cd build-mingw && ctest)
#
# Gives libneedle.dll with its import library libneedle.dll.a (the NEEDLE_API functions,
# exported through __declspec(dllexport)), libneedle.a and needle.exe. The runtime
# (libgcc, libwinpthread) is linked statically, so the DLL and the exe need no other
# DLL beside them.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR AMD64)

set(NEEDLE_CROSS_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${NEEDLE_CROSS_TRIPLE}-gcc-posix)
set(CMAKE_RC_COMPILER ${NEEDLE_CROSS_TRIPLE}-windres)

set(CMAKE_FIND_ROOT_PATH /usr/${NEEDLE_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# no host .pc file may leak in (the host's libedit, libmicrohttpd are Linux builds)
set(ENV{PKG_CONFIG_LIBDIR} /usr/${NEEDLE_CROSS_TRIPLE}/lib/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

set(CMAKE_EXE_LINKER_FLAGS_INIT -static)
set(CMAKE_SHARED_LINKER_FLAGS_INIT -static)

# Test executables run under wine (wine64 from Debian's wine64 package; its own prefix in
# the build folder, so that tests never touch ~/.wine).
find_program(NEEDLE_WINE NAMES wine64 wine PATHS /usr/lib/wine REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${NEEDLE_WINE})
