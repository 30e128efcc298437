#include "moe/data/blended_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "moe/data/token_shard.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

// Two sources of distinct token ranges: every token of source A is < 1000, of source B >= 5000,
// so a window's first token names its source; window w of a source starts with base + w % 997.
class BlendTest : public ::testing::Test {
 protected:
  static constexpr int64_t kSeq = 15;  // windows of 16 tokens
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_blend_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ::moe::remove_tree(dir_);
    fs::create_directories(dir_);
    a_ = shard("a.h5", 0, 1600);
    b_ = shard("b.h5", 5000, 300);  // 500 of 2000 samples at weight 0.25: wraps around
  }
  void TearDown() override { ::moe::remove_tree(dir_); }

  std::vector<ShardInfo> shard(const std::string& name, uint32_t base, int64_t windows) {
    std::vector<uint32_t> t;
    for (int64_t w = 0; w < windows; ++w) {
      for (int64_t i = 0; i <= kSeq; ++i) t.push_back(base + static_cast<uint32_t>((w + i) % 997));
    }
    const std::string p = (dir_ / name).string();
    write_shard(p, t, 6000, "test");
    return {inspect_shard(p)};
  }

  LoaderOptions opts(uint64_t seed = 7) const {
    LoaderOptions o;
    o.seq_len = kSeq;
    o.batch_size = 8;
    o.seed = seed;
    o.prefetch = 2;
    o.block_windows = 32;
    return o;
  }

  std::vector<BlendPart> parts(double wa, double wb) const { return {{a_, wa}, {b_, wb}}; }

  // All tokens of `n` batches, in order.
  static std::vector<int64_t> take(BatchStream& l, int n, LoaderState* last = nullptr) {
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) {
      Batch b = l.next();
      out.insert(out.end(), b.buffer.data, b.buffer.data + b.rows * b.cols);
      if (last) *last = b.state_after;
    }
    return out;
  }

  fs::path dir_;
  std::vector<ShardInfo> a_, b_;
};

TEST_F(BlendTest, FractionsFollowTheWeightsOver2000Sequences) {
  BlendedLoader l(parts(0.75, 0.25), opts());
  const auto tokens = take(l, 250);  // 2000 sequences
  int64_t from_a = 0, from_b = 0;
  for (size_t r = 0; r < tokens.size(); r += kSeq + 1) {
    // Every token of a row comes from the same source (rows never mix).
    const bool a = tokens[r] < 1000;
    for (int64_t i = 1; i <= kSeq; ++i) EXPECT_EQ(tokens[r + i] < 1000, a) << "row " << r;
    (a ? from_a : from_b)++;
  }
  EXPECT_EQ(from_a + from_b, 2000);
  EXPECT_NEAR(static_cast<double>(from_a) / 2000, 0.75, 0.02);
  EXPECT_NEAR(static_cast<double>(from_b) / 2000, 0.25, 0.02);
  // B (300 windows) was read 500 times: it wrapped into its second pass; A did not.
  EXPECT_EQ(l.source_passes(), (std::vector<int64_t>{1, 2}));
}

TEST_F(BlendTest, ScheduleKeepsEveryPrefixWithinOneSample) {
  const std::vector<double> w = {0.5, 0.3, 0.2};
  for (int64_t n : {1, 2, 3, 7, 10, 99, 1000, 12345}) {
    const auto taken = BlendedLoader::samples_per_source(w, n);
    int64_t sum = 0;
    for (size_t s = 0; s < w.size(); ++s) {
      EXPECT_LE(std::abs(static_cast<double>(taken[s]) - w[s] * static_cast<double>(n)), 1.0)
          << "source " << s << " after " << n;
      sum += taken[s];
    }
    EXPECT_EQ(sum, n);
  }
}

TEST_F(BlendTest, ResumeMidEpochIsExact) {
  BlendedLoader straight(parts(0.75, 0.25), opts());
  const auto all = take(straight, 40);
  LoaderState at;
  BlendedLoader first(parts(0.75, 0.25), opts());
  auto resumed = take(first, 20, &at);
  BlendedLoader second(parts(0.75, 0.25), opts(), at);
  const auto rest = take(second, 20);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, all);
  // Across B's wrap-around and the blend's own epoch boundary (1900 windows) too.
  BlendedLoader long_run(parts(0.75, 0.25), opts());
  const auto far = take(long_run, 300);
  BlendedLoader to_mid(parts(0.75, 0.25), opts());
  take(to_mid, 230, &at);
  EXPECT_EQ(at.epoch, 0);
  BlendedLoader from_mid(parts(0.75, 0.25), opts(), at);
  const auto tail = take(from_mid, 70, &at);
  EXPECT_EQ(at.epoch, 1);  // 2400 samples: past one blend epoch of 1900
  EXPECT_EQ(tail,
            std::vector<int64_t>(far.end() - static_cast<std::ptrdiff_t>(tail.size()), far.end()));
}

TEST_F(BlendTest, TheSeedSetsTheOrder) {
  BlendedLoader a(parts(0.75, 0.25), opts(7)), b(parts(0.75, 0.25), opts(7)),
      c(parts(0.75, 0.25), opts(8));
  const auto ta = take(a, 10);
  EXPECT_EQ(ta, take(b, 10));
  EXPECT_NE(ta, take(c, 10));
}

TEST_F(BlendTest, BadWeightsAndStatesAreErrors) {
  EXPECT_THROW(BlendedLoader(parts(0.75, 0), opts()), UserError);
  EXPECT_THROW(BlendedLoader(parts(-1, 1), opts()), UserError);
  EXPECT_THROW(BlendedLoader(parts(NAN, 1), opts()), UserError);
  EXPECT_THROW(BlendedLoader(parts(1, 1), opts(), LoaderState{0, 1900}), UserError);
  EXPECT_THROW(BlendedLoader({}, opts()), UserError);
}

}  // namespace
}  // namespace moe::data
