// The verdict and advice of the memory plan: whether it fits the device (and host), the largest
// micro-batch that does, the cheapest memory tier that fits, and what would make a config that
// does not fit fit (checkpointing, offload, bf16, LoRA, a 4-bit base, expert parallelism), each
// tried alone on a copy; where nothing tried fits, the nearest options with their figures.
#include "moe/plan/advice.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "moe/config/lora.h"
#include "plan_parts.h"

namespace moe::plan {

using config::lora_enabled;
using config::quantized_base;

std::vector<MemoryTier> memory_tiers() {
  static const char* kWeights[] = {"fp32 weights", "bf16 weights + fp32 master",
                                   "bf16 weights + bf16 master (Kahan)"};
  static const char* kWeightSettings[] = {
      "", "bf16.enabled=true training.param_dtype=bf16 ",
      "bf16.enabled=true training.param_dtype=bf16 optimizer.main_params_dtype=bf16 "};
  static const char* kMoments[] = {"fp32 moments", "bf16 moments", "8-bit moments"};
  static const char* kMomentSettings[] = {
      "", "optimizer.exp_avg_dtype=bf16 optimizer.exp_avg_sq_dtype=bf16 ",
      "optimizer.exp_avg_dtype=8bit optimizer.exp_avg_sq_dtype=8bit "};
  std::vector<MemoryTier> tiers;
  for (int ck = 0; ck < 2; ++ck) {
    // off: 0 none, 1 offload with gradients streamed in the backward, 2 copied after it
    for (int off = 0; off < 3; ++off) {
      for (int m = 0; m < 3; ++m) {
        for (int w = 0; w < 3; ++w) {
          if (w == 2 && off > 0) continue;   // offload keeps an fp32 master on the host
          if (w == 0 && off == 2) continue;  // fp32 gradients: the same bytes either way
          MemoryTier t;
          t.weights = w;
          t.moments = m;
          t.offload = off > 0;
          t.offload_after_backward = off == 2;
          t.checkpointing = ck == 1;
          t.cost = (w == 1 ? 1 : w == 2 ? 2 : 0) + m + (off ? 2 + off : 0) + ck;
          t.name = std::string(kWeights[w]) + ", " + kMoments[m] +
                   (off == 1   ? ", offload"
                    : off == 2 ? ", offload (gradients copied after the backward)"
                               : "") +
                   (ck ? ", checkpointing" : "");
          t.settings = std::string(kWeightSettings[w]) + kMomentSettings[m] +
                       (off ? "zero_optimization.offload_optimizer.device=cpu " : "") +
                       (off == 2 ? "zero_optimization.overlap_comm=false " : "") +
                       (ck ? "activation_checkpointing.number_checkpoints=NUM_LAYERS " : "");
          if (!t.settings.empty()) t.settings.pop_back();
          tiers.push_back(t);
        }
      }
    }
  }
  std::stable_sort(tiers.begin(), tiers.end(),
                   [](const MemoryTier& a, const MemoryTier& b) { return a.cost < b.cost; });
  return tiers;
}

void apply_tier(const MemoryTier& t, Config& c, PlanOptions& o) {
  const ParamDtype sixteen = c.fp16.enabled ? ParamDtype::kFp16 : ParamDtype::kBf16;
  if (t.weights > 0 && !c.fp16.enabled) c.bf16.enabled = true;
  c.training.param_dtype = t.weights > 0 ? sixteen : ParamDtype::kFp32;
  c.optimizer.main_params_dtype = t.weights == 2 ? ParamDtype::kBf16 : ParamDtype::kFp32;
  const StateDtype m = t.moments == 0   ? StateDtype::kFp32
                       : t.moments == 1 ? StateDtype::kBf16
                                        : StateDtype::k8Bit;
  c.optimizer.exp_avg_dtype = c.optimizer.exp_avg_sq_dtype = m;
  c.zero_optimization.offload_optimizer.device =
      t.offload ? OffloadDevice::kCpu : OffloadDevice::kNone;
  if (t.offload) c.zero_optimization.overlap_comm = !t.offload_after_backward;
  o.checkpointing = t.checkpointing;
}

namespace {
bool fits_memory(const MemoryPlan& p, const PlanOptions& opt) {
  return p.reserved <= opt.device_bytes && (opt.host_bytes <= 0 || p.host <= opt.host_bytes);
}
}  // namespace

LargestModel largest_fitting_model(const Config& c, const PlanOptions& opt) {
  LargestModel best;
  auto plan_with = [&](int64_t layers) {
    Config alt = c;
    alt.model.num_layers = layers;
    alt.moe.mlp_only_layers.clear();  // a layer list of the original depth would not apply
    PlanOptions o = opt;
    o.device_bytes = 0;
    return plan_memory(alt, o);
  };
  int64_t lo = 0, hi = 1;
  while (hi <= 65536 && fits_memory(plan_with(hi), opt)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits_memory(plan_with(mid), opt) ? lo : hi) = mid;
  }
  if (lo == 0) return best;
  const MemoryPlan p = plan_with(lo);
  best.num_layers = lo;
  best.parameters = p.parameters;
  best.reserved = p.reserved;
  best.host = p.host;
  return best;
}

