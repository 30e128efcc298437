#include "moe/hf/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "moe/config/architecture.h"
#include "moe/config/lora.h"
#include "moe/hf/bnb_4bit_tensors.h"
#include "moe/hf/hf_files.h"
#include "moe/hf/hf_tensor_map.h"
#include "moe/hf/load_hf_weights.h"
#include "moe/hf/mxfp4_tensors.h"
#include "moe/hf/peft_adapter.h"
#include "moe/model/parameter_layout.h"
#include "moe/train/checkpoint.h"
#include "moe/train/resume_policy.h"
#include "moe/util/errors.h"
#include "moe/util/host_memory.h"
#include "moe/util/safetensors_dtype.h"
#include "moe/util/staged_dir.h"

namespace moe::hf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << at::IntArrayRef(s);
  return o.str();
}

std::map<std::string, torch::Tensor> parameter_map(model::TransformerLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : model->named_parameters()) out[item.key()] = item.value();
  return out;
}

// HF tensors that carry no weight of ours: rotary caches of old checkpoints, a tied head.
bool ignorable(const std::string& name, const config::Config& cfg) {
  const std::string inv = "rotary_emb.inv_freq";
  if (name.size() >= inv.size() && name.compare(name.size() - inv.size(), inv.size(), inv) == 0) {
    return true;
  }
  return cfg.model.tie_embeddings && name == "lm_head.weight";
}

