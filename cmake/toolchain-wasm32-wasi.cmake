# WebAssembly (wasm32-wasi) with Debian's clang, lld, wasi-libc and
# libclang-rt-14-dev-wasm32 (scripts/install-deps.sh --test installs them). Single-threaded:
# wasi-libc has no pthreads, so src/util/wasi/pthread.h stands in (the thread pool runs
# every task on the calling thread), and the model file is read into memory
# (src/util/platform_wasi.c) instead of mapped. cJSON comes from Debian's source package
# (scripts/cjson-source.sh). ctest runs the modules with wasmtime (tests/platform/wasmtime_run.py,
# PyPI's wasmtime in a private venv: scripts/wasmtime-venv.sh).
#
#   cmake -S . -B build-wasi -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-wasm32-wasi.cmake \
#     -DNEEDLE_CJSON_SOURCE=$(scripts/cjson-source.sh build-wasi)
set(CMAKE_SYSTEM_NAME WASI)
set(CMAKE_SYSTEM_PROCESSOR wasm32)
set(CMAKE_SYSTEM_VERSION 1)

set(CMAKE_C_COMPILER clang)
set(CMAKE_C_COMPILER_TARGET wasm32-unknown-wasi)
set(CMAKE_SYSROOT /usr)
# wasi-libc's emulations for what the CLI uses: getpid (temporary file names) and signal()
# (no signals arrive under WASI; the handlers are simply never called)
set(CMAKE_C_FLAGS_INIT "-isystem ${CMAKE_CURRENT_LIST_DIR}/../src/util/wasi -D_WASI_EMULATED_GETPID -D_WASI_EMULATED_SIGNAL")
# 8 MiB of stack (the default 64 KiB is too small for the tokenizer's and grammar's frames)
set(CMAKE_EXE_LINKER_FLAGS_INIT "-fuse-ld=lld -Wl,-z,stack-size=8388608 -lwasi-emulated-getpid -lwasi-emulated-signal")
set(CMAKE_EXECUTABLE_SUFFIX .wasm)
# no shared libraries in WASI
set_property(GLOBAL PROPERTY TARGET_SUPPORTS_SHARED_LIBS FALSE)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)

set(CMAKE_FIND_ROOT_PATH /usr/lib/wasm32-wasi)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/wasm32-wasi/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# ctest runs the modules with wasmtime from a private venv in the build folder
# (scripts/wasmtime-venv.sh BUILD makes it; PyPI's wasmtime, pinned there)
set(CMAKE_CROSSCOMPILING_EMULATOR ${CMAKE_BINARY_DIR}/wasmtime-venv/bin/python
    ${CMAKE_CURRENT_LIST_DIR}/../tests/platform/wasmtime_run.py)
