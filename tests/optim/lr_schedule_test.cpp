// LR values at chosen steps against DeepSpeed's published formulas
// (deepspeed/runtime/lr_schedules.py), computed independently here.
#include "moe/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace moe::optim {
namespace {

using enum config::SchedulerType;

config::SchedulerConfig sched(config::SchedulerType type) {
  config::SchedulerConfig s;
  s.type = type;
  return s;
}

TEST(LrSchedule, WarmupLRLogAndLinear) {
  auto s = sched(kWarmupLR);
  s.warmup_min_lr = 1e-5;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 100;
  s.warmup_type = config::WarmupType::kLog;
  LrSchedule log_sched(s, 0.5, 1000);
  EXPECT_DOUBLE_EQ(log_sched.lr_at(0), 1e-5);  // log(1) = 0
  EXPECT_DOUBLE_EQ(log_sched.lr_at(1), 1e-5 + (1e-3 - 1e-5) * std::log(2.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(log_sched.lr_at(50), 1e-5 + (1e-3 - 1e-5) * std::log(51.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(log_sched.lr_at(100), 1e-3);
  EXPECT_DOUBLE_EQ(log_sched.lr_at(999), 1e-3);
  s.warmup_type = config::WarmupType::kLinear;
  LrSchedule lin(s, 0.5, 1000);
  EXPECT_DOUBLE_EQ(lin.lr_at(0), 1e-5);
  EXPECT_DOUBLE_EQ(lin.lr_at(25), 1e-5 + (1e-3 - 1e-5) * 0.25);
}

TEST(LrSchedule, WarmupNumStepsIsClampedToTwo) {
  auto s = sched(kWarmupLR);
  s.warmup_num_steps = 0;
  s.warmup_max_lr = 1.0;
  LrSchedule l(s, 1.0, 10);
  EXPECT_DOUBLE_EQ(l.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(l.lr_at(1), std::log(2.0) / std::log(2.0));
}

TEST(LrSchedule, WarmupDecayLR) {
  auto s = sched(kWarmupDecayLR);
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 2e-3;
  s.warmup_num_steps = 10;
  s.warmup_type = config::WarmupType::kLinear;
  s.total_num_steps = 110;
  LrSchedule l(s, 1.0, 0);
  EXPECT_DOUBLE_EQ(l.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(l.lr_at(1), 2e-3 * 0.1);
  EXPECT_DOUBLE_EQ(l.lr_at(10), 2e-3);                 // (110 - 10) / 100
  EXPECT_DOUBLE_EQ(l.lr_at(60), 2e-3 * 50.0 / 100.0);  // mid-decay
  EXPECT_DOUBLE_EQ(l.lr_at(110), 0.0);
  EXPECT_DOUBLE_EQ(l.lr_at(200), 0.0);
}

TEST(LrSchedule, WarmupCosineLR) {
  auto s = sched(kWarmupCosineLR);
  s.warmup_min_ratio = 0.1;
  s.cos_min_ratio = 0.01;
  s.warmup_num_steps = 20;
  s.warmup_type = config::WarmupType::kLinear;
  s.total_num_steps = 120;
  const double base = 3e-4;
  LrSchedule l(s, base, 0);
  EXPECT_DOUBLE_EQ(l.lr_at(0), base * 0.1);
  EXPECT_DOUBLE_EQ(l.lr_at(1), base * (0.1 + 0.9 * 1.0 / 20.0));
  auto cosine = [&](int64_t step) {
    double real_last = double(step - 20 + 1), real_total = 100.0;
    double r = (1 + std::cos(std::numbers::pi * std::min(1.0, real_last / real_total))) / 2;
    return base * std::max(0.0, 0.01 + 0.99 * r);
  };
  EXPECT_DOUBLE_EQ(l.lr_at(20), cosine(20));
  EXPECT_DOUBLE_EQ(l.lr_at(69), cosine(69));
  EXPECT_NEAR(l.lr_at(69), base * (0.01 + 0.99 * 0.5), 1e-15);  // half way: cos = 0
  EXPECT_DOUBLE_EQ(l.lr_at(119), base * 0.01);
  EXPECT_DOUBLE_EQ(l.lr_at(500), base * 0.01);
}

TEST(LrSchedule, WarmupCosineUsesRunLengthWhenTotalIsZero) {
  auto s = sched(kWarmupCosineLR);
  s.warmup_num_steps = 10;
  s.warmup_type = config::WarmupType::kLinear;
  s.cos_min_ratio = 0.0;
  LrSchedule l(s, 1.0, 110);
  EXPECT_NEAR(l.lr_at(109), 0.0, 1e-15);
}

TEST(LrSchedule, LinearWarmupCosineDecayAndConstant) {
  auto s = sched(kLinearWarmupCosineDecay);
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.min_lr = 1e-5;
  LrSchedule l(s, 1e-3, 0);
  EXPECT_DOUBLE_EQ(l.lr_at(0), 1e-4);
  EXPECT_DOUBLE_EQ(l.lr_at(9), 1e-3);
  EXPECT_DOUBLE_EQ(l.lr_at(10), 1e-3);
  EXPECT_NEAR(l.lr_at(60), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(l.lr_at(110), 1e-5);
  LrSchedule c(sched(kConstant), 7e-4, 100);
  EXPECT_DOUBLE_EQ(c.lr_at(0), 7e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(99), 7e-4);
}

}  // namespace
}  // namespace moe::optim
