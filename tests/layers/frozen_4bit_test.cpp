// A 4-bit frozen base (src/layers/frozen_4bit.cpp): each bitsandbytes matrix quantized on its
// own (q, k and v of the fused projection; each expert's [out, in] matrix), the GEMMs computed
// on the dequantized matrices with gradients reaching the input only, the model's frozen
// matrices emptied and held 4-bit, the fingerprint covering the codes, and a merge over the
// dequantized base leaving the function unchanged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"
#include "moe/model/transformer.h"
#include "moe/quant/bnb_4bit.h"
#include "moe/util/errors.h"

namespace moe::layers {
namespace {

using namespace model;  // the adapters and 4-bit weights inside whole models

using config::Quant4bitType;

Quant4bitOptions nf4_dq() {
  Quant4bitOptions o;
  o.type = Quant4bitType::kNf4;
  o.double_quant = true;
  return o;
}

TEST(Frozen4bit, FusedLinearQuantizesEachPartOnItsOwn) {
  torch::manual_seed(3);
  const auto w = torch::randn({40, 24});  // q 24 rows, k 8, v 8
  const auto q = QuantizedWeight::linear(w, {24, 8, 8}, nf4_dq());
  ASSERT_EQ(q->parts().size(), 3u);
  int64_t row = 0;
  for (const int64_t rows : {24, 8, 8}) {
    const auto alone = quant::quantize_4bit(w.narrow(0, row, rows), Quant4bitType::kNf4, true);
    const auto& part = q->parts()[static_cast<size_t>(row == 0 ? 0 : row == 24 ? 1 : 2)];
    EXPECT_TRUE(torch::equal(part.codes, alone.codes));
    EXPECT_TRUE(torch::equal(part.absmax, alone.absmax));
    EXPECT_TRUE(torch::equal(part.offset, alone.offset));
    row += rows;
  }
  // One part over the whole matrix would share the double-quant offset: a different state.
  const auto whole = quant::quantize_4bit(w, Quant4bitType::kNf4, true);
  EXPECT_FALSE(torch::equal(whole.offset, q->parts()[0].offset));
}

TEST(Frozen4bit, ExpertMatricesAreTheTransposedSlices) {
  torch::manual_seed(4);
  const auto w = torch::randn({3, 16, 12});  // [E, in, out]
  const auto q = QuantizedWeight::experts(w, nf4_dq());
  ASSERT_EQ(q->parts().size(), 3u);
  for (int64_t e = 0; e < 3; ++e) {
    const auto alone = quant::quantize_4bit(w[e].t().contiguous(), Quant4bitType::kNf4, true);
    EXPECT_TRUE(torch::equal(q->parts()[static_cast<size_t>(e)].codes, alone.codes)) << e;
    EXPECT_EQ(q->parts()[static_cast<size_t>(e)].shape, (std::vector<int64_t>{12, 16}));
  }
  const auto deq = q->dequantize(torch::kFloat);
  EXPECT_EQ(deq.sizes(), w.sizes());
  EXPECT_TRUE(torch::equal(deq[1], quant::dequantize_4bit(q->parts()[1]).t()));
  // 4-bit error: at most half the widest NF4 gap (0.16) of each block's absmax.
  EXPECT_LT((deq - w).abs().max().item<double>(), 0.17 * w.abs().max().item<double>());
}

TEST(Frozen4bit, LinearGradientReachesTheInputOnly) {
  torch::manual_seed(5);
  const auto w = torch::randn({10, 64});
  const auto q = QuantizedWeight::linear(w, {}, nf4_dq());
  const auto x = torch::randn({3, 7, 64}, torch::requires_grad());
  const auto y = linear_4bit(x, q);
  const auto W = q->dequantize(torch::kFloat);
  EXPECT_TRUE(torch::equal(y, torch::matmul(x.detach(), W.t())));
  const auto g = torch::randn_like(y);
  y.backward(g);
  EXPECT_TRUE(torch::equal(x.grad(), torch::matmul(g, W)));
  // Expert e's form: the same arithmetic on that expert's matrix.
  const auto stack = QuantizedWeight::experts(torch::randn({2, 64, 10}), nf4_dq());
  const auto xe = torch::randn({5, 64});
  EXPECT_TRUE(torch::equal(expert_linear_4bit(xe, stack, 1),
                           torch::matmul(xe, stack->dequantize_expert(1, torch::kFloat).t())));
}

config::Config qlora_config(const std::string& quant_type, bool double_quant) {
  nlohmann::json j = {
      {"train_batch_size", 2},
      {"model",
       {{"vocab_size", 40},
        {"seq_len", 10},
        {"hidden_size", 64},
        {"num_layers", 3},
        {"num_heads", 4},
        {"num_key_value_heads", 2},
        {"rope_theta", 10000.0},
        {"tie_embeddings", false},
        {"dense_hidden_size", 32}}},
      {"moe",
       {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 24}, {"mlp_only_layers", {1}}}},
      {"lora", {{"r", 4}, {"target_modules", {"q_proj", "v_proj", "gate_proj", "up_proj"}}}},
      {"quantization",
       {{"load_in_4bit", true},
        {"bnb_4bit_quant_type", quant_type},
        {"bnb_4bit_use_double_quant", double_quant}}},
      {"data", {{"train_path", "unused.h5"}}}};
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

// A stack larger than quantization.dequant_scratch_mib is dequantized and multiplied a few
// experts at a time: the same values and input gradients as the whole stack's one grouped GEMM
// (each row meets the same matrix either way), experts without rows included.
TEST(Frozen4bit, GroupedGemmInExpertSlicesEqualsTheWholeStack) {
  torch::manual_seed(3);
  const int64_t E = 6, in = 64, out = 32;
  const auto w = torch::randn({E, in, out});
  // Rows per expert, one with none; group ends as the experts compute them (int32).
  const auto counts = torch::tensor({3, 0, 5, 2, 4, 1}, torch::kLong);
  const auto offs = counts.cumsum(0).to(torch::kInt);
  auto mxfp4 = nf4_dq();
  mxfp4.mxfp4 = true;
  for (const auto& whole_opt : {nf4_dq(), mxfp4}) {
    auto sliced_opt = whole_opt;
    // One expert's bf16 matrix is 4 KiB: 2 experts per slice, 3 slices.
    sliced_opt.dequant_scratch_bytes = 2 * in * out * 2 + 100;
    const auto whole = QuantizedWeight::experts(w, whole_opt);
    const auto sliced = QuantizedWeight::experts(w, sliced_opt);
    auto x1 = torch::randn({15, in}).to(torch::kBFloat16).requires_grad_();
    auto x2 = x1.detach().clone().requires_grad_();
    const auto y1 = grouped_linear_4bit(x1, whole, offs);
    const auto y2 = grouped_linear_4bit(x2, sliced, offs);
    ASSERT_EQ(y2.sizes(), y1.sizes());
    EXPECT_TRUE(torch::equal(y1, y2));
    const auto g = torch::randn_like(y1);
    y1.backward(g);
    y2.backward(g);
    EXPECT_TRUE(torch::equal(x1.grad(), x2.grad()));
  }
  // A slice budget smaller than one expert still runs one expert at a time.
  auto tiny_opt = nf4_dq();
  tiny_opt.dequant_scratch_bytes = 1;
  const auto x = torch::randn({15, in}).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(grouped_linear_4bit(x, QuantizedWeight::experts(w, tiny_opt), offs),
                           grouped_linear_4bit(x, QuantizedWeight::experts(w, nf4_dq()), offs)));
}

TEST(Frozen4bit, ModelHoldsEveryFrozenMatrixIn4Bits) {
  torch::manual_seed(6);
  const auto cfg = qlora_config("nf4", true);
  TransformerLM m(cfg);
  // Per layer qkv and out; experts' gate, up, down (layers 0, 2) or the dense MLP's (layer 1).
  EXPECT_EQ(m->quantized_weights().size(), 3u * 5u);
  int64_t bytes = 0;
  for (const auto& [name, q] : m->quantized_weights()) {
    bytes += q->bytes();
    const auto p = m->named_parameters()[name];
    EXPECT_EQ(p.numel(), 0) << name << ": emptied";
    EXPECT_FALSE(p.requires_grad()) << name;
  }
  EXPECT_EQ(m->quantized_bytes(), bytes);
  EXPECT_FALSE(m->quantized_weights().count("embed.weight"));
  EXPECT_FALSE(m->quantized_weights().count("lm_head.weight"));
  // The adapters train through the dequantized GEMMs.
  const auto tokens = torch::randint(0, 40, {2, 10});
  m->train();
  m->forward(tokens).logits.square().mean().backward();
  int64_t with_grad = 0;
  for (const auto& p : trainable_parameters(*m)) with_grad += p.second.grad().defined();
  EXPECT_EQ(with_grad, static_cast<int64_t>(trainable_parameters(*m).size()));
}

TEST(Frozen4bit, FingerprintCoversTheCodes) {
  torch::manual_seed(7);
  const auto cfg = qlora_config("fp4", false);
  TransformerLM m(cfg);
  const auto before = base_fingerprint(*m, torch::kFloat, m->quantized_weights());
  EXPECT_EQ(before, base_fingerprint(*m, torch::kFloat, m->quantized_weights()));
  auto& q = m->quantized_weights().at("blocks.2.moe.experts.w_down");
  q->parts()[1].codes[3].bitwise_xor_(1);  // a view into the held codes
  EXPECT_NE(before, base_fingerprint(*m, torch::kFloat, m->quantized_weights()));
}

TEST(Frozen4bit, MergeOverTheDequantizedBaseKeepsTheFunction) {
  torch::manual_seed(8);
  const auto cfg = qlora_config("nf4", false);
  TransformerLM m(cfg);
  {
    torch::NoGradGuard g;
    for (auto& p : trainable_parameters(*m)) p.second.normal_(0, 0.05);  // B != 0
  }
  m->eval();
  const auto tokens = torch::randint(0, 40, {2, 10});
  const auto before = m->forward(tokens).logits;
  m->merge_lora();
  EXPECT_TRUE(m->quantized_weights().empty());
  EXPECT_EQ(m->named_parameters()["blocks.0.attn.qkv.weight"].sizes(),
            (std::vector<int64_t>{(4 + 2 * 2) * 16, 64}));
  const auto after = m->forward(tokens).logits;
  EXPECT_LT((after - before).abs().max().item<double>(), 1e-5);
}

TEST(Frozen4bit, ConfigRefusesA4BitBaseWithoutLora) {
  nlohmann::json j = {{"train_batch_size", 2},
                      {"quantization", {{"load_in_4bit", true}}},
                      {"data", {{"train_path", "unused.h5"}}}};
  auto c = config::from_json(j, "q.json");
  try {
    config::validate(c);
    FAIL() << "a 4-bit base without LoRA was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("q.json: quantization.load_in_4bit = true"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moe::layers
