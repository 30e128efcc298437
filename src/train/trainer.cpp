#include "moe/train/trainer.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "moe/data/dataset.h"
#include "moe/data/streaming_loader.h"
#include "moe/model/transformer.h"
#include "moe/monitor/monitor.h"
#include "moe/train/adamw.h"
#include "moe/train/checkpoint.h"
#include "moe/train/checkpoint_store.h"
#include "moe/train/cuda_graph_step.h"
#include "moe/train/evaluation.h"
#include "moe/train/loss_scaler.h"
#include "moe/train/lr_schedule.h"
#include "moe/train/metrics_log.h"
#include "moe/util/errors.h"

namespace moe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kGraphWarmupSteps = 3;  // eager steps before the CUDA graph is captured

// ---- signals: SIGTERM/SIGINT finish the step, checkpoint, exit 0; a second SIGINT exits at
// once; SIGUSR1 checkpoints and continues. -------------------------------------------------
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_checkpoint_request{false};

extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_stop_signal.load() != 0) _exit(130);
  g_stop_signal.store(sig);
}
extern "C" void on_usr1(int) { g_checkpoint_request.store(true); }

void install_signal_handlers() {
  g_stop_signal.store(0);
  g_checkpoint_request.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, nullptr);
}

void check_output_dir(const config::Config& cfg) {
  const std::string& dir = cfg.training.output_dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw UserError("config: " + cfg.source_file + ": training.output_dir = " + dir +
                    ": exists and is not a directory");
  }
}

// The files a fresh run writes; an earlier run's copies are kept (renamed) unless --overwrite.
constexpr const char* kRunFiles[] = {"metrics.jsonl", "config.json", "checkpoints"};

void set_aside_previous_run(const std::string& dir, bool overwrite, spdlog::logger& log) {
  std::error_code ec;
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  for (const char* name : kRunFiles) {
    fs::path p = fs::path(dir) / name;
    if (!fs::exists(p, ec)) continue;
    if (overwrite) {
      fs::remove_all(p, ec);
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

// The step a checkpoint holds, from its state.json; -1 when unreadable.
int64_t peek_step(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "state.json");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("step") && j["step"].is_number_integer()
             ? j["step"].get<int64_t>()
             : -1;
}

// Keeps the first `lines` lines of a metrics file (those of steps a checkpoint covers).
void truncate_lines(const fs::path& path, int64_t lines) {
  std::ifstream in(path);
  std::string kept, line;
  for (int64_t i = 0; i < lines && std::getline(in, line); ++i) kept += line + "\n";
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
}

void require_path(const config::Config& cfg, const char* key, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw UserError("config: " + cfg.source_file + ": " + key + " = " + path +
                    ": no such file or directory");
  }
}

struct StepLosses {
  torch::Tensor total, lm, aux, z;
  std::vector<torch::Tensor> tokens_per_expert;  // per MoE layer
  int64_t dropped = 0;
};

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
  model::LmOutput out = model->forward(batch.narrow(1, 0, S));
  StepLosses l;
  l.lm = torch::nn::functional::cross_entropy(
      out.logits.reshape({-1, out.logits.size(-1)}).to(torch::kFloat),
      batch.narrow(1, 1, S).reshape({-1}));
  l.aux = out.aux_loss;
  l.z = out.z_loss;
  l.total = l.lm + cfg.moe.aux_loss_coeff * l.aux + cfg.moe.z_loss_coeff * l.z;
  l.tokens_per_expert = std::move(out.tokens_per_expert);
  l.dropped = out.dropped;
  return l;
}

// Dense peak of the device for MFU, in TFLOP/s: the config's value, else a known GPU's bf16/fp16
// tensor-core peak; 0 (no MFU) when unknown, e.g. on a CPU without monitor.peak_tflops.
double peak_tflops(const config::Config& cfg, const torch::Device& device) {
  if (cfg.monitor.peak_tflops > 0) return cfg.monitor.peak_tflops;
  if (!device.is_cuda()) return 0.0;
  const std::string name =
      at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos)
    return 989.4;
  if (name.find("A100") != std::string::npos) return 312.0;
  return 0.0;
}

