# Warning and sanitizer flags shared by every target of the project.
add_library(computron_flags INTERFACE)
target_compile_options(computron_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(COMPUTRON_WERROR)
  target_compile_options(computron_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(COMPUTRON_SANITIZE)
  target_compile_options(computron_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer>)
  target_link_options(computron_flags INTERFACE -fsanitize=address,undefined)
endif()