namespace {

// Plans of altered copies: `change` alters a copy of the config and the options (device_bytes 0:
// no advice of their own), and the plan is judged against the original options' device.
class Trial {
 public:
  Trial(const Config& c, const PlanOptions& opt) : c_(c), opt_(opt) {}

  template <typename Change>
  MemoryPlan plan(Change change) const {
    Config alt = c_;
    PlanOptions o = opt_;
    o.device_bytes = 0;
    change(alt, o);
    return plan_memory(alt, o);
  }
  // Does the plan fit once `change` has altered a copy of the config and the options?
  template <typename Change>
  bool fits(Change change) const {
    return fits_memory(plan(change), opt_);
  }
  // What the altered copy reserves where it fits; 0 where it does not.
  template <typename Change>
  double reserved_if_fits(Change change) const {
    const MemoryPlan q = plan(change);
    return fits_memory(q, opt_) ? q.reserved : 0.0;
  }

 private:
  const Config& c_;
  const PlanOptions& opt_;
};

// The cheapest tier that fits as configured otherwise, with its settings; none when none does.
std::optional<std::string> cheapest_fitting_tier(const Config& c, const Trial& trial) {
  for (const MemoryTier& t : memory_tiers()) {
    if (trial.fits([&](Config& a, PlanOptions& o) { apply_tier(t, a, o); })) {
      std::string settings = t.settings;
      const auto at = settings.find("NUM_LAYERS");
      if (at != std::string::npos) settings.replace(at, 10, std::to_string(c.model.num_layers));
      return t.name + (settings.empty() ? "" : " (" + settings + ")");
    }
  }
  return std::nullopt;
}

// Memory grows with the micro-batch: double to an upper bound, then bisect.
int64_t largest_fitting_micro_batch(const Trial& trial) {
  auto fits_with = [&](int64_t b) {
    return trial.fits([b](Config&, PlanOptions& o) { o.micro_batch = b; });
  };
  int64_t lo = 0, hi = 1;
  while (hi <= (int64_t{1} << 20) && fits_with(hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits_with(mid) ? lo : hi) = mid;
  }
  return lo;
}

// LoRA (r = 16) on a frozen 16-bit base.
void apply_lora16(Config& a) {
  a.lora.r = 16;
  a.lora.lora_alpha = 32;
  if (!a.fp16.enabled) a.bf16.enabled = true;
}

// A 4-bit base (QLoRA): nf4 with double quantization, computing in the run's 16-bit dtype.
void apply_4bit_base(Config& a) {
  a.quantization.load_in_4bit = true;
  a.quantization.quant_method = config::QuantMethod::kBitsandbytes;
  a.quantization.bnb_4bit_quant_type = config::Quant4bitType::kNf4;
  a.quantization.bnb_4bit_use_double_quant = true;
  a.quantization.bnb_4bit_compute_dtype =
      a.fp16.enabled ? config::QuantComputeDtype::kFloat16 : config::QuantComputeDtype::kBfloat16;
}

// Checkpointing, optimizer offload and bf16, each alone.
void advise_single_changes(const Config& c, const PlanOptions& opt, const Trial& trial,
                           MemoryPlan& p) {
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool mixed = !opt.cpu && (c.bf16.enabled || c.fp16.enabled);
  if (!opt.checkpointing && trial.fits([](Config&, PlanOptions& o) { o.checkpointing = true; })) {
    p.advice.push_back(
        "activation checkpointing of every block "
        "(activation_checkpointing.number_checkpoints = model.num_layers)");
  }
  if (!offload && trial.fits([](Config& a, PlanOptions&) {
        a.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
      })) {
    p.advice.push_back("optimizer offload (zero_optimization.offload_optimizer.device = cpu)");
  }
  if (!mixed && !opt.cpu && trial.fits([](Config& a, PlanOptions&) { a.bf16.enabled = true; })) {
    p.advice.push_back("bf16 (bf16.enabled = true)");
  }
}

// LoRA on a frozen 16-bit base, alone or with checkpointing: what single-GPU fine-tuning of the
// large MoEs takes (docs/finetune.md).
void advise_lora(const Config& c, const PlanOptions& opt, const Trial& trial, MemoryPlan& p) {
  if (p.advice.empty() && !lora_enabled(c) && !opt.cpu) {
    if (trial.fits([&](Config& a, PlanOptions&) { apply_lora16(a); })) {
      p.advice.push_back("LoRA on a frozen bf16 base (lora.r = 16 on attention and experts)");
    } else if (trial.fits([&](Config& a, PlanOptions& o) {
                 apply_lora16(a);
                 o.checkpointing = true;
               })) {
      p.advice.push_back(
          "LoRA on a frozen bf16 base (lora.r = 16 on attention and experts) with activation "
          "checkpointing of every block");
    }
  }
}

// A 4-bit base (QLoRA) under the adapters, alone or with checkpointing, with its figure.
void advise_4bit_base(const Config& c, const PlanOptions& opt, const Trial& trial, MemoryPlan& p) {
  const bool base16 = lora_enabled(c) && !quantized_base(c);
  if (!p.fits && !opt.cpu && (base16 || (p.advice.empty() && !lora_enabled(c)))) {
    const std::string what = base16 ? "a 4-bit base (quantization.load_in_4bit, nf4 + double quant)"
                                    : "LoRA on a 4-bit base (lora.r = 16 on attention and experts; "
                                      "quantization.load_in_4bit, nf4 + double quant)";
    auto qlora = [&](Config& a) {
      if (!base16) apply_lora16(a);
      apply_4bit_base(a);
    };
    double need = trial.reserved_if_fits([&](Config& a, PlanOptions&) { qlora(a); });
    std::string how = what;
    if (need == 0 && !opt.checkpointing) {
      need = trial.reserved_if_fits([&](Config& a, PlanOptions& o) {
        qlora(a);
        o.checkpointing = true;
      });
      how += " with activation checkpointing of every block";
    }
    if (need > 0) p.advice.push_back(how + ": " + gib(need) + " expected reserved");
  }
}

// Where nothing fits one device: the fewest GPUs (a power of two dividing the experts) on which
// the model trains with expert parallelism, each GPU holding num_experts / N of the routed
// experts: full fine-tuning in bf16 with ZeRO-1 and every block checkpointed (LoRA and a 4-bit
// base do not combine with expert parallelism yet, so they are left out of the trial).
void advise_expert_parallel(const Config& c, const PlanOptions& opt, const Trial& trial,
                            MemoryPlan& p) {
  if (p.fits || opt.cpu || opt.world_size > 1 || !p.advice.empty()) return;
  const int64_t E = c.moe.num_experts;
  auto expert_parallel = [](int64_t n) {
    return [n](Config& a, PlanOptions& o) {
      a.lora.r = 0;
      a.quantization.load_in_4bit = false;
      if (!a.fp16.enabled) a.bf16.enabled = true;
      a.zero_optimization.stage = std::max<int64_t>(a.zero_optimization.stage, 1);
      a.moe.expert_parallel_size = n;
      o.world_size = n;
      o.checkpointing = true;
    };
  };
  int64_t widest = 1;
  for (int64_t n = 2; n <= E && E % n == 0; n *= 2) {
    widest = n;
    const double need = trial.reserved_if_fits(expert_parallel(n));
    if (need > 0) {
      p.advice.push_back(std::to_string(n) +
                         " GPUs with expert parallelism (torchrun "
                         "--nproc-per-node " +
                         std::to_string(n) + ", moe.expert_parallel_size = " + std::to_string(n) +
                         "; full fine-tuning in bf16, ZeRO-1, every block "
                         "checkpointed: LoRA and a 4-bit base do not combine with expert "
                         "parallelism yet): " +
                         gib(need) + " expected reserved per GPU");
      return;
    }
  }
  // Nothing fits: say how far the two closest options are, so the user sees what it would take.
  const double device = opt.device_bytes;
  auto times = [device](double need) {
    char x[32];
    std::snprintf(x, sizeof x, "%.1f", need / device);
    return std::string(x) + "x this device";
  };
  const MemoryPlan q4 = trial.plan([&](Config& a, PlanOptions& o) {
    if (!lora_enabled(a)) apply_lora16(a);
    if (!quantized_base(a)) apply_4bit_base(a);
    o.checkpointing = true;
  });
  p.nearest.push_back("LoRA on a 4-bit base (nf4 + double quant), every block checkpointed: " +
                      gib(q4.reserved) + " expected reserved, " + times(q4.reserved) +
                      " (LoRA and a 4-bit base do not combine with expert parallelism yet)");
  if (widest > 1) {
    const MemoryPlan ep = trial.plan(expert_parallel(widest));
    p.nearest.push_back(std::to_string(widest) +
                        " GPUs with expert parallelism (full fine-tuning in bf16, ZeRO-1, every "
                        "block checkpointed): " +
                        gib(ep.reserved) + " expected reserved per GPU, " + times(ep.reserved) +
                        ": the weights outside the routed experts are on every GPU, and splitting "
                        "them (tensor or pipeline parallelism) is not in moe-train");
  }
}

}  // namespace

