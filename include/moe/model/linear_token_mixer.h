// The token-mixer face of the linear mixers (Gated DeltaNet, Mamba-2): no attention mask and no
// rotary tables; documents by their positions (the scans restart at each position 0); generation
// through the layer's conv and recurrent cache.
#pragma once

#include <memory>
#include <utility>

#include "moe/model/block_parts.h"

namespace moe::model {

template <class Net>  // a module holder whose Impl has forward, set_documents, set_decode
class LinearTokenMixer final : public TokenMixer {
 public:
  explicit LinearTokenMixer(Net net) : net_(std::move(net)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return net_->forward(x); }
  void set_documents(const torch::Tensor&, const torch::Tensor& positions) override {
    net_->set_documents(positions);
  }
  void share_rotary_tables(std::shared_ptr<RotaryTableCache>) override {}  // no positions
  void merge_lora() override {
    if constexpr (requires(Net & n) { n->merge_lora(); }) net_->merge_lora();  // else: no adapters
  }
  void set_decode(const DecodeStep* step, LayerCache* cache) override {
    net_->set_decode(step, cache);
  }

 private:
  Net net_;
};

}  // namespace moe::model
