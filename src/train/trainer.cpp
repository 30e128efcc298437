// The training run as one session object: each method is one phase (inputs, resume, output
// directory, first validation, the loop, one step), delegating to the rooms that own the
// decisions: run_inputs.h (checks before any write), resume_policy.h (where the run starts),
// checkpoint_writer.h (writes), cadence.h (when to validate, save, stop), step_runner.h (the
// step's compute), train/step_report.h (what each step reports).
#include "moe/train/trainer.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "moe/checkpoint/checkpoint_dirs.h"
#include "moe/checkpoint/checkpoint_files.h"
#include "moe/checkpoint/checkpoint_writer.h"
#include "moe/checkpoint/init_from.h"
#include "moe/checkpoint/remote_checkpoints.h"
#include "moe/checkpoint/resume_policy.h"
#include "moe/config/architecture.h"
#include "moe/data/blended_loader.h"
#include "moe/data/streaming_loader.h"
#include "moe/kernels/permute.h"  // cuda_kernels_compiled
#include "moe/layers/profile_scope.h"
#include "moe/model/transformer.h"
#include "moe/monitor/flops_report.h"
#include "moe/monitor/monitor.h"
#include "moe/monitor/step_trace.h"
#include "moe/optim/adamw.h"
#include "moe/optim/loss_scaler.h"
#include "moe/optim/lr_schedule.h"
#include "moe/parallel/data_parallel.h"
#include "moe/plan/memory_plan.h"
#include "moe/train/cadence.h"
#include "moe/train/device.h"
#include "moe/train/evaluation.h"
#include "moe/train/expert_offload.h"
#include "moe/train/metrics_log.h"
#include "moe/train/run_inputs.h"
#include "moe/train/step_report.h"
#include "moe/train/step_runner.h"
#include "moe/util/errors.h"
#include "moe/util/fault_injection.h"

