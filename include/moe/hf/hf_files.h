// The files of a Hugging Face model directory: safetensors weights (one model.safetensors, or
// shards named by model.safetensors.index.json), read with every cross-reference checked, and
// written with transformers' sharding rule; the tokenizer files that travel with a model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moe/util/safetensors.h"

namespace moe::hf {

struct HfTensorRef {
  const SafetensorsFile* file = nullptr;
  const SafeTensorEntry* entry = nullptr;
};

// Every tensor of an HF directory's weights. A missing shard, an index naming a tensor its
// shard lacks, a tensor in a shard but not in the index, a truncated or damaged file, or no
// safetensors weights at all: UserError naming the file (and tensor).
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  const std::map<std::string, HfTensorRef>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const HfTensorRef* find(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, HfTensorRef> tensors_;
};

// "[2, 3]": a tensor's shape as error messages print it (at::IntArrayRef's form).
std::string shape_text(const std::vector<int64_t>& shape);

// Bytes in "5GB" (10^9, as transformers counts), "500MB", "100KB", "2GiB", "1MiB" or "123".
// UserError naming `what` otherwise.
int64_t parse_size(const std::string& text, const std::string& what);

// Writes `tensors` into `dir` as transformers does: model.safetensors when they fit in one
// shard of at most `max_shard_bytes`, else model-0000i-of-0000n.safetensors shards (in order,
// a new shard when the next tensor would pass the limit; a larger tensor gets one of its own)
// and model.safetensors.index.json. Returns the number of files.
int64_t write_hf_weights(const std::string& dir, const std::vector<SafeTensorView>& tensors,
                         int64_t max_shard_bytes);

// The tokenizer and config files a checkpoint carries beside its weights: checkpoint/side_files.h.

}  // namespace moe::hf