// Checks every tensor (presence, dtype, shape, nothing unexpected) against `params` (our
// parameters by name; meta tensors do: only shapes are read).
void check_hf_tensors(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                      Family family, const std::map<std::string, torch::Tensor>& params) {
  const auto pieces = tensor_pieces(cfg, family);
  std::set<std::string> expected;
  for (const auto& p : pieces) {
    expected.insert(p.hf);
    // What the whole HF tensor must be: our part of it, times the stride of an interleaved one.
    auto want = piece_view(p, params).sizes().vec();
    want.back() *= p.hf_step;
    if (const auto mx = mxfp4_shape(w, p.hf)) {  // gpt-oss's MXFP4 experts
      if (*mx != want) {
        throw UserError("hf: " + dir + ": tensor '" + p.hf +
                        "' (MXFP4 _blocks/_scales) has shape " + shape_text(*mx) +
                        "; config.json implies " + shape_text(want));
      }
      continue;
    }
    auto it = w.tensors().find(p.hf);
    if (it == w.tensors().end()) {
      throw UserError("hf: " + dir + ": tensor '" + p.hf + "' is missing (a " +
                      architecture_name(family) + " with this config.json has it)");
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
    if (!is_float_weight_dtype(e.dtype)) {
      throw UserError(where + " is " + e.dtype + "; expected F32, BF16 or F16");
    }
    if (e.shape != want) {
      throw UserError(where + " has shape " + shape_text(e.shape) + "; config.json implies " +
                      shape_text(want));
    }
  }
  for (const auto& [name, ref] : w.tensors()) {
    if (expected.count(name) == 0 && !ignorable(name, cfg) && !is_bnb_4bit_companion(w, name) &&
        !is_mxfp4_part(w, name)) {
      throw UserError("hf: " + ref.file->path() + ": unexpected tensor '" + name + "' (not in a " +
                      architecture_name(family) + " with this config.json)");
    }
  }
}

// Copies one HF tensor into its part of our parameter (fp32), releasing the mapped source.
void copy_piece(const HfWeights& w, const TensorPiece& p,
                const std::map<std::string, torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  if (const auto q = read_bnb_4bit(w, p.hf)) {  // a bitsandbytes 4-bit weight: its values
    piece_view(p, params).copy_(quant::dequantize_4bit(*q, torch::kFloat));
    return;
  }
  if (mxfp4_shape(w, p.hf)) {  // exact in bf16: half the transient of fp32
    piece_view(p, params).copy_(hf_part(p, read_mxfp4(w, p.hf, torch::kBFloat16)));
    return;
  }
  const HfTensorRef& ref = w.tensors().at(p.hf);
  const SafeTensorEntry& e = *ref.entry;
  // clone(): safetensors data offsets need not be aligned for the element type.
  auto src = torch::from_blob(const_cast<char*>(ref.file->data(e)), e.shape,
                              torch::TensorOptions().dtype(*scalar_type_of_safetensors(e.dtype)))
                 .clone();
  ref.file->release(e);  // the mapped pages go: one source tensor in memory at a time
  piece_view(p, params).copy_(hf_part(p, src));
}

// Checks every tensor, then copies them into the model as fp32 training weights.
void copy_hf_weights(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                     Family family, model::TransformerLM& model) {
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
  check_hf_tensors(w, dir, cfg, family, whole);
  std::map<std::string, std::vector<TensorPiece>> pieces_of;
  for (auto& p : tensor_pieces(cfg, family)) pieces_of[p.ours].push_back(p);
  for (const auto& [name, pieces] : pieces_of) {
    const auto rows = model->expert_rows(name);
    if (const auto q = quantized.find(name); q != quantized.end()) {
      const std::map<std::string, torch::Tensor> one{
          {name, torch::empty(q->second->shape(), torch::kFloat)}};
      for (const auto& p : pieces) copy_piece(w, p, one);
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
      for (const auto& p : pieces) copy_piece(w, p, params);
      continue;
    }
    const std::map<std::string, torch::Tensor> one{
        {name, torch::empty(whole.at(name).sizes(), torch::kFloat)}};
    for (const auto& p : pieces) copy_piece(w, p, one);
    torch::NoGradGuard no_grad;
    params.at(name).copy_(one.at(name).narrow(0, rows->first, rows->count));
  }
}

// import-hf without building the model: each of our parameters (model/parameter_layout.h) is
// assembled from its HF tensors and appended to model.safetensors, then freed. Host memory:
// one parameter and one source tensor, not the model.
void stream_hf_weights(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                       Family family, const std::string& out_file) {
  const auto layout = model::parameter_layout(cfg);
  std::map<std::string, torch::Tensor> shapes;
  for (const auto& l : layout) {
    shapes[l.name] = torch::empty(l.shape, torch::TensorOptions().device(torch::kMeta));
  }
  check_hf_tensors(w, dir, cfg, family, shapes);
  std::map<std::string, std::vector<TensorPiece>> pieces_of;
  for (auto& p : tensor_pieces(cfg, family)) pieces_of[p.ours].push_back(p);
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
    for (const TensorPiece& p : pieces_of.at(l.name)) copy_piece(w, p, one);
    const torch::Tensor& t = one.at(l.name);
    out.append(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  out.finish();
}

struct HfModel {
  json hf_config;
  Family family = Family::kMixtral;
  json sections;  // {"model", "moe"}
  std::vector<std::string> warnings;
  config::Config cfg;
};

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

void write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.flush();
  if (!out) throw TrainingError(path.string() + ": write failed (disk full?)");
}

// Where the original HF files of a checkpoint's model live: the checkpoint itself (import-hf
// and every checkpoint descending from an import carry them), or the directory its run started
// from (model.init_from, for checkpoints written before they were carried). "" when none.
std::string hf_source_dir(const std::string& checkpoint_dir, const config::Config& cfg) {
  const std::string own = hf_side_source(checkpoint_dir);
  return own.empty() ? hf_side_source(cfg.model.init_from) : own;
}

ExportReport export_adapter(model::TransformerLM& model, const config::Config& cfg, Family family,
                            const std::string& out_dir, const std::string& source,
                            const std::string& checkpoint_dir) {
  StagedDir out(
      "export-hf", out_dir,
      "export-hf: --out " + out_dir + " exists and is not empty (nothing is overwritten)");
  ExportReport r;
  r.family = family;
  r.tensors = write_peft_adapter(model, cfg, family, out.path(),
                                 source.empty() ? "" : fs::absolute(source).string());
  // A PEFT adapter carries no model config: a rotary scaling the run added (a long-context
  // fine-tune) is lost when the base is loaded as it is stored. Say how to load it as trained.
  config::RopeScalingConfig base_scaling;
  if (!source.empty()) {
    const fs::path p =
        fs::path(source) /
        (fs::exists(fs::path(source) / "hf_config.json") ? "hf_config.json" : "config.json");
    base_scaling = rope_scaling_of(config::load_json_file(p.string(), "hf"), p.string());
  }
  if (cfg.model.rope_scaling != base_scaling) {
    // yarn: the scaled window too, as export-hf writes it (hf_config_from) and transformers 4.x
    // needs it to derive the same factor.
    const auto& s = cfg.model.rope_scaling;
    const std::string window = s.type == config::RopeScalingType::kYarn
                                   ? ", max_position_embeddings=" + std::to_string(yarn_window(s))
                                   : "";
    r.warnings.push_back(
        "the adapters were trained with model.rope_scaling type " +
        std::string(config::name(cfg.model.rope_scaling.type)) + ", the base model's config has " +
        std::string(config::name(base_scaling.type)) +
        " (or other parameters); PEFT adapters carry no config, so load the base with "
        "from_pretrained(BASE, rope_parameters=" +
        rope_parameters(cfg.model).dump() + window + ") or export with --merge");
  }
  r.shards = 1;
  r.tokenizer_files = copy_tokenizer_files(checkpoint_dir, out.path());
  out.commit();
  return r;
}

// Every HF tensor of the export in `dtype`, in transformers' order; `keep` holds their data.
std::vector<SafeTensorView> export_views(model::TransformerLM& model, const config::Config& cfg,
                                         Family family, torch::ScalarType dtype,
                                         std::vector<torch::Tensor>& keep) {
  const auto params = parameter_map(model);
  std::vector<SafeTensorView> views;
  const auto pieces = tensor_pieces(cfg, family);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& p = pieces[i];
    if (i > 0 && pieces[i - 1].hf == p.hf && p.hf_step > 1) continue;  // written with the first
    if (p.hf_step == 1) {
      keep.push_back(piece_view(p, params).detach().to(dtype).contiguous());
    } else {  // an interleaved tensor: each of its pieces into its columns
      auto sizes = piece_view(p, params).sizes().vec();
      sizes.back() *= p.hf_step;
      auto whole = torch::empty(sizes, torch::TensorOptions().dtype(dtype));
      for (size_t j = i; j < pieces.size() && pieces[j].hf == p.hf; ++j) {
        hf_part(pieces[j], whole).copy_(piece_view(pieces[j], params).detach());
      }
      keep.push_back(whole);
    }
    const auto& t = keep.back();
    views.push_back({p.hf, safetensors_dtype_of(t.scalar_type()), t.sizes().vec(), t.data_ptr(),
                     static_cast<size_t>(t.nbytes())});
  }
  return views;
}

}  // namespace

