#include "moe/train/step_report.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "moe/monitor/device_peak.h"

namespace moe::train {

using monitor::model_flops_utilisation;
using monitor::spec_peak;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// NVIDIA's management library, loaded at run time if present (no link-time dependency):
// utilisation, power and temperature of the training GPU, sampled every steps_per_print steps.
class StepReporter::Nvml {
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

namespace {

int64_t host_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, rss = 0;
  statm >> pages >> rss;
  return rss * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Dense peak of the device for MFU, in TFLOP/s: the config's value, else the spec-sheet table
// (device_peak.h); 0 (no MFU) when unknown, e.g. on a CPU without monitor.peak_tflops.
double peak_tflops(const config::Config& cfg, const torch::Device& device) {
  if (cfg.monitor.peak_tflops > 0) return cfg.monitor.peak_tflops;
  if (!device.is_cuda()) return 0.0;
  const auto peak =
      spec_peak(at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name);
  return peak ? peak->tflops : 0.0;
}

void add_gpu_stats(json& rec, const torch::Device& device) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  rec["gpu_mem_allocated_bytes"] = stats.allocated_bytes[agg].current;
  rec["gpu_mem_reserved_bytes"] = stats.reserved_bytes[agg].current;
  rec["gpu_mem_peak_bytes"] = stats.allocated_bytes[agg].peak;
}

json expert_loads(const std::vector<torch::Tensor>& per_layer) {
  json layers = json::array();
  for (const auto& t : per_layer) {
    auto c = t.to(torch::kCPU);
    layers.push_back(
        std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()));
  }
  return layers;
}

}  // namespace

StepReporter::StepReporter(const config::Config& cfg, const torch::Device& device,
                           int64_t total_steps, int64_t first_step, Writer write,
                           spdlog::logger& log)
    : cfg_(cfg),
      device_(device),
      total_steps_(total_steps),
      first_step_(first_step),
      write_(std::move(write)),
      log_(log),
      nvml_(std::make_unique<Nvml>()),
      progress_bar_(isatty(STDERR_FILENO) && log.level() <= spdlog::level::info),
      // Model FLOPs per token, forward and backward: the flops profiler's per-module counts
      // (config::module_costs; PaLM's convention). MFU needs a peak: monitor.peak_tflops, or a
      // known GPU.
      flops_per_token_(config::training_flops_per_token(cfg)),
      causal_flops_per_token_(config::training_flops_per_token(cfg, /*causal_half=*/true)),
      // Data parallel: train_batch_size counts every rank's tokens; MFU is per GPU.
      world_size_(std::max<int64_t>(1, cfg.train_batch_size / (cfg.train_micro_batch_size_per_gpu *
                                                               cfg.gradient_accumulation_steps))),
      peak_flops_(peak_tflops(cfg, device) * 1e12),
      start_(Clock::now()) {}

StepReporter::~StepReporter() = default;

