#include "moe/hf/load_hf_weights.h"

#include <cctype>
#include <filesystem>
#include <set>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "moe/config/architecture.h"
#include "moe/config/parameter_layout.h"
#include "moe/hf/bnb_4bit_tensors.h"
#include "moe/hf/fp8_tensors.h"
#include "moe/hf/hf_tensor_map.h"
#include "moe/hf/int4_pack_tensors.h"
#include "moe/hf/mxfp4_tensors.h"
#include "moe/util/errors.h"
#include "moe/util/host_memory.h"
#include "moe/util/safetensors_dtype.h"

namespace moe::hf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A tensor of a multi-token-prediction layer (GLM-4.5's num_nextn_predict_layers: layers past
// num_hidden_layers; Qwen3-Next / Qwen3.5: everything under mtp.; ERNIE 4.5: model.mtp_*), which
// transformers drops on load; so does the import.
bool mtp_tensor(const std::string& name, const config::Config& cfg,
                const families::ModelFamily& family) {
  if (!family.has_mtp_layers()) return false;
  if (name.compare(0, 4, "mtp.") == 0) return true;
  if (name.compare(0, 10, "model.mtp_") == 0) return true;  // ERNIE 4.5: model.mtp_block.0. ...
  const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t end = prefix.size();
  int64_t layer = 0;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end])) &&
         layer < (int64_t{1} << 40)) {
    layer = layer * 10 + (name[end++] - '0');
  }
  return end > prefix.size() && end < name.size() && name[end] == '.' &&
         layer >= cfg.model.num_layers;
}

// The family's tensor table as this checkpoint lays its experts out (per expert, or fused
// stacks: with_fused_experts).
std::vector<TensorPiece> checkpoint_pieces(const HfWeights& w, const config::Config& cfg,
                                           const families::ModelFamily& family) {
  return with_fused_experts(tensor_pieces(cfg, family), config::expert_hidden_size(cfg),
                            [&](const std::string& name) { return w.tensors().count(name) > 0; });
}

bool is_selection_bias(const std::string& ours) {
  const std::string tail = "moe.router.expert_bias";
  return ours.size() >= tail.size() &&
         ours.compare(ours.size() - tail.size(), tail.size(), tail) == 0;
}

// HF tensors that carry no weight of ours: rotary caches of old checkpoints, a tied head.
bool ignorable(const std::string& name, const config::Config& cfg,
               const families::ModelFamily& family) {
  const std::string inv = "rotary_emb.inv_freq";
  if (name.size() >= inv.size() && name.compare(name.size() - inv.size(), inv.size(), inv) == 0) {
    return true;
  }
  return cfg.model.tie_embeddings && name == family.hf_head_name();
}

// What DIR/config.json says of FP8 weights (hf/fp8_tensors.h).
std::optional<quant::Fp8Block> fp8_of(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return fp8_format(config::load_json_file(path, "hf"), path);
}

// What DIR/config.json says of compressed-tensors INT4 weights (hf/int4_pack_tensors.h).
std::optional<PackQuantized> int4_of(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return pack_quantized_format(config::load_json_file(path, "hf"), path);
}

