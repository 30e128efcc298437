#include "moe/hf/peft_adapter.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/config/lora.h"
#include "moe/hf/hf_tensor_map.h"
#include "moe/util/errors.h"
#include "moe/util/safetensors.h"
#include "moe/util/safetensors_dtype.h"

namespace moe::hf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// How one of our adapter tensors is laid out in PEFT's file.
enum class Layout {
  kSame,     // lora.Linear's lora_A [r, in] / lora_B [out, r], a module_to_save's weight
  kExpertA,  // ours [E, in, r]  -> PEFT's ParamWrapper lora_A.weight [E r, in] (expert-major)
  kExpertB,  // ours [E, r, out] -> PEFT's lora_B.weight [out, r E] (expert-minor)
  // gpt-oss's gate_up_proj interleaves gate and up columns (2j gate, 2j + 1 up); our [gate | up]
  // update's columns go there, then as kExpertB.
  kExpertBInterleaved,
};

struct AdapterPiece {
  std::string peft, ours;
  Layout layout = Layout::kSame;
};

const char* kPrefix = "base_model.model.";

bool has_gated_deltanet(const config::Config& cfg) {
  for (int64_t i = 0; i < cfg.model.num_layers; ++i) {
    if (config::has_mixer(cfg, i) && config::linear_attention_layer(cfg, i)) return true;
  }
  return false;
}

// The adapter's tensors of one layer, in PEFT's names (`peft`: the layer's prefix) and ours.
class LayerAdapters {
 public:
  LayerAdapters(const config::Config& cfg, const families::ModelFamily& family,
                std::vector<AdapterPiece>& out)
      : cfg_(cfg), family_(family), t_(config::lora_targets(cfg.lora)), out_(out) {}

  void add(int64_t i, const std::string& peft, const std::string& ours) {
    attention(i, peft, ours);
    if (config::has_mixer(cfg_, i) && config::linear_attention_layer(cfg_, i)) {
      linear_attention(peft + "linear_attn.", ours + "linear_attn.");
    }
    if (config::mamba_layer(cfg_, i)) mamba(peft + family_.mamba_module(), ours);
    if (config::has_feed_forward(cfg_, i)) feed_forward(i, peft, ours);
  }

 private:
  void pair(const std::string& peft, const std::string& ours, bool experts,
            bool interleaved = false) {
    out_.push_back(
        {peft + "lora_A.weight", ours + "lora_A", experts ? Layout::kExpertA : Layout::kSame});
    out_.push_back({peft + "lora_B.weight", ours + "lora_B",
                    !experts      ? Layout::kSame
                    : interleaved ? Layout::kExpertBInterleaved
                                  : Layout::kExpertB});
  }

  // Latent attention (DeepSeek-V2/V3) has q_proj or q_a/q_b, and kv_a/kv_b, no k/v_proj; a
  // Gated DeltaNet or Mamba-2 layer, or a feed-forward-only block (Nemotron-H), has no attention
  // projections to adapt.
  void attention(int64_t i, const std::string& peft, const std::string& ours) {
    if (!config::has_mixer(cfg_, i) || config::linear_attention_layer(cfg_, i) ||
        config::mamba_layer(cfg_, i)) {
      return;
    }
    const bool mla = config::latent_attention(cfg_), q_lora = cfg_.model.q_lora_rank > 0;
    const bool v_proj = !config::keys_are_values(cfg_, i);  // Gemma 4's K = V layers have none
    for (auto [on, proj, mine] : {std::tuple{t_.q && !(mla && q_lora), "q_proj", "lora_q"},
                                  std::tuple{t_.k && !mla, "k_proj", "lora_k"},
                                  std::tuple{t_.v && !mla && v_proj, "v_proj", "lora_v"},
                                  std::tuple{t_.q_a && mla && q_lora, "q_a_proj", "lora_q_a"},
                                  std::tuple{t_.q_b && mla && q_lora, "q_b_proj", "lora_q_b"},
                                  std::tuple{t_.kv_a && mla, "kv_a_proj_with_mqa", "lora_kv_a"},
                                  std::tuple{t_.kv_b && mla, "kv_b_proj", "lora_kv_b"},
                                  std::tuple{t_.o, "o_proj", "lora_o"}}) {
      if (on)
        pair(peft + family_.attention_module() + proj + ".", ours + "attn." + mine + ".", false);
    }
  }

