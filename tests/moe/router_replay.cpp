// Routes given logits with our router (moe::RouterImpl::forward, the ATen path), for
// tests/moe/router_parity_test.py to compare with transformers' DeepSeek-V3 / GLM-4.5 router on
// the same inputs. The router's weight is the identity, so its logits are the input exactly.
//   router_replay IN.safetensors OUT.safetensors TOP_K N_GROUP TOPK_GROUP SCALING NORMALIZE
//   [FLAG...]
// Flags: cuda (on the GPU through the fused router kernel, kernels/router.cu); softmax (softmax
// scores, DeepSeek-V2's; else sigmoid); group-best (a group scored by its best expert, V2's
// group_limited_greedy; else its two best).
// IN: logits F32 [N, E], bias F32 [E] (the e_score_correction_bias; zeros with softmax).
// OUT: topk_idx I64 [N, k], topk_weight F32 [N, k] (routed_scaling_factor applied).
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "moe/config/choices.h"
#include "moe/moe/router.h"
#include "moe/util/safetensors.h"
#include "util/read_f32.h"

namespace {

using moe::test::read_f32;

}  // namespace

int main(int argc, char** argv) {
  bool cuda = false, softmax = false, group_best = false, flags_ok = argc >= 8;
  for (int i = 8; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "cuda") {
      cuda = true;
    } else if (f == "softmax") {
      softmax = true;
    } else if (f == "group-best") {
      group_best = true;
    } else {
      flags_ok = false;
    }
  }
  if (!flags_ok) {
    std::fprintf(stderr,
                 "usage: router_replay IN OUT TOP_K N_GROUP TOPK_GROUP SCALING NORMALIZE "
                 "[cuda] [softmax] [group-best]\n");
    return 2;
  }
  const moe::SafetensorsFile in(argv[1]);
  const torch::Tensor logits = read_f32(in, "logits"), bias = read_f32(in, "bias");
  const int64_t E = logits.size(1);
  moe::moe::RouterOptions opt;
  opt.hidden_size = E;
  opt.num_experts = E;
  opt.top_k = std::atoll(argv[3]);
  opt.n_group = std::atoll(argv[4]);
  opt.topk_group = std::atoll(argv[5]);
  opt.routed_scaling_factor = std::atof(argv[6]);
  opt.normalize_topk = std::string(argv[7]) == "1";
  opt.score_function =
      softmax ? moe::config::ScoreFunction::kSoftmax : moe::config::ScoreFunction::kSigmoid;
  opt.group_score_experts = group_best ? 1 : 2;
  opt.fused_kernel = cuda;
  moe::moe::Router router(opt);
  torch::NoGradGuard no_grad;
  router->weight.copy_(torch::eye(E));
  router->expert_bias.copy_(bias);
  router->eval();
  const torch::Device device = cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  router->to(device);
  at::globalContext().setAllowTF32CuBLAS(false);  // the identity weight must pass logits exactly
  const moe::moe::Routing r = router->forward(logits.to(device));
  const torch::Tensor idx = r.topk_idx.cpu().contiguous(), w = r.topk_weight.cpu().contiguous();
  const std::vector<int64_t> shape = idx.sizes().vec();
  moe::write_safetensors(argv[2],
                         {{"topk_idx", "I64", shape, idx.data_ptr(), size_t(idx.nbytes())},
                          {"topk_weight", "F32", shape, w.data_ptr(), size_t(w.nbytes())}});
  return 0;
}
