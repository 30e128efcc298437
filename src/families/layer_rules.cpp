#include "moe/families/layer_rules.h"

#include <vector>

#include "moe/util/errors.h"

namespace moe::families {

nlohmann::json first_k_dense_layers(const HfKeys& k, int64_t fallback) {
  const int64_t layers = k.integer("num_hidden_layers");
  const int64_t dense = k.integer("first_k_dense_replace", fallback);
  if (dense > layers) k.fail("first_k_dense_replace", "exceeds num_hidden_layers");
  std::vector<int64_t> dense_layers;
  for (int64_t i = 0; i < dense; ++i) dense_layers.push_back(i);
  return dense_layers;
}

int64_t leading_dense_layers(const config::Config& cfg) {
  int64_t n = 0;
  while (n < cfg.model.num_layers && !config::is_moe_layer(cfg, n)) ++n;
  return n;
}

void require_dense_layers_first(const config::Config& cfg, const std::string& who) {
  const int64_t dense = leading_dense_layers(cfg);
  for (int64_t i = 0; i < cfg.model.num_layers; ++i) {
    if (config::is_moe_layer(cfg, i) != (i >= dense)) {
      throw UserError("moe.mlp_only_layers: " + who +
                      "'s dense layers are the first first_k_dense_replace ones");
    }
  }
}

void require_all_moe(const config::Config& cfg, const std::string& who) {
  if (config::moe_layer_count(cfg) != cfg.model.num_layers) {
    throw UserError("moe.mlp_only_layers: " + who + " has no dense layers");
  }
}

}  // namespace moe::families
