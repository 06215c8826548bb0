# Warning and sanitizer flags shared by every target of the project.
add_library(computron_flags INTERFACE)
target_compile_options(computron_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(COMPUTRON_WERROR)
  target_compile_options(computron_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(COMPUTRON_SANITIZE)
  # gcc leaves float-cast-overflow out of "undefined" (clang's fuzz tree has it): a float
  # converted to an integer it does not fit is undefined all the same, and a config once
  # carried one (tests/fuzz/corpus/serve_config/regression-float-device-index).
  target_compile_options(computron_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer>)
  target_link_options(computron_flags INTERFACE -fsanitize=address,undefined,float-cast-overflow)
  # Every executable (whatever links computron_flags, however indirectly) gets the
  # default UBSan options with the suppressions file; libraries do not, so the symbol is
  # defined once per program.
  set(COMPUTRON_UBSAN_SUPPRESSIONS "${CMAKE_CURRENT_LIST_DIR}/ubsan.supp")
  set(computron_sanitizer_options "${CMAKE_BINARY_DIR}/sanitizer_options.cpp")
  configure_file("${CMAKE_CURRENT_LIST_DIR}/sanitizer_options.cpp.in"
    "${computron_sanitizer_options}" @ONLY)
  target_sources(computron_flags INTERFACE
    "$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:${computron_sanitizer_options}>")
endif()
if(COMPUTRON_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "COMPUTRON_FUZZ needs clang (scripts/fuzz sets CXX=clang++)")
  endif()
  # Libraries get coverage counters without libFuzzer's main; every UB report aborts, so
  # libFuzzer keeps the input that caused it.
  target_compile_options(computron_flags INTERFACE
    -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)
  target_link_options(computron_flags INTERFACE -fsanitize=address,undefined)
endif()
if(COMPUTRON_TSAN)
  target_compile_options(computron_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer -Wno-tsan>)
  # -Wno-tsan: gcc warns that TSan does not model std::atomic_thread_fence, once per
  # translation unit that includes a header using it (CAF's); CI's -Werror would stop there.
  target_link_options(computron_flags INTERFACE -fsanitize=thread)
  # Every executable gets the report filter for races provably inside CAF (its header
  # says why a suppression entry cannot do it); libraries do not, so it is defined once.
  target_sources(computron_flags INTERFACE
    "$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:${CMAKE_CURRENT_LIST_DIR}/tsan_report_filter.cpp>")
  target_link_libraries(computron_flags INTERFACE ${CMAKE_DL_LIBS})
endif()
