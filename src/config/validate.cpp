// validate(): the batch triple first, then each key's rule from the field lists, then the rules
// that relate several keys. Every violation reads "config: FILE: path = value: rule".
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "fields.h"
#include "moe/config/config.h"
#include "moe/config/lora.h"
#include "moe/util/cpu_list.h"
#include "moe/util/errors.h"
#include "moe/util/s3_client.h"

namespace moe::config {

namespace {

template <class T>
std::string shown(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return "\"" + value + "\"";
  } else {
    std::ostringstream v;
    v << value;
    return v.str();
  }
}

// Rules relating several keys, in one style: "path = value: rule".
class Rules {
 public:
  explicit Rules(std::string file) : file_(std::move(file)) {}
  template <class T>
  void check(bool ok, const std::string& path, const T& value, const std::string& rule) const {
    if (!ok) throw UserError("config: " + file_ + ": " + path + " = " + shown(value) + ": " + rule);
  }

 private:
  std::string file_;
};

// Walks the field lists checking each key's own rule.
class RuleChecker {
 public:
  explicit RuleChecker(const Rules& rules) : rules_(rules) {}

  template <class T>
  void field(std::string_view key, const T& value, const Rule& rule = {}, bool = true) {
    if (rule.kind == Rule::Kind::kNone) return;
    if constexpr (std::is_same_v<T, std::vector<BlendSource>>) {
      return;  // its entries: check_blend()
    } else if constexpr (std::is_same_v<T, std::array<double, 2>> ||
                         std::is_same_v<T, std::vector<int64_t>> ||
                         std::is_same_v<T, std::vector<std::string>>) {
      for (size_t i = 0; i < value.size(); ++i) {
        rules_.check(rule.allows(value[i]), paths_.of(key) + "[" + std::to_string(i) + "]",
                     value[i], rule.describe());
      }
    } else {
      rules_.check(rule.allows(value), paths_.of(key), value, rule.describe());
    }
  }

  template <class F>
  void object(std::string_view key, F&& visit) {
    paths_.push(key);
    visit();
    paths_.pop();
  }

  void ignored(std::string_view) {}
  void multi_gpu(std::string_view) {}
  void no_effect(std::string_view, std::string_view) {}
  void refused(std::string_view, std::string_view) {}

