# CUDA is optional: with nvcc present (and MOE_ENABLE_CUDA on) our .cu kernels are compiled into
# a fatbin for the GPUs users have, unless CMAKE_CUDA_ARCHITECTURES says otherwise: SASS for
# sm_80 (A100; it also runs on sm_86/89: A10, L4, L40S, RTX 30/40), sm_90 (H100/H200), sm_100
# (B200) and sm_120 (RTX 50), plus compute_120 PTX that newer GPUs JIT. `moe-train env` says
# whether the present GPU is covered (src/env/cuda_arch.cpp). Without nvcc the build is CPU-only.
set(MOE_HAVE_CUDA OFF)
if(MOE_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 100-real 120)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 dialect for nvcc 13
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(MOE_HAVE_CUDA ON)
    message(STATUS "moe-train: CUDA kernels ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "moe-train: nvcc not found, building CPU-only")
  endif()
endif()