// Checks every tensor (presence, dtype, shape, nothing unexpected) against `params` (our
// parameters by name; meta tensors do: only shapes are read). Returns how many tensors of
// multi-token-prediction layers it skipped.
int64_t check_hf_tensors(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                         const families::ModelFamily& family,
                         const std::map<std::string, torch::Tensor>& params,
                         const std::optional<quant::Fp8Block>& fp8) {
  const auto pieces = checkpoint_pieces(w, cfg, family);
  const auto int4 = int4_of(dir);
  std::set<std::string> expected;
  for (const auto& p : pieces) {
    expected.insert(p.hf);
    // What the whole HF tensor must be: our part of it, times the stride of an interleaved one.
    auto want = piece_view(p, params).sizes().vec();
    want.back() *= p.hf_step;
    if (p.hf_rows >= 0) want[want.size() - 2] = p.hf_rows_total;
    if (const auto mx = mxfp4_shape(w, p.hf)) {  // gpt-oss's MXFP4 experts
      if (*mx != want) {
        throw UserError("hf: " + dir + ": tensor '" + p.hf +
                        "' (MXFP4 _blocks/_scales) has shape " + shape_text(*mx) +
                        "; config.json implies " + shape_text(want));
      }
      continue;
    }
    if (const auto shape = pack_quantized_shape(w, p.hf, int4); shape) {  // Kimi-K2's INT4
      if (*shape != want) {
        throw UserError("hf: " + dir + ": tensor '" + p.hf + "' (pack-quantized INT4) has shape " +
                        shape_text(*shape) + "; config.json implies " + shape_text(want));
      }
      continue;
    }
    auto it = w.tensors().find(p.hf);
    if (it == w.tensors().end()) {
      throw UserError("hf: " + dir + ": tensor '" + p.hf + "' is missing (a " +
                      family.architecture() + " with this config.json has it)");
    }
    const SafeTensorEntry& e = *it->second.entry;
    const std::string where = "hf: " + it->second.file->path() + ": tensor '" + p.hf + "'";
    if (const auto q = read_bnb_4bit(w, p.hf)) {  // saved by bitsandbytes in 4 bits
      if (q->shape != want) {
        throw UserError(where + " (bitsandbytes 4-bit) has shape " + shape_text(q->shape) +
                        "; config.json implies " + shape_text(want));
      }
      continue;
    }
    if (is_fp8_weight(w, p.hf, fp8)) {  // its scales are checked there
      if (e.shape != want) {
        throw UserError(where + " (FP8) has shape " + shape_text(e.shape) +
                        "; config.json implies " + shape_text(want));
      }
      continue;
    }
    if (!is_float_weight_dtype(e.dtype)) {
      throw UserError(where + " is " + e.dtype +
                      "; expected F32, BF16 or F16 (or FP8 with scales)");
    }
    if (e.shape != want) {
      throw UserError(where + " has shape " + shape_text(e.shape) + "; config.json implies " +
                      shape_text(want));
    }
  }
  int64_t mtp = 0, carried = 0;
  for (const auto& [name, ref] : w.tensors()) {
    if (expected.count(name) > 0) continue;
    if (mtp_tensor(name, cfg, family)) {
      ++mtp;
      continue;
    }
    if (family.carried_tensor(name)) {
      ++carried;
      continue;
    }
    if (!ignorable(name, cfg, family) && !is_bnb_4bit_companion(w, name) &&
        !is_mxfp4_part(w, name) && !is_fp8_scale(w, name) && !is_pack_quantized_part(w, name)) {
      throw UserError("hf: " + ref.file->path() + ": unexpected tensor '" + name + "' (not in a " +
                      family.architecture() + " with this config.json)");
    }
  }
  if (carried > 0) {
    spdlog::info(
        "hf: {}: {} tensors outside the text model (the vision tower) are not trained; "
        "export-hf copies them from this directory",
        dir, carried);
  }
  return mtp;
}

// Copies one HF tensor into its part of our parameter (fp32), releasing the mapped source.
void copy_piece(const HfWeights& w, const TensorPiece& p,
                const std::map<std::string, torch::Tensor>& params,
                const std::optional<quant::Fp8Block>& fp8) {
  torch::NoGradGuard no_grad;
  if (const auto q = read_bnb_4bit(w, p.hf)) {  // a bitsandbytes 4-bit weight: its values
    piece_view(p, params).copy_(quant::dequantize_4bit(*q, torch::kFloat));
    return;
  }
  if (mxfp4_shape(w, p.hf)) {  // exact in bf16: half the transient of fp32
    piece_view(p, params).copy_(hf_part(p, read_mxfp4(w, p.hf, torch::kBFloat16)));
    return;
  }
  if (is_fp8_weight(w, p.hf, fp8)) {  // FP8 blockwise: transformers' dequantization, in fp32
    piece_view(p, params).copy_(hf_part(p, read_fp8(w, p.hf, *fp8, torch::kFloat)));
    return;
  }
  if (w.find(p.hf + "_packed") != nullptr) {  // INT4: compressed-tensors' dequantization, exact
    piece_view(p, params).copy_(hf_part(p, read_pack_quantized(w, p.hf)));
    return;
  }
  // One source tensor in memory at a time: its mapped pages go once it is copied.
  piece_view(p, params).copy_(hf_part(p, read_hf_tensor(w.tensors().at(p.hf))));
}

}  // namespace

