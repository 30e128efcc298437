#include "moe/families/layer_rules.h"

#include <cmath>
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

void read_time_step_limit(const HfKeys& k, nlohmann::json& m) {
  m["mamba_dt_min"] = 0.0;
  m["mamba_dt_max"] = 0.0;
  if (!k.present("time_step_limit")) return;
  const nlohmann::json& v = k.raw("time_step_limit");
  if (!v.is_array() || v.size() != 2) k.fail("time_step_limit", "expected [min, max]");
  const auto bound = [&](const nlohmann::json& b) -> double {
    if (b.is_number()) return std::isinf(b.get<double>()) ? 0.0 : b.get<double>();
    if ((b.is_object() && b.value("__float__", "") == "Infinity") ||
        (b.is_string() && b.get<std::string>() == "Infinity")) {
      return 0.0;
    }
    k.fail("time_step_limit", "expected [min, max] numbers (max may be Infinity)");
  };
  m["mamba_dt_min"] = bound(v[0]);
  m["mamba_dt_max"] = bound(v[1]);
}

nlohmann::json time_step_limit(const config::ModelConfig& m) {
  return nlohmann::json::array({m.mamba_dt_min, m.mamba_dt_max > 0
                                                    ? nlohmann::json(m.mamba_dt_max)
                                                    : nlohmann::json({{"__float__", "Infinity"}})});
}

}  // namespace moe::families