namespace moe::train {

using parallel::StopInputs;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

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

// The parameters this rank's optimizer updates (ZeRO: those it owns), decayed or not.
std::vector<optim::AdamWGroup> param_groups(model::TransformerLM& model, const config::Config& cfg,
                                            const DataParallel& dp) {
  optim::AdamWGroup decay, no_decay;
  decay.weight_decay =
      cfg.optimizer.type == config::OptimizerType::kAdam ? 0.0 : cfg.optimizer.weight_decay;
  for (auto& [name, param] : layers::trainable_parameters(*model)) {  // LoRA: no frozen base
    if (!dp.updates(name)) continue;
    // Norm weights and biases (1-D) are not decayed, as in Megatron and DeepSpeed's examples.
    optim::AdamWGroup& g =
        param.dim() >= 2 || cfg.optimizer.decay_norms_and_biases ? decay : no_decay;
    g.names.push_back(name);
    g.params.push_back(param);
  }
  std::vector<optim::AdamWGroup> groups{decay};
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
    // The planner's view of this config on this card (moe-train plan; docs/memory.md).
    plan::PlanOptions po;
    po.cuda_kernels = kernels::cuda_kernels_compiled();
    po.device_bytes = static_cast<double>(
        at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->totalGlobalMem);
    const plan::MemoryPlan plan = plan::plan_memory(cfg, po);
    msg << "; moe-train plan predicts " << gib(static_cast<int64_t>(plan.reserved))
        << " GiB, largest micro-batch that fits " << plan.max_micro_batch;
    for (const auto& a : plan.advice) msg << "; would help: " << a;
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

optim::OffloadOptions offload_options(const config::Config& cfg) {
  optim::OffloadOptions o;
  o.enabled = cfg.zero_optimization.offload_optimizer.device == config::OffloadDevice::kCpu;
  o.pin_memory = cfg.zero_optimization.offload_optimizer.pin_memory;
  // As the step runner accumulates: 16-bit gradients summed in fp32 over micro-batches, or
  // widened for fp16's unscaling (the memory plan's fp32 sums).
  o.fp32_gradient_sums = cfg.training.param_dtype != config::ParamDtype::kFp32 &&
                         (cfg.gradient_accumulation_steps > 1 || cfg.fp16.enabled);
  return o;
}

// The model, seeded; the routers sum their expert counts over the ranks (data parallel); ZeRO
// assigns its parameters to owners.
model::TransformerLM seeded_model(const config::Config& cfg, const torch::Device& device,
                                  DataParallel& dp) {
  torch::manual_seed(cfg.training.seed);
  model::TransformerLM model(cfg, device, dp.moe_parallel());
  model->to(device);
  model->train();
  dp.attach(model);
  return model;
}

// training.cpu_affinity (device.h), said in the log.
std::string pin_threads(const config::Config& cfg, const TrainOptions& opt, spdlog::logger& log) {
  const std::string cpus = apply_cpu_affinity(cfg, opt.launch.local_rank);
  if (!cpus.empty()) {
    log.info("every thread pinned to CPUs {} (training.cpu_affinity = {})", cpus,
             cfg.training.cpu_affinity);
  } else if (!cfg.training.cpu_affinity.empty()) {
    log.warn(
        "training.cpu_affinity = auto: no GPU whose nearby CPUs sysfs names; placement "
        "left to the OS");
  }
  return cpus;
}

// A CUDA run puts each rank on the GPU of its local rank.
RunInputs on_local_device(RunInputs in, const TrainOptions& opt) {
  if (in.device.is_cuda() && opt.launch.world_size > 1) {
    in.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(opt.launch.local_rank));
  }
  return in;
}

class TrainingSession {
 public:
  TrainingSession(const config::Config& cfg, const TrainOptions& opt)
      : cfg_(cfg),
        opt_(opt),
        log_(spdlog::get("moe-train") ? spdlog::get("moe-train") : spdlog::default_logger()),
        pinned_(pin_threads(cfg, opt, *log_)),
        dp_(DataParallel::create(cfg, opt.launch, pick_device(cfg).is_cuda(), *log_)),
        in_((warn_config(), on_local_device(check_run_inputs(cfg, opt, *log_), opt))),
        model_(seeded_model(cfg, in_.device, *dp_)),
        optimizer_(param_groups(model_, cfg, *dp_), cfg.optimizer.betas[0], cfg.optimizer.betas[1],
                   cfg.optimizer.eps, offload_options(cfg),
                   {cfg.optimizer.exp_avg_dtype, cfg.optimizer.exp_avg_sq_dtype,
                    cfg.moe.kernels != config::MoeKernels::kReference},
                   cfg.optimizer.main_params_dtype),
        schedule_(cfg.scheduler, cfg.optimizer.lr, in_.total_steps),
        scaler_(cfg.fp16),
        store_((fs::path(cfg.training.output_dir) / "checkpoints").string()),
        cadence_(CadenceOptions::from_config(cfg), in_.total_steps, in_.has_valid),
        guard_(cfg.training.max_bad_steps, *log_) {
    if (offload_options(cfg).enabled && in_.device.is_cpu()) {
      log_->info("optimizer offload on a CPU run: the host-side update path runs with host copies");
    }
    // ZeRO-Offload's overlap: gradients go to the host during the backward. With several ranks
    // they are reduced first, so they are copied after the backward.
    if (offload_options(cfg).enabled && cfg.zero_optimization.overlap_comm && dp_->size() == 1) {
      optimizer_.stream_gradients_in_backward();
      log_->info("optimizer offload: gradients are copied to the host during the backward");
    }
  }

  TrainSummary run() {
    resume();
    // Every rank continues from the same checkpoint, and has read it before rank 0 writes.
    dp_->agree_on_resume(state_.step, resumed_dir_, store_.root());
    open_output();
    start();
    try {
      for (int64_t step = state_.step; step < in_.total_steps; ++step) {
        if (!train_step(step)) break;
      }
    } catch (const c10::OutOfMemoryError& e) {
      throw TrainingError(oom_report(cfg_, in_.device, current_step_, e.what_without_backtrace()));
    }
    check_base_unchanged();
    report_expert_offload(model_, *log_);
    finish_uploads();
    report_offload_host_bytes();
    return summary_;
  }

