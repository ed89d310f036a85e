# The Windows build's tests (cmake/toolchain-x86_64-w64-mingw32.cmake), run under wine by
# ctest -L platform: what the C suite cannot show there (it needs POSIX the Windows runtime
# lacks: fork/wait, glob, setenv):
#   dll_exports         libneedle.dll exports exactly the NEEDLE_API functions of needle.h
#                       (__declspec(dllexport)), nothing of cJSON or the internals
#   platform_tool_call  needle.exe runs "Set a timer for 25 minutes" on the demo model and
#                       gives set_timer 25, the call of the native build (the model file is
#                       opened through CreateFileMapping, the work runs on winpthreads)
#   utf8_args           needle.exe given the model and tools by non-ASCII paths on its
#                       command line (argv rebuilt as UTF-8 from the wide command line,
#                       files opened by UTF-8 path) gives the same call
#   win_utf8_open       a program linked to libneedle.dll through its import library
#                       opens the demo model by a non-ASCII UTF-8 path (platform_win32.c
#                       converts UTF-8 paths to UTF-16); bad paths give clear errors
# wine keeps its prefix in the build folder, never in ~/.wine.
list(JOIN CMAKE_CROSSCOMPILING_EMULATOR "' '" emulator)
set(NEEDLE_WINEPREFIX ${CMAKE_BINARY_DIR}/wineprefix)
set(NEEDLE_TEST_CLI ${CMAKE_CURRENT_BINARY_DIR}/needle-wine)
file(GENERATE OUTPUT ${NEEDLE_TEST_CLI}
  CONTENT "#!/bin/sh\nWINEPREFIX='${NEEDLE_WINEPREFIX}' WINEDEBUG=-all exec '${emulator}' '$<TARGET_FILE:needle_cli>' \"$@\"\n"
  FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                   WORLD_READ WORLD_EXECUTE)

find_program(NEEDLE_MINGW_OBJDUMP NAMES ${NEEDLE_CROSS_TRIPLE}-objdump objdump)
add_test(NAME dll_exports COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/platform/check_dll_exports.sh
         ${NEEDLE_MINGW_OBJDUMP} $<TARGET_FILE:needle_shared> ${PROJECT_SOURCE_DIR}/include/needle.h
         ${PROJECT_SOURCE_DIR}/include/needle2.h)
add_test(NAME platform_tool_call COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/platform/tool_call.sh)
add_test(NAME utf8_args COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/platform/utf8_args.sh ${PROJECT_SOURCE_DIR})
add_executable(win_utf8_open platform/win_utf8_open.c)
target_compile_options(win_utf8_open PRIVATE ${NEEDLE_WARNINGS})
target_link_libraries(win_utf8_open PRIVATE needle_shared)
# the DLL beside the exe, where Windows looks for it first
add_custom_command(TARGET win_utf8_open POST_BUILD COMMAND ${CMAKE_COMMAND} -E copy_if_different
                   $<TARGET_FILE:needle_shared> $<TARGET_FILE_DIR:win_utf8_open>)
add_test(NAME win_utf8_open COMMAND win_utf8_open)
# one wine prefix: the tests run one after the other (the first creates it, ~10 s)
set_tests_properties(dll_exports platform_tool_call utf8_args win_utf8_open PROPERTIES
  LABELS platform TIMEOUT 600 RUN_SERIAL TRUE
  ENVIRONMENT "NEEDLE_CLI=${NEEDLE_TEST_CLI};WINEPREFIX=${NEEDLE_WINEPREFIX};WINEDEBUG=-all")

# The C suites that run on Windows: those that need no fork/wait, glob or aligned_alloc and
# do not drive the CLI through a POSIX shell command line (cmd.exe reads those quotes
# differently: test_grad_v3, test_validation, test_finetune_data; test_export and
# test_export_v3 run all but their test_cli there). test_backend_ops3 is not here: it
# skips without a second backend. ~2 min under wine.
set(NEEDLE_WINDOWS_TESTS
  test_tokenizer test_kernels test_parity test_lanes test_monarch_kernels test_threads
  test_arch test_attention test_a8_v3 test_heads3 test_v3 test_v3_kv test_v3_kv_layout test_export test_export_v3
  test_grammar test_grammar_mask test_grammar_refs test_grammar_union test_grammar_walk
  test_json_canon test_unicode_values test_prompt_template test_retrieval test_repeat_guard
  test_train_ops test_train_optim test_train_checkpoint)
foreach(name ${NEEDLE_WINDOWS_TESTS})
  needle_test_executable(${name})
  # mkdtemp, strndup, setenv, unsetenv: the POSIX the Windows runtime lacks
  target_compile_options(${name} PRIVATE -include ${CMAKE_CURRENT_SOURCE_DIR}/platform/win_posix.h)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS platform TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
    ENVIRONMENT "NEEDLE_FIXTURES=${CMAKE_CURRENT_SOURCE_DIR}/fixtures;NEEDLE_PARITY_SKIP=full_;WINEPREFIX=${NEEDLE_WINEPREFIX};WINEDEBUG=-all")
endforeach()
# the exporters' byte identity with the official ones (the check that found mingw's
# inexact fmaf, quant/exact_fma.h), without the CLI cases
set_property(TEST test_export APPEND PROPERTY ENVIRONMENT
  "NEEDLE_TEST_FILTER=codebooks,bits_map,identity,round_trip,hostile")
set_property(TEST test_export_v3 APPEND PROPERTY ENVIRONMENT
  "NEEDLE_TEST_FILTER=identity,round_trip,requantize")
