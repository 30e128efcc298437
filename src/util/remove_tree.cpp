#include "moe/util/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

namespace moe {

namespace {

// nftw's callback has no user pointer: the walk's tallies live in thread-local storage, one walk
// per thread at a time (nftw is not re-entered from its own callback).
thread_local std::uintmax_t t_removed = 0;
thread_local int t_errno = 0;

int remove_entry(const char* name, const struct stat*, int, struct FTW*) {
  if (std::remove(name) != 0) {     // unlink(2) for files and links, rmdir(2) for directories
    if (errno == ENOENT) return 0;  // removed by someone else meanwhile
    t_errno = errno;
    return 1;  // stops the walk
  }
  ++t_removed;
  return 0;
}

}  // namespace

std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return 0;
  }
  t_removed = 0;
  t_errno = 0;
  // FTW_DEPTH: children before their directory; FTW_PHYS: links are entries, not followed.
  const int rc = ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) ec.assign(t_errno != 0 ? t_errno : errno, std::generic_category());
  return t_removed;
}

std::uintmax_t remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t n = remove_tree(path, ec);
  if (ec) throw std::filesystem::filesystem_error("cannot remove the tree", path, ec);
  return n;
}

}  // namespace moe
