// data.reset_attention_at_eod: attention does not cross an end-of-document token inside a
// window, positions restart, and a window holding two documents gives each document the
// per-token results it gets alone.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

constexpr int kEod = 49;  // int like the literals around it in torch::tensor lists

config::Config doc_config(bool rope) {
  nlohmann::json j = {
      {"train_batch_size", 1},
      {"model",
       {{"vocab_size", 50},
        {"seq_len", 16},
        {"hidden_size", 32},
        {"num_layers", 2},
        {"num_heads", 4},
        {"num_key_value_heads", 2},
        {"rope_theta", rope ? 10000.0 : 0.0},
        {"tie_embeddings", false}}},  // a tied head would send gradients to every row
      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 48}}},
      {"data", {{"train_path", "unused.h5"}, {"reset_attention_at_eod", true}, {"eod_id", kEod}}}};
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

torch::Tensor per_token_loss(TransformerLM& m, const torch::Tensor& window) {
  const int64_t S = window.size(1) - 1;
  auto logits = m->forward(window.narrow(1, 0, S)).logits[0];
  return torch::nn::functional::cross_entropy(
      logits, window[0].narrow(0, 1, S),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
}

TEST(DocumentMask, LayoutRestartsPositionsAndBlocksAttention) {
  auto tokens = torch::tensor({{5, 6, kEod, 7, 8, 9, kEod, 3}}, torch::kLong);
  DocumentLayout l = document_layout(tokens, kEod);
  EXPECT_TRUE(torch::equal(l.positions, torch::tensor({{0, 1, 2, 0, 1, 2, 3, 0}}, torch::kLong)));
  auto m = l.mask[0][0];
  EXPECT_TRUE(m[2][0].item<bool>());   // the EOD sees its own document
  EXPECT_FALSE(m[3][2].item<bool>());  // the next document does not see it
  EXPECT_FALSE(m[5][1].item<bool>());
  EXPECT_TRUE(m[5][3].item<bool>());
  EXPECT_FALSE(m[7][6].item<bool>());
  EXPECT_FALSE(m[1][2].item<bool>());  // causal
}

// Attention weights across the boundary are zero: the second document's outputs do not depend
// on anything in the first (gradient exactly zero, outputs unchanged when it changes).
TEST(DocumentMask, NothingCrossesTheBoundary) {
  for (bool rope : {true, false}) {
    torch::manual_seed(1);
    TransformerLM m(doc_config(rope));
    m->eval();
    auto a = torch::tensor({{1, 2, 3, 4, kEod, 10, 11, 12, 13, 14}}, torch::kLong);
    auto b = a.clone();
    b[0][1] = 40, b[0][3] = 41;  // the first document changes
    auto la = m->forward(a).logits, lb = m->forward(b).logits;
    // (Not bitwise: the experts' GEMMs see segments of other sizes when the first document
    // routes differently.)
    EXPECT_TRUE(torch::allclose(la.narrow(1, 5, 5), lb.narrow(1, 5, 5), 0, 1e-6))
        << "rope " << rope;
    EXPECT_FALSE(torch::equal(la.narrow(1, 0, 5), lb.narrow(1, 0, 5)));
    // The same through autograd: d(second document's outputs)/d(first document's embeddings).
    auto emb = m->embed->weight;
    emb.mutable_grad() = torch::Tensor();
    m->forward(a).logits.narrow(1, 5, 5).sum().backward();
    auto g = emb.grad();
    for (int64_t t : {1, 2, 3, 4}) {
      EXPECT_EQ(g[t].abs().max().item<float>(), 0.0f) << "token " << t << " rope " << rope;
    }
    EXPECT_GT(g[10].abs().max().item<float>(), 0.0f);
  }
}

// A window with two documents gives the per-token losses of the two documents run separately.
TEST(DocumentMask, TwoDocumentsInOneWindowMatchTheDocumentsAlone) {
  for (bool rope : {true, false}) {
    torch::manual_seed(2);
    TransformerLM m(doc_config(rope));
    m->eval();
    torch::NoGradGuard g;
    auto doc1 = torch::tensor({{3, 8, 1, 22, 7, kEod}}, torch::kLong);
    auto doc2 = torch::tensor({{17, 4, 4, 30, 2, 9, 11}}, torch::kLong);
    auto window = torch::cat({doc1, doc2}, 1);  // 13 tokens: 12 predictions
    auto both = per_token_loss(m, window);
    auto first = per_token_loss(m, doc1);   // predictions 0..4 (the last predicts the EOD)
    auto second = per_token_loss(m, doc2);  // predictions 0..5
    EXPECT_TRUE(torch::allclose(both.narrow(0, 0, 5), first, 0, 1e-6)) << "rope " << rope;
    // Prediction 5 (input EOD -> next document's first token) is the masked one.
    EXPECT_TRUE(torch::allclose(both.narrow(0, 6, 6), second, 0, 1e-6)) << "rope " << rope;
  }
}

// The layers of one forward share their rotary tables (RotaryTableCache): a forward after
// another with other documents, another length or another grad/inference mode gives what a
// model that never ran gives, so no table outlives the forward it belongs to.
TEST(DocumentMask, SharedRotaryTablesFollowEachForward) {
  const config::Config c = doc_config(/*rope=*/true);
  torch::manual_seed(11);
  TransformerLM used(c, torch::Device(torch::kCPU));
  torch::manual_seed(11);
  TransformerLM fresh(c, torch::Device(torch::kCPU));
  auto logits = [](TransformerLM& m, const torch::Tensor& t) {
    return m->forward(t).logits.detach();
  };
  const auto a = torch::tensor({{5, 6, kEod, 7, 8, 9, kEod, 3}}, torch::kLong);
  const auto b = torch::tensor({{5, 6, 7, 8, kEod, 9, 3, 2}}, torch::kLong);  // other documents
  const auto shorter = torch::tensor({{4, kEod, 7, 8, 9}}, torch::kLong);
  // One cache for both layers, filled once per forward.
  const RotaryTableCache& cache = used->blocks[0]->attn->rotary_table_cache();
  ASSERT_EQ(&cache, &used->blocks[1]->attn->rotary_table_cache());
  (void)logits(used, a);
  EXPECT_EQ(cache.builds(), 1);
  EXPECT_TRUE(torch::equal(logits(used, b), logits(fresh, b)));
  EXPECT_EQ(cache.builds(), 2);
  EXPECT_TRUE(torch::equal(logits(used, shorter), logits(fresh, shorter)));
  {
    c10::InferenceMode inference;
    (void)logits(used, a);
  }
  // A training forward after an inference one: tables usable by autograd, gradients equal.
  auto loss = [](TransformerLM& m, const torch::Tensor& t) {
    auto l = m->forward(t).logits.square().mean();
    l.backward();
    return l.detach();
  };
  EXPECT_TRUE(torch::equal(loss(used, a), loss(fresh, a)));
  const auto &pu = used->blocks[0]->attn->qkv->weight, &pf = fresh->blocks[0]->attn->qkv->weight;
  EXPECT_TRUE(torch::equal(pu.grad(), pf.grad()));

  // Under activation checkpointing the recomputation in the backward reuses the forward's
  // tables (no new build), and the gradients are those of the plain model.
  used->zero_grad();
  fresh->zero_grad();
  used->set_checkpoint_blocks(2);
  const int64_t before = cache.builds();
  EXPECT_TRUE(torch::equal(loss(used, b), loss(fresh, b)));
  EXPECT_EQ(cache.builds(), before + 1);
  EXPECT_TRUE(torch::equal(pu.grad(), pf.grad()));
}

}  // namespace
}  // namespace moe::model

