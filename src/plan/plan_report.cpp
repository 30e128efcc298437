// The memory plan as `moe-train plan` prints it: the run's sizes, a row per term with bytes per
// parameter where that means something, the verdict and advice; or (--json) the figures in bytes.
#include "moe/plan/plan_report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <utility>

#include "moe/config/lora.h"
#include "moe/util/errors.h"
#include "plan_parts.h"

namespace moe::plan {

using config::GradientReduction;
using config::lora_enabled;
using config::QuantMethod;

std::string gib(double bytes) {
  char b[32];
  if (bytes >= kGiB) {
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / kGiB);
  } else {
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return b;
}

namespace {

// The table of format_plan: a row per term, with bytes per parameter where that means something.
class PlanRows {
 public:
  explicit PlanRows(double parameters) : parameters_(parameters) {}

  void row(const char* what, double bytes, const std::string& note) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-34s %12s  %s", what, gib(bytes).c_str(), note.c_str());
    std::string l = line;
    l.erase(l.find_last_not_of(' ') + 1);
    out += l + "\n";
  }
  std::string per(double bytes) const {
    char b[48];
    std::snprintf(b, sizeof b, "%.2f bytes/parameter", bytes / std::max(1.0, parameters_));
    return std::string(b);
  }

  std::string out;

 private:
  double parameters_;
};

// The run's sizes, and its LoRA parameter counts.
std::string plan_header(const Config& c, const PlanOptions& opt, const MemoryPlan& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "parameters: %.4g total, %.4g active per token; micro-batch %lld x %lld tokens; "
                "world size %lld, ZeRO stage %lld\n",
                static_cast<double>(p.parameters), static_cast<double>(p.active_parameters),
                static_cast<long long>(p.micro_batch), static_cast<long long>(c.model.seq_len),
                static_cast<long long>(opt.world_size),
                static_cast<long long>(c.zero_optimization.stage));
  out += line;
  out += std::string(opt.cpu ? "host memory" : "device memory") + " of one training step:\n";
  if (lora_enabled(c)) {
    const config::LoraParameterCounts n = config::lora_parameter_counts(c);
    std::snprintf(line, sizeof line,
                  "LoRA r = %lld: %.4g adapter parameters, %.4g base parameters trained in full, "
                  "%.4g frozen (%s)\n",
                  static_cast<long long>(c.lora.r), static_cast<double>(n.adapter),
                  static_cast<double>(n.trainable_base), static_cast<double>(n.frozen_base),
                  (std::string(p.quantized_parameters > 0 ? "4-bit matrices, the rest " : "") +
                   (!opt.cpu && (c.bf16.enabled || c.fp16.enabled) ? "16-bit" : "fp32"))
                      .c_str());
    out += line;
  }
  return out;
}

// Weights (and their 4-bit part), gradients, master weights, moments and autocast's copies.
void state_rows(const Config& c, const MemoryPlan& p, PlanRows& t) {
  const bool w16 = c.training.param_dtype != ParamDtype::kFp32;
  const std::string weight_dtype(name(c.training.param_dtype));
  t.row(lora_enabled(c) ? "weights (frozen base + fp32 trained)"
                        : ("weights (" + weight_dtype + ")").c_str(),
        p.weights, t.per(p.weights));
  if (p.quantized_parameters > 0) {
    const config::QuantizationConfig& q = c.quantization;
    char b[96];
    std::snprintf(b, sizeof b, "%.4g parameters, %.4f bytes each",
                  static_cast<double>(p.quantized_parameters),
                  p.quantized_base / static_cast<double>(p.quantized_parameters));
    const std::string how = q.quant_method == QuantMethod::kMxfp4
                                ? std::string("MXFP4 experts")
                                : std::string(name(q.bnb_4bit_quant_type)) +
                                      (q.bnb_4bit_use_double_quant ? ", double quant" : "");
    t.row(("  4-bit part (" + how + ")").c_str(), p.quantized_base, b);
  }
  const ExpertOffloadPlan& o = p.expert_offload;
  if (o.on) {
    const std::string layers = std::to_string(o.layers) + " MoE layers' frozen experts";
    t.row("  of it, the expert offload ring", o.ring_bytes,
          std::to_string(c.moe.offload_ring_layers) + " layers' experts (moe.offload_experts" +
              (o.chosen_by_auto ? " auto: nothing else fits)" : " on)"));
    t.row("  moved to the host", o.host_bytes, layers.c_str());
  }
  t.row(p.gradients > 2.5 * static_cast<double>(p.parameters) || !w16
            ? "gradients (fp32)"
            : ("gradients (" + weight_dtype + ")").c_str(),
        p.gradients, t.per(p.gradients));
  if (p.master_weights > 0) {
    t.row(c.optimizer.main_params_dtype == ParamDtype::kBf16 ? "bf16 master compensation (Kahan)"
                                                             : "fp32 master weights",
          p.master_weights, t.per(p.master_weights));
  }
  const std::string moment_names = std::string(name(c.optimizer.exp_avg_dtype)) + "/" +
                                   std::string(name(c.optimizer.exp_avg_sq_dtype));
  t.row(("Adam moments (" + moment_names + ")").c_str(), p.optimizer_states,
        p.optimizer_states == 0 ? "offloaded to the host" : t.per(p.optimizer_states));
  if (p.low_precision_weights > 0) {
    t.row("bf16/fp16 weight copies (autocast)", p.low_precision_weights,
          t.per(p.low_precision_weights));
  }
}

