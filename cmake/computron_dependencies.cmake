# Finds every external dependency once (DEPS.md): Debian packages, and libtorch and the CUDA
# toolkit from the Python environment scripts/setup fills (computron_python_env.cmake).
find_package(Threads REQUIRED)

# CAF 0.17.6 ships no CMake config: imported targets by hand. CAF_ROOT points at an
# unpacked .deb tree on machines without the package (the lent GPU machine).
find_path(CAF_INCLUDE_DIR caf/all.hpp HINTS ${CAF_ROOT}/usr/include ${CAF_ROOT}/include)
find_library(CAF_CORE_LIBRARY caf_core HINTS ${CAF_ROOT}/usr/lib/x86_64-linux-gnu ${CAF_ROOT}/lib)
find_library(CAF_IO_LIBRARY caf_io HINTS ${CAF_ROOT}/usr/lib/x86_64-linux-gnu ${CAF_ROOT}/lib)
find_library(CAF_OPENSSL_LIBRARY caf_openssl HINTS ${CAF_ROOT}/usr/lib/x86_64-linux-gnu ${CAF_ROOT}/lib)
if(NOT CAF_INCLUDE_DIR OR NOT CAF_CORE_LIBRARY OR NOT CAF_IO_LIBRARY)
  message(FATAL_ERROR "CAF 0.17 not found: run scripts/setup (libcaf-dev) or set CAF_ROOT")
endif()
file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" caf_version_line REGEX "define CAF_VERSION ")
string(REGEX MATCH "[0-9]+" CAF_VERSION "${caf_version_line}")
if(NOT CAF_VERSION EQUAL 1706)
  message(WARNING "Computron is written against CAF 0.17.6 (1706); found ${CAF_VERSION}")
endif()
add_library(CAF::core UNKNOWN IMPORTED)
set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES Threads::Threads)
add_library(CAF::io UNKNOWN IMPORTED)
set_target_properties(CAF::io PROPERTIES IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
  INTERFACE_LINK_LIBRARIES CAF::core)
if(CAF_OPENSSL_LIBRARY)
  add_library(CAF::openssl UNKNOWN IMPORTED)
  set_target_properties(CAF::openssl PROPERTIES IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
    INTERFACE_LINK_LIBRARIES CAF::io)
endif()

find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
if(NOT COMPUTRON_FUZZ)
  find_package(Catch2 2 REQUIRED)
  include(Catch)
endif()
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
if(NOT CLI11_INCLUDE_DIR)
  message(FATAL_ERROR "CLI11 not found: run scripts/setup (libcli11-dev)")
endif()

# CUDA: compiled whenever nvcc exists (the toolkit wheels put it in every build tree), so CI
# compile-checks the backend without a GPU. Whether a GPU is used is decided at run time
# (gpu/backends.cpp).
set(COMPUTRON_HAVE_CUDA OFF)
if(COMPUTRON_FUZZ)
  # The fuzz tree builds parsers only: no CUDA, no torch.
  return()
endif()
if(NOT COMPUTRON_NO_TORCH)
  include(computron_python_env)