void add_gpu_stats(json& rec, const torch::Device& device) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  rec["gpu_mem_allocated_bytes"] = stats.allocated_bytes[agg].current;
  rec["gpu_mem_reserved_bytes"] = stats.reserved_bytes[agg].current;
  rec["gpu_mem_peak_bytes"] = stats.allocated_bytes[agg].peak;
}

// Global L2 norm of all gradients (fp32, foreach ops) and, when it is finite, scaling by
// min(1, max_norm / (norm + 1e-6)): torch.nn.utils.clip_grad_norm_'s arithmetic. Non-finite norms
// leave the gradients untouched so the first bad layer can still be found.
double clip_gradients(model::TransformerLM& model, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (auto& p : model->parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  auto norms = at::_foreach_norm(grads, 2);
  auto total = at::linalg_vector_norm(at::stack(norms), 2);
  const double t = total.item<double>();
  if (std::isfinite(t) && std::isfinite(max_norm)) {
    auto coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    at::_foreach_mul_(grads, coef);
  }
  return t;
}

// The first parameter (in module order) whose gradient holds a NaN or Inf.
std::string first_non_finite_gradient(model::TransformerLM& model) {
  for (const auto& item : model->named_parameters()) {
    const auto& g = item.value().grad();
    if (g.defined() && !g.isfinite().all().item<bool>()) return item.key();
  }
  return "(none: the loss itself)";
}

// Test hook (tests/train/faults_test.py): MOE_TEST_INJECT_NAN="grad:PARAM:STEP,STEP..." puts a NaN
// into PARAM's gradient, "loss:STEP,..." makes the step's loss NaN.
void inject_nan_for_tests(model::TransformerLM& model, int64_t step, double& loss_sum) {
  const char* spec = std::getenv("MOE_TEST_INJECT_NAN");
  if (spec == nullptr) return;
  std::string s = spec;
  const auto steps_at = s.rfind(':');
  std::string steps = "," + s.substr(steps_at + 1) + ",";
  if (steps.find("," + std::to_string(step) + ",") == std::string::npos) return;
  if (s.rfind("loss:", 0) == 0) {
    loss_sum = std::nan("");
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad().fill_(std::nan(""));
    }
    return;
  }
  const std::string param = s.substr(5, steps_at - 5);  // after "grad:"
  for (auto& item : model->named_parameters()) {
    if (item.key() == param && item.value().grad().defined()) {
      item.value().mutable_grad().view(-1)[0] = std::nan("");
    }
  }
}

