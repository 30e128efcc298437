// Deleting a directory tree without std::filesystem::remove_all.
//
// LibTorch's wheels carry a statically linked copy of libstdc++'s <filesystem> and export it
// (pytorch/pytorch#133437). When the dynamic loader binds `remove_all` to that copy, its
// internal call through a weak, undefined symbol jumps to address 0: the process dies with
// SIGSEGV on the first non-empty directory (seen on the H200 in CudaGraphGpu's cleanup). Link
// order (moe_stdcxx_first) avoids it for our executables, but not for every program that loads
// our libraries, so the project deletes trees with nftw(3) from the C library instead.
#pragma once

#include <cstdint>
#include <filesystem>
#include <system_error>

namespace moe {

// Removes `path` and, if it is a directory, everything below it; symbolic links are removed,
// never followed. Like std::filesystem::remove_all(path, ec): returns the number of entries
// removed, 0 when `path` does not exist (not an error), and on failure sets `ec` and returns
// what was removed before it.
std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept;

// The same, throwing std::filesystem::filesystem_error on failure.
std::uintmax_t remove_tree(const std::filesystem::path& path);

}  // namespace moe
