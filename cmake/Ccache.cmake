# Use ccache for C++ and CUDA when it is installed; rebuilds after a `git checkout` stay cheap.
find_program(MOE_CCACHE ccache)
if(MOE_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${MOE_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${MOE_CCACHE})
endif()
