#include "moe/config/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "json_reader.h"
#include "moe/util/errors.h"

namespace moe::config {

using nlohmann::json;

json parse_json_text(const std::string& text, const std::string& file) {
  try {
    return json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    // nlohmann reports a byte offset; turn it into line:column for editors.
    size_t offset = e.byte == 0 ? 0 : e.byte - 1;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < offset && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    std::string what = e.what();
    // Keep nlohmann's reason (after "parse error ... : ") but drop its own prefix.
    auto pos = what.find(": syntax error");
    std::string reason = pos == std::string::npos ? what : what.substr(pos + 2);
    throw UserError("config: " + file + ":" + std::to_string(line) + ":" + std::to_string(col) +
                    ": invalid JSON: " + reason);
  } catch (const json::exception& e) {
    // E.g. out_of_range for a number like 1e3000 (found by fuzz/fuzz_config.cpp).
    std::string what = e.what();
    auto pos = what.find("] ");
    throw UserError("config: " + file +
                    ": invalid JSON: " + (pos == std::string::npos ? what : what.substr(pos + 2)));
  }
}

json load_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("config: " + path + ": cannot open file for reading");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw UserError("config: " + path + ": file is empty; expected a JSON object");
  }
  json root = parse_json_text(text, path);
  if (!root.is_object()) {
    throw UserError("config: " + path + ": top level is " + std::string(root.type_name()) +
                    "; expected a JSON object");
  }
  return root;
}

void apply_override(json& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw UserError("--set " + assignment + ": expected dotted.key=value");
  }
  std::string key = assignment.substr(0, eq);
  std::string raw = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(raw);
  } catch (const json::exception&) {
    value = raw;  // bare words are strings: --set data.train_path=/data/x.h5
  }
  json* node = &root;
  std::string walked;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part =
        key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw UserError("--set " + assignment + ": empty key segment");
    walked += (walked.empty() ? "" : ".") + part;
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    json& next = (*node)[part];
    if (next.is_null()) next = json::object();
    if (!next.is_object()) {
      throw UserError("--set " + assignment + ": " + walked + " is " + next.type_name() +
                      ", not an object");
    }
    node = &next;
    start = dot + 1;
  }
}

namespace {

void read_sink(ObjectReader r, MonitorSinkConfig& s) {
  r.get("enabled", s.enabled);
  r.get("output_path", s.output_path);
  r.get("job_name", s.job_name);
  r.finish();
}

void read_scheduler(ObjectReader r, SchedulerConfig& s) {
  r.get("type", s.type);
  ObjectReader p = r.child("params");
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    p.get("warmup_min_lr", s.warmup_min_lr);
    p.get("warmup_max_lr", s.warmup_max_lr);
    p.get("warmup_num_steps", s.warmup_num_steps);
    p.get("warmup_type", s.warmup_type);
    if (s.type == "WarmupDecayLR") p.get("total_num_steps", s.total_num_steps);
  } else if (s.type == "WarmupCosineLR") {
    p.get("warmup_min_ratio", s.warmup_min_ratio);
    p.get("cos_min_ratio", s.cos_min_ratio);
    p.get("warmup_num_steps", s.warmup_num_steps);
    p.get("warmup_type", s.warmup_type);
    p.get("total_num_steps", s.total_num_steps);
  } else if (s.type == "LinearWarmupCosineDecay") {
    s.warmup_type = "linear";
    p.get("warmup_num_steps", s.warmup_num_steps);
    p.get("total_num_steps", s.total_num_steps);
    p.get("min_lr", s.min_lr);
  } else if (s.type == "Constant") {
  } else {
    throw UserError("config: " + r.path_of("type") + " = \"" + s.type +
                    "\": expected one of WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                    "LinearWarmupCosineDecay, Constant");
  }
  p.finish();
  r.finish();
}

}  // namespace