  // Gated DeltaNet's projections (Qwen3.5 split, Qwen3-Next fused), plain lora.Linear in PEFT.
  void linear_attention(const std::string& peft, const std::string& ours) {
    const bool fused = cfg_.model.linear_fused_projections;
    for (auto [on, proj, mine] : {std::tuple{t_.in_proj_qkv && !fused, "in_proj_qkv", "lora_qkv"},
                                  std::tuple{t_.in_proj_z && !fused, "in_proj_z", "lora_z"},
                                  std::tuple{t_.in_proj_b && !fused, "in_proj_b", "lora_b"},
                                  std::tuple{t_.in_proj_a && !fused, "in_proj_a", "lora_a"},
                                  std::tuple{t_.in_proj_qkvz && fused, "in_proj_qkvz", "lora_qkvz"},
                                  std::tuple{t_.in_proj_ba && fused, "in_proj_ba", "lora_ba"},
                                  std::tuple{t_.out_proj, "out_proj", "lora_out"}}) {
      if (on) pair(peft + proj + ".", ours + mine + ".", false);
    }
  }

  // Nemotron-H's mixer.in_proj (PEFT refuses out_proj on Mamba models: mamba-ssm's fused path
  // reads its weight, bypassing adapters).
  void mamba(const std::string& peft, const std::string& ours) {
    if (t_.in_proj) pair(peft + "in_proj.", ours + "mamba.lora_in.", false);
    if (t_.out_proj) {
      throw UserError(
          "export-hf --adapter: lora.target_modules has out_proj on a Mamba model: PEFT refuses "
          "adapters on a Mamba mixer's out_proj (\"incompatible with Mamba-based models\"); use "
          "export-hf --merge, or adapt in_proj");
    }
  }

  // The routed experts (gate_up_proj, or relu2's up_proj, wrapped first: the inner "base_layer"
  // when down_proj is adapted too); dense MLPs have no PEFT names.
  void feed_forward(int64_t i, const std::string& peft, const std::string& ours) {
    const bool moe = config::is_moe_layer(cfg_, i);
    if ((!moe || cfg_.moe.parallel_dense) && t_.dense_mlp) {
      throw UserError(
          "export-hf --adapter: layer " + std::to_string(i) +
          " is a dense layer with adapters (lora.target_modules has dense_mlp): PEFT cannot "
          "target dense MLPs of this family under transformers >= 5 (it maps gate_proj / "
          "up_proj / down_proj to the experts); use export-hf --merge");
    }
    if (!moe) return;
    if (t_.shared_expert_gate && cfg_.moe.shared_expert_hidden_size > 0 &&
        cfg_.moe.shared_expert_gate) {  // Qwen3-Next / Qwen3.5's mlp.shared_expert_gate
      pair(peft + "mlp.shared_expert_gate.", ours + "moe.lora_shared_expert_gate.", false);
    }
    const std::string experts = peft + family_.experts_module();
    const std::string inner = experts + (t_.experts_down ? "base_layer." : "");
    if (!config::gated_mlp(cfg_)) {
      if (t_.experts_up) pair(inner, ours + "moe.experts.lora_gate_up.", true);
    } else if (t_.experts_gate_up_rank > 0) {
      pair(inner, ours + "moe.experts.lora_gate_up.", true, family_.interleaved_gate_up());
    }
    if (t_.experts_down) pair(experts, ours + "moe.experts.lora_down.", true);
  }

  const config::Config& cfg_;
  const families::ModelFamily& family_;
  const config::LoraTargets t_;
  std::vector<AdapterPiece>& out_;
};

// Every tensor of the adapter, in PEFT's names for transformers >= 5 (experts under "mlp.",
// Mixtral included), then the modules trained in full.
std::vector<AdapterPiece> adapter_pieces(const config::Config& cfg,
                                         const families::ModelFamily& family) {
  std::vector<AdapterPiece> p;
  LayerAdapters layers(cfg, family, p);
  for (int64_t i = 0; i < cfg.model.num_layers; ++i) {
    layers.add(
        i, std::string(kPrefix) + family.peft_model_prefix() + "layers." + std::to_string(i) + ".",
        "blocks." + std::to_string(i) + ".");
  }
  const std::string saved = family.hf_model_prefix(), in_memory = family.peft_model_prefix();
  for (const TensorPiece& piece : tensor_pieces(cfg, family)) {  // lora.modules_to_save
    if (!config::saved_in_full(cfg.lora, piece.ours, cfg.model.tie_embeddings)) continue;
    std::string name = piece.hf;
    const std::string v4 = "block_sparse_moe.";  // Mixtral's router lives under mlp. in v5
    if (auto at = name.find(v4); at != std::string::npos) name.replace(at, v4.size(), "mlp.");
    if (name.rfind(saved, 0) == 0) name = in_memory + name.substr(saved.size());
    p.push_back({kPrefix + name, piece.ours, Layout::kSame});
  }
  return p;
}