namespace moe::model {
namespace {

// Qwen3-Next / Qwen3.5's hybrid (Gated DeltaNet, gated attention, zero-centred norms, a gated
// shared expert): a window of three packed documents (one crossing the delta rule's 64-token
// chunk) gives the per-token losses and the parameter gradients of the three documents run
// alone.
TEST(DocumentMask, HybridPackedDocumentsMatchTheDocumentsAlone) {
  nlohmann::json j = {
      {"train_batch_size", 1},
      {"model",
       {{"vocab_size", 50},
        {"seq_len", 160},
        {"hidden_size", 32},
        {"num_layers", 3},
        {"num_heads", 4},
        {"num_key_value_heads", 2},
        {"head_dim", 16},
        {"rope_theta", 10000.0},
        {"partial_rotary_factor", 0.25},
        {"qk_norm", true},
        {"attention_output_gate", true},
        {"zero_centered_norm", true},
        {"layer_types", {"linear_attention", "linear_attention", "full_attention"}},
        {"linear_num_key_heads", 2},
        {"linear_num_value_heads", 4},
        {"linear_key_head_dim", 8},
        {"linear_value_head_dim", 8},
        {"tie_embeddings", false}}},
      {"moe",
       {{"num_experts", 4},
        {"top_k", 2},
        {"expert_hidden_size", 24},
        {"shared_expert_hidden_size", 16},
        {"shared_expert_gate", true}}},
      {"data", {{"train_path", "unused.h5"}, {"reset_attention_at_eod", true}, {"eod_id", kEod}}}};
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  torch::manual_seed(4);
  TransformerLM m(c);
  m->eval();
  std::vector<torch::Tensor> docs;
  for (int64_t n : {20, 70, 41}) {  // each ends with its EOD
    auto d = torch::randint(0, kEod, {1, n}, torch::kLong);
    d[0][n - 1] = kEod;
    docs.push_back(d);
  }
  const auto window = torch::cat(docs, 1);  // 131 tokens, 130 predictions
  auto grads = [&](const torch::Tensor& loss) {
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
    loss.backward();
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters())
      g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return g;
  };
  const auto packed = per_token_loss(m, window);
  const auto packed_losses = packed.detach();
  // The predictions across a boundary (input EOD -> the next document's first token, 19 and 89)
  // are no document's: left out.
  const auto packed_grads = grads(packed.narrow(0, 0, 19).sum() + packed.narrow(0, 20, 69).sum() +
                                  packed.narrow(0, 90, 40).sum());
  int64_t at = 0;
  torch::Tensor alone_total;
  for (const auto& d : docs) {
    const int64_t n = d.size(1);
    const auto losses = per_token_loss(m, d);
    EXPECT_TRUE(torch::allclose(packed_losses.narrow(0, at, n - 1), losses.detach(), 0, 1e-5))
        << "document at " << at;
    alone_total = alone_total.defined() ? alone_total + losses.sum() : losses.sum();
    at += n;
  }
  const auto summed = grads(alone_total);
  const auto names = m->named_parameters();
  for (size_t i = 0; i < summed.size(); ++i) {
    EXPECT_TRUE(torch::allclose(packed_grads[i], summed[i], 1e-4, 1e-5)) << names[i].key();
  }
}

}  // namespace
}  // namespace moe::model