// NVIDIA's management library, loaded at run time if present (no link-time dependency):
// utilisation, power and temperature of the training GPU, sampled every steps_per_print steps.
class Nvml {
 public:
  Nvml() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    init_ = reinterpret_cast<int (*)()>(::dlsym(lib_, "nvmlInit_v2"));
    handle_ =
        reinterpret_cast<int (*)(unsigned, void**)>(::dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
    util_ =
        reinterpret_cast<int (*)(void*, unsigned*)>(::dlsym(lib_, "nvmlDeviceGetUtilizationRates"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(::dlsym(lib_, "nvmlDeviceGetPowerUsage"));
    temp_ =
        reinterpret_cast<int (*)(void*, int, unsigned*)>(::dlsym(lib_, "nvmlDeviceGetTemperature"));
    ok_ = init_ && handle_ && util_ && power_ && temp_ && init_() == 0;
  }
  ~Nvml() {
    if (lib_ != nullptr) ::dlclose(lib_);
  }
  void sample(json& rec, int index) {
    void* dev = nullptr;
    if (!ok_ || handle_(static_cast<unsigned>(std::max(0, index)), &dev) != 0) return;
    unsigned rates[2] = {0, 0}, mw = 0, celsius = 0;  // nvmlUtilization_t {gpu, memory}
    if (util_(dev, rates) == 0) rec["gpu_utilization"] = rates[0] / 100.0;
    if (power_(dev, &mw) == 0) rec["gpu_power_w"] = mw / 1000.0;
    if (temp_(dev, 0, &celsius) == 0) rec["gpu_temperature_c"] = celsius;  // NVML_TEMPERATURE_GPU
  }

 private:
  void* lib_ = nullptr;
  bool ok_ = false;
  int (*init_)() = nullptr;
  int (*handle_)(unsigned, void**) = nullptr;
  int (*util_)(void*, unsigned*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*temp_)(void*, int, unsigned*) = nullptr;
};

int64_t host_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, rss = 0;
  statm >> pages >> rss;
  return rss * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

json eval_record(int64_t step, const EvalResult& r) {
  return {{"type", "eval"},         {"step", step},
          {"split", "valid"},       {"loss", r.loss},
          {"accuracy", r.accuracy}, {"perplexity", r.perplexity},
          {"tokens", r.tokens},     {"expert_imbalance", r.expert_imbalance}};
}

std::vector<AdamWGroup> param_groups(model::TransformerLM& model, const config::Config& cfg) {
  AdamWGroup decay, no_decay;
  decay.weight_decay = cfg.optimizer.type == "Adam" ? 0.0 : cfg.optimizer.weight_decay;
  for (auto& item : model->named_parameters()) {
    // Norm weights and biases (1-D) are not decayed, as in Megatron and DeepSpeed's examples.
    AdamWGroup& g =
        item.value().dim() >= 2 || cfg.optimizer.decay_norms_and_biases ? decay : no_decay;
    g.names.push_back(item.key());
    g.params.push_back(item.value());
  }
  std::vector<AdamWGroup> groups{decay};
  if (!no_decay.params.empty()) groups.push_back(no_decay);
  return groups;
}

// What to tell a user whose step ran out of memory (the seed guide's OOM checklist): where,
// with which batch, the allocator's numbers, and the settings that lower memory. Nothing is
// saved: the last complete checkpoint stays the one to resume from.
std::string oom_report(const config::Config& cfg, const torch::Device& device, int64_t step,
                       const std::string& what) {
  std::ostringstream msg;
  msg << "out of memory at step " << step << " on " << device.str() << " with micro-batch ["
      << cfg.train_micro_batch_size_per_gpu << ", " << cfg.model.seq_len << "] tokens";
  if (device.is_cuda()) {
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    auto gib = [](int64_t b) { return static_cast<double>(b) / (1 << 30); };
    msg << std::fixed << std::setprecision(2) << "; allocator: allocated "
        << gib(stats.allocated_bytes[agg].current) << " GiB (peak "
        << gib(stats.allocated_bytes[agg].peak) << "), reserved "
        << gib(stats.reserved_bytes[agg].current) << " GiB (peak "
        << gib(stats.reserved_bytes[agg].peak) << "), " << stats.num_alloc_retries << " retries, "
        << stats.num_ooms << " OOMs";
  }
  msg << "; to use less memory: lower train_micro_batch_size_per_gpu (now "
      << cfg.train_micro_batch_size_per_gpu << ") and raise gradient_accumulation_steps (now "
      << cfg.gradient_accumulation_steps << ") to keep train_batch_size, set "
      << "activation_checkpointing.number_checkpoints (now "
      << cfg.activation_checkpointing.number_checkpoints << " of " << cfg.model.num_layers
      << " blocks), set zero_optimization.offload_optimizer.device = cpu (now "
      << cfg.zero_optimization.offload_optimizer.device
      << ": moves Adam state and master weights to host memory), or shorten model.seq_len; the "
         "last checkpoint is intact. ("
      << what.substr(0, 200) << ")";
  std::string s = msg.str();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
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
  const bool fp16 = device.is_cuda() && cfg.fp16.enabled;
  const bool bf16 = device.is_cuda() && cfg.bf16.enabled;
  if (!cfg.data.path.empty()) require_path(cfg, "data.path", cfg.data.path);
  if (!cfg.data.train_path.empty()) require_path(cfg, "data.train_path", cfg.data.train_path);
  if (!cfg.data.valid_path.empty()) require_path(cfg, "data.valid_path", cfg.data.valid_path);
  if (!opt.resume_from.empty()) require_path(cfg, "--resume", opt.resume_from);
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
  OffloadOptions offload;
  offload.enabled = cfg.zero_optimization.offload_optimizer.device == "cpu";
  offload.pin_memory = cfg.zero_optimization.offload_optimizer.pin_memory;
  if (offload.enabled && device.is_cpu()) {
    log->info("optimizer offload on a CPU run: the host-side update path runs with host copies");
  }
  FusedAdamW optimizer(param_groups(model, cfg), cfg.optimizer.betas[0], cfg.optimizer.betas[1],
                       cfg.optimizer.eps, offload);
  LrSchedule schedule(cfg.scheduler, cfg.optimizer.lr, total_steps);
  LossScaler scaler(cfg.fp16);

  // ---- resume: an explicit checkpoint, else the newest loadable one in output_dir ----
  const fs::path out_dir = cfg.training.output_dir;
  CheckpointStore store((out_dir / "checkpoints").string());
  TrainingState state;
  TrainSummary summary;
  bool finished_run = false;
  if (!opt.resume_from.empty()) {
    state = load_checkpoint(opt.resume_from, model, &optimizer);
    summary.resumed_from = state.step;
  } else if (opt.resume && !opt.overwrite) {
    for (const auto& dir : store.candidates()) {
      if (peek_step(dir) >= total_steps) {
        // A finished run is not continued: a new one starts and the old one is kept aside.
        log->warn("{} holds a finished run (step {} of {}); starting a new run", dir,
                  peek_step(dir), total_steps);
        finished_run = true;
        break;
      }
      try {
        state = load_checkpoint(dir, model, &optimizer);
        summary.resumed_from = state.step;
        break;
      } catch (const UserError& e) {
        log->error("checkpoint {} is unusable ({}); trying the one before", dir, e.what());
      }
    }
    if (summary.resumed_from < 0 && !finished_run && !store.candidates().empty()) {
      throw UserError("checkpoint: no loadable checkpoint in " + store.root() +
                      " (see the errors above); use --no-resume to start over");
    }
  }
  scaler.restore(summary.resumed_from >= 0 ? state.scaler : scaler.state());

  // Sinks next: a Prometheus port that cannot be bound is still a user error, before any write.
  monitor::MonitorOptions mo;
  auto sink_dir = [&](const config::MonitorSinkConfig& s, const char* fallback) {
    if (!s.enabled) return std::string();
    const fs::path base = s.output_path.empty() ? out_dir / fallback : fs::path(s.output_path);
    return (base / s.job_name).string();
  };
  mo.tensorboard_dir = sink_dir(cfg.tensorboard, "tensorboard");
  mo.csv_dir = sink_dir(cfg.csv_monitor, "csv");
  mo.prometheus_port = static_cast<int>(cfg.monitor.prometheus_port);
  mo.prometheus_host = cfg.monitor.prometheus_host;
  monitor::Monitor sinks(mo);
  if (mo.prometheus_port > 0) {
    log->info("prometheus: serving http://{}:{}/metrics", mo.prometheus_host, mo.prometheus_port);
  }

  // ---- from here on we write into the output directory ----
  fs::create_directories(out_dir);
  const fs::path metrics_path = out_dir / "metrics.jsonl";
  if (summary.resumed_from >= 0) {
    truncate_lines(metrics_path, state.metrics_lines);
    log->info("resuming from step {} (tokens {}, epoch {}, window {})", state.step, state.tokens,
              state.loader.epoch, state.loader.position);
  } else {
    set_aside_previous_run(out_dir.string(), opt.overwrite, *log);
  }
  store.clean_partial();
  {
    std::ofstream resolved(out_dir / "config.json");
    resolved << config::to_json(cfg).dump(2) << "\n";
  }
  MetricsLog metrics(metrics_path.string(), /*append=*/summary.resumed_from >= 0);

  log->info("model: {} parameters ({} active per token), {} layers, {} experts top-{}; device {}",
            config::count_parameters(cfg), config::active_parameters_per_token(cfg),
            cfg.model.num_layers, cfg.moe.num_experts, cfg.moe.top_k, device.str());
  log->info(
      "data: {} training windows of {} tokens in {} shards; {} steps of {} sequences ({} x "
      "{} micro)",
      train_windows, cfg.model.seq_len, shards.train.size(), total_steps, gbs, mbs, gas);

  const int64_t tokens_per_step = gbs * cfg.model.seq_len;
  auto write_record = [&](const json& rec) {
    metrics.write(rec);
    sinks.record(rec);
  };
  auto last_save = Clock::now();
  auto save = [&](const char* why) {
    state.metrics_lines = metrics.lines();
    state.config = config::to_json(cfg);
    state.scaler = scaler.state();
    const std::string tmp = store.begin(state.step);
    try {
      save_checkpoint(tmp, model, optimizer, state);
      const std::string dir =
          store.commit(tmp, state.step, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every);
      log->info("checkpoint ({}): {}", why, dir);
    } catch (const TrainingError& e) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // the previous checkpoint and `latest` are untouched
      if (cfg.checkpoint.on_failure != "continue") throw;
      log->error("{}; training continues (checkpoint.on_failure = continue)", e.what());
      return;
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
    last_save = Clock::now();
  };

  summary.output_dir = cfg.training.output_dir;
  summary.steps = total_steps;
  summary.has_validation = has_valid;
  if (has_valid)
    summary.majority_baseline = data::majority_baseline(shards.valid, cfg.model.seq_len);
  if (summary.resumed_from < 0) {
    if (has_valid) {
      summary.initial_eval = evaluate(model, shards.valid, cfg, device);
      write_record(eval_record(0, summary.initial_eval));
      log->info("step 0: validation loss {:.4f}, accuracy {:.4f}", summary.initial_eval.loss,
                summary.initial_eval.accuracy);
    }
    if (cfg.checkpoint.save_initial) save("initial");
  }

  data::LoaderOptions lo;
  lo.seq_len = cfg.model.seq_len;
  lo.batch_size = mbs;
  lo.seed = cfg.training.seed;
  lo.shuffle = cfg.data.shuffle;
  lo.prefetch = cfg.data.prefetch;
  lo.reader_threads = static_cast<int>(cfg.data.reader_threads);
  lo.block_windows = cfg.data.block_windows;
  data::StreamingLoader loader(shards.train, lo, state.loader, tensor_buffers(device));

  // Model FLOPs per token (PaLM's count): 6 x active matmul parameters + 12 x L x d x S for
  // attention scores; forward and backward. MFU needs a peak: monitor.peak_tflops, or known GPUs.
  const double flops_per_token =
      6.0 * static_cast<double>(config::active_parameters_per_token(cfg)) +
      12.0 * static_cast<double>(cfg.model.num_layers * cfg.model.hidden_size * cfg.model.seq_len);
  const double peak_flops = peak_tflops(cfg, device) * 1e12;
  auto sync_for_timing = [&] {
    if (cfg.wall_clock_breakdown && device.is_cuda()) torch::cuda::synchronize();
  };
  const bool progress_bar = isatty(STDERR_FILENO) && log->level() <= spdlog::level::info;
  auto clear_progress = [&] {
    if (progress_bar) std::fprintf(stderr, "\r\033[K");
  };
  auto show_progress = [&](int64_t done, int64_t total, int64_t first, Clock::time_point start,
                           double loss) {
    if (!progress_bar) return;
    const double rate = std::chrono::duration<double>(Clock::now() - start).count() /
                        static_cast<double>(std::max<int64_t>(1, done - first));
    const int64_t eta = static_cast<int64_t>(rate * static_cast<double>(total - done));
    const int width = 30, filled = static_cast<int>(width * done / std::max<int64_t>(1, total));
    std::fprintf(stderr, "\r\033[K[%s%s] %lld/%lld loss %.4f ETA %02lld:%02lld:%02lld",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total), loss,
                 static_cast<long long>(eta / 3600), static_cast<long long>(eta / 60 % 60),
                 static_cast<long long>(eta % 60));
    if (done == total) std::fprintf(stderr, "\n");
  };

  const double max_norm =
      cfg.gradient_clipping > 0 ? cfg.gradient_clipping : std::numeric_limits<double>::infinity();
  // training.cuda_graph: the whole step as one CUDA graph when this run allows it
  // (include/moe/train/cuda_graph_step.h lists the conditions).
  std::unique_ptr<CudaGraphStep> graph_step;
  bool graph_captured = false;
  if (cfg.training.cuda_graph) {
    const std::string why = cuda_graph_ineligible_reason(cfg, device);
    if (!why.empty()) {
      log->warn("training.cuda_graph: not used because {}; training runs eagerly", why);
    } else {
      auto micro_forward = [&model, &cfg](const torch::Tensor& tokens) {
        struct Bf16Autocast {  // switched off again even when the forward throws mid-capture
          Bf16Autocast() {
            at::autocast::set_autocast_enabled(at::kCUDA, true);
            at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
          }
          ~Bf16Autocast() { at::autocast::set_autocast_enabled(at::kCUDA, false); }
        } autocast;
        StepLosses l = compute_losses(model, tokens, cfg);
        return MicroLosses{l.total, l.lm, l.aux, l.z, l.tokens_per_expert};
      };
      graph_step = std::make_unique<CudaGraphStep>(
          model->parameters(), optimizer, micro_forward, gas,
          std::vector<int64_t>{mbs, cfg.model.seq_len + 1}, max_norm, device);
    }
  }

  Nvml nvml;  // GPU utilisation, power, temperature when libnvidia-ml is present
  install_signal_handlers();
  sd_notify(0, "READY=1");
  auto run_start = Clock::now();
  const int64_t first_step = state.step;
  int64_t current_step = state.step;
  int64_t consecutive_bad = 0;
  // Test hook (tests/train/checkpoint_test.py): pretend the allocator ran out at this step.
  const char* fake_oom = std::getenv("MOE_TEST_FAKE_OOM_AT_STEP");
  try {
    for (int64_t step = state.step; step < total_steps; ++step) {
      current_step = step + 1;
      TORCH_CHECK_WITH(OutOfMemoryError,
                       fake_oom == nullptr || std::to_string(step + 1) != fake_oom,
                       "out of memory (MOE_TEST_FAKE_OOM_AT_STEP)");
      auto t0 = Clock::now();
      double forward_s = 0, backward_s = 0;
      const double lr = schedule.lr_at(step);
      double lm_sum = 0.0, aux_sum = 0.0, z_sum = 0.0;
      int64_t dropped = 0;
      std::vector<torch::Tensor> load;  // tokens per expert, summed over micro-batches
      const double wait_before = loader.wait_seconds();
      // Eager steps take each micro-batch as they reach it (loading overlaps compute); a graph
      // replay needs all of them first.
      std::vector<data::Batch> hosts;
      auto next_batch = [&] {
        hosts.push_back(loader.next());
        state.loader = hosts.back().state_after;
      };
      // CUDA graph: eager warm-up steps first (allocator, cuBLAS, autograd settle), then one
      // capture; every later step is a replay. A failed capture leaves the run eager.
      bool graphed = false;
      if (graph_step && step - first_step >= kGraphWarmupSteps) {
        for (int64_t micro = 0; micro < gas; ++micro) next_batch();
        for (int64_t micro = 0; micro < gas; ++micro) {
          graph_step->set_input(micro, to_device(hosts[static_cast<size_t>(micro)], device));
        }
        if (!graph_captured) {
          std::string why;
          graph_captured = graph_step->capture(why);
          at::autocast::clear_cache();
          if (graph_captured) {
            log->info("training.cuda_graph: step {} captured; replaying from here on", step + 1);
          } else {
            log->warn("training.cuda_graph: capture failed ({}); training continues eagerly", why);
            graph_step.reset();
          }
        }
        if (graph_step) {
          graph_step->replay(lr);
          graphed = true;
          lm_sum = graph_step->lm_sum.item<double>();
          aux_sum = graph_step->aux_sum.item<double>();
          z_sum = graph_step->z_sum.item<double>();
          load = graph_step->tokens_per_expert;
        }
      }
      if (!graphed) optimizer.zero_grad();
      for (int64_t micro = 0; micro < (graphed ? 0 : gas); ++micro) {
        if (hosts.size() <= static_cast<size_t>(micro)) next_batch();
        auto batch = to_device(hosts[static_cast<size_t>(micro)], device);
        if (bf16 || fp16) {
          at::autocast::set_autocast_enabled(at::kCUDA, true);
          at::autocast::set_autocast_dtype(at::kCUDA, bf16 ? at::kBFloat16 : at::kHalf);
        }
        auto tf = Clock::now();
        StepLosses l = compute_losses(model, batch, cfg);
        if (bf16 || fp16) at::autocast::set_autocast_enabled(at::kCUDA, false);
        sync_for_timing();
        auto tb = Clock::now();
        // Only fp16 scales the loss; bf16 and fp32 gradients need no scaling.
        (l.total * ((fp16 ? scaler.scale() : 1.0) / static_cast<double>(gas))).backward();
        sync_for_timing();
        forward_s += std::chrono::duration<double>(tb - tf).count();
        backward_s += std::chrono::duration<double>(Clock::now() - tb).count();
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
      if (bf16 || fp16) at::autocast::clear_cache();
      // fp16: unscale in place and detect overflow in one pass; skip the step on overflow.
      bool overflow = false;
      if (fp16 && !graphed) {
        std::vector<torch::Tensor> grads;
        for (auto& p : model->parameters()) {
          if (p.grad().defined()) grads.push_back(p.grad());
        }
        auto found_inf = torch::zeros({1}, torch::TensorOptions().device(device));
        auto inv_scale =
            torch::full({1}, 1.0 / scaler.scale(), torch::TensorOptions().device(device));
        at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
        overflow = found_inf.item<float>() > 0;
      }
      double grad_norm;
      if (graphed) {  // clipped (and the update done or skipped) inside the graph
        grad_norm = graph_step->grad_norm.item<double>();
      } else {
        inject_nan_for_tests(model, step + 1, lm_sum);
        grad_norm = overflow ? std::nan("") : clip_gradients(model, max_norm);
      }
      const double loss = lm_sum / static_cast<double>(gas);
      bool skipped = overflow;
      if (fp16) {
        scaler.update(overflow);
      } else if (!std::isfinite(grad_norm) || !std::isfinite(loss)) {
        // bf16/fp32: skip the update; stop after training.max_bad_steps in a row.
        skipped = true;
        const std::string where = first_non_finite_gradient(model);
        const std::vector<std::string> ckpts = store.candidates();
        if (++consecutive_bad >= cfg.training.max_bad_steps) {
          throw TrainingError(
              "non-finite " + std::string(std::isfinite(loss) ? "gradients" : "loss") +
              " at step " + std::to_string(step + 1) + " (" + std::to_string(consecutive_bad) +
              " bad steps in a row, training.max_bad_steps = " +
              std::to_string(cfg.training.max_bad_steps) + "); first non-finite gradients in " +
              where + "; last good checkpoint: " + (ckpts.empty() ? "none" : ckpts.front()));
        }
        log->warn(
            "step {}: non-finite {} (first in {}); update skipped ({} of {} allowed in a row)",
            step + 1, std::isfinite(loss) ? "gradients" : "loss", where, consecutive_bad,
            cfg.training.max_bad_steps - 1);
      } else {
        consecutive_bad = 0;
      }
      auto to = Clock::now();
      if (!skipped) {
        if (!graphed) optimizer.step(lr);
        // Aux-loss-free balancing: each router's bias follows this step's load (all micro-batches).
        for (size_t i = 0; i < load.size(); ++i)
          model->blocks[i]->moe->router->update_expert_bias(load[i]);
      }
      sync_for_timing();
      const double optimizer_s = std::chrono::duration<double>(Clock::now() - to).count();
      state.step = step + 1;
      state.tokens = state.step * tokens_per_step;
      const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (step == first_step) summary.first_train_loss = loss;
      summary.last_train_loss = loss;
      json rec = {{"type", "train"},
                  {"skipped", skipped},
                  {"cuda_graph", graphed},
                  {"step", step + 1},
                  {"loss", loss},
                  {"aux_loss", aux_sum / static_cast<double>(gas)},
                  {"z_loss", z_sum / static_cast<double>(gas)},
                  {"lr", lr},
                  {"grad_norm", overflow ? json(nullptr) : json(grad_norm)},
                  {"tokens", state.tokens},
                  {"dropped_tokens", dropped},
                  {"expert_tokens", expert_loads(load)},
                  {"epoch", state.loader.epoch},
                  {"data_wait_s", loader.wait_seconds() - wait_before},
                  {"step_time_s", step_s},
                  {"tokens_per_s", static_cast<double>(tokens_per_step) / step_s}};
      if (fp16) {
        rec["loss_scale"] = scaler.scale();
        rec["skipped_steps"] = scaler.state().skipped_steps;
      }
      rec["host_rss_bytes"] = host_rss_bytes();
      rec["samples_per_s"] = static_cast<double>(gbs) / step_s;
      if (device.is_cuda() && ((step + 1) % cfg.steps_per_print == 0))
        nvml.sample(rec, device.index());
      if (cfg.wall_clock_breakdown) {  // DeepSpeed's breakdown (CUDA syncs between phases)
        rec["forward_s"] = forward_s;
        rec["backward_s"] = backward_s;
        rec["optimizer_s"] = optimizer_s;
      }
      if (peak_flops > 0) {
        rec["mfu"] = static_cast<double>(tokens_per_step) / step_s * flops_per_token / peak_flops;
      }
      if (device.is_cuda()) add_gpu_stats(rec, device);
      clear_progress();
      write_record(rec);
      // systemd: the watchdog sees a live loop; `systemctl status` shows where it is.
      sd_notifyf(0, "WATCHDOG=1\nSTATUS=step %lld/%lld loss %.4f", static_cast<long long>(step + 1),
                 static_cast<long long>(total_steps), loss);
      if ((step + 1) % cfg.steps_per_print == 0 || step + 1 == total_steps) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
        log->info("step {}/{}: loss {:.4f} aux {:.4f} lr {:.3e} grad_norm {:.3f} {:.0f} tok/s",
                  step + 1, total_steps, loss, aux_sum / static_cast<double>(gas), lr, grad_norm,
                  static_cast<double>((step + 1 - first_step) * tokens_per_step) / elapsed);
      }
      show_progress(step + 1, total_steps, first_step, run_start, loss);
      const bool last = step + 1 == total_steps;
      if (has_valid && (last || (cfg.training.eval_interval > 0 &&
                                 (step + 1) % cfg.training.eval_interval == 0))) {
        EvalResult r = evaluate(model, shards.valid, cfg, device);
        write_record(eval_record(step + 1, r));
        log->info("step {}: validation loss {:.4f}, accuracy {:.4f}, perplexity {:.2f}", step + 1,
                  r.loss, r.accuracy, r.perplexity);
        if (last) summary.final_eval = r;
      }
      const double minutes = std::chrono::duration<double>(Clock::now() - last_save).count() / 60.0;
      if (last && cfg.checkpoint.save_final) {
        save("final");
      } else if (cfg.checkpoint.save_interval > 0 &&
                 (step + 1) % cfg.checkpoint.save_interval == 0) {
        save("interval");
      } else if (cfg.checkpoint.save_interval_minutes > 0 &&
                 minutes >= cfg.checkpoint.save_interval_minutes) {
        save("time");
      } else if (g_checkpoint_request.exchange(false)) {
        save("SIGUSR1");
      }
      const double run_minutes =
          std::chrono::duration<double>(Clock::now() - run_start).count() / 60.0;
      const bool exit_now =
          !last &&
          ((cfg.training.exit_interval > 0 && (step + 1) % cfg.training.exit_interval == 0) ||
           (cfg.training.exit_duration_minutes > 0 &&
            run_minutes >= cfg.training.exit_duration_minutes));
      if (exit_now) {
        save("exit_interval");
        log->info(
            "exit_interval/exit_duration reached after step {}; run the same command to resume",
            step + 1);
        summary.interrupted = true;
        summary.steps = step + 1;
        break;
      }
      if (g_stop_signal.load() != 0 && !last) {
        save(g_stop_signal.load() == SIGTERM ? "SIGTERM" : "SIGINT");
        log->warn("stopped by signal after step {}; resume by running the same command", step + 1);
        summary.interrupted = true;
        summary.steps = step + 1;
        break;
      }
    }
  } catch (const c10::OutOfMemoryError& e) {
    throw TrainingError(oom_report(cfg, device, current_step, e.what_without_backtrace()));
  }
  return summary;
}

}  // namespace moe::train
