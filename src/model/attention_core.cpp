#include "moe/model/attention_core.h"

#include <ATen/SDPBackend.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <mutex>
#include <optional>
#include <set>

#include <torch/torch.h>

namespace moe::model {

torch::Tensor attention_mask(int64_t S, const AttentionMasking& m, const torch::Device& device) {
  if (m.window <= 0) return m.documents;
  const auto i = torch::arange(S, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto distance = i.unsqueeze(1) - i.unsqueeze(0);  // query - key
  // transformers' sliding_window_overlay: kv_idx > q_idx - window, with the causal kv <= q.
  const auto window = distance.ge(0) & distance.lt(m.window);
  return m.documents.defined() ? (m.documents & window) : window;
}

torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionMasking& m, double p) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), T = k.size(2);
  const double scale = m.scale > 0 ? m.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  auto scores = torch::matmul(q, k.transpose(2, 3)) * scale;
  auto mask = m.cached.defined() ? m.cached : attention_mask(S, m, q.device());
  if (!mask.defined()) {
    mask = torch::ones({S, S}, q.options().dtype(torch::kBool)).tril();
  }
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  torch::Tensor probs;
  if (m.sinks.defined()) {
    // gpt-oss: the sink is one more logit in each row's softmax, dropped after it.
    const auto sinks = m.sinks.reshape({1, H, 1, 1}).expand({B, H, S, 1}).to(scores.scalar_type());
    auto combined = torch::cat({scores, sinks}, -1);
    combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
    probs = torch::softmax(combined, -1, combined.scalar_type()).narrow(-1, 0, T);
  } else {
    probs = torch::softmax(scores, -1, scores.scalar_type());
  }
  if (p > 0) probs = torch::dropout(probs, p, /*train=*/true);
  return torch::matmul(probs.to(v.scalar_type()), v);
}

namespace {

const char* sdpa_kernel_name(int64_t choice) {
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::flash_attention:
      return "flash";
    case at::SDPBackend::efficient_attention:
      return "efficient (memory-efficient)";
    case at::SDPBackend::cudnn_attention:
      return "cudnn";
    case at::SDPBackend::math:
      return "math";
    default:
      return "another";
  }
}

// The kernel torch's SDPA picks for a head width, logged the first time that width runs on a
// GPU: flash and cuDNN take head_dim <= 256, so Gemma 4's 512-wide full-attention heads fall
// back to another kernel, and the log says which.
void log_sdpa_kernel_once(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& mask, double p, std::optional<double> scale) {
  static std::mutex mu;
  static std::set<int64_t> logged;
  const int64_t hd = q.size(3);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!logged.insert(hd).second) return;
  }
  const int64_t choice = at::_fused_sdp_choice(
      q, k, v, mask.defined() ? std::optional(mask) : std::nullopt, p, !mask.defined(), scale);
  spdlog::info("attention: head_dim {} runs on torch's {} SDPA kernel{}", hd,
               sdpa_kernel_name(choice), hd > 256 ? " (flash and cuDNN take head_dim <= 256)" : "");
}

}  // namespace

torch::Tensor attention_sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionMasking& m, double p) {
  const int64_t S = q.size(2), hd = q.size(3);
  if (m.cached.defined()) {
    // Generation's few queries over the cache: sinks take the eager form (the extra-key trick
    // below needs a square mask).
    if (m.sinks.defined()) return attention_reference(q, k, v, m, p);
    const std::optional<double> given = m.scale > 0 ? std::optional<double>(m.scale) : std::nullopt;
    return at::scaled_dot_product_attention(q, k, v, m.cached, p, false, given);
  }
  if (!m.sinks.defined()) {
    const auto mask = attention_mask(S, m, q.device());
    // The default scale unless one is given (latent attention's YaRN mscale).
    const std::optional<double> given = m.scale > 0 ? std::optional<double>(m.scale) : std::nullopt;
    if (q.is_cuda()) log_sdpa_kernel_once(q, k, v, mask, p, given);
    return mask.defined() ? at::scaled_dot_product_attention(q, k, v, mask, p, false, given)
                          : at::scaled_dot_product_attention(q, k, v, {}, p, true, given);
  }
  // Sinks as one more key: a sink key at position 0 whose score with every query is the head's
  // sink logit, with a zero value. q gains a last coordinate 1 and k (for the real keys) 0; the
  // sink key is 0 except that coordinate, sink / scale. Padded to a multiple of 8 (what the
  // fused kernels take), with the scale of the real head_dim passed explicitly. A dummy query
  // row 0 (it sees only the sink; its output is dropped) keeps the mask square and causal, so a
  // plain causal layer stays on is_causal (flash attention).
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const int64_t padded = (hd + 1 + 7) / 8 * 8, extra = padded - hd;
  const int64_t B = q.size(0), H = q.size(1);
  const auto o = q.options();
  auto ones_then_zeros = torch::zeros({B, H, S, extra}, o);
  ones_then_zeros.select(-1, 0).fill_(1);
  auto q_ext = torch::cat({q, ones_then_zeros}, -1);
  auto k_ext = torch::cat({k, torch::zeros({B, H, S, extra}, k.options())}, -1);
  auto v_ext = torch::cat({v, torch::zeros({B, H, S, extra}, v.options())}, -1);
  const auto sink_key =
      torch::cat({torch::zeros({B, H, 1, hd}, k.options()),
                  (m.sinks.to(k.scalar_type()) / scale).reshape({1, H, 1, 1}).expand({B, H, 1, 1}),
                  torch::zeros({B, H, 1, extra - 1}, k.options())},
                 -1);
  q_ext = torch::cat({torch::zeros({B, H, 1, padded}, o), q_ext}, 2);
  k_ext = torch::cat({sink_key, k_ext}, 2);
  v_ext = torch::cat({torch::zeros({B, H, 1, padded}, v.options()), v_ext}, 2);
  torch::Tensor y;
  if (!m.documents.defined() && m.window <= 0) {
    y = at::scaled_dot_product_attention(q_ext, k_ext, v_ext, {}, p, true, scale);
  } else {
    auto mask = attention_mask(S, m, q.device());  // [.., S, S] -> [.., S + 1, S + 1]
    auto sizes = mask.sizes().vec();
    sizes[sizes.size() - 2] += 1, sizes.back() += 1;
    auto full = torch::zeros(sizes, mask.options());
    full.narrow(-1, 0, 1).fill_(true);  // every row sees the sink
    full.narrow(-2, 1, S).narrow(-1, 1, S).copy_(mask);
    y = at::scaled_dot_product_attention(q_ext, k_ext, v_ext, full, p, false, scale);
  }
  return y.narrow(2, 1, S).narrow(-1, 0, hd);
}

}  // namespace moe::model