 private:
  const Rules& rules_;
  PathStack paths_;
};

void resolve_batch(Config& c, const Rules& rules) {
  int64_t& tbs = c.train_batch_size;
  int64_t& mbs = c.train_micro_batch_size_per_gpu;
  int64_t& gas = c.gradient_accumulation_steps;
  rules.check(tbs >= 0, "train_batch_size", tbs, "must be > 0");
  rules.check(mbs >= 0, "train_micro_batch_size_per_gpu", mbs, "must be > 0");
  rules.check(gas >= 0, "gradient_accumulation_steps", gas, "must be > 0");
  // DeepSpeed's rule: train_batch_size = micro x accumulation x world size; any two of the
  // three keys determine the third.
  const int64_t w = std::max<int64_t>(1, c.world_size);
  const std::string ws = std::to_string(w);
  if (tbs > 0 && mbs > 0 && gas > 0) {
    rules.check(tbs == mbs * gas * w, "train_batch_size", tbs,
                "must equal train_micro_batch_size_per_gpu (" + std::to_string(mbs) +
                    ") x gradient_accumulation_steps (" + std::to_string(gas) + ") x world size (" +
                    ws + ")");
  } else if (tbs > 0 && mbs > 0) {
    rules.check(tbs % (mbs * w) == 0, "train_batch_size", tbs,
                "must be a multiple of train_micro_batch_size_per_gpu (" + std::to_string(mbs) +
                    ") x world size (" + ws + ")");
    gas = tbs / (mbs * w);
  } else if (tbs > 0 && gas > 0) {
    rules.check(tbs % (gas * w) == 0, "train_batch_size", tbs,
                "must be a multiple of gradient_accumulation_steps (" + std::to_string(gas) +
                    ") x world size (" + ws + ")");
    mbs = tbs / (gas * w);
  } else if (mbs > 0 && gas > 0) {
    tbs = mbs * gas * w;
  } else if (tbs > 0) {
    rules.check(tbs % w == 0, "train_batch_size", tbs,
                "must be a multiple of the world size (" + ws + ")");
    mbs = tbs / w;
    gas = 1;
  } else if (mbs > 0) {
    gas = 1;
    tbs = mbs * w;
  } else {
    rules.check(false, "train_batch_size", tbs,
                "set train_batch_size or train_micro_batch_size_per_gpu (both missing)");
  }
}

// After the per-key rules, so each key is in its own range (num_heads >= 1 before dividing).
// data.blend: alone (not with path, train_path, valid_path), each entry a path and a finite
// weight > 0, names unique (a missing name becomes the path's last part).
void check_blend(DataConfig& d, const Rules& rules) {
  rules.check(d.path.empty() && d.train_path.empty() && d.valid_path.empty(), "data.blend",
              std::string("[...]"),
              "give data.blend or data.path / data.train_path / data.valid_path, not both");
  for (size_t i = 0; i < d.blend.size(); ++i) {
    BlendSource& s = d.blend[i];
    const std::string at = "data.blend[" + std::to_string(i) + "]";
    rules.check(!s.path.empty(), at + ".path", s.path,
                "each source needs a path (a prepare-data directory or HDF5 shards)");
    rules.check(s.weight > 0 && std::isfinite(s.weight), at + ".weight", s.weight,
                "must be a finite number > 0");
    if (s.name.empty()) {
      std::filesystem::path p(s.path);
      s.name = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
    }
    for (size_t j = 0; j < i; ++j) {
      rules.check(d.blend[j].name != s.name, at + ".name", s.name,
                  "two sources share this name; give each a distinct \"name\"");
    }
  }
}

// lora: the linear mixers' projections and the shared expert's gate name something this model has
// (Gated DeltaNet's split or fused input projections; out_proj of Gated DeltaNet or Mamba-2).
void check_mixer_lora_targets(const Config& c, const Rules& rules) {
  bool linear = false, mamba = false;
  for (int64_t i = 0; i < c.model.num_layers; ++i) {
    linear = linear || (has_mixer(c, i) && linear_attention_layer(c, i));
    mamba = mamba || (has_mixer(c, i) && mamba_layer(c, i));
  }
  const bool fused = c.model.linear_fused_projections;
  for (const auto& name : c.lora.target_modules) {
    const bool split_name =
        name == "in_proj_qkv" || name == "in_proj_z" || name == "in_proj_b" || name == "in_proj_a";
    const bool fused_name = name == "in_proj_qkvz" || name == "in_proj_ba";
    if (split_name || fused_name) {
      rules.check(linear, "lora.target_modules", name,
                  "is a Gated DeltaNet projection (Qwen3.5, Qwen3-Next); this model has no "
                  "linear_attention layers");
      rules.check(!linear || split_name != fused, "lora.target_modules", name,
                  fused ? "this model's linear attention fuses its input projections "
                          "(model.linear_fused_projections): in_proj_qkvz and in_proj_ba"
                        : "this model's linear attention splits its input projections: "
                          "in_proj_qkv, in_proj_z, in_proj_b and in_proj_a");
    }
    rules.check(name != "shared_expert_gate" ||
                    (c.moe.shared_expert_hidden_size > 0 && c.moe.shared_expert_gate),
                "lora.target_modules", name,
                "needs a sigmoid-gated shared expert (moe.shared_expert_gate with "
                "moe.shared_expert_hidden_size > 0: Qwen2-MoE, Qwen3-Next, Qwen3.5)");
    rules.check(name != "out_proj" || linear || mamba, "lora.target_modules", name,
                "is the output projection of Gated DeltaNet and Mamba-2 mixers; this model has "
                "neither (attention's is o_proj)");
    rules.check(name != "in_proj" || mamba, "lora.target_modules", name,
                "is the Mamba-2 mixers' input projection; this model has no mamba layers" +
                    std::string(linear ? " (its linear attention's: in_proj_qkv, in_proj_z, "
                                         "in_proj_b, in_proj_a or in_proj_qkvz, in_proj_ba)"
                                       : ""));
  }
}

// lora: names it knows, the experts' gate and up together, what a frozen base cannot do.
void check_lora(const Config& c, const Rules& rules) {
  const LoraConfig& l = c.lora;
  auto one_of = [&](const std::vector<std::string>& names, const std::string& v) {
    return std::find(names.begin(), names.end(), v) != names.end();
  };
  if (!lora_enabled(c)) return;
  rules.check(!l.target_modules.empty(), "lora.target_modules", std::string("[]"),
              "name at least one projection to adapt (e.g. [\"q_proj\", \"v_proj\"])");
  // The experts' gate and up are one stacked parameter: PEFT refuses one without the other.
  // Non-gated (relu2) experts have up alone, and no gate to name.
  const bool gated = c.moe.activation != ExpertActivation::kRelu2;
  rules.check(gated || !one_of(l.target_modules, "gate_proj"), "lora.target_modules",
              std::string("gate_proj"), "the relu2 experts have no gate (up_proj and down_proj)");
  for (auto [a, b] : {std::pair{"gate_proj", "up_proj"}, std::pair{"w1", "w3"}}) {
    if (!gated) break;
    const bool has_a = one_of(l.target_modules, a), has_b = one_of(l.target_modules, b);
    rules.check(has_a == has_b, "lora.target_modules", std::string(has_a ? a : b),
                std::string("the experts hold ") + a + " and " + b +
                    " as one stacked gate_up_proj (transformers >= 5): list both, or gate_up_proj "
                    "for one rank-r adapter over the pair");
  }
  rules.check(!c.training.cuda_graph, "training.cuda_graph", "true",
              "is not supported with LoRA (lora.r > 0) yet; set it to false");
  // The projections one attention form has and the other has not.
  const bool mla = latent_attention(c), q_lora = c.model.q_lora_rank > 0;
  for (const auto& name : l.target_modules) {
    const bool fused_only = name == "k_proj" || name == "v_proj";
    const bool mla_only = name == "q_a_proj" || name == "q_b_proj" ||
                          name == "kv_a_proj_with_mqa" || name == "kv_b_proj";
    rules.check(!(mla && fused_only), "lora.target_modules", name,
                "latent attention (model.kv_lora_rank > 0) has no k_proj / v_proj: its keys and "
                "values come from kv_a_proj_with_mqa and kv_b_proj");
    rules.check(mla || !mla_only, "lora.target_modules", name,
                "is a latent-attention projection (DeepSeek-V2/V3); this model has q/k/v_proj");
    rules.check(!(mla && q_lora && name == "q_proj"), "lora.target_modules", name,
                "with model.q_lora_rank > 0 the queries come from q_a_proj and q_b_proj");
    rules.check(!(mla && !q_lora && (name == "q_a_proj" || name == "q_b_proj")),
                "lora.target_modules", name,
                "with model.q_lora_rank = 0 the queries come from one q_proj");
  }
  check_mixer_lora_targets(c, rules);
}

// quantization: a 4-bit frozen base is the base of a LoRA run (QLoRA), never trained weights.
void check_quantization(const Config& c, const Rules& rules) {
  const QuantizationConfig& q = c.quantization;
  rules.check(!q.load_in_8bit, "quantization.load_in_8bit", "true",
              "LLM.int8() bases are not supported; use load_in_4bit (nf4 or fp4)");
  if (q.quant_method == QuantMethod::kMxfp4) {
    rules.check(!q.load_in_4bit, "quantization.quant_method", "mxfp4",
                "holds the experts in MXFP4; load_in_4bit (bitsandbytes) is another method: "
                "set one of them");
    rules.check(lora_enabled(c), "quantization.quant_method", "mxfp4",
                "quantizes the frozen base of a LoRA run: set lora.r > 0");
    rules.check(c.model.hidden_size % 32 == 0 && expert_hidden_size(c) % 32 == 0,
                "quantization.quant_method", "mxfp4",
                "needs model.hidden_size and the experts' width to be multiples of 32 (MXFP4 "
                "blocks)");
    rules.check(c.moe.expert_parallel_size <= 1, "quantization.quant_method", "mxfp4",
                "is not supported with moe.expert_parallel_size > 1 yet");
    return;
  }
  if (!q.load_in_4bit) return;
  rules.check(lora_enabled(c), "quantization.load_in_4bit", "true",
              "quantizes the frozen base of a LoRA run: set lora.r > 0 (a 4-bit matrix has no "
              "gradient to train)");
  rules.check(c.moe.expert_parallel_size <= 1, "quantization.load_in_4bit", "true",
              "is not supported with moe.expert_parallel_size > 1 yet");
}

// moe.offload_experts on: the routed experts of a LoRA run are frozen (lora.modules_to_save
// cannot name them) and move to host memory.
void check_offload_experts(const Config& c, const Rules& rules) {
  if (c.moe.offload_experts != OffloadExperts::kOn) return;
  rules.check(lora_enabled(c), "moe.offload_experts", "on",
              "moves the frozen routed experts of a LoRA run to host memory: set lora.r > 0 "
              "(experts that train need their weights on the device)");
  rules.check(c.world_size <= 1, "moe.offload_experts", "on",
              "is not supported with several processes yet; set it off");
}

// moe.expert_parallel_size: divides the experts and the world; what EP does not combine with yet.
void check_expert_parallel(Config& c, const Rules& rules) {
  const int64_t ep = c.moe.expert_parallel_size;
  if (ep <= 1) return;
  rules.check(c.moe.num_experts % ep == 0, "moe.expert_parallel_size", ep,
              "must divide moe.num_experts (" + std::to_string(c.moe.num_experts) + ")");
  if (c.world_size <= 1) {
    c.warnings.push_back("moe.expert_parallel_size = " + std::to_string(ep) +
                         " with one process: every expert stays on this process");
    return;
  }
  rules.check(c.world_size % ep == 0, "moe.expert_parallel_size", ep,
              "must divide the world size (" + std::to_string(c.world_size) + " processes)");
  const std::string why = "is not supported with moe.expert_parallel_size > 1 yet";
  rules.check(!lora_enabled(c), "lora.r", c.lora.r, why + "; use moe.expert_parallel_size 1");
  rules.check(c.zero_optimization.offload_optimizer.device == OffloadDevice::kNone,
              "zero_optimization.offload_optimizer.device",
              std::string(name(c.zero_optimization.offload_optimizer.device)), why);
  rules.check(!c.training.cuda_graph, "training.cuda_graph", "true", why + "; set it to false");
  const auto& o = c.optimizer;
  rules.check(o.exp_avg_dtype != StateDtype::k8Bit && o.exp_avg_sq_dtype != StateDtype::k8Bit,
              "optimizer.exp_avg_dtype",
              std::string(name(o.exp_avg_dtype)) + " / " + std::string(name(o.exp_avg_sq_dtype)),
              "8-bit moments " + why + "; use fp32 or bf16");
}

// DeepSpeed's activation-checkpointing switches that change nothing here: said when asked for.
void warn_inert_checkpointing_keys(Config& c) {
  const auto& a = c.activation_checkpointing;
  const std::pair<bool, const char*> inert[] = {
      {a.partition_activations,
       "partition_activations = true has no effect: it splits checkpoints across model-parallel "
       "ranks, and there is no model parallelism here"},
      {a.contiguous_memory_optimization,
       "contiguous_memory_optimization = true has no effect: it is for partitioned checkpoints"},
      {a.synchronize_checkpoint_boundary,
       "synchronize_checkpoint_boundary = true has no effect: it is a profiling aid"},
      {a.profile, "profile = true has no effect: use flops_profiler or wall_clock_breakdown"},
  };
  for (const auto& [on, what] : inert) {
    if (on) c.warnings.push_back(std::string("activation_checkpointing.") + what);
  }
}

// training.param_dtype / optimizer.main_params_dtype: 16-bit working weights are the compute
// dtype of an enabled bf16/fp16 section; a bf16 master is those weights themselves.
void check_weight_precision(const Config& c, const Rules& rules) {
  const ParamDtype w = c.training.param_dtype, master = c.optimizer.main_params_dtype;
  if (w == ParamDtype::kBf16) {
    rules.check(c.bf16.enabled, "training.param_dtype", "bf16", "needs bf16.enabled = true");
  }
  if (w == ParamDtype::kFp16) {
    rules.check(c.fp16.enabled, "training.param_dtype", "fp16", "needs fp16.enabled = true");
  }
  if (w != ParamDtype::kFp32) {
    rules.check(!lora_enabled(c), "training.param_dtype", name(w).data(),
                "LoRA keeps its frozen base in the compute dtype already and trains fp32 "
                "adapters; leave training.param_dtype at fp32 with lora.r > 0");
    rules.check(c.world_size <= 1, "training.param_dtype", name(w).data(),
                "16-bit working weights train in one process for now; use fp32 with several "
                "data-parallel ranks");
  }
  rules.check(master != ParamDtype::kFp16, "optimizer.main_params_dtype", "fp16",
              "expected fp32 or bf16");
  if (master == ParamDtype::kBf16) {
    rules.check(w == ParamDtype::kBf16, "optimizer.main_params_dtype", "bf16",
                "a bf16 master is the bf16 working weights themselves: needs "
                "training.param_dtype = bf16");
    rules.check(c.zero_optimization.offload_optimizer.device == OffloadDevice::kNone,
                "optimizer.main_params_dtype", "bf16",
                "offload keeps an fp32 master on the host; use main_params_dtype fp32 with "
                "zero_optimization.offload_optimizer");
  }
}

// s3:// locations: well formed before anything touches the network.
void check_remote_paths(const Config& c, const Rules& rules) {
  auto url = [&](const std::string& key, const std::string& v, bool required) {
    if (v.empty() || (!required && !s3::is_s3_url(v))) return;
    try {
      s3::parse_url(v, key);
    } catch (const UserError& e) {
      const std::string what = e.what();
      rules.check(false, key, v, what.substr(what.find(v) + v.size() + 2));
    }
  };
  url("checkpoint.remote", c.checkpoint.remote, true);
  url("data.path", c.data.path, false);
  for (size_t i = 0; i < c.data.blend.size(); ++i) {
    url("data.blend[" + std::to_string(i) + "].path", c.data.blend[i].path, false);
  }
  rules.check(!s3::is_s3_url(c.data.train_path), "data.train_path", c.data.train_path,
              "s3:// works for prepare-data datasets (their manifest carries the checksums each "
              "fetched shard is verified against); give it as data.path");
  rules.check(!s3::is_s3_url(c.data.valid_path), "data.valid_path", c.data.valid_path,
              "s3:// works for prepare-data datasets; give it as data.path (its valid split)");
}

void check_schedule(const Config& c, const Rules& rules) {
  const auto& s = c.scheduler;
  if (s.total_num_steps > 0 && s.type != SchedulerType::kWarmupLR &&
      s.type != SchedulerType::kConstant) {
    rules.check(s.total_num_steps > s.warmup_num_steps, "scheduler.params.total_num_steps",
                s.total_num_steps,
                "must be > warmup_num_steps (" + std::to_string(s.warmup_num_steps) + ")");
  }
}

void check_zero(Config& c, const Rules& rules) {
  const int64_t stage = c.zero_optimization.stage;
  if (stage > 0 && c.world_size <= 1) {
    c.warnings.push_back("zero_optimization.stage = " + std::to_string(stage) +
                         ": ZeRO partitions state across GPUs; with one GPU it changes nothing");
  } else if (stage > 0) {
    rules.check(stage < 3, "zero_optimization.stage", stage,
                "stage 3 (parameter partitioning) is not supported; use 0, 1 or 2");
    // The ZeRO checkpoint gathers fp32 moments from their owners (parallel/zero.cpp).
    const auto& o = c.optimizer;
    rules.check(o.exp_avg_dtype == StateDtype::kFp32 && o.exp_avg_sq_dtype == StateDtype::kFp32,
                "optimizer.exp_avg_dtype",
                std::string(name(o.exp_avg_dtype)) + " / " + std::string(name(o.exp_avg_sq_dtype)),
                "ZeRO stage 1-2 with several ranks keeps fp32 moments for now; use "
                "zero_optimization.stage 0 or fp32 moments");
  }
}

// What data parallelism cannot keep independent of the world size (docs/distributed.md):
// dropout masks come from each rank's own RNG stream. (A capacity limit is: the routers rank
// every rank's assignments together, router.cpp.)
void warn_world_size_dependence(Config& c) {
  if (c.world_size > 1) {
    const std::string n = std::to_string(c.world_size);
    if (c.model.dropout > 0 || c.moe.expert_dropout > 0) {
      c.warnings.push_back("model.dropout / moe.expert_dropout > 0 with " + n +
                           " data-parallel ranks: each rank draws its own dropout masks, so "
                           "losses differ (slightly) from a run at another world size");
    }
  }
}

void check_profile_window(const Config& c, const Rules& rules) {
  const auto& t = c.training;
  if (t.profile_step_end > 0) {
    rules.check(t.profile_step_start > 0, "training.profile_step_end", t.profile_step_end,
                "needs training.profile_step_start (the window's first step)");
    rules.check(t.profile_step_end > t.profile_step_start, "training.profile_step_end",
                t.profile_step_end,
                "must be > training.profile_step_start (" + std::to_string(t.profile_step_start) +
                    "): the window is [start, end)");
  }
}

// Heads that divide the hidden size and one another; rotary positions on an even head.
void check_attention_heads(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  rules.check(m.padding_idx < m.vocab_size, "model.padding_idx", m.padding_idx,
              "must be < model.vocab_size (" + std::to_string(m.vocab_size) + ")");
  if (m.head_dim == 0 && m.kv_lora_rank == 0) {  // latent attention: explicit head widths
    rules.check(m.hidden_size % m.num_heads == 0, "model.num_heads", m.num_heads,
                "must divide model.hidden_size (" + std::to_string(m.hidden_size) + ")");
  }
  rules.check(m.num_heads % key_value_heads(c) == 0, "model.num_key_value_heads",
              m.num_key_value_heads,
              "must divide model.num_heads (" + std::to_string(m.num_heads) + ")");
  if (m.rope_theta > 0) {
    rules.check(head_dim(c) % 2 == 0, "model.head_dim", head_dim(c),
                "must be even with rotary positions (model.rope_theta > 0)");
  }
}

void check_rope_scaling(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  const auto& rs = m.rope_scaling;
  if (rs.type != RopeScalingType::kNone) {
    rules.check(m.rope_theta > 0, "model.rope_scaling.type", std::string(name(rs.type)),
                "scales rotary positions; model.rope_theta is 0 (learned positions)");
  }
  if (rs.type == RopeScalingType::kYarn) {
    rules.check(rs.original_max_position_embeddings > 0,
                "model.rope_scaling.original_max_position_embeddings",
                rs.original_max_position_embeddings,
                "must be the pretraining window (> 0) with yarn scaling");
    rules.check(rs.beta_fast >= rs.beta_slow, "model.rope_scaling.beta_fast", rs.beta_fast,
                "must be >= model.rope_scaling.beta_slow (" + shown(rs.beta_slow) + ")");
  }
}

// Which layers are MoE layers: valid dense-layer indices, and at least one MoE layer left.
void check_moe_layers(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  const auto& e = c.moe;
  for (size_t i = 0; i < e.mlp_only_layers.size(); ++i) {
    rules.check(e.mlp_only_layers[i] < m.num_layers,
                "moe.mlp_only_layers[" + std::to_string(i) + "]", e.mlp_only_layers[i],
                "must be a layer index < model.num_layers (" + std::to_string(m.num_layers) + ")");
  }
  rules.check(moe_layer_count(c) > 0, "moe.decoder_sparse_step", e.decoder_sparse_step,
              "leaves no MoE layer (with moe.mlp_only_layers)");
}

// Group-limited routing (DeepSeek-V3's and V2's rules): equal groups of at least
// group_score_experts experts (a group's score is the sum of that many best), enough experts in
// the chosen groups for top_k, and the usual score-then-top-k order.
void check_expert_groups(const MoeConfig& e, const Rules& rules) {
  const std::string experts = "moe.num_experts (" + std::to_string(e.num_experts) + ")";
  rules.check(e.num_experts % e.n_group == 0, "moe.n_group", e.n_group, "must divide " + experts);
  rules.check(e.topk_group <= e.n_group, "moe.topk_group", e.topk_group,
              "must be <= moe.n_group (" + std::to_string(e.n_group) + ")");
  if (e.n_group == 1 || e.num_experts % e.n_group != 0) return;
  const int64_t per_group = e.num_experts / e.n_group;
  rules.check(per_group >= e.group_score_experts, "moe.n_group", e.n_group,
              "leaves " + std::to_string(per_group) +
                  " experts per group; a group's score is the sum of its best " +
                  std::to_string(e.group_score_experts) + " (moe.group_score_experts)");
  rules.check(e.top_k <= e.topk_group * per_group, "moe.top_k", e.top_k,
              "must be <= moe.topk_group x experts per group (" +
                  std::to_string(e.topk_group * per_group) + ")");
  rules.check(!e.softmax_after_topk, "moe.n_group", e.n_group,
              "cannot be combined with moe.softmax_after_topk");
}

// Multi-head latent attention (DeepSeek-V2/V3): whole dimensions, an even rotary part, and none
// of the per-head features of the fused q/k/v projection.
void check_latent_attention(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  if (m.kv_lora_rank == 0) {
    for (const auto& [key, v] : {std::pair{"model.q_lora_rank", m.q_lora_rank},
                                 {"model.qk_nope_head_dim", m.qk_nope_head_dim},
                                 {"model.qk_rope_head_dim", m.qk_rope_head_dim},
                                 {"model.v_head_dim", m.v_head_dim}}) {
      rules.check(v == 0, key, v, "needs model.kv_lora_rank > 0 (multi-head latent attention)");
    }
    rules.check(!m.rope_interleave || m.rope_theta > 0, "model.rope_interleave", "true",
                "needs rotary positions (model.rope_theta > 0)");
    rules.check(m.rope_scaling.llama_4_scaling_beta == 0, "model.rope_scaling.llama_4_scaling_beta",
                m.rope_scaling.llama_4_scaling_beta,
                "is applied by multi-head latent attention only (Mistral Small 4; "
                "model.kv_lora_rank > 0)");
    return;
  }
  rules.check(m.rope_scaling.llama_4_scaling_beta == 0 ||
                  m.rope_scaling.original_max_position_embeddings > 0,
              "model.rope_scaling.llama_4_scaling_beta", m.rope_scaling.llama_4_scaling_beta,
              "needs model.rope_scaling.original_max_position_embeddings > 0 (the window it "
              "counts in)");
  const std::string mla = "with multi-head latent attention (model.kv_lora_rank > 0)";
  rules.check(m.rope_theta > 0, "model.kv_lora_rank", m.kv_lora_rank,
              "needs rotary positions (model.rope_theta > 0) " + mla);
  rules.check(m.qk_rope_head_dim >= 2 && m.qk_rope_head_dim % 2 == 0, "model.qk_rope_head_dim",
              m.qk_rope_head_dim, "must be even and >= 2 " + mla);
  rules.check(m.v_head_dim >= 1, "model.v_head_dim", m.v_head_dim, "must be >= 1 " + mla);
  rules.check(m.num_key_value_heads == 0 || m.num_key_value_heads == m.num_heads,
              "model.num_key_value_heads", m.num_key_value_heads,
              "must be 0 or model.num_heads " + mla + ": every head has its own keys and values");
  rules.check(m.head_dim == 0, "model.head_dim", m.head_dim,
              "must be 0 " + mla +
                  " (the heads' widths are qk_nope_head_dim + qk_rope_head_dim "
                  "and v_head_dim)");
  rules.check(!m.qk_norm, "model.qk_norm", "true", "is not supported " + mla);
  rules.check(m.clip_qkv == 0, "model.clip_qkv", m.clip_qkv, "is not supported " + mla);
  rules.check(!m.attention_bias && !m.qkv_bias, "model.attention_bias", "true",
              "biases are not supported " + mla);
  rules.check(!m.attention_sinks, "model.attention_sinks", "true", "is not supported " + mla);
  rules.check(m.sliding_window == 0, "model.sliding_window", m.sliding_window,
              "is not supported " + mla);
  rules.check(m.partial_rotary_factor == 1.0, "model.partial_rotary_factor",
              m.partial_rotary_factor,
              "must be 1 " + mla + " (qk_rope_head_dim is the rotary part)");
}

// Sliding-window attention: one known type per layer, and a window where a layer slides.
void check_layer_types(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  if (m.layer_types.empty()) return;
  rules.check(
      static_cast<int64_t>(m.layer_types.size()) == m.num_layers, "model.layer_types",
      std::to_string(m.layer_types.size()) + " entries",
      "needs one entry per layer (model.num_layers = " + std::to_string(m.num_layers) + ")");
  for (size_t i = 0; i < m.layer_types.size(); ++i) {
    const std::string& t = m.layer_types[i];
    const std::string key = "model.layer_types[" + std::to_string(i) + "]";
    if (m.sublayer_blocks) {  // one sublayer per block
      rules.check(t == "mamba" || t == "full_attention" || t == "moe" || t == "mlp", key, t,
                  "expected mamba, full_attention, moe or mlp (model.sublayer_blocks)");
    } else {
      rules.check(t == "full_attention" || t == "sliding_attention" || t == "linear_attention" ||
                      t == "mamba",
                  key, t, "expected full_attention, sliding_attention, linear_attention or mamba");
    }
    rules.check(t != "mamba" || m.mamba_num_heads > 0, key, t,
                "needs model.mamba_num_heads > 0 (the Mamba-2 mixer's shape)");
    rules.check(t != "sliding_attention" || m.sliding_window > 0, key, t,
                "needs model.sliding_window > 0");
    rules.check(t != "linear_attention" || m.linear_num_key_heads > 0, key, t,
                "needs model.linear_num_key_heads > 0 (the Gated DeltaNet's shape)");
  }
}

// Gemma 4's full-attention layers and block: settings that need the layers they apply to.
void check_global_attention(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  bool any_global = false;
  for (int64_t l = 0; l < m.num_layers && !m.layer_types.empty(); ++l) {
    any_global = any_global || global_attention_layer(c, l);
  }
  const std::string why = "needs full_attention layers in model.layer_types";
  rules.check(any_global || m.global_head_dim == 0, "model.global_head_dim", m.global_head_dim,
              why);
  rules.check(any_global || m.global_num_key_value_heads == 0, "model.global_num_key_value_heads",
              m.global_num_key_value_heads, why);
  rules.check(any_global || !m.attention_k_eq_v, "model.attention_k_eq_v", "true", why);
  rules.check(any_global || m.global_rope_theta == 0, "model.global_rope_theta",
              m.global_rope_theta, why);
  rules.check(any_global || m.global_partial_rotary_factor == 1.0,
              "model.global_partial_rotary_factor", m.global_partial_rotary_factor, why);
  const int64_t kv = m.global_num_key_value_heads;
  rules.check(kv == 0 || m.num_heads % kv == 0, "model.global_num_key_value_heads", kv,
              "must divide model.num_heads (" + std::to_string(m.num_heads) + ")");
  const int64_t hd = m.global_head_dim > 0 ? m.global_head_dim : head_dim(c);
  rules.check(hd % 2 == 0 && static_cast<int64_t>(hd * m.global_partial_rotary_factor) >= 2,
              "model.global_partial_rotary_factor", m.global_partial_rotary_factor,
              "the full-attention head (" + std::to_string(hd) +
                  ") needs an even width and at least one rotating pair");
  const bool plain_mixer = !latent_attention(c) && !m.attention_output_gate && !m.attention_sinks;
  rules.check(plain_mixer || !(any_global && (m.attention_k_eq_v || m.global_head_dim > 0)),
              "model.global_head_dim", m.global_head_dim,
              "needs grouped-query attention without latent attention, sinks or output gates");
  rules.check(!c.moe.parallel_dense || m.sandwich_norms, "moe.parallel_dense", "true",
              "needs model.sandwich_norms (each branch has its own output norm)");
  rules.check(!m.attention_k_eq_v || !(m.attention_bias || m.qkv_bias), "model.attention_k_eq_v",
              "true", "cannot be combined with attention biases");
}

// Mamba-2: every width set, heads in whole groups; one-sublayer blocks need their list; no
// positions means no rotary either; relu2's MLPs have no gate (nothing to bias or adapt there).
void check_mamba_and_blocks(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  rules.check(!m.sublayer_blocks || !m.layer_types.empty(), "model.sublayer_blocks", "true",
              "needs model.layer_types (what each block holds)");
  rules.check(!m.no_position_encoding || m.rope_theta == 0, "model.no_position_encoding", "true",
              "needs model.rope_theta = 0 (no rotary positions)");
  rules.check(c.moe.activation != ExpertActivation::kRelu2 || !c.moe.expert_bias, "moe.activation",
              "relu2", "cannot be combined with moe.expert_bias");
  if (m.mamba_num_heads == 0) return;
  const auto positive = [&](int64_t v, const char* key) {
    rules.check(v > 0, std::string("model.") + key, v,
                "must be > 0 with model.mamba_num_heads set");
  };
  positive(m.mamba_head_dim, "mamba_head_dim");
  positive(m.ssm_state_size, "ssm_state_size");
  rules.check(m.mamba_num_heads % m.mamba_n_groups == 0, "model.mamba_n_groups", m.mamba_n_groups,
              "must divide model.mamba_num_heads (" + std::to_string(m.mamba_num_heads) + ")");
  rules.check(m.mamba_dt_max == 0 || m.mamba_dt_max >= m.mamba_dt_min, "model.mamba_dt_max",
              m.mamba_dt_max, "must be 0 (unbounded) or >= model.mamba_dt_min");
}

// Gated DeltaNet: every width set, value heads in whole groups per key head.
void check_linear_attention(const Config& c, const Rules& rules) {
  const auto& m = c.model;
  if (m.linear_num_key_heads == 0) return;
  const auto positive = [&](int64_t v, const char* key) {
    rules.check(v > 0, std::string("model.") + key, v,
                "must be > 0 with model.linear_num_key_heads set");
  };
  positive(m.linear_num_value_heads, "linear_num_value_heads");
  positive(m.linear_key_head_dim, "linear_key_head_dim");
  positive(m.linear_value_head_dim, "linear_value_head_dim");
  rules.check(m.linear_num_value_heads % m.linear_num_key_heads == 0,
              "model.linear_num_value_heads", m.linear_num_value_heads,
              "must be a multiple of model.linear_num_key_heads (" +
                  std::to_string(m.linear_num_key_heads) + ")");
  rules.check(!latent_attention(c), "model.linear_num_key_heads", m.linear_num_key_heads,
              "cannot be combined with latent attention (model.kv_lora_rank)");
}

void check_cpu_affinity(const Config& c, const Rules& rules) {
  if (const std::string& a = c.training.cpu_affinity; !a.empty() && a != "auto") {
    bool ok = true;
    try {
      parse_cpu_list(a, "training.cpu_affinity");
    } catch (const UserError&) {
      ok = false;
    }
    rules.check(ok, "training.cpu_affinity", a,
                "expected \"auto\" or a CPU list such as \"0-7,16-23\"");
  }
}

// The end-of-document id, and one source of training data: a blend, data.path or
// data.train_path.
void check_data_source(Config& c, const Rules& rules) {
  const auto& d = c.data;
  rules.check(!d.reset_attention_at_eod || (d.eod_id >= 0 && d.eod_id < c.model.vocab_size),
              "data.eod_id", d.eod_id,
              "data.reset_attention_at_eod needs the end-of-document id, < model.vocab_size");
  if (!d.blend.empty()) {
    check_blend(c.data, rules);
    return;
  }
  rules.check(!d.path.empty() || !d.train_path.empty(), "data.path", d.path,
              "set data.path (a prepare-data directory), data.train_path (HDF5 shards) or "
              "data.blend");
  rules.check(d.path.empty() || d.train_path.empty(), "data.train_path", d.train_path,
              "give data.path or data.train_path, not both");
  rules.check(d.path.empty() || d.valid_path.empty(), "data.valid_path", d.valid_path,
              "with data.path the validation split comes from its manifest");
}

void check_relations(Config& c, const Rules& rules) {
  check_remote_paths(c, rules);
  check_schedule(c, rules);
  rules.check(!(c.fp16.enabled && c.bf16.enabled), "fp16.enabled", "true",
              "fp16 and bf16 cannot both be enabled");
  check_weight_precision(c, rules);
  check_zero(c, rules);
  warn_world_size_dependence(c);
  check_profile_window(c, rules);
  check_latent_attention(c, rules);
  if (!latent_attention(c)) check_attention_heads(c, rules);
  check_rope_scaling(c, rules);
  check_layer_types(c, rules);  // before the rules that read the layers' kinds
  check_moe_layers(c, rules);
  check_linear_attention(c, rules);
  check_mamba_and_blocks(c, rules);
  check_global_attention(c, rules);
  rules.check(c.moe.shared_expert_hidden_size > 0 || !c.moe.shared_expert_gate,
              "moe.shared_expert_gate", "true", "needs moe.shared_expert_hidden_size > 0");
  rules.check(!c.moe.softmax_after_topk || c.moe.score_function == ScoreFunction::kSoftmax,
              "moe.softmax_after_topk", "true", "needs moe.score_function = softmax");
  rules.check(!c.moe.softmax_after_topk || c.moe.router_bias_update_rate == 0,
              "moe.softmax_after_topk", "true",
              "cannot be combined with moe.router_bias_update_rate (a selection bias on scores)");
  check_expert_groups(c.moe, rules);
  const auto& m = c.model;
  rules.check(m.qk_norm || m.qk_norm_scope == QkNormScope::kHead, "model.qk_norm_scope",
              std::string(name(m.qk_norm_scope)), "needs model.qk_norm = true");
  rules.check(!(m.qkv_bias && m.attention_bias), "model.qkv_bias", "true",
              "cannot be combined with model.attention_bias (which already biases q, k, v and o)");
  if (m.partial_rotary_factor != 1.0) {
    const double dims = static_cast<double>(head_dim(c)) * m.partial_rotary_factor;
    const auto rotary = static_cast<int64_t>(dims);  // transformers' int(head_dim * factor)
    rules.check(rotary >= 2 && rotary % 2 == 0, "model.partial_rotary_factor",
                m.partial_rotary_factor,
                "head_dim (" + std::to_string(head_dim(c)) +
                    ") x factor must give an even number of rotary dimensions >= 2");
    rules.check(m.rope_theta > 0, "model.partial_rotary_factor", m.partial_rotary_factor,
                "needs rotary positions (model.rope_theta > 0)");
  }
  rules.check(c.moe.top_k <= c.moe.num_experts, "moe.top_k", c.moe.top_k,
              "must be <= moe.num_experts (" + std::to_string(c.moe.num_experts) + ")");
  check_lora(c, rules);
  check_quantization(c, rules);
  check_expert_parallel(c, rules);
  check_offload_experts(c, rules);
  check_cpu_affinity(c, rules);
  warn_inert_checkpointing_keys(c);
  check_data_source(c, rules);
}

}  // namespace

void validate(Config& c) {
  const Rules rules(c.source_file);
  resolve_batch(c, rules);
  RuleChecker checker(rules);
  visit_fields(checker, std::as_const(c));
  check_relations(c, rules);
}

}  // namespace moe::config
