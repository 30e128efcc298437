#include "moe/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moe::optim {

using enum config::SchedulerType;

LrSchedule::LrSchedule(const config::SchedulerConfig& cfg, double base_lr, int64_t run_steps)
    : cfg_(cfg), base_lr_(base_lr) {
  // DeepSpeed clamps to >= 2 so that log(warmup_num_steps) is never 0.
  warmup_steps_ = cfg.type == kLinearWarmupCosineDecay ? cfg.warmup_num_steps
                                                       : std::max<int64_t>(2, cfg.warmup_num_steps);
  total_steps_ = cfg.total_num_steps > 0 ? cfg.total_num_steps : run_steps;
}

double LrSchedule::warmup_gamma(int64_t step) const {
  if (step >= warmup_steps_) return 1.0;
  if (cfg_.warmup_type == config::WarmupType::kLog) {
    return std::log(static_cast<double>(step + 1)) / std::log(static_cast<double>(warmup_steps_));
  }
  return static_cast<double>(step) / static_cast<double>(warmup_steps_);
}

double LrSchedule::lr_at(int64_t step) const {
  const auto t = cfg_.type;
  if (t == kConstant) return base_lr_;
  if (t == kWarmupLR || t == kWarmupDecayLR) {
    double gamma = warmup_gamma(step);
    if (t == kWarmupDecayLR && step >= warmup_steps_) {
      gamma = std::max(0.0, static_cast<double>(total_steps_ - step) /
                                std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_)));
    }
    return cfg_.warmup_min_lr + (cfg_.warmup_max_lr - cfg_.warmup_min_lr) * gamma;
  }
  if (t == kWarmupCosineLR) {
    if (step < warmup_steps_) {
      double ratio = warmup_gamma(step);
      return base_lr_ * (cfg_.warmup_min_ratio + ratio * (1.0 - cfg_.warmup_min_ratio));
    }
    double real_last = static_cast<double>(step - warmup_steps_ + 1);
    double real_total = static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_steps_));
    // DeepSpeed's current code clamps progress at 1 so the rate stays at its floor after total.
    double ratio = (1.0 + std::cos(std::numbers::pi * std::min(1.0, real_last / real_total))) / 2.0;
    ratio = std::max(0.0, cfg_.cos_min_ratio + (1.0 - cfg_.cos_min_ratio) * ratio);
    return base_lr_ * ratio;
  }
  // LinearWarmupCosineDecay: linear 0 -> lr over warmup, cosine lr -> min_lr until total, then
  // min_lr.
  if (step < warmup_steps_) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) /
                                      std::max<double>(1.0, double(total_steps_ - warmup_steps_)));
  return cfg_.min_lr +
         (base_lr_ - cfg_.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace moe::optim
