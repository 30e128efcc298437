// Supervised fine-tuning data's loss mask in training and evaluation: prompt tokens (marked by
// data::kNotTargetBit from the shards' loss_mask) take no loss, their changes leave gradients
// unchanged where no answer sees them, and evaluation's loss and accuracy count answers only.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/data/token_shard.h"
#include "moe/model/transformer.h"
#include "moe/train/evaluation.h"
#include "moe/train/loss_targets.h"
#include "moe/train/step_runner.h"
#include "moe/util/remove_tree.h"

namespace moe::train {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kVocab = 64, kSeq = 16, kEod = 0;

config::Config tiny_config(const std::string& valid_path = "unused.h5") {
  // No router balancing losses: they see every token by design (their gradients would differ
  // when any token changes); the language-model loss is what the mask governs.
  nlohmann::json j = {{"train_batch_size", 2},
                      {"model",
                       {{"vocab_size", kVocab},
                        {"seq_len", kSeq},
                        {"hidden_size", 16},
                        {"num_layers", 2},
                        {"num_heads", 2}}},
                      {"moe",
                       {{"num_experts", 4},
                        {"top_k", 2},
                        {"expert_hidden_size", 32},
                        {"aux_loss_coeff", 0.0},
                        {"z_loss_coeff", 0.0}}},
                      {"data",
                       {{"train_path", "unused.h5"},
                        {"valid_path", valid_path},
                        {"reset_attention_at_eod", true},
                        {"eod_id", kEod}}},
                      {"training", {{"output_dir", "unused"}, {"eval_iters", 2}}}};
  config::Config cfg = config::from_json(j, "sft.json");
  config::validate(cfg);
  return cfg;
}

// Two windows of kSeq + 1 tokens: [prompt 5, answer 4, EOD, next prompt 7]; `next_prompt` fills
// the second example's prompt, which no answer of the window sees.
torch::Tensor sft_batch(int64_t next_prompt) {
  std::vector<int64_t> v;
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t i = 0; i < 5; ++i)
      v.push_back(((3 + i * 7 + row) % (kVocab - 1) + 1) | data::kNotTargetBit);
    for (int64_t i = 0; i < 4; ++i) v.push_back((11 + i * 5 + row) % (kVocab - 1) + 1);
    v.push_back(kEod | data::kNotTargetBit);
    for (int64_t i = 0; i < kSeq + 1 - 10; ++i) {
      v.push_back(((next_prompt + i * 3 + row) % (kVocab - 1) + 1) | data::kNotTargetBit);
    }
  }
  return torch::tensor(v, torch::kLong).view({2, kSeq + 1});
}

std::vector<torch::Tensor> gradients(model::TransformerLM& m, const torch::Tensor& batch,
                                     const config::Config& cfg, double* loss = nullptr) {
  m->zero_grad();
  MicroLosses l = compute_losses(m, batch, cfg);
  l.total.backward();
  if (loss != nullptr) *loss = l.lm.item<double>();
  std::vector<torch::Tensor> g;
  for (const auto& p : m->parameters()) {
    if (p.grad().defined()) g.push_back(p.grad().clone());
  }
  return g;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST(LossTargets, StripsTheMaskBitAndKeepsAnswersOnly) {
  const config::Config cfg = tiny_config();
  const torch::Tensor batch = sft_batch(30);
  const LossTargets t = loss_targets(batch, cfg);
  EXPECT_EQ(t.inputs.max().item<int64_t>() < kVocab, true);
  // Targets are tokens 1..kSeq of each window: the 4 answer tokens (positions 5..8) are kept; the
  // prompt, the EOD and the next prompt are not.
  const auto keep = t.keep.view({2, kSeq});
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t s = 0; s < kSeq; ++s) {
      EXPECT_EQ(keep[row][s].item<bool>(), s >= 4 && s <= 7) << "row " << row << " target " << s;
    }
  }
  EXPECT_EQ(t.count.item<float>(), 8.0f);
  EXPECT_EQ((t.targets == kIgnoredTarget).sum().item<int64_t>(), 2 * kSeq - 8);
}

