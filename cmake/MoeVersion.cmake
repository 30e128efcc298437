# Record the git commit at configure time for `moe-train --version`.
execute_process(COMMAND git -C "${CMAKE_SOURCE_DIR}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE MOE_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR MOE_GIT_COMMIT STREQUAL "")
  set(MOE_GIT_COMMIT unknown)
endif()
# CUDA versions for `moe-train --version`: nvcc's for our kernels, and the one LibTorch was built
# against (the wheel's torch/version.py, or a LibTorch zip's build-version: "2.11.0+cu130").
set(MOE_CUDA_TOOLKIT_VERSION "")
if(MOE_HAVE_CUDA)
  set(MOE_CUDA_TOOLKIT_VERSION "${CMAKE_CUDA_COMPILER_VERSION}")
endif()
set(MOE_TORCH_CUDA_VERSION "")
if(EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
  file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" _cuda REGEX "^cuda.*= *'[0-9.]+'")
  string(REGEX REPLACE ".*'([0-9.]+)'.*" "\\1" MOE_TORCH_CUDA_VERSION "${_cuda}")
elseif(EXISTS "${TORCH_INSTALL_PREFIX}/build-version")
  file(STRINGS "${TORCH_INSTALL_PREFIX}/build-version" _cuda REGEX "\\+cu[0-9]+")
  if(_cuda MATCHES "\\+cu([0-9]+)([0-9])$")
    set(MOE_TORCH_CUDA_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
  endif()
endif()
if(MOE_HAVE_CUDA)
  set(MOE_HAVE_CUDA_BOOL true)
else()
  set(MOE_HAVE_CUDA_BOOL false)
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/build_info.h.in ${CMAKE_BINARY_DIR}/generated/moe/build_info.h @ONLY)
# Re-run this at build time after each commit so --version never shows a stale commit.
if(EXISTS "${CMAKE_SOURCE_DIR}/.git/index")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/.git/index")
endif()
