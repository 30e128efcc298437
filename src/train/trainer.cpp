#include "moe/train/trainer.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include <ATen/autocast_mode.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/data/dataset.h"
#include "moe/data/streaming_loader.h"
#include "moe/model/transformer.h"
#include "moe/train/lr_schedule.h"
#include "moe/train/metrics_log.h"
#include "moe/util/errors.h"

namespace moe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

torch::Device pick_device(const config::Config& cfg) {
  const bool have_cuda = torch::cuda::is_available();
  if (cfg.training.device == "cuda") {
    if (!have_cuda) {
      throw UserError("config: " + cfg.source_file +
                      ": training.device = \"cuda\": no CUDA device is visible");
    }
    return torch::kCUDA;
  }
  if (cfg.training.device == "cpu" || !have_cuda) return torch::kCPU;
  return torch::kCUDA;
}

// Checks (without writing) that the output directory can take a new run.
void check_output_dir(const config::Config& cfg) {
  const std::string& dir = cfg.training.output_dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw UserError("config: " + cfg.source_file + ": training.output_dir = " + dir +
                    ": exists and is not a directory");
  }
}

// The files a run writes; an earlier run's copies are kept (renamed) unless --overwrite.
constexpr const char* kRunFiles[] = {"metrics.jsonl", "config.json"};

// Called only after every input check passed. Without checkpoints there is nothing to resume,
// so a new run starts; the earlier run's files are renamed to NAME.prev-YYYYmmdd-HHMMSS.
void set_aside_previous_run(const std::string& dir, bool overwrite, spdlog::logger& log) {
  std::error_code ec;
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  for (const char* name : kRunFiles) {
    fs::path p = fs::path(dir) / name;
    if (!fs::exists(p, ec)) continue;
    if (overwrite) {
      fs::remove(p, ec);
      continue;
    }
    fs::path kept = p;
    kept += std::string(".prev-") + stamp;
    fs::rename(p, kept, ec);
    if (ec)
      throw UserError("cannot keep " + p.string() + " as " + kept.string() + ": " + ec.message());
    log.warn("{} held an earlier run; kept its {} as {}", dir, name, kept.filename().string());
  }
}

// Names the config key when a data path does not exist (the loader names only the file).
void require_path(const config::Config& cfg, const char* key, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw UserError("config: " + cfg.source_file + ": " + key + " = " + path +
                    ": no such file or directory");
  }
}

// Batches live in torch tensors from the start: pinned host memory when training on CUDA, so
// the copy to the device can be non-blocking.
data::BufferFactory tensor_buffers(const torch::Device& device) {
  const bool pin = device.is_cuda();
  return [pin](int64_t n) {
    auto t = std::make_shared<torch::Tensor>(
        torch::empty({n}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(pin)));
    return data::BatchBuffer{t->data_ptr<int64_t>(), t};
  };
}

torch::Tensor to_device(const data::Batch& b, const torch::Device& device) {
  const auto& t = *static_cast<torch::Tensor*>(b.buffer.owner.get());
  return t.view({b.rows, b.cols}).to(device, /*non_blocking=*/true);
}

struct StepLosses {
  torch::Tensor total, lm, aux, z;
  std::vector<torch::Tensor> tokens_per_expert;  // per MoE layer
  int64_t dropped = 0;
};

// Per-layer expert loads as nested JSON arrays (for the metrics file).
json expert_loads(const std::vector<torch::Tensor>& per_layer) {
  json layers = json::array();
  for (const auto& t : per_layer) {
    auto c = t.to(torch::kCPU);
    layers.push_back(
        std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()));
  }
  return layers;
}

StepLosses compute_losses(model::TransformerLM& model, const torch::Tensor& batch,
                          const config::Config& cfg) {
  const int64_t S = batch.size(1) - 1;
  auto inputs = batch.narrow(1, 0, S);
  auto targets = batch.narrow(1, 1, S);
  model::LmOutput out = model->forward(inputs);
  StepLosses l;
  l.lm = torch::nn::functional::cross_entropy(
      out.logits.reshape({-1, out.logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
  l.aux = out.aux_loss;
  l.z = out.z_loss;
  l.total = l.lm + cfg.moe.aux_loss_coeff * l.aux + cfg.moe.z_loss_coeff * l.z;
  l.tokens_per_expert = std::move(out.tokens_per_expert);
  l.dropped = out.dropped;
  return l;
}

EvalResult evaluate(model::TransformerLM& model, const std::vector<data::ShardInfo>& shards,
                    const config::Config& cfg, const torch::Device& device) {
  torch::NoGradGuard no_grad;
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
  for (int64_t done = 0; done < windows; done += B) {
    auto batch = to_device(loader.next(), device).narrow(0, 0, std::min(B, windows - done));
    const int64_t S = batch.size(1) - 1;
    auto targets = batch.narrow(1, 1, S).reshape({-1});
    auto logits = model->forward(batch.narrow(1, 0, S)).logits;
    logits = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, targets,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(-1).eq(targets).sum().item<int64_t>();
    count += targets.numel();
  }
  model->train();
  EvalResult r;
  r.tokens = count;
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, count));
  r.accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, count));
  r.perplexity = std::exp(std::min(r.loss, 700.0));
  return r;
}

