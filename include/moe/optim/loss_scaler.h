// fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler.update_scale, current form), key for key from the ds_config fp16 block:
//   loss_scale 0 = dynamic (else a static scale), initial_scale_power, loss_scale_window,
//   hysteresis (DeepSpeed's delayed_shift), consecutive_hysteresis, min_loss_scale.
// On overflow: while hysteresis remains, it is decremented; once used up the scale halves
// (floor min_loss_scale), and an overflow at the minimum scale is fatal. Without overflow: with
// consecutive_hysteresis the hysteresis refills at once; after loss_scale_window clean steps
// since the last overflow the scale doubles (and, without consecutive_hysteresis, the
// hysteresis refills). Overflowing steps are skipped by the trainer and counted.
#pragma once

#include <cstdint>

#include "moe/config/config.h"

namespace moe::optim {

struct LossScalerState {
  double scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int64_t cur_hysteresis = 1;
  int64_t skipped_steps = 0;
};

class LossScaler {
 public:
  explicit LossScaler(const config::Fp16Config& cfg);
  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  // Updates after one step; returns true when the step must be skipped (overflow).
  // Throws TrainingError when an overflow happens at the minimum scale.
  bool update(bool overflow);
  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& s) { state_ = s; }

 private:
  bool dynamic_;
  double min_scale_;
  int64_t window_;
  int64_t delayed_shift_;
  bool consecutive_hysteresis_;
  LossScalerState state_;
};

}  // namespace moe::optim
