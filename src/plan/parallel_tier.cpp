// The parallel tier (docs/distributed.md): data parallelism's gradient communication buffers
// (DDP's Reducer, ZeRO-2's buckets, the after-backward all-reduce), expert parallelism's
// all-to-all rows, and the routed experts a rank leaves to the others. ZeRO's shares of the
// gradients and states are in the plan's basis (memory_plan.cpp) and the weights tier.
#include <algorithm>
#include <string>

#include "moe/config/parameter_layout.h"
#include "plan_parts.h"

namespace moe::plan {

namespace {

// Values of the routed experts' stacks (all MoE layers), which expert parallelism spreads.
double routed_expert_parameters(const Config& c) {
  double n = 0;
  for (const auto& p : config::parameter_layout(c)) {
    if (p.name.find(".moe.experts.") == std::string::npos) continue;
    double v = 1;
    for (int64_t d : p.shape) v *= static_cast<double>(d);
    n += v;
  }
  return n;
}

// Gradient-reduction buffers of data parallelism (docs/distributed.md).
double communication_bytes(GradientReduction reduction, double bucket, double trained, double N) {
  switch (reduction) {
    case GradientReduction::kNone:
      return 0;
    case GradientReduction::kAllReduceAfterBackward:
      return std::min(bucket, 4 * trained);
    case GradientReduction::kReduceToOwnersInBackward:
      return std::min(3 * bucket, 4 * trained * (N - 1) / N);
    case GradientReduction::kReducerInBackward:
      return 4 * trained;
  }
  return 0;
}

}  // namespace

// Expert parallelism: a rank holds num_experts / EP of the routed experts, with their gradients
// and Adam state.
double held_on_other_ranks(const Config& c, const DataParallelMode& dp) {
  return routed_expert_parameters(c) * (1 - 1.0 / static_cast<double>(dp.expert_parallel));
}

// The gradient communication buffers alive in the backward, and under expert parallelism the
// all-to-all's received rows and their expert-order copy.
void add_parallel(const PlanContext& x, PlanDraft& d) {
  const PlanBasis& b = x.b;
  MemoryPlan& p = d.plan;
  const double bucket = static_cast<double>(config::reduce_bucket_bytes(x.c));
  p.communication = communication_bytes(b.dp.reduction, bucket, b.trained, b.N);
  if (b.dp.expert_parallel > 1) {
    const Shape rows = shape_of(x.c, p.micro_batch, x.opt);
    p.communication += 2 * rows.T * rows.k * rows.d * rows.a;
  }
}

}  // namespace moe::plan
