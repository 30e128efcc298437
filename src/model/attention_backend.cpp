#include "moe/model/attention_backend.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include <algorithm>

namespace moe::model {

namespace {

int64_t backend_value(config::AttentionBackend b) {
  switch (b) {
    case config::AttentionBackend::kFlash:
      return static_cast<int64_t>(at::SDPBackend::flash_attention);
    case config::AttentionBackend::kCudnn:
      return static_cast<int64_t>(at::SDPBackend::cudnn_attention);
    case config::AttentionBackend::kEfficient:
      return static_cast<int64_t>(at::SDPBackend::efficient_attention);
    case config::AttentionBackend::kMath:
      return static_cast<int64_t>(at::SDPBackend::math);
    case config::AttentionBackend::kAuto:
      break;
  }
  return -1;
}

std::vector<int64_t> current_order() {
  std::vector<int64_t> order;
  for (at::SDPBackend b : at::globalContext().sDPPriorityOrder()) {
    order.push_back(static_cast<int64_t>(b));
  }
  return order;
}

// torch's own order, as it was before this process first changed it.
const std::vector<int64_t>& torch_order() {
  static const std::vector<int64_t> order = current_order();
  return order;
}

}  // namespace

std::vector<int64_t> attention_priority(config::AttentionBackend first,
                                        const std::vector<int64_t>& base) {
  if (first == config::AttentionBackend::kAuto) return base;
  const int64_t chosen = backend_value(first);
  std::vector<int64_t> order{chosen};
  std::copy_if(base.begin(), base.end(), std::back_inserter(order),
               [chosen](int64_t b) { return b != chosen; });
  return order;
}

void apply_attention_backend(config::AttentionBackend first) {
  at::globalContext().setSDPPriorityOrder(attention_priority(first, torch_order()));
}

std::string attention_priority_names() {
  std::string names;
  for (int64_t b : current_order()) {
    std::string name;
    switch (static_cast<at::SDPBackend>(b)) {
      case at::SDPBackend::flash_attention:
        name = "flash";
        break;
      case at::SDPBackend::efficient_attention:
        name = "efficient";
        break;
      case at::SDPBackend::cudnn_attention:
        name = "cudnn";
        break;
      case at::SDPBackend::math:
        name = "math";
        break;
      case at::SDPBackend::overrideable:
        name = "overrideable";
        break;
      default:
        name = std::to_string(b);
    }
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

}  // namespace moe::model
