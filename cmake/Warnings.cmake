# Strict warnings on our own C++ (third-party headers come in as SYSTEM and stay quiet).
function(moe_strict_warnings target)
  set(flags -Wall -Wextra -Wno-unused-parameter)
  if(MOE_WARNINGS_AS_ERRORS)
    list(APPEND flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${flags}>)
endfunction()

# LibTorch's pip build exports its own copy of std::filesystem (remove_all & co.), which crashes
# when it interposes libstdc++'s (seen: SIGSEGV in std::filesystem::remove_all). Listing
# libstdc++ first in DT_NEEDED makes the dynamic linker bind those symbols to libstdc++.
function(moe_stdcxx_first target)
  target_link_options(${target} BEFORE PRIVATE "LINKER:--push-state,--no-as-needed" "-lstdc++"
                      "LINKER:--pop-state")
endfunction()
