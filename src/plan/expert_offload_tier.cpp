// The expert offload tier (moe.offload_experts on, layers/offload_ring.h): a LoRA run's frozen
// routed experts leave the device for host memory; a ring of moe.offload_ring_layers device
// buffers, each the size of the largest MoE layer's experts, takes their place. Each micro-batch
// copies every MoE layer's experts over the host link once in the forward and once in the
// backward, except the layer at the turn, which the ring still holds (a recomputation and the
// backward after it read one copy).
#include <algorithm>
#include <map>
#include <string>

#include "moe/config/lora.h"
#include "moe/config/parameter_layout.h"
#include "moe/plan/quantized_base_tier.h"
#include "plan_parts.h"

namespace moe::plan {

namespace {

// A routed expert stack's name: blocks.<i>.moe.experts.w_gate, w_up or w_down.
bool routed_expert_stack(const std::string& name) {
  const auto at = name.find(".moe.experts.w_");
  return at != std::string::npos && name.find('.', at + 15) == std::string::npos &&
         (name.ends_with("w_gate") || name.ends_with("w_up") || name.ends_with("w_down"));
}

// PCIe 4.0 x16's practical host-to-device rate from pinned memory, where none was measured.
constexpr double kAssumedLinkBytesPerSecond = 25e9;

// Bytes of each MoE layer's frozen routed experts as the model holds them: 16-bit (fp32 on a
// CPU) stacks, or 4-bit states (bitsandbytes or MXFP4), by block index.
std::map<int64_t, double> frozen_expert_bytes(const Config& c, const PlanBasis& b) {
  std::map<int64_t, double> layers;
  const bool four_bit = config::quantized_base(c);
  const bool mxfp4 = c.quantization.quant_method == config::QuantMethod::kMxfp4;
  for (const auto& p : config::parameter_layout(c)) {
    if (!routed_expert_stack(p.name)) continue;
    if (config::saved_in_full(c.lora, p.name, c.model.tie_embeddings)) continue;
    const int64_t layer = std::stoll(p.name.substr(p.name.find('.') + 1));
    const int64_t experts = p.shape[0], matrix = p.shape[1] * p.shape[2];
    const double values = static_cast<double>(experts * matrix);
    double bytes = (b.mixed || b.w16 ? 2.0 : 4.0) * values;
    if (four_bit) {
      bytes = mxfp4 ? values * 17.0 / 32.0
                    : static_cast<double>(experts) *
                          quantized_4bit_bytes(matrix, c.quantization.bnb_4bit_use_double_quant);
    }
    layers[layer] += bytes;
  }
  return layers;
}

}  // namespace

void add_expert_offload(const PlanContext& x, PlanDraft& d) {
  const Config& c = x.c;
  if (c.moe.offload_experts != config::OffloadExperts::kOn || !config::lora_enabled(c)) return;
  const std::map<int64_t, double> layers = frozen_expert_bytes(c, x.b);
  if (layers.empty()) return;
  ExpertOffloadPlan& o = d.plan.expert_offload;
  o.on = true;
  o.layers = static_cast<int64_t>(layers.size());
  double largest = 0;
  for (const auto& [layer, bytes] : layers) {
    o.host_bytes += bytes;
    largest = std::max(largest, bytes);
  }
  const double slots = static_cast<double>(std::min<int64_t>(c.moe.offload_ring_layers, o.layers));
  o.ring_bytes = slots * largest;
  const double micro_batches =
      static_cast<double>(std::max<int64_t>(1, c.gradient_accumulation_steps));
  const double per_pass = o.host_bytes / static_cast<double>(o.layers);
  o.copy_bytes_per_step = micro_batches * (2.0 * o.host_bytes - per_pass);
  o.link_bytes_per_s =
      x.opt.host_link_bytes_per_s > 0 ? x.opt.host_link_bytes_per_s : kAssumedLinkBytesPerSecond;
  o.copy_seconds_per_step = o.copy_bytes_per_step / o.link_bytes_per_s;
  d.plan.weights += o.ring_bytes - o.host_bytes;
  d.plan.host += o.host_bytes;
}

}  // namespace moe::plan