ImportReport import_hf(const std::string& hf_dir, const std::string& out_dir,
                       const std::string& adapter_dir) {
  HfModel hm = read_hf_model(hf_dir);
  HfWeights weights(hf_dir);
  train::TrainingState state;
  state.config = config::to_json(hm.cfg);
  const json imported = {
      {"imported_from",
       {{"dir", fs::absolute(hf_dir).string()}, {"architecture", architecture_name(hm.family)}}}};
  // Removed again, with whatever is in it, if anything below throws (a bad tensor included).
  StagedDir out(
      "import-hf", out_dir,
      "import-hf: --out " + out_dir + " exists and is not empty (nothing is overwritten)");
  if (adapter_dir.empty()) {
    stream_hf_weights(weights, hf_dir, hm.cfg, hm.family,
                      (fs::path(out.path()) / "model.safetensors").string());
    train::write_weights_state(out.path(), state, imported);
  } else {  // the adapter folded in: the checkpoint holds the merged weights
    config::Config adapted_cfg = hm.cfg;
    adapted_cfg.lora = lora_config_from_peft(adapter_dir);
    model::TransformerLM adapted(adapted_cfg, torch::Device(torch::kCPU));
    copy_hf_weights(weights, hf_dir, hm.cfg, hm.family, adapted);
    read_peft_adapter(adapter_dir, adapted, adapted_cfg, hm.family);
    adapted->merge_lora();
    model::TransformerLM model(hm.cfg, torch::Device(torch::kCPU));
    auto mine = model->named_parameters();
    for (auto& item : adapted->named_parameters()) {
      if (!config::is_lora_parameter(item.key())) mine[item.key()].set_data(item.value());
    }
    train::save_weights_checkpoint(out.path(), model, state, imported);
  }
  write_json(fs::path(out.path()) / "hf_config.json", hm.hf_config);
  write_json(fs::path(out.path()) / "moe-train.json", hm.sections);
  const fs::path gen = fs::path(hf_dir) / "generation_config.json";
  if (fs::is_regular_file(gen)) fs::copy_file(gen, fs::path(out.path()) / "generation_config.json");
  ImportReport r;
  r.family = hm.family;
  r.tensors = static_cast<int64_t>(weights.tensors().size());
  r.warnings = hm.warnings;
  r.tokenizer_files = copy_tokenizer_files(hf_dir, out.path());
  out.commit();
  return r;
}

