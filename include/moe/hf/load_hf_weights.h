// model.init_from with a Hugging Face directory: its weights into a model built from the run's
// config.
#pragma once

#include <string>

#include "moe/config/config.h"
#include "moe/model/transformer.h"

namespace moe::hf {

// Loads the HF directory's weights into `model` (built from `cfg`), after checking that the
// directory's architecture is cfg's (the first differing key is named) and every tensor.
void load_hf_weights(const std::string& hf_dir, const config::Config& cfg,
                     model::TransformerLM& model);

}  // namespace moe::hf
