#include "moe/config/parallel_dims.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace moe::config {
namespace {

TEST(ParallelDims, ExpertRangesTileTheExpertsInRankOrder) {
  for (int64_t ep : {1, 2, 4, 8}) {
    int64_t next = 0;
    for (int64_t r = 0; r < ep; ++r) {
      const ExpertRange held = expert_range(64, ep, r);
      EXPECT_EQ(held.first, next) << "ep " << ep << " rank " << r;
      EXPECT_EQ(held.count, 64 / ep);
      EXPECT_EQ(held.total, 64);
      EXPECT_EQ(held.all(), ep == 1);
      next += held.count;
    }
    EXPECT_EQ(next, 64);
  }
}

TEST(ParallelDims, GroupsOfAWorldOfEightWithExpertParallelTwo) {
  // Ranks 0..7, EP 2: EP groups {0,1} {2,3} {4,5} {6,7}; replicas {0,2,4,6} and {1,3,5,7}.
  const ParallelDims five = parallel_dims(8, 5, 2);
  EXPECT_EQ(five.ep_rank(), 1);
  EXPECT_EQ(five.ep_group(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(five.expert_replicas(), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(five.experts(8).first, 4);
  EXPECT_EQ(five.experts(8).count, 4);
  const ParallelDims zero = parallel_dims(8, 0, 2);
  EXPECT_EQ(zero.ep_group(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(zero.expert_replicas(), (std::vector<int64_t>{0, 2, 4, 6}));
  // Every rank is in exactly one EP group and one replica set, and the two meet in it alone.
  for (int64_t r = 0; r < 8; ++r) {
    const ParallelDims d = parallel_dims(8, r, 4);
    int64_t both = 0;
    for (int64_t g : d.ep_group()) {
      for (int64_t x : d.expert_replicas()) both += (g == x);
    }
    EXPECT_EQ(both, 1) << "rank " << r;
  }
}

TEST(ParallelDims, ImpossibleLayoutsAreRefused) {
  EXPECT_THROW(expert_range(6, 4, 0), std::invalid_argument);   // 6 experts over 4 ranks
  EXPECT_THROW(expert_range(8, 2, 2), std::invalid_argument);   // place outside the group
  EXPECT_THROW(parallel_dims(6, 0, 4), std::invalid_argument);  // world not a multiple of EP
  EXPECT_THROW(parallel_dims(4, 4, 2), std::invalid_argument);  // rank outside the world
  EXPECT_THROW(parallel_dims(0, 0, 1), std::invalid_argument);
}

}  // namespace
}  // namespace moe::config