void fit_and_advise(const Config& c, const PlanOptions& opt, MemoryPlan& p) {
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool ckpt = opt.checkpointing;
  p.fits = fits_memory(p, opt);
  const Trial trial(c, opt);
  // The cheapest tier that fits as configured otherwise (LoRA runs keep their own rules).
  if (!lora_enabled(c) && opt.world_size <= 1) {
    if (std::optional<std::string> tier = cheapest_fitting_tier(c, trial)) p.cheapest_tier = *tier;
  }
  p.max_micro_batch = largest_fitting_micro_batch(trial);
  if (p.fits && p.max_micro_batch >= p.micro_batch) return;
  advise_single_changes(c, opt, trial, p);
  advise_lora(c, opt, trial, p);
  advise_4bit_base(c, opt, trial, p);
  if (p.advice.empty() && !ckpt && !offload && trial.fits([](Config& a, PlanOptions& o) {
        o.checkpointing = true;
        a.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
      })) {
    p.advice.push_back("activation checkpointing of every block together with optimizer offload");
  }
  advise_expert_parallel(c, opt, trial, p);
  if (p.max_micro_batch > 0) {
    p.advice.push_back("train_micro_batch_size_per_gpu = " + std::to_string(p.max_micro_batch) +
                       " with gradient_accumulation_steps raised to keep train_batch_size");
  }
}

}  // namespace moe::plan
