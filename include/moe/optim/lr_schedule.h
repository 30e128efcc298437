// Learning-rate schedules with DeepSpeed's names, parameters and formulas
// (deepspeed/runtime/lr_schedules.py), plus LinearWarmupCosineDecay and Constant.
// `step` is the 0-based optimizer step: lr_at(0) is the rate of the first update.
#pragma once

#include <cstdint>

#include "moe/config/config.h"

namespace moe::optim {

class LrSchedule {
 public:
  // base_lr: optimizer.params.lr. run_steps: the run's optimizer steps, used when
  // scheduler.params.total_num_steps is 0.
  LrSchedule(const config::SchedulerConfig& cfg, double base_lr, int64_t run_steps);
  double lr_at(int64_t step) const;

 private:
  double warmup_gamma(int64_t step) const;  // 0..1 over the warmup (DeepSpeed's _get_gamma)

  config::SchedulerConfig cfg_;
  double base_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace moe::optim