// Activations, transients, communication buffers, the peak, the reserve and the host's share.
void dynamic_rows(const Config& c, const PlanOptions& opt, const MemoryPlan& p, PlanRows& t) {
  t.row("activations, one micro-batch", p.activations,
        c.activation_checkpointing.number_checkpoints > 0 || opt.checkpointing
            ? "with activation checkpointing"
            : "no activation checkpointing");
  t.row("  without checkpointing", p.activations_no_checkpoint, "");
  t.row("  every block checkpointed", p.activations_checkpoint, "");
  t.row("backward transients", p.backward_transient, "largest short-lived buffers");
  if (p.dequant_scratch > 0) {
    t.row("4-bit dequantization scratch", p.dequant_scratch,
          "the largest matrix group dequantized for one GEMM");
  }
  if (p.update_transient > 0) {
    t.row("update transients", p.update_transient,
          "fp32 copies: the largest parameter's moments, 16-bit weights' gradient buckets");
  }
  if (p.communication > 0) {
    const GradientReduction r = config::data_parallel_mode(c, opt.world_size).reduction;
    t.row("gradient communication", p.communication,
          r == GradientReduction::kReduceToOwnersInBackward
              ? "ZeRO-2 buckets being reduced onto owners"
          : r == GradientReduction::kReducerInBackward
              ? "DDP Reducer buckets (a copy of every gradient)"
              : "one all-reduce bucket after the backward");
  }
  t.row("peak of tensors", p.peak, "the worst moment of the backward or the update");
  if (!opt.cpu) {
    t.row("expected reserved", p.reserved, "+5% allocator, +0.75 GiB CUDA context");
    // What torch.cuda.max_memory_reserved() reports (and Unsloth's notebooks quote): the
    // allocator's share, without the context.
    t.row("  of it, the allocator's", p.peak * 1.05, "torch.cuda.max_memory_reserved()");
  }
  if (p.host > 0) {
    std::string held;
    for (const auto& [on, what] :
         {std::pair{p.host_states > 0, "moments, master weights, gradient staging"},
          {c.activation_checkpointing.cpu_checkpointing, "checkpointed inputs"},
          {p.expert_offload.on, "the frozen experts (pinned)"}}) {
      if (on) held += (held.empty() ? "" : "; ") + std::string(what);
    }
    t.row("host (offload)", p.host, held);
  }
  const ExpertOffloadPlan& o = p.expert_offload;
  if (o.on) {
    char b[160];
    std::snprintf(b, sizeof b, "%.3f s per step at %.1f GB/s%s", o.copy_seconds_per_step,
                  o.link_bytes_per_s / 1e9,
                  opt.host_link_bytes_per_s > 0 ? "" : " (assumed: PCIe 4.0 x16)");
    t.row("host -> device copies per step", o.copy_bytes_per_step, b);
  }
}