 private:
  // Offload: the host bytes the optimizer holds, next to what `moe-train plan` counts for them.
  void report_offload_host_bytes() {
    if (!optimizer_.offloaded()) return;
    summary_.offload_host_bytes = optimizer_.host_bytes();
    plan::PlanOptions po;
    po.cpu = in_.device.is_cpu();
    po.world_size = dp_->size();
    const double planned = plan::plan_memory(cfg_, po).host_states;
    log_->info("optimizer offload: {:.3f} GiB of host buffers held (moe-train plan: {:.3f} GiB)",
               static_cast<double>(summary_.offload_host_bytes) / (1 << 30), planned / (1 << 30));
  }

  int warn_config() {
    for (const auto& w : cfg_.warnings) log_->warn("{}", w);
    return 0;
  }

  // The checkpoint to continue from (resume_policy.h), or a fresh start.
  void resume() {
    if (model_->has_lora()) {  // the frozen base first: a LoRA checkpoint holds adapters only
      checkpoint::load_lora_base(cfg_, model_, /*seeded=*/true);
      optimizer_.reload_master_weights();  // offload: modules_to_save start from the base
      log_->info("LoRA: base {} in {} (fingerprint {}); {}",
                 cfg_.model.init_from.empty() ? "randomly initialised" : cfg_.model.init_from,
                 c10::toString(model_->base_dtype()), model_->base_fingerprint(), lora_summary());
      if (!model_->quantized_weights().empty()) {
        const auto& q = cfg_.quantization;
        log_->info(
            "LoRA: 4-bit base: {} matrices in {}{}, {:.3f} GiB of codes and statistics, "
            "dequantized to {} before each GEMM",
            model_->quantized_weights().size(), config::name(q.bnb_4bit_quant_type),
            q.bnb_4bit_use_double_quant ? " with double quant" : "",
            static_cast<double>(model_->quantized_bytes()) / (1024.0 * 1024.0 * 1024.0),
            config::name(q.bnb_4bit_compute_dtype));
      }
      if (const auto& ring = model_->expert_ring()) {
        log_->info(
            "expert offload: on: the MoE layers' frozen experts stay in host memory{}; a ring of "
            "{} layers on {} takes them in turn, the next layer copied ahead",
            ring->device().is_cuda() ? " (pinned)" : "", ring->slots(), ring->device().str());
      }
    }
    open_remote_checkpoints();
    const auto candidates = store_.candidates();
    checkpoint::ResumeDecision d =
        checkpoint::decide_resume(opt_, candidates, in_.total_steps, store_.root());
    while (d.action == checkpoint::ResumeDecision::Action::kLoad) {
      try {
        state_ = checkpoint::load_checkpoint(d.dir, model_, &optimizer_, true,
                                             dp_->optimizer_is_share());
        summary_.resumed_from = state_.step;
        resumed_dir_ = d.dir;
        break;
      } catch (const checkpoint::BaseMismatchError&) {
        throw;  // every checkpoint here has the same base: an older one would not help
      } catch (const UserError& e) {
        if (!d.fallback) throw;
        log_->error("{}", checkpoint::unusable_checkpoint_message(d.dir, e.what()));
        d = checkpoint::decide_resume(opt_, candidates, in_.total_steps, store_.root(),
                                      d.next_index);
      }
    }
    if (d.action == checkpoint::ResumeDecision::Action::kFinished) log_->warn("{}", d.message);
    if (d.action == checkpoint::ResumeDecision::Action::kNoneLoadable) throw UserError(d.message);
    if (summary_.resumed_from < 0 && !cfg_.model.init_from.empty() && !model_->has_lora()) {
      // A fresh run from existing weights: the optimizer's fp32 masters follow them.
      const std::string what = checkpoint::init_weights_from(cfg_, model_);
      optimizer_.reload_master_weights();
      log_->info("initial weights from {} ({})", cfg_.model.init_from, what);
    }
    scaler_.restore(summary_.resumed_from >= 0 ? state_.scaler : scaler_.state());
  }