std::map<std::string, torch::Tensor> parameter_map(model::TransformerLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : model->named_parameters()) out[item.key()] = item.value();
  for (auto& item : model->named_buffers()) {
    if (is_selection_bias(item.key())) out[item.key()] = item.value();
  }
  return out;
}

// Checks every tensor, then copies them into the model as fp32 training weights.
void copy_hf_weights(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                     const families::ModelFamily& family, model::TransformerLM& model) {
  const auto params = parameter_map(model);
  // Expert parallelism: a rank holds some experts' rows of the routed experts' stacks; those
  // are checked whole and assembled whole, one parameter at a time, and the rank keeps its rows.
  // A 4-bit base: its (emptied) matrices are checked at their shapes, assembled whole in fp32
  // one at a time and quantized (host memory: the 4-bit base plus one matrix and one source).
  const auto& quantized = model->quantized_weights();
  auto whole = params;
  for (auto& [name, t] : whole) {
    if (const auto rows = model->expert_rows(name)) {
      auto shape = t.sizes().vec();
      shape[0] = rows->total;
      t = torch::empty(shape, t.options().device(torch::kMeta));
    } else if (const auto q = quantized.find(name); q != quantized.end()) {
      t = torch::empty(q->second->shape(), t.options().device(torch::kMeta));
    }
  }
  const auto fp8 = fp8_of(dir);
  if (const int64_t mtp = check_hf_tensors(w, dir, cfg, family, whole, fp8); mtp > 0) {
    spdlog::warn(
        "hf: {}: {} tensors of multi-token-prediction layers are not loaded (as "
        "transformers drops them)",
        dir, mtp);
  }
  std::map<std::string, std::vector<TensorPiece>> pieces_of;
  for (auto& p : checkpoint_pieces(w, cfg, family)) pieces_of[p.ours].push_back(p);
  for (const auto& [name, pieces] : pieces_of) {
    const auto rows = model->expert_rows(name);
    if (const auto q = quantized.find(name); q != quantized.end()) {
      const std::map<std::string, torch::Tensor> one{
          {name, torch::empty(q->second->shape(), torch::kFloat)}};
      for (const auto& p : pieces) copy_piece(w, p, one, fp8);
      q->second->requantize(one.at(name));
      // An MXFP4 base from an MXFP4 checkpoint keeps the checkpoint's own codes (gate and up:
      // every second row of gate_up_proj's blocks).
      if (q->second->is_mxfp4() && pieces.size() == 1 && mxfp4_shape(w, pieces[0].hf)) {
        const TensorPiece& p = pieces[0];
        auto [blocks, scales] = read_mxfp4_codes(w, p.hf);
        q->second->replace_mxfp4(blocks.slice(1, p.hf_first, std::nullopt, p.hf_step),
                                 scales.slice(1, p.hf_first, std::nullopt, p.hf_step));
      }
      // A matrix bitsandbytes saved in this very format is kept as saved, not requantized from
      // its dequantized values (which need not give the same codes back).
      for (const auto& p : pieces) {
        auto saved = read_bnb_4bit(w, p.hf);
        const auto& o = q->second->options();
        if (saved && saved->type == o.type && saved->double_quant() == o.double_quant &&
            saved->blocksize == quant::kBlocksize) {
          q->second->replace_part(p.expert >= 0 ? p.expert : q->second->part_of_row(p.row_begin),
                                  std::move(*saved));
        }
      }
      return_free_host_memory();  // the fp32 matrix, its sources and the old codes
      continue;
    }
    if (!rows) {
      for (const auto& p : pieces) copy_piece(w, p, params, fp8);
      continue;
    }
    const std::map<std::string, torch::Tensor> one{
        {name, torch::empty(whole.at(name).sizes(), torch::kFloat)}};
    for (const auto& p : pieces) copy_piece(w, p, one, fp8);
    torch::NoGradGuard no_grad;
    params.at(name).copy_(one.at(name).narrow(0, rows->first, rows->count));
  }
}

