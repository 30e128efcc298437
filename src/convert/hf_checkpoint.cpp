#include "moe/convert/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "moe/checkpoint/checkpoint_files.h"
#include "moe/checkpoint/resume_policy.h"
#include "moe/checkpoint/side_files.h"
#include "moe/config/architecture.h"
#include "moe/config/lora.h"
#include "moe/config/parameter_layout.h"
#include "moe/hf/bnb_4bit_tensors.h"
#include "moe/hf/hf_files.h"
#include "moe/hf/hf_tensor_map.h"
#include "moe/hf/load_hf_weights.h"
#include "moe/hf/mxfp4_tensors.h"
#include "moe/hf/peft_adapter.h"
#include "moe/util/errors.h"
#include "moe/util/host_memory.h"
#include "moe/util/safetensors_dtype.h"
#include "moe/util/staged_dir.h"

namespace moe::convert {

namespace fs = std::filesystem;
using nlohmann::json;
// The hf room's readers and writers that import and export are made of.
using hf::copy_hf_weights;
using hf::export_family;
using hf::hf_config_from;
using hf::hf_part;
using hf::HfModel;
using hf::HfWeights;
using hf::lora_config_from_peft;
using hf::parameter_map;
using hf::piece_view;
using hf::read_hf_model;
using hf::read_peft_adapter;
using hf::rope_parameters;
using hf::rope_scaling_of;
using hf::StreamedHf;
using hf::tensor_pieces;
using hf::TensorPiece;
using hf::write_hf_weights;
using hf::write_peft_adapter;
using hf::yarn_window;

namespace {

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
  const std::string own = checkpoint::hf_side_source(checkpoint_dir);
  return own.empty() ? checkpoint::hf_side_source(cfg.model.init_from) : own;
}

ExportReport export_adapter(model::TransformerLM& model, const config::Config& cfg,
                            const families::ModelFamily& family, const std::string& out_dir,
                            const std::string& source, const std::string& checkpoint_dir) {
  StagedDir out(
      "export-hf", out_dir,
      "export-hf: --out " + out_dir + " exists and is not empty (nothing is overwritten)");
  ExportReport r;
  r.family = &family;
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
  r.tokenizer_files = checkpoint::copy_tokenizer_files(checkpoint_dir, out.path());
  out.commit();
  return r;
}

// Every HF tensor of the export in `dtype`, in transformers' order; `keep` holds their data.
std::vector<SafeTensorView> export_views(model::TransformerLM& model, const config::Config& cfg,
                                         const families::ModelFamily& family,
                                         torch::ScalarType dtype,
                                         std::vector<torch::Tensor>& keep) {
  const auto params = parameter_map(model);
  std::vector<SafeTensorView> views;
  const auto pieces = tensor_pieces(cfg, family);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TensorPiece& p = pieces[i];
    // Pieces sharing one HF tensor: interleaved columns (gpt-oss's gate_up_proj) or row ranges
    // (a fused expert stack, gate rows then up rows); written with the first.
    const bool shared = p.hf_step > 1 || p.hf_rows >= 0;
    if (i > 0 && pieces[i - 1].hf == p.hf && shared) continue;
    // GLM-4.5's router and its correction bias stay fp32 in any dtype, as transformers keeps
    // and saves them (_keep_in_fp32_modules_strict).
    const auto ends_with = [&](const std::string& tail) {
      return p.hf.size() >= tail.size() &&
             p.hf.compare(p.hf.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool fp32_kept = family.router_kept_fp32() &&
                           (ends_with(".mlp.gate.weight") || ends_with(".e_score_correction_bias"));
    if (!shared) {
      keep.push_back(
          piece_view(p, params).detach().to(fp32_kept ? torch::kFloat : dtype).contiguous());
    } else {  // each of its pieces into its columns or rows
      auto sizes = piece_view(p, params).sizes().vec();
      sizes.back() *= p.hf_step;
      if (p.hf_rows >= 0) sizes[sizes.size() - 2] = p.hf_rows_total;
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

// A vision-language release's tensors outside the text model (its vision tower), as stored, into
// DIR/hf_carried.safetensors: a side file every later checkpoint carries (checkpoint/side_files.h)
// and export-hf writes back.
void write_carried_tensors(const HfWeights& w, const families::ModelFamily& family,
                           const std::string& dir) {
  std::vector<SafeTensorView> views;
  for (const auto& [name, ref] : w.tensors()) {
    if (!family.carried_tensor(name)) continue;
    const SafeTensorEntry& e = *ref.entry;
    views.push_back({name, e.dtype, e.shape, ref.file->data(e), e.end - e.begin});
  }
  // A release without a tower (Gemma 4's text-only config: vision_config null) still gets the
  // file, empty: export-hf then knows nothing is missing.
  if (views.empty() && family.text_config_key() == nullptr) return;
  SafetensorsWriter out((fs::path(dir) / checkpoint::kCarriedTensorsFile).string(), views,
                        {{"format", "pt"}, {"producer", "moe-train"}});
  for (const auto& v : views) out.append(v.data, v.nbytes);
  out.finish();
}

}  // namespace

ImportReport import_hf(const std::string& hf_dir, const std::string& out_dir,
                       const std::string& adapter_dir) {
  HfModel hm = read_hf_model(hf_dir);
  HfWeights weights(hf_dir);
  checkpoint::TrainingState state;
  state.config = config::to_json(hm.cfg);
  const json imported = {
      {"imported_from",
       {{"dir", fs::absolute(hf_dir).string()}, {"architecture", hm.family->architecture()}}}};
  // Removed again, with whatever is in it, if anything below throws (a bad tensor included).
  StagedDir out(
      "import-hf", out_dir,
      "import-hf: --out " + out_dir + " exists and is not empty (nothing is overwritten)");
  int64_t skipped_mtp = 0;
  if (adapter_dir.empty()) {
    const StreamedHf streamed = stream_hf_weights(
        weights, hf_dir, hm.cfg, *hm.family, (fs::path(out.path()) / "model.safetensors").string());
    skipped_mtp = streamed.skipped_mtp_tensors;
    json extra = imported;
    if (!streamed.expert_biases.empty()) extra["expert_biases"] = streamed.expert_biases;
    checkpoint::write_weights_state(out.path(), state, extra);
  } else {  // the adapter folded in: the checkpoint holds the merged weights
    config::Config adapted_cfg = hm.cfg;
    adapted_cfg.lora = lora_config_from_peft(adapter_dir);
    model::TransformerLM adapted(adapted_cfg, torch::Device(torch::kCPU));
    copy_hf_weights(weights, hf_dir, hm.cfg, *hm.family, adapted);
    read_peft_adapter(adapter_dir, adapted, adapted_cfg, *hm.family);
    adapted->merge_lora();
    model::TransformerLM model(hm.cfg, torch::Device(torch::kCPU));
    auto mine = model->named_parameters();
    for (auto& item : adapted->named_parameters()) {
      if (!config::is_lora_parameter(item.key())) mine[item.key()].set_data(item.value());
    }
    auto my_buffers = model->named_buffers();  // the routers' selection biases
    for (auto& item : adapted->named_buffers()) {
      if (auto* b = my_buffers.find(item.key())) b->copy_(item.value());
    }
    checkpoint::save_weights_checkpoint(out.path(), model, state, imported);
  }
  write_carried_tensors(weights, *hm.family, out.path());
  write_json(fs::path(out.path()) / "hf_config.json", hm.hf_config);
  write_json(fs::path(out.path()) / "moe-train.json", hm.sections);
  const fs::path gen = fs::path(hf_dir) / "generation_config.json";
  if (fs::is_regular_file(gen)) fs::copy_file(gen, fs::path(out.path()) / "generation_config.json");
  ImportReport r;
  r.family = hm.family;
  r.tensors = static_cast<int64_t>(weights.tensors().size());
  r.warnings = hm.warnings;
  if (skipped_mtp > 0) {
    r.warnings.push_back(std::to_string(skipped_mtp) +
                         " tensors of multi-token-prediction layers (num_nextn_predict_layers, "
                         "mtp.*) are not imported, as transformers drops them; exports have "
                         "none");
  }
  r.tokenizer_files = checkpoint::copy_tokenizer_files(hf_dir, out.path());
  out.commit();
  return r;
}

namespace {
// Where a vision-language release's vision tower is mapped until written: the file import-hf
// kept beside the checkpoint, or the release itself (a run whose model.init_from named it).
struct CarriedSource {
  std::optional<SafetensorsFile> kept;
  std::optional<HfWeights> release;
};

// That vision tower, appended to `views`.
void add_carried_tensors(const families::ModelFamily& family, const std::string& source,
                         const std::string& init_from, CarriedSource& carried,
                         std::vector<SafeTensorView>& views) {
  const fs::path file = fs::path(source) / checkpoint::kCarriedTensorsFile;
  if (!source.empty() && fs::is_regular_file(file)) {
    carried.kept.emplace(file.string());
    for (const auto& [name, e] : carried.kept->entries()) {
      views.push_back({name, e.dtype, e.shape, carried.kept->data(e), e.end - e.begin});
    }
    return;
  }
  const fs::path release = init_from;
  if (init_from.empty() || !fs::is_regular_file(release / "config.json") ||
      fs::exists(release / "state.json")) {
    throw UserError("export-hf: " + file.string() + " is missing: " + family.architecture() +
                    " needs the vision tower import-hf keeps beside a checkpoint (or the release "
                    "directory model.init_from named)");
  }
  carried.release.emplace(init_from);
  for (const auto& [name, ref] : carried.release->tensors()) {
    if (!family.carried_tensor(name)) continue;
    const SafeTensorEntry& e = *ref.entry;
    views.push_back({name, e.dtype, e.shape, ref.file->data(e), e.end - e.begin});
  }
}

// The architecture of the release the checkpoint was imported from when it is one of the
// families' (export-hf writes that form again unless --architecture says otherwise: a family
// whose checkpoints another family's claim would take, GLM-4.7-Flash's as DeepSeek-V3's, or a
// vision-language release); "" for anything else.
std::string released_architecture(const std::string& source) {
  if (source.empty()) return "";
  const fs::path p =
      fs::path(source) /
      (fs::exists(fs::path(source) / "hf_config.json") ? "hf_config.json" : "config.json");
  if (!fs::exists(p)) return "";
  const json c = config::load_json_file(p.string(), "hf");
  if (!c.contains("architectures") || !c["architectures"].is_array() ||
      c["architectures"].empty() || !c["architectures"][0].is_string()) {
    return "";
  }
  const std::string arch = c["architectures"][0].get<std::string>();
  for (const families::ModelFamily* f : families::all_families()) {
    if (arch == f->architecture()) return arch;
  }
  return "";
}

// The family export-hf writes: --architecture's; else the release's the checkpoint came from
// when it can write it (a vision-language release: always), else the highest claim.
const families::ModelFamily& chosen_family(const config::Config& cfg, const std::string& requested,
                                           const std::string& source) {
  if (!requested.empty()) return export_family(cfg, requested);
  const std::string released = released_architecture(source);
  if (released.empty()) return export_family(cfg, "");
  const auto& family = families::family_named(released, "export-hf");
  if (family.text_config_key() != nullptr) return export_family(cfg, released);
  try {
    return export_family(cfg, released);
  } catch (const UserError&) {
    return export_family(cfg, "");  // trained into another family's architecture
  }
}
}  // namespace

ExportReport export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                       const ExportOptions& opt) {
  const checkpoint::CheckpointState cs = checkpoint::read_checkpoint_state(checkpoint_dir);
  const config::Config cfg = config::from_json(cs.config, cs.path);
  const families::ModelFamily& family = [&]() -> const families::ModelFamily& {
    try {
      return chosen_family(cfg, opt.architecture, hf_source_dir(checkpoint_dir, cfg));
    } catch (const UserError& e) {
      throw UserError("export-hf: " + cs.path + ": " + e.what());
    }
  }();
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
  checkpoint::load_checkpoint(checkpoint_dir, model, nullptr, /*restore_rng=*/false);

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
  std::vector<SafeTensorView> views = export_views(model, cfg, family, dt->second, keep);
  // A vision-language release: its vision tower as the imported directory stores it, mapped
  // until written.
  CarriedSource carried;
  if (family.text_config_key() != nullptr) {
    add_carried_tensors(family, source, cfg.model.init_from, carried, views);
  }

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
  r.family = &family;
  r.warnings = std::move(warnings);
  r.tensors = static_cast<int64_t>(views.size());
  r.shards = shards;
  r.tokenizer_files = checkpoint::copy_tokenizer_files(checkpoint_dir, out.path());
  if (r.tokenizer_files.empty() && !source.empty()) {
    r.tokenizer_files = checkpoint::copy_tokenizer_files(source, out.path());
  }
  out.commit();
  return r;
}

}  // namespace moe::convert
