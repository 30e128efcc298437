#include "moe/train/evaluation.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "moe/train/loss_targets.h"
#include "moe/util/errors.h"

namespace moe::train {

EvalResult evaluate(model::TransformerLM& model, const std::vector<data::ShardInfo>& shards,
                    const config::Config& cfg, const torch::Device& device, EvalDump* dump) {
  torch::NoGradGuard no_grad;
  model::BaseDtypeAutocast autocast(model);
  const bool was_training = model->is_training();
  model->eval();
  const int64_t B = cfg.train_micro_batch_size_per_gpu;
  data::LoaderOptions lo;
  lo.seq_len = cfg.model.seq_len;
  lo.batch_size = B;
  lo.shuffle = false;  // the same windows at every evaluation
  lo.prefetch = 2;
  lo.block_windows = cfg.data.block_windows;
  data::StreamingLoader loader(shards, lo, {}, tensor_buffers(device));
  const int64_t windows = std::min(loader.windows_per_epoch(), cfg.training.eval_iters * B);
  double loss_sum = 0.0;
  int64_t correct = 0, count = 0;
  std::vector<torch::Tensor> load;
  for (int64_t done = 0; done < windows; done += B) {
    auto batch = to_device(loader.next(), device).narrow(0, 0, std::min(B, windows - done));
    // The positions training takes its loss at: SFT data's answers only, no EOD inputs with
    // reset_attention_at_eod.
    const LossTargets t = loss_targets(batch, cfg);
    // training.head_chunk_tokens: the head over the kept positions a chunk at a time, as in
    // training (no [tokens, vocab] logits); a logits dump needs them whole.
    const int64_t chunk = dump == nullptr ? cfg.training.head_chunk_tokens : 0;
    model::LmOutput out = model->forward(t.inputs, /*logits=*/chunk == 0);
    auto targets = t.targets.index({t.keep});
    if (dump != nullptr) {
      dump->windows.push_back(batch.to(torch::kCPU));
      dump->logits.push_back(out.logits.to(torch::kFloat).to(torch::kCPU));
    }
    const auto rows = chunk == 0 ? out.logits.reshape({-1, out.logits.size(-1)}).index({t.keep})
                                 : out.hidden.reshape({-1, out.hidden.size(-1)}).index({t.keep});
    auto batch_loss = torch::zeros({}, rows.options().dtype(torch::kFloat));
    auto batch_correct = torch::zeros({}, targets.options());
    const int64_t n = rows.size(0), step = chunk == 0 ? std::max<int64_t>(n, 1) : chunk;
    for (int64_t s = 0; s < n; s += step) {
      const int64_t m = std::min(step, n - s);
      const auto part = rows.narrow(0, s, m);
      const auto logits = (chunk == 0 ? part : model->head(part)).to(torch::kFloat);
      const auto tc = targets.narrow(0, s, m);
      batch_loss += torch::nn::functional::cross_entropy(
          logits, tc, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      batch_correct += logits.argmax(-1).eq(tc).sum();
    }
    loss_sum += batch_loss.item<double>();
    correct += batch_correct.item<int64_t>();
    count += targets.numel();
    for (size_t l = 0; l < out.tokens_per_expert.size(); ++l) {
      if (load.size() <= l)
        load.push_back(out.tokens_per_expert[l].to(torch::kDouble));
      else
        load[l] += out.tokens_per_expert[l].to(torch::kDouble);
    }
  }
  if (was_training) model->train();
  EvalResult r;
  r.tokens = count;
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, count));
  r.accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, count));
  r.perplexity = std::exp(std::min(r.loss, 700.0));
  for (const auto& l : load)
    r.expert_imbalance.push_back((l.max() / l.mean().clamp_min(1e-9)).item<double>());
  return r;
}

EvalResult evaluate_dataset(model::TransformerLM& model, const data::DatasetShards& shards,
                            const config::Config& cfg, const torch::Device& device,
                            EvalDump* dump) {
  if (shards.sources.empty()) return evaluate(model, shards.valid, cfg, device, dump);
  EvalResult r;
  double weights = 0;
  for (const auto& s : shards.sources) {
    if (s.valid.empty()) continue;
    const EvalResult one = evaluate(model, s.valid, cfg, device);
    r.sources.push_back({s.name, one.loss, one.accuracy, one.perplexity, one.tokens});
    r.loss += s.weight * one.loss;
    r.accuracy += s.weight * one.accuracy;
    r.tokens += one.tokens;
    r.expert_imbalance.resize(one.expert_imbalance.size(), 0.0);
    for (size_t l = 0; l < one.expert_imbalance.size(); ++l)
      r.expert_imbalance[l] += s.weight * one.expert_imbalance[l];
    weights += s.weight;
  }
  if (weights == 0) return r;
  r.loss /= weights;
  r.accuracy /= weights;
  for (double& x : r.expert_imbalance) x /= weights;
  r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace moe::train