// import-hf without building the model: each of our parameters (config/parameter_layout.h) is
// assembled from its HF tensors and appended to model.safetensors, then freed. Host memory:
// one parameter and one source tensor, not the model.
StreamedHf stream_hf_weights(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                             const families::ModelFamily& family, const std::string& out_file) {
  const auto layout = config::parameter_layout(cfg);
  std::map<std::string, torch::Tensor> shapes;
  for (const auto& l : layout) {
    shapes[l.name] = torch::empty(l.shape, torch::TensorOptions().device(torch::kMeta));
  }
  std::map<std::string, std::vector<TensorPiece>> pieces_of;
  for (auto& p : checkpoint_pieces(w, cfg, family)) {
    if (is_selection_bias(p.ours)) {
      shapes[p.ours] =
          torch::empty({cfg.moe.num_experts}, torch::TensorOptions().device(torch::kMeta));
    }
    pieces_of[p.ours].push_back(p);
  }
  StreamedHf r;
  const auto fp8 = fp8_of(dir);
  r.skipped_mtp_tensors = check_hf_tensors(w, dir, cfg, family, shapes, fp8);
  for (const auto& [name, pieces] : pieces_of) {  // buffers: into state.json, not the weights
    if (!is_selection_bias(name)) continue;
    const std::map<std::string, torch::Tensor> one{{name, torch::empty({cfg.moe.num_experts})}};
    for (const TensorPiece& p : pieces) copy_piece(w, p, one, fp8);
    const auto& t = one.at(name);
    r.expert_biases[name] =
        std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  std::vector<SafeTensorView> views;
  for (const auto& l : layout) {
    if (pieces_of.count(l.name) == 0) {
      throw std::logic_error("import-hf: no Hugging Face tensor fills " + l.name);
    }
    int64_t n = 1;
    for (const int64_t s : l.shape) n *= s;
    views.push_back({l.name, "F32", l.shape, nullptr, static_cast<size_t>(n) * 4});
  }
  SafetensorsWriter out(out_file, views, {{"format", "pt"}, {"producer", "moe-train"}});
  for (const auto& l : layout) {
    const std::map<std::string, torch::Tensor> one{{l.name, torch::empty(l.shape)}};
    for (const TensorPiece& p : pieces_of.at(l.name)) copy_piece(w, p, one, fp8);
    const torch::Tensor& t = one.at(l.name);
    out.append(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  out.finish();
  return r;
}

HfModel read_hf_model(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  if (!fs::is_directory(dir)) throw UserError("hf: " + dir + ": not a directory");
  if (!fs::exists(path)) {
    throw UserError("hf: " + dir + ": no config.json (not a Hugging Face model directory)");
  }
  HfModel m;
  m.hf_config = config::load_json_file(path.string(), "hf");
  m.sections = architecture_from_hf(m.hf_config, path.string(), &m.family, &m.warnings);
  json root = m.sections;
  // validate() wants data and a batch size; neither is part of an architecture.
  root["data"] = {{"path", "-"}};
  root["train_micro_batch_size_per_gpu"] = 1;
  try {
    m.cfg = config::from_json(root, path.string());
    config::validate(m.cfg);
  } catch (const UserError& e) {
    throw UserError("hf: " + path.string() +
                    ": maps to a configuration moe-train refuses: " + e.what());
  }
  m.cfg.data.path.clear();
  m.cfg.warnings.clear();
  return m;
}

void load_hf_weights(const std::string& hf_dir, const config::Config& cfg,
                     model::TransformerLM& model) {
  const HfModel hm = read_hf_model(hf_dir);
  config::check_same_architecture(cfg, hm.sections, hf_dir + "/config.json");
  const HfWeights weights(hf_dir);
  copy_hf_weights(weights, hf_dir, cfg, *hm.family, model);
}

}  // namespace moe::hf
