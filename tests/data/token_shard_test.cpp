#include "moe/data/token_shard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moe/data/dataset.h"
#include "moe/data/synthetic.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_shard_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ::moe::remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { ::moe::remove_tree(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST_F(ShardTest, RoundTripUint16AndUint32) {
  std::vector<uint32_t> small = {0, 1, 2, 65535, 7};
  write_shard(path("a.h5"), small, 65536, "byte");
  ShardInfo a = inspect_shard(path("a.h5"));
  EXPECT_EQ(a.bytes_per_token, 2);
  EXPECT_EQ(a.num_tokens, 5);
  EXPECT_EQ(a.vocab_size, 65536);
  EXPECT_EQ(a.tokenizer, "byte");
  auto t = read_tokens(a, 1, 3);
  EXPECT_EQ(t, (std::vector<int32_t>{1, 2, 65535}));

  std::vector<uint32_t> big = {0, 100000, 3};
  write_shard(path("b.h5"), big, 200000, "sp");
  ShardInfo b = inspect_shard(path("b.h5"));
  EXPECT_EQ(b.bytes_per_token, 4);
  EXPECT_EQ(read_tokens(b, 0, 3), (std::vector<int32_t>{0, 100000, 3}));
  EXPECT_FALSE(fs::exists(path("b.h5.tmp")));
}

TEST_F(ShardTest, BadFilesAreClearErrors) {
  EXPECT_NE(error_of([&] { inspect_shard(path("missing.h5")); }).find("file not found"),
            std::string::npos);
  { std::ofstream(path("text.h5")) << "not hdf5 at all"; }
  EXPECT_NE(error_of([&] { inspect_shard(path("text.h5")); }).find("not an HDF5 file"),
            std::string::npos);
  std::vector<uint32_t> toks(1000, 3);
  write_shard(path("ok.h5"), toks, 16, "byte");
  fs::copy_file(path("ok.h5"), path("trunc.h5"));
  fs::resize_file(path("trunc.h5"), fs::file_size(path("trunc.h5")) / 2);
  std::string msg = error_of([&] {
    ShardInfo i = inspect_shard(path("trunc.h5"));
    read_tokens(i, 0, i.num_tokens);
  });
  EXPECT_NE(msg.find("trunc.h5"), std::string::npos) << msg;
}

TEST_F(ShardTest, OutOfRangeTokensAreRejectedWithOffset) {
  EXPECT_NE(error_of([&] {
              std::vector<uint32_t> t = {1, 2, 99};
              write_shard(path("w.h5"), t, 10, "byte");
            }).find("token 99 at offset 2"),
            std::string::npos);
}

TEST_F(ShardTest, OpenDatasetChecksRawShardsAndComputesBaseline) {
  SyntheticSpec spec;
  spec.vocab_size = 32;
  spec.doc_len = 9;
  spec.num_docs = 50;
  auto toks = make_permutation_corpus(spec);
  ASSERT_EQ(toks.size(), 450u);
  write_shard(path("s.h5"), toks, 32, "synthetic");
  DatasetShards d = open_dataset({"", path("s.h5"), path("s.h5")}, 32, 8, false);
  EXPECT_EQ(d.train.size(), 1u);
  EXPECT_EQ(d.valid.size(), 1u);
  EXPECT_TRUE(d.scanned);
  EXPECT_LE(majority_baseline(d.valid, 8), 0.3);
  EXPECT_NE(error_of([&] {
              open_dataset({"", path("s.h5"), ""}, 16, 8, false);
            }).find("exceeds model.vocab_size"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              open_dataset({"", path("s.h5"), ""}, 32, 1000, false);
            }).find("one window needs seq_len + 1 = 1001"),
            std::string::npos);
}

TEST_F(ShardTest, MajorityBaselineCountsTargetsOnly) {
  // Windows of 4 tokens (seq_len 3): targets are positions 1..3 of each window.
  std::vector<uint32_t> t = {9, 1, 1, 2, 9, 1, 3, 3};
  write_shard(path("b.h5"), t, 10, "test");
  // targets: 1 1 2 | 1 3 3 -> token 1 three times of six.
  EXPECT_DOUBLE_EQ(majority_baseline({inspect_shard(path("b.h5"))}, 3), 0.5);
}

TEST(Synthetic, FollowsItsPermutation) {
  SyntheticSpec spec;
  spec.programs = 1;
  spec.vocab_size = 16;
  spec.doc_len = 20;
  spec.num_docs = 30;
  auto t = make_permutation_corpus(spec);
  // With one program, each token has exactly one successor inside documents.
  std::vector<int> next(16, -1);
  for (int d = 0; d < 30; ++d) {
    for (int i = 0; i + 1 < 20; ++i) {
      uint32_t a = t[d * 20 + i], b = t[d * 20 + i + 1];
      if (next[a] < 0) next[a] = static_cast<int>(b);
      EXPECT_EQ(next[a], static_cast<int>(b));
    }
  }
}

}  // namespace
}  // namespace moe::data
