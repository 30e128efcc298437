// DeepSpeed's dynamic loss-scaling rules, computed by hand step by step.
#include "moe/optim/loss_scaler.h"

#include <gtest/gtest.h>

#include "moe/util/errors.h"

namespace moe::optim {
namespace {

config::Fp16Config fp16(int64_t power, int64_t window, int64_t hysteresis, bool consecutive,
                        double min_scale = 1.0) {
  config::Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

TEST(LossScaler, GrowsAfterAWindowOfCleanSteps) {
  LossScaler s(fp16(4, 3, 1, false));
  EXPECT_EQ(s.scale(), 16.0);
  // stable interval = cur_iter - (-1) - 1 = cur_iter; doubles when it is a positive multiple of 3.
  std::vector<double> expect = {16, 16, 16, 32, 32, 32, 64};  // after iters 0..6
  for (double e : expect) {
    EXPECT_FALSE(s.update(false));
    EXPECT_EQ(s.scale(), e);
  }
}

TEST(LossScaler, HysteresisDelaysBackOffThenSkipsAndGrows) {
  LossScaler s(fp16(10, 2, 2, false));  // scale 1024, window 2, hysteresis 2
  EXPECT_TRUE(s.update(true));          // iter 0: overflow, hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  EXPECT_TRUE(s.update(true));  // iter 1: overflow, hysteresis used up -> halve
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_FALSE(s.update(false));  // iter 2: stable = 2 - 1 - 1 = 0
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);  // not refilled without consecutive_hysteresis
  EXPECT_FALSE(s.update(false));           // iter 3: stable 1
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_FALSE(s.update(false));  // iter 4: stable 2 -> grow, refill hysteresis
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  EXPECT_TRUE(s.update(true));  // iter 5: hysteresis 2 -> 1
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.state().skipped_steps, 3);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler s(fp16(10, 100, 2, true));
  s.update(true);   // hysteresis 1
  s.update(false);  // refilled to 2
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  s.update(true);  // 2 -> 1, no halving
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(true);  // halve
  EXPECT_EQ(s.scale(), 512.0);
}

TEST(LossScaler, MinimumScaleFloorsAndThenFails) {
  LossScaler s(fp16(2, 1000, 1, false, 2.0));  // 4, min 2
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_THROW(s.update(true), TrainingError);
}

TEST(LossScaler, StaticScaleSkipsButNeverChanges) {
  config::Fp16Config c;
  c.loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_TRUE(s.update(true));
  for (int i = 0; i < 5000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.state().skipped_steps, 1);
}

}  // namespace
}  // namespace moe::optim
