// What a checkpoint holds and how it maps to files:
//   model.safetensors      every parameter by name (fp32 master weights); with LoRA only what
//                          trains (adapters, lora.modules_to_save), the base by fingerprint
//   optimizer.safetensors  <name>.exp_avg, <name>.exp_avg_sq, <name>.step for every parameter
//   state.json             step, tokens, loader position, loss scaler, RNG states, metrics line
//                          count, the resolved config and the format version
// The safetensors files open in Python's `safetensors` with no code execution.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/checkpoint/resume_policy.h"
#include "moe/data/dataset.h"
#include "moe/model/transformer.h"
#include "moe/optim/adamw.h"
#include "moe/optim/loss_scaler.h"
#include "moe/util/errors.h"
#include "moe/util/safetensors.h"

namespace moe::checkpoint {

// A LoRA checkpoint met a different base model than the one its adapters were trained on: not
// a damaged checkpoint (an older one would not help), the run stops (exit 2).
class BaseMismatchError : public UserError {
 public:
  using UserError::UserError;
};

inline constexpr int64_t kCheckpointFormatVersion = kStateFormatVersion;  // resume_policy.h

struct TrainingState {
  int64_t step = 0;  // optimizer steps done
  int64_t tokens = 0;
  data::LoaderState loader;
  optim::LossScalerState scaler;
  int64_t metrics_lines = 0;  // lines of metrics.jsonl that belong to steps <= step
  nlohmann::json config;      // the resolved config of the run that wrote it
};

// The optimizer state a checkpoint writes, one tensor at a time: `layout` names every tensor
// (name, dtype, shape, bytes), and each(sink) hands them to `sink` in that order. The local
// optimizer's stream holds nothing extra; ZeRO's (zero.h) gathers each tensor from its owner just
// in time, so the writer never holds more than one state tensor beyond its own share.
struct OptimizerStream {
  using Sink = std::function<void(const at::Tensor&)>;
  std::vector<SafeTensorView> layout;
  std::function<void(const Sink&)> each;
  // 16-bit working weights: the fp32 master of a parameter (a host tensor), which
  // model.safetensors holds instead of the 16-bit weight; undefined (or no function): the weight.
  std::function<at::Tensor(const std::string&)> master_weight;
  // Expert parallelism: a routed-expert parameter's whole tensor (every expert, gathered from
  // the EP group before the write), which model.safetensors holds instead of this rank's share;
  // undefined (or no function): the parameter as it is.
  std::function<at::Tensor(const std::string&)> whole_parameter;
};
OptimizerStream local_optimizer_stream(optim::FusedAdamW& optimizer);

// Writes the three files into `dir` (an empty directory). `optimizer.each` runs to the end even
// when a write fails (its tensors may come from collectives every rank takes part in); the
// failure is thrown after it.
void save_checkpoint(const std::string& dir, model::TransformerLM& model,
                     const OptimizerStream& optimizer, const TrainingState& state);

// A weights-only checkpoint (model.safetensors + state.json without RNG states; import-hf):
// loadable by eval, generate, export-hf and model.init_from, not resumable. `extra`: more
// top-level keys of state.json (e.g. "imported_from").
void save_weights_checkpoint(const std::string& dir, model::TransformerLM& model,
                             const TrainingState& state, const nlohmann::json& extra);

// state.json of a weights-only checkpoint whose model.safetensors was written by its own means
// (import-hf streams it tensor by tensor): no RNG states, no expert biases.
void write_weights_state(const std::string& dir, const TrainingState& state,
                         const nlohmann::json& extra);

// Loads `dir` into the model and optimizer (whose shapes must match; optimizer may be null).
// Throws UserError naming the file and the problem for anything missing, damaged or
// mismatched. `restore_rng`: continue the saved RNG streams (a resume), when the state has them.
// `optimizer_share`: the optimizer holds a share of the parameters (ZeRO): the file's states of
// the other parameters are not its own and are skipped, not an error.
TrainingState load_checkpoint(const std::string& dir, model::TransformerLM& model,
                              optim::FusedAdamW* optimizer, bool restore_rng = true,
                              bool optimizer_share = false);

}  // namespace moe::checkpoint