  // checkpoint.remote: rank 0 uploads (it writes the checkpoints) and, when the output
  // directory holds no checkpoint (a new Spot instance), first restores the newest remote one.
  void open_remote_checkpoints() {
    if (cfg_.checkpoint.remote.empty()) return;
    if (dp_->writes()) {
      remote_ = std::make_unique<checkpoint::RemoteCheckpoints>(
          s3::client_from_environment(), s3::parse_url(cfg_.checkpoint.remote, "checkpoint.remote"),
          store_.root(), cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every, *log_);
      if (store_.candidates().empty() && opt_.resume_from.empty()) {
        const std::string dir = remote_->restore();
        if (dir.empty())
          log_->info("checkpoint: {} holds no checkpoint yet", cfg_.checkpoint.remote);
      }
    }
    dp_->barrier();  // the other ranks look for checkpoints after rank 0 restored one
  }

  // After the last step: the queued uploads finish. After SIGTERM they get
  // checkpoint.remote_grace_s (systemd's TimeoutStopSec must leave room for it); an upload that
  // did not complete is a failed run (exit 3), the remote `latest` naming the previous one.
  void finish_uploads() {
    if (!remote_ || last_enqueued_ < 0) return;
    const bool signalled = g_stop_signal.load() != 0;
    const double limit = signalled ? cfg_.checkpoint.remote_grace_s : 7 * 24 * 3600.0;
    log_->info("checkpoint: waiting for the upload of step {} to {}{}", last_enqueued_,
               cfg_.checkpoint.remote,
               signalled ? fmt::format(" (at most {} s)", cfg_.checkpoint.remote_grace_s) : "");
    const bool done = remote_->wait(limit);
    if (!done || remote_->last_uploaded() < last_enqueued_) {
      throw TrainingError(fmt::format(
          "checkpoint: step {} was not uploaded to {} ({}); the local copy is complete, the "
          "remote latest is step {}",
          last_enqueued_, cfg_.checkpoint.remote,
          done ? "the upload failed, see above"
               : fmt::format("not done within checkpoint.remote_grace_s = {} s",
                             cfg_.checkpoint.remote_grace_s),
          remote_->last_uploaded()));
    }
  }

  // LoRA: frozen means frozen. The base is hashed again at the end and must be bit for bit
  // what was loaded.
  void check_base_unchanged() {
    if (!model_->has_lora()) return;
    const std::string now =
        layers::base_fingerprint(*model_, model_->base_dtype(), model_->quantized_weights());
    if (now != model_->base_fingerprint()) {
      throw TrainingError("LoRA: the frozen base weights changed during training (fingerprint " +
                          model_->base_fingerprint() + " -> " + now + "): a bug, please report it");
    }
    log_->info("LoRA: base weights unchanged after training (fingerprint {})", now);
  }

  std::string lora_summary() const {
    const auto n = config::lora_parameter_counts(cfg_);
    return fmt::format(
        "{} adapter parameters (r = {}, scaling {:.4g}), {} base parameters trained "
        "in full, {} frozen",
        n.adapter, cfg_.lora.r, config::lora_scaling(cfg_.lora), n.trainable_base, n.frozen_base);
  }