json eval_record(int64_t step, const EvalResult& r) {
  return {{"type", "eval"},    {"step", step},           {"split", "valid"},
          {"loss", r.loss},    {"accuracy", r.accuracy}, {"perplexity", r.perplexity},
          {"tokens", r.tokens}};
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

}  // namespace

TrainSummary run_training(const config::Config& cfg, const TrainOptions& opt) {
  auto log = spdlog::get("moe-train") ? spdlog::get("moe-train") : spdlog::default_logger();
  for (const auto& w : cfg.warnings) log->warn("{}", w);

  // ---- everything that can reject the user's input, before any file is written ----
  const torch::Device device = pick_device(cfg);
  if (device.is_cpu() && (cfg.fp16.enabled || cfg.bf16.enabled)) {
    log->warn("{} is enabled but training runs on the CPU: computing in fp32",
              cfg.fp16.enabled ? "fp16" : "bf16");
  }
  if (device.is_cuda() && cfg.fp16.enabled) {
    throw UserError("config: " + cfg.source_file +
                    ": fp16.enabled = true: the fp16 loss scaler is not implemented yet; use "
                    "bf16.enabled = true on this GPU");
  }
  if (!cfg.data.path.empty()) require_path(cfg, "data.path", cfg.data.path);
  if (!cfg.data.train_path.empty()) require_path(cfg, "data.train_path", cfg.data.train_path);
  if (!cfg.data.valid_path.empty()) require_path(cfg, "data.valid_path", cfg.data.valid_path);
  if (cfg.data.verify_checksums) log->info("data: verifying shard checksums");
  const data::DatasetShards shards =
      data::open_dataset({cfg.data.path, cfg.data.train_path, cfg.data.valid_path},
                         cfg.model.vocab_size, cfg.model.seq_len, cfg.data.verify_checksums);
  const bool has_valid = !shards.valid.empty();
  int64_t train_windows = 0;
  for (const auto& s : shards.train) train_windows += s.num_tokens / (cfg.model.seq_len + 1);
  check_output_dir(cfg);

  const int64_t gbs = cfg.train_batch_size, mbs = cfg.train_micro_batch_size_per_gpu;
  const int64_t gas = cfg.gradient_accumulation_steps;
  const int64_t steps_per_epoch = (train_windows + gbs - 1) / gbs;
  const int64_t total_steps = cfg.training.train_iters > 0 ? cfg.training.train_iters
                                                           : cfg.training.epochs * steps_per_epoch;

  torch::manual_seed(cfg.training.seed);
  model::TransformerLM model(cfg);
  model->to(device);
  model->train();
  const bool bf16 = device.is_cuda() && cfg.bf16.enabled;

  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) {
    (p.dim() >= 2 || cfg.optimizer.decay_norms_and_biases ? decay : no_decay).push_back(p);
  }
  const double wd = cfg.optimizer.type == "Adam" ? 0.0 : cfg.optimizer.weight_decay;
  auto adam_opts = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(cfg.optimizer.lr)
            .betas({cfg.optimizer.betas[0], cfg.optimizer.betas[1]})
            .eps(cfg.optimizer.eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adam_opts(wd));
  if (!no_decay.empty()) groups.emplace_back(no_decay, adam_opts(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(cfg.optimizer.lr));
  LrSchedule schedule(cfg.scheduler, cfg.optimizer.lr, total_steps);

  // ---- from here on we write into the output directory ----
  fs::create_directories(cfg.training.output_dir);
  set_aside_previous_run(cfg.training.output_dir, opt.overwrite, *log);
  {
    std::ofstream resolved(fs::path(cfg.training.output_dir) / "config.json");
    resolved << config::to_json(cfg).dump(2) << "\n";
  }
  MetricsLog metrics((fs::path(cfg.training.output_dir) / "metrics.jsonl").string());

  log->info("model: {} parameters ({} active per token), {} layers, {} experts top-{}; device {}",
            model->parameters().empty() ? 0 : config::count_parameters(cfg),
            config::active_parameters_per_token(cfg), cfg.model.num_layers, cfg.moe.num_experts,
            cfg.moe.top_k, device.str());
  log->info(
      "data: {} training windows of {} tokens in {} shards; {} steps of {} sequences ({} x "
      "{} micro)",
      train_windows, cfg.model.seq_len, shards.train.size(), total_steps, gbs, mbs, gas);

  TrainSummary summary;
  summary.output_dir = cfg.training.output_dir;
  summary.steps = total_steps;
  if (has_valid) {
    summary.has_validation = true;
    summary.majority_baseline = data::majority_baseline(shards.valid, cfg.model.seq_len);
    summary.initial_eval = evaluate(model, shards.valid, cfg, device);
    metrics.write(eval_record(0, summary.initial_eval));
    log->info("step 0: validation loss {:.4f}, accuracy {:.4f}", summary.initial_eval.loss,
              summary.initial_eval.accuracy);
  }

  data::LoaderOptions lo;
  lo.seq_len = cfg.model.seq_len;
  lo.batch_size = mbs;
  lo.seed = cfg.training.seed;
  lo.shuffle = cfg.data.shuffle;
  lo.prefetch = cfg.data.prefetch;
  lo.reader_threads = static_cast<int>(cfg.data.reader_threads);
  lo.block_windows = cfg.data.block_windows;
  data::StreamingLoader loader(shards.train, lo, {}, tensor_buffers(device));
  data::LoaderState loader_state;
  const int64_t tokens_per_step = gbs * cfg.model.seq_len;
  auto run_start = Clock::now();
  for (int64_t step = 0; step < total_steps; ++step) {
    auto t0 = Clock::now();
    const double lr = schedule.lr_at(step);
    set_lr(optimizer, lr);
    optimizer.zero_grad(/*set_to_none=*/true);
    double lm_sum = 0.0, aux_sum = 0.0, z_sum = 0.0;
    int64_t dropped = 0;
    const double wait_before = loader.wait_seconds();
    std::vector<torch::Tensor> load;  // tokens per expert, summed over micro-batches
    for (int64_t micro = 0; micro < gas; ++micro) {
      data::Batch host = loader.next();
      loader_state = host.state_after;
      auto batch = to_device(host, device);
      if (bf16) {
        at::autocast::set_autocast_enabled(at::kCUDA, true);
        at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      }
      StepLosses l = compute_losses(model, batch, cfg);
      if (bf16) at::autocast::set_autocast_enabled(at::kCUDA, false);
      (l.total / static_cast<double>(gas)).backward();
      lm_sum += l.lm.item<double>();
      aux_sum += l.aux.item<double>();
      z_sum += l.z.item<double>();
      dropped += l.dropped;
      if (load.empty()) {
        load = l.tokens_per_expert;
      } else {
        for (size_t i = 0; i < load.size(); ++i) load[i] = load[i] + l.tokens_per_expert[i];
      }
    }
    if (bf16) at::autocast::clear_cache();
    const double max_norm =
        cfg.gradient_clipping > 0 ? cfg.gradient_clipping : std::numeric_limits<double>::infinity();
    const double grad_norm = torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
    if (!std::isfinite(grad_norm) || !std::isfinite(lm_sum)) {
      throw TrainingError("training diverged at step " + std::to_string(step + 1) + ": loss " +
                          std::to_string(lm_sum / gas) + ", grad norm " +
                          std::to_string(grad_norm));
    }
    optimizer.step();
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double loss = lm_sum / static_cast<double>(gas);
    if (step == 0) summary.first_train_loss = loss;
    summary.last_train_loss = loss;
    metrics.write({{"type", "train"},
                   {"step", step + 1},
                   {"loss", loss},
                   {"aux_loss", aux_sum / static_cast<double>(gas)},
                   {"z_loss", z_sum / static_cast<double>(gas)},
                   {"lr", lr},
                   {"grad_norm", grad_norm},
                   {"tokens", (step + 1) * tokens_per_step},
                   {"dropped_tokens", dropped},
                   {"expert_tokens", expert_loads(load)},
                   {"epoch", loader_state.epoch},
                   {"data_wait_s", loader.wait_seconds() - wait_before},
                   {"step_time_s", step_s},
                   {"tokens_per_s", static_cast<double>(tokens_per_step) / step_s}});
    if ((step + 1) % cfg.steps_per_print == 0 || step + 1 == total_steps) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      log->info("step {}/{}: loss {:.4f} aux {:.4f} lr {:.3e} grad_norm {:.3f} {:.0f} tok/s",
                step + 1, total_steps, loss, aux_sum / static_cast<double>(gas), lr, grad_norm,
                static_cast<double>((step + 1) * tokens_per_step) / elapsed);
    }
    const bool last = step + 1 == total_steps;
    if (has_valid && (last || (cfg.training.eval_interval > 0 &&
                               (step + 1) % cfg.training.eval_interval == 0))) {
      EvalResult r = evaluate(model, shards.valid, cfg, device);
      metrics.write(eval_record(step + 1, r));
      log->info("step {}: validation loss {:.4f}, accuracy {:.4f}, perplexity {:.2f}", step + 1,
                r.loss, r.accuracy, r.perplexity);
      if (last) summary.final_eval = r;
    }
  }
  return summary;
}

}  // namespace moe::train