endif()
if(COMPUTRON_CUDA AND NOT COMPUTRON_NO_TORCH)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE)
    # pip's NCCL has only libnccl.so.2, hence NAMES_PER_DIR and the versioned name.
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
      HINTS ${NCCL_ROOT} ${NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
    if(NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
      set(COMPUTRON_HAVE_CUDA ON)
      message(STATUS "computron: CUDA backend ON (CUDA ${CUDAToolkit_VERSION}, ${NCCL_LIBRARY})")
    else()
      message(WARNING "computron: nvcc found but NCCL is missing; CUDA backend OFF")
    endif()
  else()
    message(STATUS "computron: no nvcc; CPU-only build (emulated devices)")
  endif()
endif()

if(COMPUTRON_REQUIRE_CUDA AND NOT COMPUTRON_HAVE_CUDA)
  message(FATAL_ERROR "computron: COMPUTRON_REQUIRE_CUDA is on, but no nvcc and NCCL were found: "
    "run scripts/setup (it installs the CUDA toolkit wheels into ${COMPUTRON_VENV})")
endif()

set(COMPUTRON_TORCH_CUDA OFF)
if(COMPUTRON_NO_TORCH)
  # The sanitizer and TSan trees build torch-free binaries only (scripts/build).
  return()
endif()
set(COMPUTRON_CUDA_ARCHITECTURES_SAVED ${CMAKE_CUDA_ARCHITECTURES})
# libtorch: the CUDA libtorch 2.x that the torch wheel carries, on every machine. Found here,
# before any target, because two of its properties change how the whole project compiles.
find_package(Torch REQUIRED)
# 1. Torch 2.x bundles fmt headers of its own version (fmt 12 in torch 2.11) ahead of
#    Debian's fmt 9 on the include path; its translation units then reference fmt::v12
#    symbols that no library exports. Header-only fmt everywhere makes every use
#    self-contained, whichever headers a translation unit sees.
set(COMPUTRON_TORCH_FMT_VERSION "")
foreach(dir ${TORCH_INCLUDE_DIRS})
  foreach(h base.h core.h)
    if(NOT COMPUTRON_TORCH_FMT_VERSION AND EXISTS "${dir}/fmt/${h}"
       AND NOT "${dir}" STREQUAL "/usr/include")
      file(STRINGS "${dir}/fmt/${h}" fmt_line REGEX "^#[ \t]*define FMT_VERSION [0-9]+")
      string(REGEX MATCH "[0-9]+$" COMPUTRON_TORCH_FMT_VERSION "${fmt_line}")
    endif()
  endforeach()
endforeach()
if(COMPUTRON_TORCH_FMT_VERSION)
  math(EXPR torch_fmt_major "${COMPUTRON_TORCH_FMT_VERSION} / 10000")
  if(NOT torch_fmt_major EQUAL fmt_VERSION_MAJOR)
    message(STATUS "computron: torch bundles fmt ${COMPUTRON_TORCH_FMT_VERSION}, the system "
                   "has ${fmt_VERSION}: building with FMT_HEADER_ONLY")
    add_compile_definitions(FMT_HEADER_ONLY=1)
  endif()
endif()
# 2. A CUDA libtorch lets the OPT forward cap libtorch's caching allocator to the
#    activation workspace (engine/torch/torch_interop.cpp is the only user).
if(TORCH_CUDA_LIBRARIES OR TARGET c10_cuda)
  set(COMPUTRON_TORCH_CUDA ON)
  message(STATUS "computron: libtorch ${Torch_VERSION} with CUDA")
endif()
# 3. The wheel's libtorch.so and libtorch_cpu.so export copies of libstdc++'s std::filesystem
#    and <chrono> time-zone functions (built with the manylinux toolchain's static
#    libstdc++ parts). A binary lists libstdc++ last, so those copies interposed on the
#    system's: std::filesystem::remove_all resolved into libtorch.so and jumped to address 0.
#    computron_torch links libstdc++ ahead of torch, so every binary that links torch takes
#    the standard library from libstdc++ itself. Use it instead of TORCH_LIBRARIES.
add_library(computron_torch INTERFACE)
target_link_libraries(computron_torch INTERFACE
  "-Wl,--push-state,--no-as-needed" stdc++ "-Wl,--pop-state" ${TORCH_LIBRARIES})
if(COMPUTRON_REQUIRE_CUDA AND NOT COMPUTRON_TORCH_CUDA)
  message(FATAL_ERROR "computron: COMPUTRON_REQUIRE_CUDA is on, but libtorch ${Torch_VERSION} "
    "has no CUDA: run scripts/setup (the torch wheel in ${COMPUTRON_VENV} is the CUDA build)")
endif()
if(COMPUTRON_CUDA_ARCHITECTURES_SAVED)
  set(CMAKE_CUDA_ARCHITECTURES ${COMPUTRON_CUDA_ARCHITECTURES_SAVED})
endif()
