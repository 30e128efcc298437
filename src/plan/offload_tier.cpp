// The offload tier (zero_optimization.offload_optimizer.device = cpu): the optimizer's states
// leave the device for the host, where the offloaded optimizer holds the moments, an fp32 master
// copy and the gradients' staging (or, streamed in the backward, fp32 gradients and a 16-bit
// staging buffer), and where the update's transients are allocated.
#include <algorithm>

#include "moe/plan/weights_tier.h"
#include "plan_parts.h"

namespace moe::plan {

namespace {

// Host bytes held for the whole run: moments + fp32 master copy + gradient staging (in the
// gradients' dtype); streamed: fp32 gradients, and a 16-bit staging buffer for 16-bit weights
// (their copies both ways). One host buffer per dtype, packed (optim/host_arena.h): no allocator
// rounding to add. Under 16-bit weights the norms and routers stay fp32: fp32 staging, no 16-bit
// copy. ZeRO 1+ shares them out over the ranks.
double host_state_bytes(const Config& c, const PlanBasis& b) {
  const double trained = b.trained;
  const double state_share = b.dp.shards_optimizer() ? b.N : 1;
  const double moments = moment_bytes_per_parameter(c);
  const double staging = b.streamed ? 4 + (b.w16 ? 2 : 0) : !b.w16 || b.fp32_sums ? 4 : 2;
  const double fp32_held =
      b.w16 ? std::min(trained, static_cast<double>(config::fp32_parameters_under_16bit_weights(c)))
            : 0;
  const double staging_bytes = staging * trained + (b.streamed ? -2 : 4 - staging) * fp32_held;
  return ((moments + 4) * trained + staging_bytes) / state_share;
}

}  // namespace

// Offload moves the moments, the master weights and the update's transients to the host; the
// host also holds what the activations part left there (checkpointed inputs).
void add_offload(const PlanContext& x, PlanDraft& d) {
  MemoryPlan& p = d.plan;
  if (x.b.offload) {
    p.host_states = host_state_bytes(x.c, x.b);
    p.optimizer_states = 0;
    p.master_weights = 0;
    d.update_on_device = 0;
  }
  p.host = p.host_states + p.host;
  if (x.b.offload) p.host += p.update_transient;
}

}  // namespace moe::plan
