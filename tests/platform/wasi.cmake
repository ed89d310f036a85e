# The WASI build's tests (cmake/toolchain-wasm32-wasi.cmake), run by wasmtime (ctest's
# emulator, tests/platform/wasmtime_run.py): ctest -L platform. The suites that need no
# process (WASI has none: the harness's run_command fails there) on the one-thread build
# (src/util/wasi/pthread.h), and the tool call through the CLI module.
list(JOIN CMAKE_CROSSCOMPILING_EMULATOR "' '" emulator)
set(NEEDLE_TEST_CLI ${CMAKE_CURRENT_BINARY_DIR}/needle-wasmtime)
file(GENERATE OUTPUT ${NEEDLE_TEST_CLI}
  CONTENT "#!/bin/sh\nexec '${emulator}' '$<TARGET_FILE:needle_cli>' \"$@\"\n"
  FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                   WORLD_READ WORLD_EXECUTE)
set(NEEDLE_WASI_TESTS test_format3 test_tokenizer test_kernels test_simd test_parity)
foreach(name ${NEEDLE_WASI_TESTS})
  needle_test_executable(${name}) # test_simd: the simd128 kernels against the portable ones
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS platform TIMEOUT 600 SKIP_RETURN_CODE 77
    ENVIRONMENT "NEEDLE_FIXTURES=${CMAKE_CURRENT_SOURCE_DIR}/fixtures;NEEDLE_PARITY_SKIP=full_")
endforeach()
# the kernel tests of test_simd (its pool tests need threads, which WASI lacks): every
# level built here, the simd128 one included, against the portable kernels
set_property(TEST test_simd APPEND PROPERTY ENVIRONMENT
             "NEEDLE_TEST_FILTER=dispatch,matmul,transforms,dot,large")
add_test(NAME platform_tool_call COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/platform/tool_call.sh)
set_tests_properties(platform_tool_call PROPERTIES LABELS platform TIMEOUT 600
  ENVIRONMENT "NEEDLE_CLI=${NEEDLE_TEST_CLI}")
# The browser build's module through its exports (web/needle_web.c), with no files or
# environment, as a tab runs it: the demo model's bytes, the demo tools, one query. ~8 s.
list(GET CMAKE_CROSSCOMPILING_EMULATOR 0 wasmtime_python)
add_test(NAME platform_web_module COMMAND ${wasmtime_python}
         ${CMAKE_CURRENT_SOURCE_DIR}/platform/web_module.py $<TARGET_FILE:needle_web>
         ${PROJECT_SOURCE_DIR}/models/needle-demo.cact ${PROJECT_SOURCE_DIR}/models/needle-demo.tools.json)
set_tests_properties(platform_web_module PROPERTIES LABELS platform TIMEOUT 300)