Config from_json(const json& root, const std::string& file) {
  Config c;
  c.source_file = file;
  ObjectReader r(&root, "", file);

  r.get("train_batch_size", c.train_batch_size);
  r.get("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu);
  r.get("gradient_accumulation_steps", c.gradient_accumulation_steps);
  {
    ObjectReader o = r.child("optimizer");
    o.get("type", c.optimizer.type);
    ObjectReader p = o.child("params");
    p.get("lr", c.optimizer.lr);
    p.get("betas", c.optimizer.betas);
    p.get("eps", c.optimizer.eps);
    p.get("weight_decay", c.optimizer.weight_decay);
    p.get("decay_norms_and_biases", c.optimizer.decay_norms_and_biases);
    p.accept("torch_adam");  // DeepSpeed implementation switches: no meaning here
    p.accept("adam_w_mode");
    p.finish();
    o.finish();
  }
  read_scheduler(r.child("scheduler"), c.scheduler);
  {
    ObjectReader f = r.child("fp16");
    f.get("enabled", c.fp16.enabled);
    f.get("loss_scale", c.fp16.loss_scale);
    f.get("initial_scale_power", c.fp16.initial_scale_power);
    f.get("loss_scale_window", c.fp16.loss_scale_window);
    f.get("hysteresis", c.fp16.hysteresis);
    f.get("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    f.get("min_loss_scale", c.fp16.min_loss_scale);
    f.finish();
  }
  {
    ObjectReader b = r.child("bf16");
    b.get("enabled", c.bf16.enabled);
    b.finish();
  }
  r.get("gradient_clipping", c.gradient_clipping);
  r.get("steps_per_print", c.steps_per_print);
  r.get("wall_clock_breakdown", c.wall_clock_breakdown);
  {
    ObjectReader z = r.child("zero_optimization");
    z.get("stage", c.zero_optimization.stage);
    ObjectReader off = z.child("offload_optimizer");
    off.get("device", c.zero_optimization.offload_optimizer.device);
    off.get("pin_memory", c.zero_optimization.offload_optimizer.pin_memory);
    off.finish();
    // Multi-GPU communication knobs: meaningless on one GPU, accepted so ds_configs load.
    for (const char* k :
         {"allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter",
          "reduce_bucket_size", "contiguous_gradients", "round_robin_gradients"}) {
      if (z.has(k)) c.warnings.push_back(z.path_of(k) + " is a multi-GPU setting; ignored");
      z.accept(k);
    }
    z.finish();
  }
  {
    ObjectReader a = r.child("activation_checkpointing");
    auto& ac = c.activation_checkpointing;
    a.get("partition_activations", ac.partition_activations);
    a.get("cpu_checkpointing", ac.cpu_checkpointing);
    a.get("contiguous_memory_optimization", ac.contiguous_memory_optimization);
    a.get("number_checkpoints", ac.number_checkpoints);
    a.get("synchronize_checkpoint_boundary", ac.synchronize_checkpoint_boundary);
    a.get("profile", ac.profile);
    a.finish();
  }
  read_sink(r.child("tensorboard"), c.tensorboard);
  read_sink(r.child("csv_monitor"), c.csv_monitor);
  for (const char* k : {"prescale_gradients", "gradient_predivide_factor",
                        "communication_data_type", "zero_allow_untested_optimizer"}) {
    if (r.has(k)) c.warnings.push_back(std::string(k) + " is a multi-GPU setting; ignored");
    r.accept(k);
  }
  {
    ObjectReader m = r.child("model");
    m.get("vocab_size", c.model.vocab_size);
    m.get("seq_len", c.model.seq_len);
    m.get("hidden_size", c.model.hidden_size);
    m.get("num_layers", c.model.num_layers);
    m.get("num_heads", c.model.num_heads);
    m.get("dropout", c.model.dropout);
    m.get("init_std", c.model.init_std);
    m.get("norm_eps", c.model.norm_eps);
    m.get("tie_embeddings", c.model.tie_embeddings);
    m.finish();
  }
  {
    ObjectReader m = r.child("moe");
    m.get("num_experts", c.moe.num_experts);
    m.get("top_k", c.moe.top_k);
    m.get("expert_hidden_size", c.moe.expert_hidden_size);
    m.get("score_function", c.moe.score_function);
    m.get("normalize_topk", c.moe.normalize_topk);
    m.get("aux_loss_coeff", c.moe.aux_loss_coeff);
    m.get("z_loss_coeff", c.moe.z_loss_coeff);
    m.get("capacity_factor", c.moe.capacity_factor);
    m.get("expert_dropout", c.moe.expert_dropout);
    m.get("shared_expert_hidden_size", c.moe.shared_expert_hidden_size);
    m.get("router_bias_update_rate", c.moe.router_bias_update_rate);
    m.get("kernels", c.moe.kernels);
    m.finish();
  }
  {
    ObjectReader d = r.child("data");
    d.get("path", c.data.path);
    d.get("train_path", c.data.train_path);
    d.get("valid_path", c.data.valid_path);
    d.get("verify_checksums", c.data.verify_checksums);
    d.get("shuffle", c.data.shuffle);
    d.get("prefetch", c.data.prefetch);
    d.get("reader_threads", c.data.reader_threads);
    d.get("block_windows", c.data.block_windows);
    d.finish();
  }
  {
    ObjectReader t = r.child("training");
    t.get("output_dir", c.training.output_dir);
    t.get("train_iters", c.training.train_iters);
    t.get("epochs", c.training.epochs);
    t.get("eval_interval", c.training.eval_interval);
    t.get("eval_iters", c.training.eval_iters);
    t.get("seed", c.training.seed);
    t.get("device", c.training.device);
    t.get("exit_interval", c.training.exit_interval);
    t.get("max_bad_steps", c.training.max_bad_steps);
    t.get("exit_duration_minutes", c.training.exit_duration_minutes);
    t.get("cuda_graph", c.training.cuda_graph);
    t.finish();
  }
  {
    ObjectReader k = r.child("checkpoint");
    k.get("save_interval", c.checkpoint.save_interval);
    k.get("save_interval_minutes", c.checkpoint.save_interval_minutes);
    k.get("keep_last", c.checkpoint.keep_last);
    k.get("keep_every", c.checkpoint.keep_every);
    k.get("save_initial", c.checkpoint.save_initial);
    k.get("save_final", c.checkpoint.save_final);
    k.get("on_failure", c.checkpoint.on_failure);
    k.finish();
  }
  {
    ObjectReader m = r.child("monitor");
    ObjectReader p = m.child("prometheus");
    p.get("port", c.monitor.prometheus_port);
    p.get("host", c.monitor.prometheus_host);
    p.finish();
    m.get("peak_tflops", c.monitor.peak_tflops);
    m.finish();
  }
  r.accept("$schema");  // lets editors find configs/schema.json
  r.finish();
  return c;
}

namespace {

// Collects the rule violations of validate() in one style: "path = value: rule".
class Rules {
 public:
  explicit Rules(std::string file) : file_(std::move(file)) {}
  template <class T>
  void check(bool ok, const std::string& path, const T& value, const std::string& rule) {
    if (ok) return;
    std::ostringstream v;
    v << value;
    throw UserError("config: " + file_ + ": " + path + " = " + v.str() + ": " + rule);
  }
  void check_one_of(const std::string& path, const std::string& value,
                    std::initializer_list<const char*> options) {
    std::string list;
    for (const char* o : options) {
      if (value == o) return;
      list += (list.empty() ? "" : ", ") + std::string(o);
    }
    throw UserError("config: " + file_ + ": " + path + " = \"" + value + "\": expected one of " +
                    list);
  }

 private:
  std::string file_;
};

void resolve_batch(Config& c, Rules& rules) {
  int64_t& tbs = c.train_batch_size;
  int64_t& mbs = c.train_micro_batch_size_per_gpu;
  int64_t& gas = c.gradient_accumulation_steps;
  rules.check(tbs >= 0, "train_batch_size", tbs, "must be > 0");
  rules.check(mbs >= 0, "train_micro_batch_size_per_gpu", mbs, "must be > 0");
  rules.check(gas >= 0, "gradient_accumulation_steps", gas, "must be > 0");
  // DeepSpeed's rule with world size 1: any two determine the third.
  if (tbs > 0 && mbs > 0 && gas > 0) {
    rules.check(tbs == mbs * gas, "train_batch_size", tbs,
                "must equal train_micro_batch_size_per_gpu (" + std::to_string(mbs) +
                    ") x gradient_accumulation_steps (" + std::to_string(gas) +
                    ") x world size (1)");
  } else if (tbs > 0 && mbs > 0) {
    rules.check(
        tbs % mbs == 0, "train_batch_size", tbs,
        "must be a multiple of train_micro_batch_size_per_gpu (" + std::to_string(mbs) + ")");
    gas = tbs / mbs;
  } else if (tbs > 0 && gas > 0) {
    rules.check(tbs % gas == 0, "train_batch_size", tbs,
                "must be a multiple of gradient_accumulation_steps (" + std::to_string(gas) + ")");
    mbs = tbs / gas;
  } else if (mbs > 0 && gas > 0) {
    tbs = mbs * gas;
  } else if (tbs > 0) {
    mbs = tbs;
    gas = 1;
  } else if (mbs > 0) {
    gas = 1;
    tbs = mbs;
  } else {
    rules.check(false, "train_batch_size", tbs,
                "set train_batch_size or train_micro_batch_size_per_gpu (both missing)");
  }
}

}  // namespace

void validate(Config& c) {
  Rules rules(c.source_file);
  resolve_batch(c, rules);

  rules.check_one_of("optimizer.type", c.optimizer.type, {"AdamW", "Adam"});
  rules.check(c.optimizer.lr > 0, "optimizer.params.lr", c.optimizer.lr, "must be > 0");
  for (int i = 0; i < 2; ++i) {
    rules.check(c.optimizer.betas[i] >= 0 && c.optimizer.betas[i] < 1,
                "optimizer.params.betas[" + std::to_string(i) + "]", c.optimizer.betas[i],
                "must be in [0, 1)");
  }
  rules.check(c.optimizer.eps > 0, "optimizer.params.eps", c.optimizer.eps, "must be > 0");
  rules.check(c.optimizer.weight_decay >= 0, "optimizer.params.weight_decay",
              c.optimizer.weight_decay, "must be >= 0");

  const auto& s = c.scheduler;
  rules.check(s.warmup_num_steps >= 0, "scheduler.params.warmup_num_steps", s.warmup_num_steps,
              "must be >= 0");
  rules.check_one_of("scheduler.params.warmup_type", s.warmup_type, {"log", "linear"});
  rules.check(s.total_num_steps >= 0, "scheduler.params.total_num_steps", s.total_num_steps,
              "must be >= 0 (0 = the run's length)");
  rules.check(s.warmup_min_lr >= 0, "scheduler.params.warmup_min_lr", s.warmup_min_lr,
              "must be >= 0");
  rules.check(s.warmup_max_lr > 0, "scheduler.params.warmup_max_lr", s.warmup_max_lr,
              "must be > 0");
  rules.check(s.warmup_min_ratio >= 0 && s.warmup_min_ratio <= 1,
              "scheduler.params.warmup_min_ratio", s.warmup_min_ratio, "must be in [0, 1]");
  rules.check(s.cos_min_ratio >= 0 && s.cos_min_ratio <= 1, "scheduler.params.cos_min_ratio",
              s.cos_min_ratio, "must be in [0, 1]");
  rules.check(s.min_lr >= 0, "scheduler.params.min_lr", s.min_lr, "must be >= 0");
  if (s.total_num_steps > 0 && s.type != "WarmupLR" && s.type != "Constant") {
    rules.check(s.total_num_steps > s.warmup_num_steps, "scheduler.params.total_num_steps",
                s.total_num_steps,
                "must be > warmup_num_steps (" + std::to_string(s.warmup_num_steps) + ")");
  }

  const auto& f = c.fp16;
  rules.check(!(f.enabled && c.bf16.enabled), "fp16.enabled", "true",
              "fp16 and bf16 cannot both be enabled");
  rules.check(f.loss_scale >= 0, "fp16.loss_scale", f.loss_scale, "must be >= 0 (0 = dynamic)");
  rules.check(f.initial_scale_power >= 0 && f.initial_scale_power <= 62, "fp16.initial_scale_power",
              f.initial_scale_power, "must be in [0, 62]");
  rules.check(f.loss_scale_window >= 1, "fp16.loss_scale_window", f.loss_scale_window,
              "must be >= 1");
  rules.check(f.hysteresis >= 1, "fp16.hysteresis", f.hysteresis, "must be >= 1");
  rules.check(f.min_loss_scale > 0, "fp16.min_loss_scale", f.min_loss_scale, "must be > 0");

  rules.check(c.gradient_clipping >= 0, "gradient_clipping", c.gradient_clipping,
              "must be >= 0 (0 = off)");
  rules.check(c.steps_per_print >= 1, "steps_per_print", c.steps_per_print, "must be >= 1");
  rules.check(c.zero_optimization.stage >= 0 && c.zero_optimization.stage <= 3,
              "zero_optimization.stage", c.zero_optimization.stage, "must be 0, 1, 2 or 3");
  if (c.zero_optimization.stage > 0) {
    c.warnings.push_back("zero_optimization.stage = " + std::to_string(c.zero_optimization.stage) +
                         ": ZeRO partitions state across GPUs; with one GPU it changes nothing");
  }
  rules.check_one_of("zero_optimization.offload_optimizer.device",
                     c.zero_optimization.offload_optimizer.device, {"none", "cpu"});
  rules.check(c.activation_checkpointing.number_checkpoints >= 0,
              "activation_checkpointing.number_checkpoints",
              c.activation_checkpointing.number_checkpoints, "must be >= 0");

  const auto& m = c.model;
  rules.check(m.vocab_size >= 2 && m.vocab_size <= (int64_t(1) << 31), "model.vocab_size",
              m.vocab_size, "must be in [2, 2^31]");
  rules.check(m.seq_len >= 1 && m.seq_len <= (1 << 20), "model.seq_len", m.seq_len,
              "must be in [1, 1048576]");
  rules.check(m.hidden_size >= 1 && m.hidden_size <= 65536, "model.hidden_size", m.hidden_size,
              "must be in [1, 65536]");
  rules.check(m.num_layers >= 1 && m.num_layers <= 1024, "model.num_layers", m.num_layers,
              "must be in [1, 1024]");
  rules.check(m.num_heads >= 1, "model.num_heads", m.num_heads, "must be >= 1");
  rules.check(m.hidden_size % m.num_heads == 0, "model.num_heads", m.num_heads,
              "must divide model.hidden_size (" + std::to_string(m.hidden_size) + ")");
  rules.check(m.dropout >= 0 && m.dropout < 1, "model.dropout", m.dropout, "must be in [0, 1)");
  rules.check(m.init_std > 0, "model.init_std", m.init_std, "must be > 0");
  rules.check(m.norm_eps > 0, "model.norm_eps", m.norm_eps, "must be > 0");

  const auto& e = c.moe;
  rules.check(e.num_experts >= 1 && e.num_experts <= 1024, "moe.num_experts", e.num_experts,
              "must be in [1, 1024]");
  rules.check(e.top_k >= 1 && e.top_k <= 8, "moe.top_k", e.top_k, "must be in [1, 8]");
  rules.check(e.top_k <= e.num_experts, "moe.top_k", e.top_k,
              "must be <= moe.num_experts (" + std::to_string(e.num_experts) + ")");
  rules.check(e.expert_hidden_size >= 0, "moe.expert_hidden_size", e.expert_hidden_size,
              "must be >= 0 (0 = derived from hidden_size)");
  rules.check_one_of("moe.score_function", e.score_function, {"softmax", "sigmoid"});
  rules.check(e.aux_loss_coeff >= 0, "moe.aux_loss_coeff", e.aux_loss_coeff, "must be >= 0");
  rules.check(e.z_loss_coeff >= 0, "moe.z_loss_coeff", e.z_loss_coeff, "must be >= 0");
  rules.check(e.capacity_factor >= 0, "moe.capacity_factor", e.capacity_factor,
              "must be >= 0 (0 = dropless)");
  rules.check(e.expert_dropout >= 0 && e.expert_dropout < 1, "moe.expert_dropout", e.expert_dropout,
              "must be in [0, 1)");
  rules.check_one_of("moe.kernels", e.kernels, {"auto", "cuda", "reference"});
  rules.check(e.shared_expert_hidden_size >= 0, "moe.shared_expert_hidden_size",
              e.shared_expert_hidden_size, "must be >= 0 (0 = no shared expert)");
  rules.check(e.router_bias_update_rate >= 0 && e.router_bias_update_rate < 1,
              "moe.router_bias_update_rate", e.router_bias_update_rate,
              "must be in [0, 1) (0 = no expert bias)");

  const auto& t = c.training;
  rules.check(!t.output_dir.empty(), "training.output_dir", "\"\"", "must not be empty");
  rules.check(t.train_iters >= 0, "training.train_iters", t.train_iters,
              "must be >= 0 (0 = derive from epochs)");
  rules.check(t.epochs >= 1, "training.epochs", t.epochs, "must be >= 1");
  rules.check(t.eval_interval >= 0, "training.eval_interval", t.eval_interval,
              "must be >= 0 (0 = only at the end)");
  rules.check(t.eval_iters >= 1, "training.eval_iters", t.eval_iters, "must be >= 1");
  rules.check_one_of("training.device", t.device, {"auto", "cpu", "cuda"});
  rules.check(t.max_bad_steps >= 1, "training.max_bad_steps", t.max_bad_steps, "must be >= 1");
  rules.check(t.exit_interval >= 0, "training.exit_interval", t.exit_interval,
              "must be >= 0 (0 = off)");
  rules.check(t.exit_duration_minutes >= 0, "training.exit_duration_minutes",
              t.exit_duration_minutes, "must be >= 0 (0 = off)");
  rules.check(c.monitor.prometheus_port >= 0 && c.monitor.prometheus_port <= 65535,
              "monitor.prometheus.port", c.monitor.prometheus_port,
              "must be in [0, 65535] (0 = off)");
  rules.check(c.monitor.peak_tflops >= 0, "monitor.peak_tflops", c.monitor.peak_tflops,
              "must be >= 0 (0 = known GPUs only)");
  rules.check(!c.monitor.prometheus_host.empty(), "monitor.prometheus.host", "\"\"",
              "must name an address to bind, e.g. 127.0.0.1");
  const auto& k = c.checkpoint;
  rules.check(k.save_interval >= 0, "checkpoint.save_interval", k.save_interval,
              "must be >= 0 (0 = off)");
  rules.check(k.save_interval_minutes >= 0, "checkpoint.save_interval_minutes",
              k.save_interval_minutes, "must be >= 0 (0 = off)");
  rules.check_one_of("checkpoint.on_failure", k.on_failure, {"stop", "continue"});
  rules.check(k.keep_last >= 1, "checkpoint.keep_last", k.keep_last, "must be >= 1");
  rules.check(k.keep_every >= 0, "checkpoint.keep_every", k.keep_every, "must be >= 0 (0 = none)");

  const auto& d = c.data;
  rules.check(!d.path.empty() || !d.train_path.empty(), "data.path", "\"\"",
              "set data.path (a prepare-data directory) or data.train_path (HDF5 shards)");
  rules.check(d.path.empty() || d.train_path.empty(), "data.train_path", "\"" + d.train_path + "\"",
              "give data.path or data.train_path, not both");
  rules.check(d.path.empty() || d.valid_path.empty(), "data.valid_path", "\"" + d.valid_path + "\"",
              "with data.path the validation split comes from its manifest");
  rules.check(d.prefetch >= 1 && d.prefetch <= 1024, "data.prefetch", d.prefetch,
              "must be in [1, 1024]");
  rules.check(d.reader_threads >= 1 && d.reader_threads <= 64, "data.reader_threads",
              d.reader_threads, "must be in [1, 64]");
  rules.check(d.block_windows >= 1, "data.block_windows", d.block_windows, "must be >= 1");
}

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  json root = load_json_file(path);
  for (const auto& o : overrides) apply_override(root, o);
  Config c = from_json(root, path);
  validate(c);
  return c;
}

json to_json(const Config& c) {
  json j;
  j["train_batch_size"] = c.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  j["optimizer"] = {{"type", c.optimizer.type},
                    {"params",
                     {{"lr", c.optimizer.lr},
                      {"betas", c.optimizer.betas},
                      {"eps", c.optimizer.eps},
                      {"weight_decay", c.optimizer.weight_decay},
                      {"decay_norms_and_biases", c.optimizer.decay_norms_and_biases}}}};
  const auto& s = c.scheduler;
  json sp;
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    sp = {{"warmup_min_lr", s.warmup_min_lr},
          {"warmup_max_lr", s.warmup_max_lr},
          {"warmup_num_steps", s.warmup_num_steps},
          {"warmup_type", s.warmup_type}};
    if (s.type == "WarmupDecayLR") sp["total_num_steps"] = s.total_num_steps;
  } else if (s.type == "WarmupCosineLR") {
    sp = {{"warmup_min_ratio", s.warmup_min_ratio},
          {"cos_min_ratio", s.cos_min_ratio},
          {"warmup_num_steps", s.warmup_num_steps},
          {"warmup_type", s.warmup_type},
          {"total_num_steps", s.total_num_steps}};
  } else if (s.type == "LinearWarmupCosineDecay") {
    sp = {{"warmup_num_steps", s.warmup_num_steps},
          {"total_num_steps", s.total_num_steps},
          {"min_lr", s.min_lr}};
  } else {
    sp = json::object();
  }
  j["scheduler"] = {{"type", s.type}, {"params", sp}};
  j["fp16"] = {{"enabled", c.fp16.enabled},
               {"loss_scale", c.fp16.loss_scale},
               {"initial_scale_power", c.fp16.initial_scale_power},
               {"loss_scale_window", c.fp16.loss_scale_window},
               {"hysteresis", c.fp16.hysteresis},
               {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
               {"min_loss_scale", c.fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", c.bf16.enabled}};
  j["gradient_clipping"] = c.gradient_clipping;
  j["steps_per_print"] = c.steps_per_print;
  j["wall_clock_breakdown"] = c.wall_clock_breakdown;
  j["zero_optimization"] = {{"stage", c.zero_optimization.stage},
                            {"offload_optimizer",
                             {{"device", c.zero_optimization.offload_optimizer.device},
                              {"pin_memory", c.zero_optimization.offload_optimizer.pin_memory}}}};
  const auto& ac = c.activation_checkpointing;
  j["activation_checkpointing"] = {
      {"partition_activations", ac.partition_activations},
      {"cpu_checkpointing", ac.cpu_checkpointing},
      {"contiguous_memory_optimization", ac.contiguous_memory_optimization},
      {"number_checkpoints", ac.number_checkpoints},
      {"synchronize_checkpoint_boundary", ac.synchronize_checkpoint_boundary},
      {"profile", ac.profile}};
  for (auto [name, sink] :
       {std::pair{"tensorboard", &c.tensorboard}, std::pair{"csv_monitor", &c.csv_monitor}}) {
    j[name] = {{"enabled", sink->enabled},
               {"output_path", sink->output_path},
               {"job_name", sink->job_name}};
  }
  const auto& m = c.model;
  j["model"] = {{"vocab_size", m.vocab_size},
                {"seq_len", m.seq_len},
                {"hidden_size", m.hidden_size},
                {"num_layers", m.num_layers},
                {"num_heads", m.num_heads},
                {"dropout", m.dropout},
                {"init_std", m.init_std},
                {"norm_eps", m.norm_eps},
                {"tie_embeddings", m.tie_embeddings}};
  const auto& e = c.moe;
  j["moe"] = {{"num_experts", e.num_experts},
              {"top_k", e.top_k},
              {"expert_hidden_size", expert_hidden_size(c)},
              {"score_function", e.score_function},
              {"normalize_topk", e.normalize_topk},
              {"aux_loss_coeff", e.aux_loss_coeff},
              {"z_loss_coeff", e.z_loss_coeff},
              {"capacity_factor", e.capacity_factor},
              {"expert_dropout", e.expert_dropout},
              {"shared_expert_hidden_size", e.shared_expert_hidden_size},
              {"router_bias_update_rate", e.router_bias_update_rate},
              {"kernels", e.kernels}};
  j["data"] = {{"path", c.data.path},
               {"train_path", c.data.train_path},
               {"valid_path", c.data.valid_path},
               {"verify_checksums", c.data.verify_checksums},
               {"shuffle", c.data.shuffle},
               {"prefetch", c.data.prefetch},
               {"reader_threads", c.data.reader_threads},
               {"block_windows", c.data.block_windows}};
  const auto& t = c.training;
  j["training"] = {{"output_dir", t.output_dir},
                   {"train_iters", t.train_iters},
                   {"epochs", t.epochs},
                   {"eval_interval", t.eval_interval},
                   {"eval_iters", t.eval_iters},
                   {"seed", t.seed},
                   {"device", t.device},
                   {"exit_interval", t.exit_interval},
                   {"max_bad_steps", t.max_bad_steps},
                   {"exit_duration_minutes", t.exit_duration_minutes},
                   {"cuda_graph", t.cuda_graph}};
  const auto& k = c.checkpoint;
  j["checkpoint"] = {
      {"save_interval", k.save_interval}, {"save_interval_minutes", k.save_interval_minutes},
      {"keep_last", k.keep_last},         {"keep_every", k.keep_every},
      {"save_initial", k.save_initial},   {"save_final", k.save_final},
      {"on_failure", k.on_failure}};
  j["monitor"] = {
      {"prometheus", {{"port", c.monitor.prometheus_port}, {"host", c.monitor.prometheus_host}}},
      {"peak_tflops", c.monitor.peak_tflops}};
  return j;
}

int64_t expert_hidden_size(const Config& c) {
  if (c.moe.expert_hidden_size > 0) return c.moe.expert_hidden_size;
  // SwiGLU convention (LLaMA): 2/3 of 4h, rounded up to a multiple of 64.
  int64_t h = (8 * c.model.hidden_size) / 3;
  return ((h + 63) / 64) * 64;
}

int64_t count_parameters(const Config& c) {
  const int64_t d = c.model.hidden_size, L = c.model.num_layers, V = c.model.vocab_size;
  const int64_t f = expert_hidden_size(c), E = c.moe.num_experts;
  int64_t per_layer = 4 * d * d        // qkv + out projections
                      + 2 * d          // two RMSNorm weights
                      + d * E          // router
                      + E * 3 * d * f  // SwiGLU experts
                      + 3 * d * c.moe.shared_expert_hidden_size;
  int64_t embed = V * d + c.model.seq_len * d;
  int64_t head = c.model.tie_embeddings ? 0 : V * d;
  return L * per_layer + embed + head + d;  // + final norm
}

int64_t active_parameters_per_token(const Config& c) {
  const int64_t d = c.model.hidden_size, L = c.model.num_layers;
  const int64_t f = expert_hidden_size(c);
  return L * (4 * d * d + d * c.moe.num_experts + c.moe.top_k * 3 * d * f +
              3 * d * c.moe.shared_expert_hidden_size) +
         c.model.vocab_size * d;
}

}  // namespace moe::config
