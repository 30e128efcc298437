# Record the git commit at configure time for `moe-train --version`.
execute_process(COMMAND git -C "${CMAKE_SOURCE_DIR}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE MOE_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR MOE_GIT_COMMIT STREQUAL "")
  set(MOE_GIT_COMMIT unknown)
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
