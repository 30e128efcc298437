# Locate LibTorch. Two routes, both documented in the README:
#  1. a user-supplied LibTorch: -DCMAKE_PREFIX_PATH=/path/to/libtorch (or -DTorch_DIR=...);
#  2. otherwise the pip package installed by scripts/setup: we ask its python for
#     torch.utils.cmake_prefix_path (MOE_PYTHON, default /opt/moe-train/venv/bin/python).
set(MOE_PYTHON "$ENV{MOE_VENV}/bin/python" CACHE FILEPATH "Python whose torch package provides LibTorch")
if(NOT EXISTS "${MOE_PYTHON}")
  set(MOE_PYTHON /opt/moe-train/venv/bin/python CACHE FILEPATH "" FORCE)
endif()

# Torch's CMake config overwrites CMAKE_CUDA_ARCHITECTURES (it wants TORCH_CUDA_ARCH_LIST):
# keep ours and hand torch the same list so its legacy nvcc flags agree.
set(MOE_CUDA_ARCHS "${CMAKE_CUDA_ARCHITECTURES}")
if(MOE_HAVE_CUDA AND NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "")
  foreach(a IN LISTS MOE_CUDA_ARCHS)
    # 90-real / 120-virtual / 120 -> 9.0 / 12.0 (torch's list has no SASS/PTX suffixes)
    string(REGEX REPLACE "^([0-9]+)([0-9])(a?)(-real|-virtual)?$" "\\1.\\2\\3" dotted "${a}")
    list(APPEND TORCH_CUDA_ARCH_LIST "${dotted}")
  endforeach()
elseif(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  # Without our kernels nothing is compiled for a GPU, but a CUDA wheel's config still probes
  # the local GPUs with a CUDA try_run, which fails without the CUDA language: name the archs.
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
unset(CMAKE_CUDA_ARCHITECTURES)
find_package(Torch QUIET CONFIG)
if(NOT Torch_FOUND)
  if(NOT EXISTS "${MOE_PYTHON}")
    message(FATAL_ERROR "LibTorch not found: run scripts/setup (installs torch==2.11.0 into "
                        "/opt/moe-train/venv) or pass -DCMAKE_PREFIX_PATH=/path/to/libtorch")
  endif()
  execute_process(
    COMMAND "${MOE_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE MOE_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${MOE_PYTHON} could not import torch; run scripts/setup")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${MOE_TORCH_PREFIX}")
  find_package(Torch REQUIRED CONFIG)
endif()
set(CMAKE_CUDA_ARCHITECTURES "${MOE_CUDA_ARCHS}")
message(STATUS "moe-train: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
# The library directory holding libtorch*.so: baked into RPATH so the binary starts without
# LD_LIBRARY_PATH; torch's own libraries find the CUDA runtime wheels through their RPATHs.
get_filename_component(MOE_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
set(CMAKE_BUILD_RPATH "${MOE_TORCH_LIB_DIR}")
set(CMAKE_INSTALL_RPATH "${MOE_TORCH_LIB_DIR}")