void StepReporter::step(const StepFigures& f) {
  const int64_t tokens_per_step = cfg_.train_batch_size * cfg_.model.seq_len;
  json rec = {{"type", "train"},
              {"skipped", f.skipped},
              {"cuda_graph", f.graphed},
              {"step", f.step},
              {"loss", f.loss},
              {"aux_loss", f.aux_loss},
              {"z_loss", f.z_loss},
              {"lr", f.lr},
              {"grad_norm", f.grad_norm ? json(*f.grad_norm) : json(nullptr)},
              {"tokens", f.tokens},
              {"target_tokens", f.target_tokens},
              {"dropped_tokens", f.dropped},
              {"expert_tokens", expert_loads(f.tokens_per_expert)},
              {"epoch", f.epoch},
              {"data_wait_s", f.data_wait_s},
              {"step_time_s", f.step_s},
              {"tokens_per_s", static_cast<double>(tokens_per_step) / f.step_s}};
  if (!f.source_passes.empty()) rec["source_passes"] = f.source_passes;
  if (f.loss_scale) {
    rec["loss_scale"] = *f.loss_scale;
    rec["skipped_steps"] = f.skipped_steps;
  }
  rec["host_rss_bytes"] = host_rss_bytes();
  rec["samples_per_s"] = static_cast<double>(cfg_.train_batch_size) / f.step_s;
  if (device_.is_cuda() && (f.step % cfg_.steps_per_print == 0)) {
    nvml_->sample(rec, device_.index());
  }
  if (cfg_.wall_clock_breakdown) {  // DeepSpeed's breakdown (CUDA syncs between phases)
    rec["forward_s"] = f.forward_s;
    rec["backward_s"] = f.backward_s;
    rec["optimizer_s"] = f.optimizer_s;
  }
  // Achieved model TFLOP/s per GPU (Megatron's "TFLOP/s/GPU"); MFU against the spec peak, in
  // PaLM's full-square attention convention and in the causal-half one.
  const double tokens_per_s_per_gpu =
      static_cast<double>(tokens_per_step) / f.step_s / static_cast<double>(world_size_);
  rec["tflops"] = tokens_per_s_per_gpu * flops_per_token_ / 1e12;
  if (peak_flops_ > 0) {
    rec["mfu"] = model_flops_utilisation(tokens_per_s_per_gpu, flops_per_token_, peak_flops_);
    rec["mfu_causal"] =
        model_flops_utilisation(tokens_per_s_per_gpu, causal_flops_per_token_, peak_flops_);
  }
  if (device_.is_cuda()) add_gpu_stats(rec, device_);
  clear_progress();
  write_(rec);
  // systemd: the watchdog sees a live loop; `systemctl status` shows where it is.
  sd_notifyf(0, "WATCHDOG=1\nSTATUS=step %lld/%lld loss %.4f", static_cast<long long>(f.step),
             static_cast<long long>(total_steps_), f.loss);
  if (f.step % cfg_.steps_per_print == 0 || f.step == total_steps_) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    log_.info("step {}/{}: loss {:.4f} aux {:.4f} lr {:.3e} grad_norm {:.3f} {:.0f} tok/s", f.step,
              total_steps_, f.loss, f.aux_loss, f.lr, f.grad_norm ? *f.grad_norm : std::nan(""),
              static_cast<double>((f.step - first_step_) * tokens_per_step) / elapsed);
  }
  progress(f.step, f.loss);
}

void StepReporter::eval(int64_t step, const train::EvalResult& r) {
  json rec = {{"type", "eval"},         {"step", step},
              {"split", "valid"},       {"loss", r.loss},
              {"accuracy", r.accuracy}, {"perplexity", r.perplexity},
              {"tokens", r.tokens},     {"expert_imbalance", r.expert_imbalance}};
  if (!r.sources.empty()) {
    json per = json::object();
    for (const auto& s : r.sources) {
      per[s.name] = {{"loss", s.loss},
                     {"accuracy", s.accuracy},
                     {"perplexity", s.perplexity},
                     {"tokens", s.tokens}};
      log_.info("step {}: validation of {}: loss {:.4f}, accuracy {:.4f}", step, s.name, s.loss,
                s.accuracy);
    }
    rec["sources"] = per;
  }
  write_(rec);
  if (step == 0) {
    log_.info("step 0: validation loss {:.4f}, accuracy {:.4f}", r.loss, r.accuracy);
  } else {
    log_.info("step {}: validation loss {:.4f}, accuracy {:.4f}, perplexity {:.2f}", step, r.loss,
              r.accuracy, r.perplexity);
  }
}

void StepReporter::clear_progress() {
  if (progress_bar_) std::fprintf(stderr, "\r\033[K");
}

void StepReporter::progress(int64_t done, double loss) {
  if (!progress_bar_) return;
  const double rate = std::chrono::duration<double>(Clock::now() - start_).count() /
                      static_cast<double>(std::max<int64_t>(1, done - first_step_));
  const int64_t eta = static_cast<int64_t>(rate * static_cast<double>(total_steps_ - done));
  const int width = 30,
            filled = static_cast<int>(width * done / std::max<int64_t>(1, total_steps_));
  std::fprintf(stderr, "\r\033[K[%s%s] %lld/%lld loss %.4f ETA %02lld:%02lld:%02lld",
               std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(width - filled), '.').c_str(),
               static_cast<long long>(done), static_cast<long long>(total_steps_), loss,
               static_cast<long long>(eta / 3600), static_cast<long long>(eta / 60 % 60),
               static_cast<long long>(eta % 60));
  if (done == total_steps_) std::fprintf(stderr, "\n");
}

}  // namespace moe::train