TEST(LossTargets, LossIsTheMeanOverAnswerTokens) {
  torch::manual_seed(1);
  const config::Config cfg = tiny_config();
  model::TransformerLM m(cfg);
  const torch::Tensor batch = sft_batch(30);
  double loss = 0;
  gradients(m, batch, cfg, &loss);
  // By hand: per-token cross entropy of the model's logits, averaged over the kept targets.
  const LossTargets t = loss_targets(batch, cfg);
  torch::NoGradGuard no_grad;
  const auto logits = m->forward(t.inputs).logits.reshape({-1, kVocab}).to(torch::kFloat);
  const auto ids = batch.bitwise_and(data::kTokenIdBits).narrow(1, 1, kSeq).reshape({-1});
  const auto per_token = torch::nn::functional::cross_entropy(
      logits, ids, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const double want = per_token.index({t.keep}).mean().item<double>();
  EXPECT_NEAR(loss, want, 1e-6);
  EXPECT_GT(std::abs(loss - per_token.mean().item<double>()), 1e-4);  // the mask matters
}

TEST(LossTargets, PromptTokensNoAnswerSeesLeaveGradientsUnchanged) {
  torch::manual_seed(2);
  const config::Config cfg = tiny_config();
  model::TransformerLM m(cfg);
  const auto base = gradients(m, sft_batch(30), cfg);
  // Another prompt for the second example (after the EOD, with no answer in the window):
  // bitwise the same gradients.
  EXPECT_TRUE(same(base, gradients(m, sft_batch(41), cfg)));
  // Controls: the same change without the mask (every token a target) changes them, and so does
  // a change to the first example's prompt, which its answer attends to.
  auto unmasked = [](torch::Tensor b) { return b.bitwise_and(data::kTokenIdBits); };
  EXPECT_FALSE(
      same(gradients(m, unmasked(sft_batch(30)), cfg), gradients(m, unmasked(sft_batch(41)), cfg)));
  torch::Tensor changed = sft_batch(30);
  changed[0][1] = ((changed[0][1].item<int64_t>() & data::kTokenIdBits) % (kVocab - 2) + 1) |
                  data::kNotTargetBit;
  EXPECT_FALSE(same(base, gradients(m, changed, cfg)));
}

TEST(LossTargets, EvaluationCountsAnswersOnly) {
  const fs::path dir = fs::temp_directory_path() / ("moe_sft_eval_" + std::to_string(::getpid()));
  ::moe::remove_tree(dir);
  fs::create_directories(dir);
  // Four windows of the batch layout, as a shard with a loss mask.
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
  for (int64_t w = 0; w < 2; ++w) {
    const torch::Tensor b = sft_batch(30 + w);
    for (int64_t i = 0; i < b.numel(); ++i) {
      const int64_t v = b.view({-1})[i].item<int64_t>();
      tokens.push_back(static_cast<uint32_t>(v & data::kTokenIdBits));
      mask.push_back((v & data::kNotTargetBit) ? 0 : 1);
    }
  }
  const std::string shard = (dir / "valid.h5").string();
  data::write_shard(shard, tokens, kVocab, "test", {}, mask);
  const data::ShardInfo info = data::inspect_shard(shard);
  ASSERT_TRUE(info.has_loss_mask);
  torch::manual_seed(3);
  const config::Config cfg = tiny_config(shard);
  model::TransformerLM m(cfg);
  EvalDump dump;
  const EvalResult r = evaluate(m, {info}, cfg, torch::Device(torch::kCPU), &dump);
  EXPECT_EQ(r.tokens, 4 * 4);  // 4 windows, 4 answer tokens each
  // By hand from the dumped windows and logits.
  int64_t correct = 0, count = 0;
  double loss = 0;
  for (size_t i = 0; i < dump.windows.size(); ++i) {
    const LossTargets t = loss_targets(dump.windows[i], cfg);
    const auto logits = dump.logits[i].reshape({-1, kVocab}).index({t.keep});
    const auto targets = t.targets.index({t.keep});
    loss += torch::nn::functional::cross_entropy(
                logits, targets,
                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
    correct += logits.argmax(-1).eq(targets).sum().item<int64_t>();
    count += targets.numel();
  }
  EXPECT_EQ(count, r.tokens);
  EXPECT_NEAR(r.loss, loss / static_cast<double>(count), 1e-6);
  EXPECT_DOUBLE_EQ(r.accuracy, static_cast<double>(correct) / static_cast<double>(count));
  // training.head_chunk_tokens: the head over the answers a chunk at a time (3 of the 16 answer
  // rows, so chunks end mid-window): the same figures (no dump: a dump keeps whole logits).
  config::Config chunked = cfg;
  chunked.training.head_chunk_tokens = 3;
  const EvalResult rc = evaluate(m, {info}, chunked, torch::Device(torch::kCPU));
  EXPECT_EQ(rc.tokens, r.tokens);
  EXPECT_NEAR(rc.loss, r.loss, 1e-6 * r.loss);
  EXPECT_DOUBLE_EQ(rc.accuracy, r.accuracy);
  ::moe::remove_tree(dir);
}

}  // namespace
}  // namespace moe::train