// [..., gate | up] <-> [..., gate_0, up_0, gate_1, up_1, ...] (gpt-oss's column order).
torch::Tensor interleave_halves(const torch::Tensor& t) {
  const auto halves = t.chunk(2, -1);
  return torch::stack({halves[0], halves[1]}, -1).flatten(-2);
}
torch::Tensor split_interleaved(const torch::Tensor& t) {
  return torch::cat({t.slice(-1, 0, std::nullopt, 2), t.slice(-1, 1, std::nullopt, 2)}, -1);
}

torch::Tensor to_peft(const torch::Tensor& t, Layout l) {
  switch (l) {
    case Layout::kExpertBInterleaved:
      return to_peft(interleave_halves(t), Layout::kExpertB);
    case Layout::kExpertA:  // [E, in, r] -> [E r, in]
      return t.transpose(1, 2).reshape({t.size(0) * t.size(2), t.size(1)});
    case Layout::kExpertB:  // [E, r, out] -> [out, r E], column j E + e
      return t.permute({2, 1, 0}).reshape({t.size(2), t.size(1) * t.size(0)});
    case Layout::kSame:
      break;
  }
  return t;
}

torch::Tensor from_peft(const torch::Tensor& t, Layout l, const torch::Tensor& like) {
  switch (l) {
    case Layout::kExpertBInterleaved:
      return split_interleaved(from_peft(t, Layout::kExpertB, like));
    case Layout::kExpertA:
      return t.reshape({like.size(0), like.size(2), like.size(1)}).transpose(1, 2);
    case Layout::kExpertB:
      return t.reshape({like.size(2), like.size(1), like.size(0)}).permute({2, 1, 0});
    case Layout::kSame:
      break;
  }
  return t;
}

// adapter_config.json's target_modules: the nn.Linear names PEFT wraps in this model.
json target_module_names(const config::Config& cfg, const config::LoraTargets& t) {
  json modules = json::array();
  const bool mla = config::latent_attention(cfg), q_lora = cfg.model.q_lora_rank > 0;
  const bool gdn = has_gated_deltanet(cfg), fused = cfg.model.linear_fused_projections;
  const bool split_gdn = gdn && !fused, fused_gdn = gdn && fused;
  const bool mamba = cfg.model.mamba_num_heads > 0;
  const bool gated_shared = cfg.moe.shared_expert_hidden_size > 0 && cfg.moe.shared_expert_gate;
  for (auto [on, name] :
       {std::pair{t.q && !(mla && q_lora), "q_proj"}, std::pair{t.k && !mla, "k_proj"},
        std::pair{t.v && !mla, "v_proj"}, std::pair{t.q_a && mla && q_lora, "q_a_proj"},
        std::pair{t.q_b && mla && q_lora, "q_b_proj"},
        std::pair{t.kv_a && mla, "kv_a_proj_with_mqa"}, std::pair{t.kv_b && mla, "kv_b_proj"},
        std::pair{t.o, "o_proj"},
        // the Mamba-2 mixers' projections, or Gated DeltaNet's
        std::pair{t.in_proj && mamba, "in_proj"},
        std::pair{t.in_proj_qkv && split_gdn, "in_proj_qkv"},
        std::pair{t.in_proj_z && split_gdn, "in_proj_z"},
        std::pair{t.in_proj_b && split_gdn, "in_proj_b"},
        std::pair{t.in_proj_a && split_gdn, "in_proj_a"},
        std::pair{t.in_proj_qkvz && fused_gdn, "in_proj_qkvz"},
        std::pair{t.in_proj_ba && fused_gdn, "in_proj_ba"},
        std::pair{t.out_proj && (mamba || gdn), "out_proj"},
        std::pair{t.shared_expert_gate && gated_shared, "shared_expert_gate"}}) {
    if (on) modules.push_back(name);
  }
  return modules;
}

