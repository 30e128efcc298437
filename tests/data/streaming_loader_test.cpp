#include "moe/data/streaming_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "moe/data/token_shard.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

// Shards whose windows are identifiable: window w of shard s starts with token s*1000 + w.
class LoaderTest : public ::testing::Test {
 protected:
  static constexpr int64_t kSeq = 7;  // windows of 8 tokens
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_loader_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ::moe::remove_tree(dir_);
    fs::create_directories(dir_);
    const int64_t windows[] = {37, 5, 64};  // uneven shards; 106 windows per epoch
    for (int s = 0; s < 3; ++s) {
      std::vector<uint32_t> t;
      for (int64_t w = 0; w < windows[s]; ++w) {
        for (int64_t i = 0; i <= kSeq; ++i) t.push_back(static_cast<uint32_t>(s * 1000 + w + i));
      }
      t.push_back(5);  // a partial tail that is never read
      std::string p = (dir_ / ("s" + std::to_string(s) + ".h5")).string();
      write_shard(p, t, 4096, "test");
      shards_.push_back(inspect_shard(p));
    }
  }
  void TearDown() override { ::moe::remove_tree(dir_); }

  LoaderOptions opts(int threads = 1, bool shuffle = true) const {
    LoaderOptions o;
    o.seq_len = kSeq;
    o.batch_size = 4;
    o.seed = 42;
    o.shuffle = shuffle;
    o.prefetch = 2;
    o.reader_threads = threads;
    o.block_windows = 10;
    return o;
  }

  // First tokens of the rows of `n` batches.
  static std::vector<std::vector<int64_t>> take(StreamingLoader& l, int n,
                                                std::vector<LoaderState>* states = nullptr) {
    std::vector<std::vector<int64_t>> out;
    for (int i = 0; i < n; ++i) {
      Batch b = l.next();
      std::vector<int64_t> rows;
      for (int64_t r = 0; r < b.rows; ++r) {
        const int64_t* row = b.buffer.data + r * b.cols;
        for (int64_t c = 1; c < b.cols; ++c) EXPECT_EQ(row[c], row[0] + c);  // whole windows
        rows.push_back(row[0]);
      }
      out.push_back(rows);
      if (states) states->push_back(b.state_after);
    }
    return out;
  }

  fs::path dir_;
  std::vector<ShardInfo> shards_;
};

TEST_F(LoaderTest, EveryWindowOncePerEpochInBothModes) {
  for (bool shuffle : {false, true}) {
    StreamingLoader l(shards_, opts(1, shuffle));
    EXPECT_EQ(l.windows_per_epoch(), 106);
    std::map<int64_t, int> seen;
    std::vector<int64_t> order;
    // 106 windows = 26 full batches + 2 windows; read 2 epochs' worth plus change.
    for (auto& rows : take(l, 53)) {
      for (int64_t r : rows) {
        ++seen[r];
        order.push_back(r);
      }
    }
    std::map<int64_t, int> first_epoch;
    for (size_t i = 0; i < 106; ++i) ++first_epoch[order[i]];
    EXPECT_EQ(first_epoch.size(), 106u) << "shuffle " << shuffle;
    for (auto& [w, n] : first_epoch) EXPECT_EQ(n, 1);
    if (!shuffle) {
      EXPECT_EQ(order[0], 0);
      EXPECT_EQ(order[37], 1000);  // shard 1 follows shard 0
      EXPECT_EQ(order[42], 2000);
    }
  }
}

TEST_F(LoaderTest, SeededAndEpochsDiffer) {
  StreamingLoader a(shards_, opts()), b(shards_, opts());
  auto o = opts();
  o.seed = 43;
  StreamingLoader c(shards_, o);
  auto ta = take(a, 60), tb = take(b, 60), tc = take(c, 60);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  // Epoch 1 is a different order from epoch 0.
  std::vector<int64_t> flat;
  for (auto& r : ta) flat.insert(flat.end(), r.begin(), r.end());
  EXPECT_NE(std::vector<int64_t>(flat.begin(), flat.begin() + 106),
            std::vector<int64_t>(flat.begin() + 106, flat.begin() + 212));
}

TEST_F(LoaderTest, ResumeYieldsTheSameBatches) {
  for (int threads : {1, 2}) {
    std::vector<LoaderState> states;
    StreamingLoader full(shards_, opts(threads), {}, {});
    auto all = take(full, 80, &states);  // three epochs and a bit
    for (int k : {1, 13, 26, 27, 53, 79}) {
      StreamingLoader resumed(shards_, opts(threads), states[static_cast<size_t>(k - 1)]);
      auto rest = take(resumed, 80 - k);
      EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(all.begin() + k, all.end()))
          << "resume at batch " << k << " with " << threads << " reader thread(s)";
    }
  }
}

TEST_F(LoaderTest, BadStateAndShortShardsAreErrors) {
  EXPECT_THROW(StreamingLoader(shards_, opts(), LoaderState{0, 106}), UserError);
  auto o = opts();
  o.seq_len = 100;  // shard 1 holds 41 tokens
  try {
    StreamingLoader l(shards_, o);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("s1.h5: holds 41 tokens; one window needs"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(LoaderTest, ReaderErrorsReachTheConsumer) {
  // Token ids >= the shard's vocab_size surface from the reader thread as a UserError.
  std::vector<uint32_t> t(80, 1);
  t[50] = 300;
  std::string p = (dir_ / "bad.h5").string();
  write_shard(p, t, 4096, "test");
  ShardInfo info = inspect_shard(p);
  info.vocab_size = 256;  // as if the attribute promised 256
  StreamingLoader l({info}, opts(1, false));
  try {
    for (int i = 0; i < 10; ++i) l.next();
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("token at offset 50 is 300"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moe::data
