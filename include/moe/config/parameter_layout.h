// The names and shapes of a model's parameters from its config alone, in the order
// TransformerLM registers them (named_parameters()), without building it: what a streaming
// import writes tensor by tensor. tests/model/parameter_layout_test.cpp holds it to the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/config.h"

namespace moe::config {

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<ParameterShape> parameter_layout(const config::Config& cfg);

}  // namespace moe::config