json adapter_config(const config::Config& cfg, const families::ModelFamily& family,
                    const std::string& base) {
  const config::LoraConfig& l = cfg.lora;
  const config::LoraTargets t = config::lora_targets(l);
  const json modules = target_module_names(cfg, t);
  json params = json::array();
  json rank_pattern = json::object(), alpha_pattern = json::object();
  const std::string experts = family.experts_module();
  if (!config::gated_mlp(cfg)) {
    if (t.experts_up) params.push_back(experts + "up_proj");
  } else if (t.experts_gate_up_rank > 0) {
    params.push_back(experts + "gate_up_proj");
    if (t.experts_gate_up_rank != l.r) {  // gate_proj + up_proj: rank 2r, alpha 2 alpha
      rank_pattern[".*\\.gate_up_proj"] = t.experts_gate_up_rank;
      alpha_pattern[".*\\.gate_up_proj"] = t.experts_gate_up_alpha;
    }
  }
  if (t.experts_down) params.push_back(experts + "down_proj");
  json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base.empty() ? json(nullptr) : json(base)},
      {"r", l.r},
      {"lora_alpha", l.lora_alpha},
      {"lora_dropout", l.lora_dropout},
      {"use_rslora", l.use_rslora},
      {"target_modules", modules},
      {"target_parameters", params.empty() ? json(nullptr) : params},
      {"rank_pattern", rank_pattern},
      {"alpha_pattern", alpha_pattern},
      {"modules_to_save", l.modules_to_save.empty() ? json(nullptr) : json(l.modules_to_save)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"use_dora", false},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"revision", nullptr}};
  return j;
}

}  // namespace

int64_t write_peft_adapter(model::TransformerLM& model, const config::Config& cfg,
                           const families::ModelFamily& family, const std::string& dir,
                           const std::string& base) {
  const config::LoraTargets t = config::lora_targets(cfg.lora);
  if (cfg.lora.lora_dropout > 0 &&
      (t.experts_gate_up_rank > 0 || t.experts_down || (t.experts_up && !config::gated_mlp(cfg)))) {
    throw UserError(
        "export-hf --adapter: lora.lora_dropout = " + std::to_string(cfg.lora.lora_dropout) +
        " with adapters on the experts: PEFT's adapters on stacked parameters take no dropout "
        "(it raises on load); use export-hf --merge");
  }
  std::map<std::string, torch::Tensor> params;
  for (auto& item : model->named_parameters()) params[item.key()] = item.value();
  std::vector<torch::Tensor> keep;
  std::vector<SafeTensorView> views;
  for (const AdapterPiece& piece : adapter_pieces(cfg, family)) {
    auto it = params.find(piece.ours);
    if (it == params.end()) throw std::logic_error("peft adapter: no parameter " + piece.ours);
    keep.push_back(to_peft(it->second.detach().to(torch::kCPU), piece.layout).contiguous());
    const auto& k = keep.back();
    views.push_back({piece.peft, safetensors_dtype_of(k.scalar_type()), k.sizes().vec(),
                     k.data_ptr(), static_cast<size_t>(k.nbytes())});
  }
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), views,
                    {{"format", "pt"}, {"producer", "moe-train"}});
  std::ofstream out(fs::path(dir) / "adapter_config.json");
  out << adapter_config(cfg, family, base).dump(2) << "\n";
  out.flush();
  if (!out) throw TrainingError(dir + "/adapter_config.json: write failed (disk full?)");
  return static_cast<int64_t>(views.size());
}

void read_peft_adapter(const std::string& dir, model::TransformerLM& model,
                       const config::Config& cfg, const families::ModelFamily& family) {
  SafetensorsFile file((fs::path(dir) / "adapter_model.safetensors").string());
  std::map<std::string, torch::Tensor> params;
  for (auto& item : model->named_parameters()) params[item.key()] = item.value();
  const auto pieces = adapter_pieces(cfg, family);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // destination, value
  for (const AdapterPiece& piece : pieces) {
    const SafeTensorEntry& e = file.entry(piece.peft);  // missing: an error naming it
    const torch::Tensor& dst = params.at(piece.ours);
    const auto want = to_peft(dst, piece.layout).sizes().vec();
    if (e.shape != want || !is_float_weight_dtype(e.dtype)) {
      std::ostringstream msg;
      msg << "tensor '" << piece.peft << "' is " << e.dtype << " " << at::IntArrayRef(e.shape)
          << "; this base with the adapter's config expects a float " << at::IntArrayRef(want);
      throw UserError("import-hf --adapter: " + file.path() + ": " + msg.str());
    }
    const auto dtype = *scalar_type_of_safetensors(e.dtype);
    auto src = torch::from_blob(const_cast<char*>(file.data(e)), e.shape,
                                torch::TensorOptions().dtype(dtype))
                   .clone()
                   .to(torch::kFloat);
    copies.emplace_back(dst, from_peft(src, piece.layout, dst));
  }
  if (file.entries().size() != pieces.size()) {
    throw UserError("import-hf --adapter: " + file.path() + ": " +
                    std::to_string(file.entries().size()) +
                    " tensors; its adapter_config.json "
                    "describes " +
                    std::to_string(pieces.size()));
  }
  torch::NoGradGuard no_grad;
  for (auto& [dst, value] : copies) dst.copy_(value);
}

}  // namespace moe::hf