ExportReport export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                       const ExportOptions& opt) {
  const train::CheckpointState cs = train::read_checkpoint_state(checkpoint_dir);
  const config::Config cfg = config::from_json(cs.config, cs.path);
  Family family = Family::kMixtral;
  try {
    family = export_family(cfg, opt.architecture);
  } catch (const UserError& e) {
    throw UserError("export-hf: " + cs.path + ": " + e.what());
  }
  static const std::map<std::string, torch::ScalarType> kDtypes = {
      {"float32", torch::kFloat}, {"bfloat16", torch::kBFloat16}, {"float16", torch::kHalf}};
  auto dt = kDtypes.find(opt.dtype);
  if (dt == kDtypes.end()) {
    throw UserError("export-hf: --dtype " + opt.dtype + ": expected float32, bfloat16 or float16");
  }
  if (opt.merge && opt.adapter) {
    throw UserError(
        "export-hf: --merge and --adapter: choose one (full merged weights, or the "
        "PEFT adapter)");
  }
  if (config::lora_enabled(cfg) && !opt.merge && !opt.adapter) {
    throw UserError("export-hf: " + checkpoint_dir +
                    " holds LoRA adapters over a frozen base "
                    "(lora.r = " +
                    std::to_string(cfg.lora.r) +
                    "): pass --merge (full weights, "
                    "base + s B A) or --adapter (PEFT adapter_config.json + "
                    "adapter_model.safetensors)");
  }
  if (!config::lora_enabled(cfg) && opt.adapter) {
    throw UserError("export-hf --adapter: " + checkpoint_dir +
                    " has no LoRA adapters (no lora section with r > 0): export it without "
                    "--adapter");
  }
  // model.safetensors holds fp32 masters whatever training.param_dtype was: export them as
  // written, not rounded to the run's 16-bit working weights.
  config::Config fp32_cfg = cfg;
  fp32_cfg.training.param_dtype = config::ParamDtype::kFp32;
  model::TransformerLM model(fp32_cfg, torch::Device(torch::kCPU));
  train::load_checkpoint(checkpoint_dir, model, nullptr, /*restore_rng=*/false);

  const std::string source = hf_source_dir(checkpoint_dir, cfg);
  if (opt.adapter) return export_adapter(model, cfg, family, out_dir, source, checkpoint_dir);
  if (model->has_lora()) model->merge_lora();
  json base;
  if (!source.empty()) {
    const fs::path p =
        fs::path(source) /
        (fs::exists(fs::path(source) / "hf_config.json") ? "hf_config.json" : "config.json");
    base = config::load_json_file(p.string(), "hf");
  }
  std::vector<std::string> warnings;
  const json hf_config = hf_config_from(cfg, family, base, opt.dtype, &warnings);

  std::vector<torch::Tensor> keep;
  const std::vector<SafeTensorView> views = export_views(model, cfg, family, dt->second, keep);

  StagedDir out(
      "export-hf", out_dir,
      "export-hf: --out " + out_dir + " exists and is not empty (nothing is overwritten)");
  const int64_t shards = write_hf_weights(out.path(), views, opt.max_shard_bytes);
  write_json(fs::path(out.path()) / "config.json", hf_config);
  const fs::path gen = source.empty() ? fs::path() : fs::path(source) / "generation_config.json";
  if (!source.empty() && fs::is_regular_file(gen)) {
    fs::copy_file(gen, fs::path(out.path()) / "generation_config.json");
  } else {
    json g = {{"_from_model_config", true}};
    for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (hf_config.contains(id) && !hf_config[id].is_null()) g[id] = hf_config[id];
    }
    write_json(fs::path(out.path()) / "generation_config.json", g);
  }
  ExportReport r;
  r.family = family;
  r.warnings = std::move(warnings);
  r.tensors = static_cast<int64_t>(views.size());
  r.shards = shards;
  r.tokenizer_files = copy_tokenizer_files(checkpoint_dir, out.path());
  if (r.tokenizer_files.empty() && !source.empty()) {
    r.tokenizer_files = copy_tokenizer_files(source, out.path());
  }
  out.commit();
  return r;
}

void load_hf_weights(const std::string& hf_dir, const config::Config& cfg,
                     model::TransformerLM& model) {
  const HfModel hm = read_hf_model(hf_dir);
  config::check_same_architecture(cfg, hm.sections, hf_dir + "/config.json");
  const HfWeights weights(hf_dir);
  copy_hf_weights(weights, hf_dir, cfg, hm.family, model);
}

}  // namespace moe::hf
