# Where libtorch and the CUDA toolkit come from: one Python environment (DEPS.md).
#
# Every machine builds against the same libtorch, the CUDA build that PyPI's torch wheel
# carries (it runs on machines without a GPU too), and the CUDA toolkit wheels of the same
# CUDA version (nvcc, cudart, cuBLAS, NCCL). scripts/setup installs them into
# COMPUTRON_VENV (default ~/.cache/computron/venv); on a GPU machine without that
# environment, the python3 on PATH that has torch is used (its image carries torch).
# Debian's libtorch and a toolkit under /usr/local/cuda are never preferred: the toolkit
# there is only a fallback where the environment has no nvcc.
#
# Sets: COMPUTRON_PYTHON, COMPUTRON_TORCH_PREFIX (torch's CMake prefix),
# COMPUTRON_TORCH_ROOT (the torch package folder), and, where the environment has them,
# CMAKE_CUDA_COMPILER, CUDAToolkit_ROOT, CUDA_TOOLKIT_ROOT_DIR (torch's legacy FindCUDA)
# and NCCL_ROOT. Values given on the command line win.

set(COMPUTRON_VENV "$ENV{HOME}/.cache/computron/venv" CACHE PATH
  "The Python environment scripts/setup fills (torch, CUDA toolkit wheels)")
if(NOT COMPUTRON_PYTHON)
  if(EXISTS "${COMPUTRON_VENV}/bin/python3")
    set(COMPUTRON_PYTHON "${COMPUTRON_VENV}/bin/python3")
  else()
    find_program(COMPUTRON_PYTHON NAMES python3)
  endif()
endif()
set(COMPUTRON_PYTHON "${COMPUTRON_PYTHON}" CACHE FILEPATH "The python3 whose torch is built against")

if(NOT COMPUTRON_TORCH_PREFIX AND COMPUTRON_PYTHON)
  # One interpreter start (about 2 s with torch) answers every path.
  execute_process(
    COMMAND "${COMPUTRON_PYTHON}" -c
      "import os, sysconfig, torch; print(torch.utils.cmake_prefix_path); print(os.path.dirname(torch.__file__)); print(sysconfig.get_paths()['purelib']); print(torch.__version__); print(torch.version.cuda or '')"
    OUTPUT_VARIABLE py_out RESULT_VARIABLE py_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(py_rc EQUAL 0)
    string(REPLACE "\n" ";" py_lines "${py_out}")
    list(GET py_lines 0 COMPUTRON_TORCH_PREFIX)
    list(GET py_lines 1 COMPUTRON_TORCH_ROOT)
    list(GET py_lines 2 COMPUTRON_SITE_PACKAGES)
    list(GET py_lines 3 COMPUTRON_TORCH_WHEEL_VERSION)
    list(LENGTH py_lines n)
    if(n GREATER 4)
      list(GET py_lines 4 COMPUTRON_TORCH_WHEEL_CUDA)
    endif()
    set(COMPUTRON_TORCH_PREFIX "${COMPUTRON_TORCH_PREFIX}" CACHE PATH "torch's CMake prefix")
    set(COMPUTRON_TORCH_ROOT "${COMPUTRON_TORCH_ROOT}" CACHE PATH "the torch package folder")
    set(COMPUTRON_SITE_PACKAGES "${COMPUTRON_SITE_PACKAGES}" CACHE PATH "site-packages of COMPUTRON_PYTHON")
    message(STATUS "computron: torch ${COMPUTRON_TORCH_WHEEL_VERSION} (CUDA ${COMPUTRON_TORCH_WHEEL_CUDA}) from ${COMPUTRON_PYTHON}")
  endif()
endif()
if(NOT COMPUTRON_TORCH_PREFIX)
  message(FATAL_ERROR "computron: no torch found for ${COMPUTRON_PYTHON}: run scripts/setup "
    "(it installs torch into ${COMPUTRON_VENV}), or give -DCOMPUTRON_PYTHON=/path/to/python3")
endif()
# The torch package folder itself is a prefix too, ahead of everything else: its lib/ is then
# searched before the system's, so a Debian libtorch left on the machine is never picked.
list(PREPEND CMAKE_PREFIX_PATH "${COMPUTRON_TORCH_ROOT}" "${COMPUTRON_TORCH_PREFIX}")

# The CUDA toolkit wheels lay the toolkit out under site-packages/nvidia/cu<major>/ (bin/nvcc,
# include/, lib/), NCCL under site-packages/nvidia/nccl/.
if(COMPUTRON_SITE_PACKAGES)
  file(GLOB computron_cu_dirs LIST_DIRECTORIES true "${COMPUTRON_SITE_PACKAGES}/nvidia/cu[0-9]*")
  foreach(dir ${computron_cu_dirs})
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS "${dir}/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "${dir}/bin/nvcc")
      set(CUDAToolkit_ROOT "${dir}")
      set(CUDA_TOOLKIT_ROOT_DIR "${dir}" CACHE PATH "the CUDA toolkit (torch's FindCUDA)")
    endif()
  endforeach()
  if(NOT NCCL_ROOT AND EXISTS "${COMPUTRON_SITE_PACKAGES}/nvidia/nccl/include/nccl.h")
    set(NCCL_ROOT "${COMPUTRON_SITE_PACKAGES}/nvidia/nccl")
  endif()
endif()
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  # A GPU machine's image whose Python has torch but no nvcc wheel.
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  set(CUDAToolkit_ROOT /usr/local/cuda)
  set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda CACHE PATH "the CUDA toolkit (torch's FindCUDA)")
endif()
# Hopper (H100/H200) unless told otherwise; torch's own CUDA config reads the second name.
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
if(NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST 9.0)
endif()
