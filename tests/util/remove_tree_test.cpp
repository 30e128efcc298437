// remove_tree: deletes non-empty trees (links removed, not followed), and this LibTorch-linked
// test binary binds std::filesystem::remove_all to libstdc++, not to LibTorch's exported copy
// (pytorch/pytorch#133437; docs/build.md).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "moe/util/remove_tree.h"

namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::error_code ec;
  moe::remove_tree(d, ec);
  fs::create_directories(d);
  return d;
}

TEST(RemoveTree, RemovesANonEmptyTreeAndCountsEntries) {
  const fs::path root = fresh_dir("moe-remove-tree");
  fs::create_directories(root / "a" / "b" / "c");
  for (const char* f : {"x.bin", "a/y.bin", "a/b/z.bin", "a/b/c/w.bin"}) {
    std::ofstream(root / f) << "data";
  }
  std::error_code ec;
  // 4 files + a, a/b, a/b/c + the root
  EXPECT_EQ(moe::remove_tree(root, ec), 8u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(root));
}

TEST(RemoveTree, MissingPathIsZeroWithoutError) {
  std::error_code ec;
  EXPECT_EQ(moe::remove_tree(fs::temp_directory_path() / "moe-no-such-dir-xyz", ec), 0u);
  EXPECT_FALSE(ec);
}

TEST(RemoveTree, RemovesLinksWithoutFollowingThem) {
  const fs::path root = fresh_dir("moe-remove-tree-links");
  const fs::path keep = fresh_dir("moe-remove-tree-keep");
  std::ofstream(keep / "precious") << "keep me";
  fs::create_directories(root / "d");
  fs::create_directory_symlink(keep, root / "d" / "to-keep");
  fs::create_symlink(keep / "precious", root / "file-link");
  std::error_code ec;
  EXPECT_EQ(moe::remove_tree(root, ec), 4u);  // two links, d, root
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(keep / "precious"));
  // A link given as the root is removed itself.
  fs::create_directory_symlink(keep, fs::temp_directory_path() / "moe-remove-tree-rootlink");
  EXPECT_EQ(moe::remove_tree(fs::temp_directory_path() / "moe-remove-tree-rootlink"), 1u);
  EXPECT_TRUE(fs::exists(keep / "precious"));
  moe::remove_tree(keep);
}

TEST(RemoveTree, ReportsWhatItCouldNotRemove) {
  // A path under a regular file: not a missing path (which is no error) but ENOTDIR, as root too.
  const fs::path file = fresh_dir("moe-remove-tree-file") / "plain";
  std::ofstream(file) << "x";
  std::error_code ec;
  EXPECT_EQ(moe::remove_tree(file / "below", ec), 0u);
  EXPECT_EQ(ec, std::errc::not_a_directory) << ec.message();
  EXPECT_THROW(moe::remove_tree(file / "below"), fs::filesystem_error);
  moe::remove_tree(file.parent_path());
  if (::geteuid() == 0) return;  // root ignores the directory permissions below
  const fs::path root = fresh_dir("moe-remove-tree-ro");
  fs::create_directories(root / "locked");
  std::ofstream(root / "locked" / "f") << "x";
  fs::permissions(root / "locked", fs::perms::owner_read | fs::perms::owner_exec);
  moe::remove_tree(root, ec);
  EXPECT_TRUE(ec);
  EXPECT_THROW(moe::remove_tree(root), fs::filesystem_error);
  fs::permissions(root / "locked", fs::perms::owner_all);
  moe::remove_tree(root);
}

// Where this binary's std::filesystem::remove_all resolves. Our code does not call it, but a
// binding to LibTorch's copy would mean the link order that keeps libstdc++ first is lost.
TEST(RemoveTree, StdRemoveAllDoesNotBindToLibTorch) {
  (void)torch::ones({1});  // LibTorch is really loaded in this process
  using Fn = std::uintmax_t (*)(const fs::path&, std::error_code&);
  const Fn fn = &fs::remove_all;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(fn), &info) == 0 || info.dli_fname == nullptr) {
    GTEST_SKIP() << "dladdr cannot name the object that defines remove_all";
  }
  const std::string lib = info.dli_fname;
  EXPECT_EQ(lib.find("libtorch"), std::string::npos) << "remove_all binds to " << lib;
  // And the libstdc++ one really removes a non-empty tree in this process.
  const fs::path root = fresh_dir("moe-remove-all-probe");
  fs::create_directories(root / "sub");
  std::ofstream(root / "sub" / "f") << "x";
  std::error_code ec;
  EXPECT_EQ(fn(root, ec), 3u);
  EXPECT_FALSE(ec);
}

}  // namespace