  // Sinks first (a Prometheus port that cannot be bound is still a user error, before any
  // write), then the output directory: earlier run set aside or metrics truncated, config.json.
  void open_output() {
    const fs::path out_dir = cfg_.training.output_dir;
    monitor::MonitorOptions mo;
    auto sink_dir = [&](const config::MonitorSinkConfig& s, const char* fallback) {
      if (!s.enabled) return std::string();
      const fs::path base = s.output_path.empty() ? out_dir / fallback : fs::path(s.output_path);
      return (base / s.job_name).string();
    };
    mo.tensorboard_dir = sink_dir(cfg_.tensorboard, "tensorboard");
    mo.csv_dir = sink_dir(cfg_.csv_monitor, "csv");
    mo.prometheus_port = static_cast<int>(cfg_.monitor.prometheus_port);
    mo.prometheus_host = cfg_.monitor.prometheus_host;
    if (!dp_->writes()) {  // data parallel: rank 0 writes for everyone
      sinks_ = std::make_unique<monitor::Monitor>(monitor::MonitorOptions{});
      metrics_ = std::make_unique<MetricsLog>("/dev/null", false);
      return;
    }
    sinks_ = std::make_unique<monitor::Monitor>(mo);
    if (mo.prometheus_port > 0) {
      log_->info("prometheus: serving http://{}:{}/metrics", mo.prometheus_host,
                 mo.prometheus_port);
    }
    // ---- from here on we write into the output directory ----
    fs::create_directories(out_dir);
    const fs::path metrics_path = out_dir / "metrics.jsonl";
    if (summary_.resumed_from >= 0) {
      checkpoint::truncate_metrics(metrics_path, state_.metrics_lines);
      log_->info("resuming from step {} (tokens {}, epoch {}, window {})", state_.step,
                 state_.tokens, state_.loader.epoch, state_.loader.position);
    } else {
      checkpoint::set_aside_previous_run(out_dir.string(), opt_.overwrite,
                                         checkpoint::run_time_stamp(std::time(nullptr)), *log_);
    }
    store_.clean_partial();
    std::ofstream(out_dir / "config.json") << config::to_json(cfg_).dump(2) << "\n";
    metrics_ = std::make_unique<MetricsLog>(metrics_path.string(), summary_.resumed_from >= 0);
    log_->info(
        "model: {} parameters ({} active per token), {} layers, {} experts top-{}; device {}",
        config::count_parameters(cfg_), config::active_parameters_per_token(cfg_),
        cfg_.model.num_layers, cfg_.moe.num_experts, cfg_.moe.top_k, in_.device.str());
    log_->info(
        "data: {} training windows of {} tokens in {} shards; {} steps of {} sequences ({} x "
        "{} micro)",
        in_.train_windows, cfg_.model.seq_len, in_.shards.train.size(), in_.total_steps,
        cfg_.train_batch_size, cfg_.train_micro_batch_size_per_gpu,
        cfg_.gradient_accumulation_steps);
  }

  // Step-0 validation and checkpoint of a fresh run, the loader, the step runner, the reporter.
  void start() {
    checkpointer_ = std::make_unique<checkpoint::Checkpointer>(
        cfg_, store_, model_, optimizer_, scaler_, state_, *log_, resumed_dir_);
    if (remote_) {
      checkpointer_->after_commit([this](const std::string& dir, int64_t step) {
        try {
          remote_->enqueue(dir, step);
          last_enqueued_ = step;
        } catch (const std::exception& e) {  // the local checkpoint stands; the next one retries
          log_->error("checkpoint: cannot stage {} for upload: {}", dir, e.what());
        }
      });
    }
    auto write = [this](const json& rec) {
      metrics_->write(rec);
      sinks_->record(rec);
    };
    summary_.output_dir = cfg_.training.output_dir;
    summary_.steps = in_.total_steps;
    summary_.has_validation = in_.has_valid;
    if (in_.has_valid) {
      summary_.majority_baseline = data::majority_baseline(in_.shards.valid, cfg_.model.seq_len);
    }
    first_step_ = state_.step;
    reporter_ = std::make_unique<train::StepReporter>(cfg_, in_.device, in_.total_steps,
                                                      first_step_, write, *log_);
    const Actions first = cadence_.before_first_step(summary_.resumed_from >= 0);
    if (first.evaluate) {
      summary_.initial_eval = validate();
      reporter_->eval(0, summary_.initial_eval);
    }
    if (first.save != SaveReason::kNone) save(first.save);

    data::LoaderOptions lo;
    lo.seq_len = cfg_.model.seq_len;
    // Every rank reads the global micro-batch (the same windows in the same order for any world
    // size) and trains on its own slice of it.
    lo.batch_size = cfg_.train_micro_batch_size_per_gpu * dp_->size();
    lo.seed = cfg_.training.seed;
    lo.shuffle = cfg_.data.shuffle;
    lo.prefetch = cfg_.data.prefetch;
    lo.reader_threads = static_cast<int>(cfg_.data.reader_threads);
    lo.block_windows = cfg_.data.block_windows;
    if (in_.shards.sources.empty()) {
      loader_ = std::make_unique<data::StreamingLoader>(in_.shards.train, lo, state_.loader,
                                                        tensor_buffers(in_.device));
    } else {
      std::vector<data::BlendPart> parts;
      for (const auto& s : in_.shards.sources) parts.push_back({s.train, s.weight});
      loader_ = std::make_unique<data::BlendedLoader>(std::move(parts), lo, state_.loader,
                                                      tensor_buffers(in_.device));
      source_passes_ = loader_->source_passes();
    }
    StepRunnerOptions so;
    so.micro_batches = cfg_.gradient_accumulation_steps;
    so.max_norm = cfg_.gradient_clipping > 0 ? cfg_.gradient_clipping
                                             : std::numeric_limits<double>::infinity();
    so.bf16 = in_.bf16;
    so.fp16 = in_.fp16;
    so.sync_for_timing = cfg_.wall_clock_breakdown && in_.device.is_cuda();
    so.dp = dp_.get();
    dp_->start(model_);  // the gradient reduction that runs inside the backward, if any
    runner_ =
        make_step_runner(model_, cfg_, optimizer_, scaler_, so, in_.device, state_.step, *log_);
    install_signal_handlers();
    sd_notify(0, "READY=1");
    open_trace();
    run_start_ = Clock::now();
    lap_start_ = run_start_;
    reporter_->start_clock();  // rates and ETA count from the first step
  }