// Whether the plan fits the device, and the advice (with a device size to judge against).
std::string plan_verdict(const PlanOptions& opt, const MemoryPlan& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "verdict: %s on %s (%s needed); largest micro-batch that fits: %lld\n",
                p.fits ? "fits" : "does NOT fit", gib(opt.device_bytes).c_str(),
                gib(p.reserved).c_str(), static_cast<long long>(p.max_micro_batch));
  out += line;
  for (const auto& a : p.advice) out += "  would help: " + a + "\n";
  if (!p.cheapest_tier.empty()) out += "  cheapest tier that fits: " + p.cheapest_tier + "\n";
  if (!p.fits && p.advice.empty()) {
    out +=
        "  nothing tried fits one device (checkpointing, offload, LoRA, a 4-bit base, "
        "micro-batch 1): more devices (data parallel with ZeRO), a shorter model.seq_len, or a "
        "smaller model\n";
  }
  for (const auto& n : p.nearest) out += "  nearest: " + n + "\n";
  return out;
}

}  // namespace

std::string format_plan(const Config& c, const PlanOptions& opt, const MemoryPlan& p) {
  PlanRows t(static_cast<double>(p.parameters));
  t.out = plan_header(c, opt, p);
  state_rows(c, p, t);
  dynamic_rows(c, opt, p, t);
  if (opt.device_bytes > 0) t.out += plan_verdict(opt, p);
  return t.out;
}

nlohmann::json plan_json(const PlanOptions& o, const MemoryPlan& p) {
  nlohmann::json j = {{"parameters", p.parameters},
                      {"active_parameters", p.active_parameters},
                      {"micro_batch", p.micro_batch},
                      {"device", o.cpu ? "cpu" : "gpu"},
                      {"world_size", o.world_size},
                      {"weights_bytes", p.weights},
                      {"gradients_bytes", p.gradients},
                      {"optimizer_states_bytes", p.optimizer_states},
                      {"low_precision_weights_bytes", p.low_precision_weights},
                      {"master_weights_bytes", p.master_weights},
                      {"activations_bytes", p.activations},
                      {"activations_no_checkpoint_bytes", p.activations_no_checkpoint},
                      {"activations_checkpoint_bytes", p.activations_checkpoint},
                      {"backward_transient_bytes", p.backward_transient},
                      {"communication_bytes", p.communication},
                      {"peak_bytes", p.peak},
                      {"reserved_bytes", p.reserved},
                      {"host_bytes", p.host},
                      {"host_states_bytes", p.host_states},
                      {"quantized_base_bytes", p.quantized_base},
                      {"quantized_parameters", p.quantized_parameters},
                      {"dequant_scratch_bytes", p.dequant_scratch}};
  if (o.device_bytes > 0) {
    j["device_bytes"] = o.device_bytes;
    j["fits"] = p.fits;
    j["max_micro_batch"] = p.max_micro_batch;
    j["advice"] = p.advice;
    j["nearest"] = p.nearest;
    j["cheapest_tier"] = p.cheapest_tier;
  }
  if (o.host_bytes > 0) j["host_memory_bytes"] = o.host_bytes;
  const ExpertOffloadPlan& e = p.expert_offload;
  j["expert_offload"] = {{"on", e.on},
                         {"chosen_by_auto", e.chosen_by_auto},
                         {"layers", e.layers},
                         {"host_bytes", e.host_bytes},
                         {"ring_bytes", e.ring_bytes},
                         {"copy_bytes_per_step", e.copy_bytes_per_step},
                         {"link_bytes_per_s", e.link_bytes_per_s},
                         {"copy_seconds_per_step", e.copy_seconds_per_step}};
  return j;
}

double parse_memory_size(const std::string& text, const std::string& what) {
  std::string t;
  for (char ch : text) {
    if (ch != ' ') t += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  }
  size_t i = 0;
  while (i < t.size() &&
         (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' || t[i] == 'E' ||
          ((t[i] == '+' || t[i] == '-') && i > 0 && t[i - 1] == 'E'))) {
    ++i;
  }
  double v = 0;
  try {
    v = i == 0 ? -1 : std::stod(t.substr(0, i));
  } catch (const std::exception&) {
    v = -1;
  }
  const std::string unit = t.substr(i);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB") scale = 1e3;
  if (unit == "MB") scale = 1e6;
  if (unit == "GB") scale = 1e9;
  if (unit == "TB") scale = 1e12;
  if (unit == "KIB") scale = 1024.0;
  if (unit == "MIB") scale = 1024.0 * 1024.0;
  if (unit == "GIB") scale = kGiB;
  if (unit == "TIB") scale = kGiB * 1024.0;
  if (v <= 0 || scale == 0) {
    throw UserError(what + " = \"" + text + "\": expected a size such as 141GiB, 80GB or 24GiB");
  }
  return v * scale;
}

}  // namespace moe::plan
