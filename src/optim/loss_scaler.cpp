#include "moe/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "moe/util/errors.h"

namespace moe::optim {

LossScaler::LossScaler(const config::Fp16Config& cfg)
    : dynamic_(cfg.loss_scale == 0.0),
      min_scale_(cfg.min_loss_scale),
      window_(cfg.loss_scale_window),
      delayed_shift_(cfg.hysteresis),
      consecutive_hysteresis_(cfg.consecutive_hysteresis) {
  state_.scale =
      dynamic_ ? std::ldexp(1.0, static_cast<int>(cfg.initial_scale_power)) : cfg.loss_scale;
  state_.cur_hysteresis = delayed_shift_;
}

bool LossScaler::update(bool overflow) {
  auto& s = state_;
  if (!dynamic_) {
    // A static scale never changes; an overflowing step is still skipped.
    if (overflow) ++s.skipped_steps;
    ++s.cur_iter;
    return overflow;
  }
  if (overflow) {
    if (delayed_shift_ == 1 || s.cur_hysteresis == 1) {
      if (s.scale == min_scale_) {
        throw TrainingError("fp16: gradients overflow at the minimum loss scale " +
                            std::to_string(min_scale_) + " (step " +
                            std::to_string(s.cur_iter + 1) +
                            "); the run diverged. Try bf16, a lower learning rate or "
                            "fp16.min_loss_scale below " +
                            std::to_string(min_scale_));
      }
      s.scale = std::max(s.scale / 2.0, min_scale_);
    } else {
      --s.cur_hysteresis;
    }
    s.last_overflow_iter = s.cur_iter;
    ++s.skipped_steps;
  } else {
    if (consecutive_hysteresis_) s.cur_hysteresis = delayed_shift_;
    const int64_t stable = (s.cur_iter - s.last_overflow_iter) - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_hysteresis_) s.cur_hysteresis = delayed_shift_;
      s.scale *= 2.0;
    }
  }
  ++s.cur_iter;
  return overflow;
}

}  // namespace moe::optim