  // Step time: wall clock from the previous step's end (the device idle, its record written)
  // to this step's end, so batch fetch, loss scaling, clipping, the optimizer, host syncs and
  // the previous step's reporting all count, as for consecutive step starts. Validation and
  // checkpoints between steps are not a step's time: after_step restarts the lap after them.
  double lap() {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - lap_start_).count();
    lap_start_ = now;
    return s;
  }

  // One optimizer step (0-based `step`); false when the run stops after it.
  bool train_step(int64_t step) {
    current_step_ = step + 1;
    dp_->set_step(step + 1);  // a failed collective names the ranks behind
    TORCH_CHECK_WITH(OutOfMemoryError, step + 1 != fault_injection().fake_oom_at_step,
                     "out of memory (MOE_TEST_FAKE_OOM_AT_STEP)");
    const bool profiled =
        cfg_.flops_profiler.enabled && step + 1 == cfg_.flops_profiler.profile_step;
    if (profiled) layers::profile::start(in_.device.is_cuda());
    if (trace_) trace_->before_step(step + 1);
    const double lr = schedule_.lr_at(step);
    const double wait_before = loader_->wait_seconds();
    std::vector<data::Batch> hosts;  // host buffers stay ours until this step's copies are done
    StepResult r = runner_->run(step, lr, [&] {
      hosts.push_back(loader_->next());
      state_.loader = hosts.back().state_after;
      const int64_t B = cfg_.train_micro_batch_size_per_gpu;
      return to_device(hosts.back(), in_.device).narrow(0, dp_->rank() * B, B);
    });
    const double gas = static_cast<double>(cfg_.gradient_accumulation_steps);
    const double loss = r.lm_sum / gas;
    bool skipped = r.overflow;
    if (in_.fp16) {
      scaler_.update(r.overflow);
    } else {
      skipped = guard_.skip(r, loss, step + 1, model_, [this] { return store_.candidates(); });
    }
    const auto t_update = Clock::now();
    if (!skipped) {
      runner_->update(lr);
      model_->after_optimizer_step(r.tokens_per_expert);              // the routers' expert biases
      if (const int ms = fault_injection().slow_update_ms; ms > 0) {  // test hook
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
    }
    // The step is over when the device has finished it (AdamW's kernels included): every step
    // waits here, so its time is what the user waits for, not what the host took to enqueue it.
    if (in_.device.is_cuda()) torch::cuda::synchronize();
    const double optimizer_s = std::chrono::duration<double>(Clock::now() - t_update).count();
    state_.step = step + 1;
    state_.tokens = state_.step * cfg_.train_batch_size * cfg_.model.seq_len;
    if (step == first_step_) summary_.first_train_loss = loss;
    summary_.last_train_loss = loss;

    train::StepFigures f;
    f.step = step + 1;
    f.skipped = skipped;
    f.graphed = r.graphed;
    f.loss = loss;
    f.aux_loss = r.aux_sum / gas;
    f.z_loss = r.z_sum / gas;
    f.lr = lr;
    if (!r.overflow) f.grad_norm = r.grad_norm;
    f.tokens = state_.tokens;
    f.dropped = r.dropped;
    f.target_tokens = r.target_tokens;
    f.epoch = state_.loader.epoch;
    f.tokens_per_expert = r.tokens_per_expert;
    f.data_wait_s = loader_->wait_seconds() - wait_before;
    f.source_passes = blend_passes(step + 1);
    f.step_s = lap();
    f.forward_s = r.forward_s;
    f.backward_s = r.backward_s;
    f.optimizer_s = optimizer_s;
    if (in_.fp16) f.loss_scale = scaler_.scale(), f.skipped_steps = scaler_.state().skipped_steps;
    reporter_->step(f);
    if (profiled) report_flops(f);
    // The trace window closes before this step's validation and checkpoint, or after them when
    // the run stops inside it (the table counts only the steps' own spans either way).
    if (trace_ && (trace_->end_step(step + 1) || step + 1 == in_.total_steps)) report_trace();
    const bool more = after_step(step + 1);
    if (trace_ && !more) report_trace();
    return more;
  }

  // training.profile_step_start/end: the torch profiler's window (monitor/step_trace.h).
  void open_trace() {
    const auto& t = cfg_.training;
    if (t.profile_step_start == 0) return;
    const int64_t end = t.profile_step_end > 0 ? t.profile_step_end : t.profile_step_start + 1;
    if (t.profile_step_start > in_.total_steps || end <= state_.step + 1) {
      log_->warn(
          "training.profile_step_start = {}: steps [{}, {}) lie outside this run's steps "
          "{}-{}; nothing is profiled",
          t.profile_step_start, t.profile_step_start, end, state_.step + 1, in_.total_steps);
      return;
    }
    const auto file =
        fs::path(t.output_dir) / "profile" /
        fmt::format("rank{}.steps{}-{}.pt.trace.json", dp_->rank(), t.profile_step_start, end - 1);
    trace_ =
        std::make_unique<monitor::StepTrace>(t.profile_step_start, end, file, in_.device.is_cuda());
  }

  void report_trace() {
    const auto table = trace_->finish();
    if (!table) return;
    std::istringstream lines(*table);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("trace: not written", 0) == 0) {
        log_->warn("{}", line);
      } else {
        log_->info("{}", line);
      }
    }
    trace_.reset();
    lap_start_ = Clock::now();  // stopping the profiler and writing the trace is no step's time
  }

  // flops_profiler: the table of the profiled step, in the log and in output_file.
  void report_flops(const train::StepFigures& f) {
    const auto timings = layers::profile::stop();
    const std::string table = monitor::flops_report(
        cfg_, {f.step, f.step_s, f.forward_s, f.backward_s, f.optimizer_s}, timings);
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) log_->info("{}", line);
    const std::string& file = cfg_.flops_profiler.output_file;
    if (file.empty() || !dp_->writes()) return;
    std::ofstream out(file);
    out << table;
    if (!out) log_->warn("flops_profiler.output_file = {}: cannot write it", file);
  }

  EvalResult validate() { return evaluate_dataset(model_, in_.shards, cfg_, in_.device); }

  // data.blend: each source's pass, with a warning when one wraps around (it ran out before the
  // blend's epoch ended and is read again, in a new order).
  std::vector<int64_t> blend_passes(int64_t step) {
    if (in_.shards.sources.empty()) return {};
    const std::vector<int64_t> now = loader_->source_passes();
    for (size_t s = 0; s < now.size(); ++s) {
      if (now[s] > source_passes_[s]) {
        log_->warn("data.blend[{}] ({}) wrapped around at step {}: pass {} over it begins", s,
                   in_.shards.sources[s].name, step, now[s]);
      }
    }
    source_passes_ = now;
    return now;
  }

  // The cadence's decisions after step `done` (1-based): validate, save, stop.
  bool after_step(int64_t done) {
    const bool evaluated = cadence_.after_step_evaluate(done);
    if (evaluated) {
      EvalResult r = validate();
      reporter_->eval(done, r);
      if (cadence_.is_last(done)) summary_.final_eval = r;
    }
    const StopInputs now =
        agree(checkpointer_->minutes_since_save(),
              std::chrono::duration<double>(Clock::now() - run_start_).count() / 60.0);
    const SaveReason why =
        cadence_.after_step_save(done, now.minutes_since_save, now.checkpoint_request);
    if (why == SaveReason::kSigusr1) g_checkpoint_request.store(false);
    if (why != SaveReason::kNone) save(why);
    if (evaluated || why != SaveReason::kNone) lap_start_ = Clock::now();
    const int signal = now.signal;
    const StopReason stop = cadence_.after_step_stop(done, now.run_minutes, signal);
    if (stop == StopReason::kNone) return true;
    save(Cadence::save_reason(stop, signal));
    if (stop == StopReason::kSignal) {
      log_->warn("stopped by signal after step {}; resume by running the same command", done);
    } else {
      log_->info(
          "exit_interval/exit_duration reached after step {}; run the same command to resume",
          done);
    }
    summary_.interrupted = true;
    summary_.steps = done;
    return false;
  }

  // The inputs of the save and stop decisions, the same on every rank: rank 0's clocks, and a
  // signal or checkpoint request that reached any rank (SIGTERM to one rank stops all of them
  // after the same step, with one checkpoint).
  StopInputs agree(double minutes_since_save, double run_minutes) {
    return dp_->agree(
        {minutes_since_save, run_minutes, g_stop_signal.load(), g_checkpoint_request.load()});
  }

  // Rank 0 writes (with ZeRO, every owner's state streamed to it); every rank returns after.
  void save(SaveReason why) {
    dp_->checkpoint(optimizer_, [&](const checkpoint::OptimizerStream* state) {
      checkpointer_->save(to_string(why), metrics_->lines(), state);
    });
  }

  const config::Config& cfg_;
  const TrainOptions& opt_;
  std::shared_ptr<spdlog::logger> log_;
  std::string pinned_;  // training.cpu_affinity's CPUs, before any thread of the run starts
  std::unique_ptr<DataParallel> dp_;  // a world of one, or the ranks (data_parallel.h)
  RunInputs in_;
  model::TransformerLM model_;
  optim::FusedAdamW optimizer_;
  optim::LrSchedule schedule_;
  optim::LossScaler scaler_;
  checkpoint::CheckpointStore store_;
  std::unique_ptr<checkpoint::RemoteCheckpoints> remote_;  // checkpoint.remote, on rank 0
  int64_t last_enqueued_ = -1;
  Cadence cadence_;
  NonFiniteGuard guard_;
  checkpoint::TrainingState state_;
  TrainSummary summary_;
  std::unique_ptr<monitor::Monitor> sinks_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  std::unique_ptr<data::BatchStream> loader_;
  std::vector<int64_t> source_passes_;  // data.blend: last reported pass of each source
  std::unique_ptr<StepRunner> runner_;
  std::unique_ptr<train::StepReporter> reporter_;
  std::unique_ptr<monitor::StepTrace> trace_;  // training.profile_step_start, while it lasts
  int64_t first_step_ = 0, current_step_ = 0;
  Clock::time_point run_start_, lap_start_;
  std::string resumed_dir_;  // the checkpoint this run continues from; empty on a fresh start
};

}  // namespace

TrainSummary run_training(const config::Config& cfg, const TrainOptions& opt) {
  auto log = spdlog::get("moe-train") ? spdlog::get("moe-train") : spdlog::default_logger();
  const config::Config settled = settle_expert_offload(cfg, pick_device(cfg), *log);
  return TrainingSession(settled, opt).run();
}

}  // namespace moe::train
