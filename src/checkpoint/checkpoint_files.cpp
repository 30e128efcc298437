#include "moe/checkpoint/checkpoint_files.h"

#include <ATen/Context.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "moe/checkpoint/checkpoint_dirs.h"
#include "moe/checkpoint/init_from.h"
#include "moe/config/lora.h"
#include "moe/layers/lora.h"
#include "moe/quant/blockwise_quant.h"
#include "moe/util/errors.h"
#include "moe/util/fault_injection.h"
#include "moe/util/safetensors.h"
#include "moe/util/safetensors_dtype.h"

namespace moe::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* dtype_name(at::ScalarType t) { return safetensors_dtype_of(t); }

// Host copies keep the tensors alive while the file is written.
struct HostTensors {
  std::vector<at::Tensor> keep;
  std::vector<SafeTensorView> views;
  void add(const std::string& name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    keep.push_back(c);
    views.push_back({name, dtype_name(c.scalar_type()), c.sizes().vec(), c.data_ptr(),
                     static_cast<size_t>(c.nbytes())});
  }
};

// A float tensor of the file may fill a float parameter of another width: a LoRA run's 16-bit
// base loads from fp32 checkpoints.
bool converts(const std::string& file_dtype, const at::Tensor& dst) {
  const bool sixteen = dst.scalar_type() == at::kBFloat16 || dst.scalar_type() == at::kHalf;
  return is_float_weight_dtype(file_dtype) && sixteen;
}

// The scalar type of tensor `name` of `f`; a dtype safetensors_dtype.h does not know is refused.
at::ScalarType scalar_type_of(const SafetensorsFile& f, const std::string& name) {
  const std::string& dtype = f.entry(name).dtype;
  if (auto t = scalar_type_of_safetensors(dtype)) return *t;
  throw UserError("checkpoint: " + f.path() + ": tensor '" + name + "' has dtype " + dtype +
                  ", which no tensor of a checkpoint has");
}

using ExpertRows = model::TransformerLMImpl::ExpertRows;
using RowsOf = std::function<std::optional<ExpertRows>(const std::string&)>;

// The shape a checkpoint holds for `t`: the whole tensor of which an expert-parallel rank holds
// `rows` (dim 0: the experts).
std::vector<int64_t> file_shape(const at::Tensor& t, const std::optional<ExpertRows>& rows) {
  std::vector<int64_t> shape = t.sizes().vec();
  if (rows && !shape.empty()) shape[0] = rows->total;
  return shape;
}

// `rows`: an expert-parallel rank's share of the file's tensor (its experts' rows).
void copy_into(const SafetensorsFile& f, const std::string& name, at::Tensor& dst,
               const std::optional<ExpertRows>& rows = std::nullopt) {
  const SafeTensorEntry& e = f.entry(name);
  const bool convert = e.dtype != dtype_name(dst.scalar_type()) && converts(e.dtype, dst);
  const std::vector<int64_t> shape = file_shape(dst, rows);
  at::Tensor host = at::empty(shape, dst.options().device(at::kCPU).dtype(
                                         convert ? scalar_type_of(f, name) : dst.scalar_type()));
  if ((e.dtype != dtype_name(dst.scalar_type()) && !convert) || e.shape != shape) {
    std::ostringstream msg;
    msg << "tensor '" << name << "' is " << e.dtype << " " << at::IntArrayRef(e.shape)
        << "; the model expects " << dtype_name(dst.scalar_type()) << " " << dst.sizes();
    throw UserError("checkpoint: " + f.path() + ": " + msg.str());
  }
  std::memcpy(host.data_ptr(), f.data(e), e.end - e.begin);
  f.release(e);
  at::NoGradGuard g;
  dst.copy_(rows && dst.dim() > 0 ? host.narrow(0, rows->first, rows->count) : host);
}

// `f` holds exactly the tensors of `expected`, each with the dtype and shape of its tensor.
void check_tensor_set(const SafetensorsFile& f,
                      const std::vector<std::pair<std::string, at::Tensor>>& expected,
                      const char* owner, bool extra_allowed = false,
                      const std::set<std::string>& also_expected = {}, const RowsOf& rows_of = {}) {
  std::set<std::string> names = also_expected;
  for (const auto& [name, t] : expected) {
    names.insert(name);
    const SafeTensorEntry& e = f.entry(name);  // missing: an error naming it
    const bool dtype_ok = e.dtype == dtype_name(t.scalar_type()) || converts(e.dtype, t);
    const auto shape = file_shape(t, rows_of ? rows_of(name) : std::nullopt);
    if (!dtype_ok || e.shape != shape) {
      std::ostringstream msg;
      msg << "tensor '" << name << "' is " << e.dtype << " " << at::IntArrayRef(e.shape) << "; "
          << owner << " expects " << dtype_name(t.scalar_type()) << " " << at::IntArrayRef(shape);
      throw UserError("checkpoint: " + f.path() + ": " + msg.str());
    }
  }
  int64_t extra = 0;
  std::string first;
  for (const auto& [name, e] : f.entries()) {
    if (names.count(name) != 0) continue;
    if (extra++ == 0) first = name;
  }
  if (extra > 0 && !extra_allowed) {
    throw UserError("checkpoint: " + f.path() + ": tensor '" + first + "' is not in " + owner +
                    " (" + std::to_string(extra) +
                    " unexpected tensors: a checkpoint of another architecture?)");
  }
}

// One Adam moment from the file into the state's own storage. The same storage is copied as it
// is (a bitwise resume); another one (a checkpoint written with another optimizer.exp_avg_dtype)
// goes through fp32: 8-bit codes are dequantised, then cast or quantised for this run. With
// `check_only`, only checks (everything is checked before anything is copied). Adds the names it
// reads to `read`.
void load_moment(const SafetensorsFile& f, const std::string& name, optim::AdamWState& st,
                 int which, bool check_only, std::set<std::string>& read,
                 const std::optional<ExpertRows>& rows) {
  at::Tensor& dst = which == 0 ? st.exp_avg : st.exp_avg_sq;
  at::Tensor& dst_absmax = which == 0 ? st.exp_avg_absmax : st.exp_avg_sq_absmax;
  const SafeTensorEntry& e = f.entry(name);  // missing: an error naming it
  const bool codes = e.dtype == "U8";
  const bool floats = is_float_weight_dtype(e.dtype);
  const std::vector<int64_t> blocks = {quant::quant_blocks(dst.numel())};
  const std::string absmax_name = name + ".absmax";
  const std::vector<int64_t> shape = file_shape(dst, rows);
  bool ok = (codes || floats) && e.shape == shape && (!codes || !rows);
  if (ok && codes) {
    const SafeTensorEntry& a = f.entry(absmax_name);
    ok = a.dtype == "F32" && a.shape == blocks;
  }
  if (!ok) {
    std::ostringstream msg;
    msg << "tensor '" << name << "' is " << e.dtype << " " << at::IntArrayRef(e.shape)
        << "; the optimizer expects an Adam moment of shape " << at::IntArrayRef(shape)
        << " (F32, BF16, or U8 codes with an F32 '.absmax' of " << blocks[0] << " blocks)";
    throw UserError("checkpoint: " + f.path() + ": " + msg.str());
  }
  read.insert(name);
  if (codes) read.insert(absmax_name);
  if (check_only) return;
  if (codes && dst_absmax.defined()) {
    copy_into(f, name, dst);
    copy_into(f, absmax_name, dst_absmax);
    return;
  }
  if (!codes && !dst_absmax.defined() && e.dtype == dtype_name(dst.scalar_type())) {
    copy_into(f, name, dst, rows);
    return;
  }
  at::Tensor value;
  if (codes) {
    at::Tensor c = at::empty(dst.sizes(), at::kByte);
    at::Tensor a = at::empty(blocks, at::kFloat);
    copy_into(f, name, c);
    copy_into(f, absmax_name, a);
    value = quant::dequantize_blockwise(c, a, quant::dynamic_map(which == 0, c.device()));
  } else {
    at::Tensor t = at::empty(dst.sizes(), scalar_type_of(f, name));
    copy_into(f, name, t, rows);
    value = t.to(at::kFloat);
  }
  at::NoGradGuard g;
  set_moment(st, which, value.to(dst.device()));
}

std::string to_hex(const at::Tensor& bytes) {
  static const char* d = "0123456789abcdef";
  const auto* p = bytes.data_ptr<uint8_t>();
  std::string s(static_cast<size_t>(bytes.numel()) * 2, '0');
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    s[2 * i] = d[p[i] >> 4];
    s[2 * i + 1] = d[p[i] & 15];
  }
  return s;
}

at::Tensor from_hex(const std::string& s, const std::string& file) {
  if (s.size() % 2 != 0) throw UserError("checkpoint: " + file + ": bad RNG state");
  at::Tensor t = at::empty({static_cast<int64_t>(s.size() / 2)}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw UserError("checkpoint: " + file + ": bad RNG state");
  };
  for (size_t i = 0; i < s.size() / 2; ++i)
    p[i] = static_cast<uint8_t>(nib(s[2 * i]) * 16 + nib(s[2 * i + 1]));
  return t;
}

// Test hook (tests/train/crash_test.py): MOE_TEST_PAUSE_IN_CHECKPOINT_MS widens the window
// between a checkpoint's files so that random SIGKILLs land inside writes.
void test_pause() {
  if (const int ms = fault_injection().pause_in_checkpoint_ms; ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

// The tensors a checkpoint of `model` holds: every parameter, or with LoRA what trains (the
// adapters and lora.modules_to_save): the frozen base is referenced, not copied.
std::vector<std::pair<std::string, at::Tensor>> checkpointed_parameters(
    model::TransformerLM& model) {
  if (model->has_lora()) return layers::trainable_parameters(*model);
  std::vector<std::pair<std::string, at::Tensor>> all;
  for (auto& item : model->named_parameters()) all.emplace_back(item.key(), item.value());
  return all;
}

// What a checkpoint without adapters gives a LoRA model: its base (model.init_from of a LoRA
// run); the adapters keep their initial values.
std::vector<std::pair<std::string, at::Tensor>> base_parameters(model::TransformerLM& model) {
  std::vector<std::pair<std::string, at::Tensor>> base;
  for (auto& item : model->named_parameters()) {
    if (!config::is_lora_parameter(item.key())) base.emplace_back(item.key(), item.value());
  }
  return base;
}

// `master_weight` (optional): the fp32 master of a 16-bit weight, written in its place so that a
// checkpoint of any tier loads into any other.
// `whole` (optional): an expert-parallel parameter's whole tensor (gathered from its EP group),
// written in place of this rank's share.
void write_model_file(const std::string& dir, model::TransformerLM& model,
                      const std::function<at::Tensor(const std::string&)>& master_weight = {},
                      const std::function<at::Tensor(const std::string&)>& whole = {}) {
  HostTensors weights;
  for (const auto& [name, t] : checkpointed_parameters(model)) {
    const at::Tensor full = whole ? whole(name) : at::Tensor();
    const at::Tensor master = master_weight ? master_weight(name) : at::Tensor();
    weights.add(name, full.defined() ? full : master.defined() ? master : t);
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), weights.views,
                    {{"format", "pt"}, {"producer", "moe-train"}});
}

// state.json; `with_rng`: the RNG states (a resumable checkpoint; an imported one has none).
// `model` (optional): its expert biases and LoRA base fingerprint.
void write_state_file(const std::string& dir, model::TransformerLM* model,
                      const TrainingState& state, bool with_rng, const json& extra) {
  json j;
  j["format_version"] = kCheckpointFormatVersion;
  j["step"] = state.step;
  j["tokens"] = state.tokens;
  j["loader"] = {{"epoch", state.loader.epoch}, {"position", state.loader.position}};
  j["loss_scaler"] = {{"scale", state.scaler.scale},
                      {"cur_iter", state.scaler.cur_iter},
                      {"last_overflow_iter", state.scaler.last_overflow_iter},
                      {"cur_hysteresis", state.scaler.cur_hysteresis},
                      {"skipped_steps", state.scaler.skipped_steps}};
  if (with_rng) {
    j["rng"]["cpu"] = to_hex(at::detail::getDefaultCPUGenerator().get_state());
    if (at::hasCUDA()) {
      j["rng"]["cuda"] = to_hex(at::globalContext().defaultGenerator(at::kCUDA).get_state());
    }
  }
  // Expert biases (aux-loss-free balancing) are buffers, not weights: the state carries them.
  for (const auto& b : model != nullptr ? (*model)->named_buffers()
                                        : torch::OrderedDict<std::string, at::Tensor>()) {
    if (b.key().size() >= 11 && b.key().compare(b.key().size() - 11, 11, "expert_bias") == 0) {
      auto v = b.value().to(at::kCPU, at::kFloat).contiguous();
      j["expert_biases"][b.key()] =
          std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
    }
  }
  j["metrics_lines"] = state.metrics_lines;
  j["config"] = state.config;
  if (model != nullptr && (*model)->has_lora()) {
    j["lora_base_fingerprint"] = (*model)->base_fingerprint();
    j["lora_base_dtype"] = c10::toString((*model)->base_dtype());
  }
  for (const auto& [key, value] : extra.items()) j[key] = value;
  const std::string path = (fs::path(dir) / "state.json").string();
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.flush();
  if (!out) throw TrainingError("checkpoint: " + path + ": write failed (disk full?)");
}

// A LoRA checkpoint goes with the base it was trained on: a model without LoRA cannot take it,
// a model whose base is not loaded yet (eval, export-hf) loads the one the checkpoint's config
// names, and a different base (another fingerprint) is refused by name.
void check_lora_base(const std::string& dir, const json& state, model::TransformerLM& model) {
  const std::string file = (fs::path(dir) / "state.json").string();
  const config::Config written = config::from_json(state.at("config"), file);
  if (!model->has_lora()) {
    throw UserError("checkpoint: " + dir +
                    ": holds LoRA adapters (lora.r = " + std::to_string(written.lora.r) +
                    ") over a frozen base; this model has no LoRA section: use the config of the "
                    "run that wrote it, or export-hf --merge it first");
  }
  if (model->base_fingerprint().empty()) load_lora_base(written, model, /*seeded=*/false);
  const std::string recorded = state.at("lora_base_fingerprint").get<std::string>();
  // The base as the run that wrote the checkpoint held it (a GPU run's bf16 matrices are
  // checked on a CPU by rounding the fp32 values the same way).
  const std::string held = state.value("lora_base_dtype", std::string("Float"));
  torch::ScalarType dtype = torch::kFloat;
  for (auto t : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    if (held == c10::toString(t)) dtype = t;
  }
  const std::string mine =
      dtype == model->base_dtype()
          ? model->base_fingerprint()
          : layers::base_fingerprint(*model, dtype, model->quantized_weights());
  if (mine == recorded) return;
  auto named = [](const std::string& init_from) {
    return init_from.empty() ? std::string("a random initialisation (no model.init_from)")
                             : "model.init_from = " + init_from;
  };
  // A 4-bit base is another base than the same weights in 16 bits or quantized another way.
  auto held_as = [](bool four_bit, config::Quant4bitType type, bool double_quant) {
    if (!four_bit) return std::string();
    return std::string(" held in 4 bits (") + std::string(config::name(type)) +
           (double_quant ? ", double quant)" : ")");
  };
  const auto& wq = written.quantization;
  const auto& mq = model->quantized_weights();
  const bool their_mx = wq.quant_method == config::QuantMethod::kMxfp4;
  const std::string theirs =
      their_mx ? std::string(" with MXFP4 experts")
               : held_as(wq.load_in_4bit, wq.bnb_4bit_quant_type, wq.bnb_4bit_use_double_quant);
  const std::string ours = mq.empty() ? std::string()
                           : mq.begin()->second->options().mxfp4
                               ? " with MXFP4 experts"
                               : held_as(true, mq.begin()->second->options().type,
                                         mq.begin()->second->options().double_quant);
  throw BaseMismatchError("checkpoint: " + dir + ": its LoRA adapters were trained on " +
                          named(written.model.init_from) + theirs + " (base fingerprint " +
                          recorded + "); this run's base, " + named(model->lora_base_source()) +
                          ours + ", has fingerprint " + mine +
                          ": a different base model; point model.init_from at the base the "
                          "adapters were trained on, or start a new output_dir");
}

// 16-bit working weights: their masters from the file's values (fp32 when a 16-bit tier wrote
// them, the weight itself when the default tier did), the weights rounded from those.
void load_master_weights(const SafetensorsFile& weights, const SafetensorsFile& opt,
                         const std::vector<std::pair<std::string, at::Tensor>>& params,
                         optim::FusedAdamW& optimizer) {
  if (!optimizer.has_16bit_params()) return;
  auto read = [](const SafetensorsFile& f, const std::string& name, const at::Tensor& like) {
    at::Tensor t = at::empty(like.sizes(), scalar_type_of(f, name));
    copy_into(f, name, t);
    return t.to(at::kFloat);
  };
  for (const auto& [name, t] : params) {
    if (t.scalar_type() == at::kFloat) continue;
    std::optional<at::Tensor> compensation;
    if (opt.has(name + ".compensation")) compensation = read(opt, name + ".compensation", t);
    optimizer.load_master_weight(name, read(weights, name, t), compensation);
  }
}

}  // namespace

void save_weights_checkpoint(const std::string& dir, model::TransformerLM& model,
                             const TrainingState& state, const json& extra) {
  write_model_file(dir, model);
  write_state_file(dir, &model, state, /*with_rng=*/false, extra);
}

void write_weights_state(const std::string& dir, const TrainingState& state, const json& extra) {
  write_state_file(dir, nullptr, state, /*with_rng=*/false, extra);
}

OptimizerStream local_optimizer_stream(optim::FusedAdamW& optimizer) {
  OptimizerStream s;
  std::vector<at::Tensor> tensors;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    s.layout.push_back({name, dtype_name(t.scalar_type()), t.sizes().vec(), nullptr,
                        static_cast<size_t>(t.nbytes())});
    tensors.push_back(t);
  };
  for (auto& [name, st] : optimizer.named_state()) {
    add(name + ".exp_avg", st->exp_avg);  // 8-bit moments: the codes, then their scales
    if (st->exp_avg_absmax.defined()) add(name + ".exp_avg.absmax", st->exp_avg_absmax);
    add(name + ".exp_avg_sq", st->exp_avg_sq);
    if (st->exp_avg_sq_absmax.defined()) add(name + ".exp_avg_sq.absmax", st->exp_avg_sq_absmax);
    add(name + ".step", st->step);
  }
  for (auto& [name, c] : optimizer.named_compensation()) add(name + ".compensation", c);
  if (optimizer.has_16bit_params()) {
    s.master_weight = [&optimizer](const std::string& name) {
      return optimizer.master_weight_host(name);
    };
  }
  s.each = [tensors](const OptimizerStream::Sink& sink) {
    for (const auto& t : tensors) sink(t);
  };
  return s;
}

namespace {

// optimizer.safetensors from the stream; the stream is drained even after a failed write.
void write_optimizer_file(const std::string& path, const OptimizerStream& optimizer) {
  std::exception_ptr failure;
  std::optional<SafetensorsWriter> out;
  try {
    out.emplace(path, optimizer.layout,
                std::map<std::string, std::string>{
                    {"format", "pt"}, {"producer", "moe-train"}, {"optimizer", "AdamW"}});
  } catch (...) {
    failure = std::current_exception();
  }
  optimizer.each([&](const at::Tensor& t) {
    if (failure) return;
    try {
      const at::Tensor host = t.detach().to(at::kCPU).contiguous();
      out->append(host.data_ptr(), static_cast<size_t>(host.nbytes()));
    } catch (...) {
      failure = std::current_exception();
    }
  });
  if (!failure) {
    try {
      out->finish();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

void save_checkpoint(const std::string& dir, model::TransformerLM& model,
                     const OptimizerStream& optimizer, const TrainingState& state) {
  try {
    write_model_file(dir, model, optimizer.master_weight, optimizer.whole_parameter);
    // Test hook (tests/checkpoint/checkpoint_test.py): die half-way through a checkpoint write.
    if (state.step == fault_injection().abort_in_checkpoint_step) std::abort();
    test_pause();
  } catch (...) {
    optimizer.each([](const at::Tensor&) {});  // the other ranks' gathers still complete
    throw;
  }
  write_optimizer_file((fs::path(dir) / "optimizer.safetensors").string(), optimizer);
  test_pause();
  write_state_file(dir, &model, state, /*with_rng=*/true, json::object());
}

namespace {

// A 4-bit base (its parameters are empty) is checked at its matrices' shapes: `params` with those
// parameters as fp32 meta tensors of their shapes.
std::vector<std::pair<std::string, at::Tensor>> with_4bit_shapes(
    std::vector<std::pair<std::string, at::Tensor>> params,
    const std::map<std::string, layers::QuantizedWeightPtr>& quantized) {
  for (auto& [name, t] : params) {
    if (const auto q = quantized.find(name); q != quantized.end()) {
      t = at::empty(q->second->shape(), at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
    }
  }
  return params;
}

// The checked parameters' values from the file; a 4-bit matrix is read in fp32 on its own and
// quantized (host memory: the 4-bit base plus one parameter).
void copy_parameters(const SafetensorsFile& weights,
                     const std::vector<std::pair<std::string, at::Tensor>>& params,
                     const std::map<std::string, layers::QuantizedWeightPtr>& quantized,
                     const RowsOf& rows_of) {
  for (auto [name, t] : params) {
    if (const auto q = quantized.find(name); q != quantized.end()) {
      at::Tensor full = at::empty(q->second->shape(), at::kFloat);
      copy_into(weights, name, full, rows_of(name));
      q->second->requantize(full);
      continue;
    }
    copy_into(weights, name, t, rows_of(name));
  }
}

}  // namespace

TrainingState load_checkpoint(const std::string& dir, model::TransformerLM& model,
                              optim::FusedAdamW* optimizer, bool restore_rng,
                              bool optimizer_share) {
  // state.json has one reader (resume_policy.h); the tensors' parts of it are read here.
  CheckpointState cs = read_checkpoint_state(dir);
  const std::string& state_path = cs.path;
  const json& j = cs.document;
  TrainingState s;
  s.step = cs.step;
  s.tokens = cs.tokens;
  s.loader = cs.loader;
  s.scaler = cs.scaler;
  s.metrics_lines = cs.metrics_lines;
  s.config = cs.config;
  // Everything is checked before anything is copied: a checkpoint of another architecture (a
  // missing, extra or reshaped tensor, an expert bias the model lacks) is an error naming the
  // first difference and leaves the model and optimizer as they were.
  const bool adapters = j.contains("lora_base_fingerprint");
  if (adapters) check_lora_base(dir, j, model);
  SafetensorsFile weights((fs::path(dir) / "model.safetensors").string());
  const auto params = with_4bit_shapes(
      adapters || !model->has_lora() ? checkpointed_parameters(model) : base_parameters(model),
      model->quantized_weights());
  const RowsOf rows_of = [&model](const std::string& name) { return model->expert_rows(name); };
  check_tensor_set(weights, params, adapters ? "the model's LoRA adapters" : "the model", false, {},
                   rows_of);
  std::optional<SafetensorsFile> opt;
  std::vector<std::pair<std::string, at::Tensor>> states;
  if (optimizer != nullptr) {
    opt.emplace((fs::path(dir) / "optimizer.safetensors").string());
    std::set<std::string> read;
    for (auto& [name, st] : optimizer->named_state()) {
      load_moment(*opt, name + ".exp_avg", *st, 0, /*check_only=*/true, read, rows_of(name));
      load_moment(*opt, name + ".exp_avg_sq", *st, 1, /*check_only=*/true, read, rows_of(name));
      states.emplace_back(name + ".step", st->step);
      // A bf16 master's compensation: read when this run keeps one, else ignored.
      if (opt->has(name + ".compensation")) read.insert(name + ".compensation");
    }
    // The moments' tensors (any storage) count as expected: the set check sees the rest.
    check_tensor_set(*opt, states, "the optimizer", optimizer_share, read);
  }
  auto buffers = model->named_buffers();
  std::vector<std::pair<at::Tensor, std::vector<float>>> bias_values;
  try {
    // Expert biases: zero unless the state carries them (a run without the feature saves none).
    const json biases = j.value("expert_biases", json::object());
    for (const auto& [name, values] : biases.items()) {
      auto* buf = buffers.find(name);
      auto v = values.get<std::vector<float>>();
      if (buf == nullptr || buf->numel() != static_cast<int64_t>(v.size())) {
        throw UserError("checkpoint: " + state_path + ": expert_biases." + name +
                        " does not match this model (" + std::to_string(v.size()) + " values)");
      }
      bias_values.emplace_back(*buf, std::move(v));
    }
  } catch (const json::exception& e) {
    throw UserError("checkpoint: " + state_path + ": expert_biases: " + e.what());
  }
  {
    at::NoGradGuard no_grad;
    for (auto& b : buffers) {
      if (b.key().find("expert_bias") != std::string::npos) b.value().zero_();
    }
    for (auto& [buf, v] : bias_values) buf.copy_(at::tensor(v));
  }
  copy_parameters(weights, params, model->quantized_weights(), rows_of);
  if (optimizer != nullptr) {
    optimizer->reload_master_weights();
    load_master_weights(weights, *opt, params, *optimizer);
    for (auto& [name, t] : states) copy_into(*opt, name, t);
    std::set<std::string> read;
    for (auto& [name, st] : optimizer->named_state()) {
      load_moment(*opt, name + ".exp_avg", *st, 0, /*check_only=*/false, read, rows_of(name));
      load_moment(*opt, name + ".exp_avg_sq", *st, 1, /*check_only=*/false, read, rows_of(name));
    }
  }
  // Restore RNGs last: nothing above draws random numbers, and dropout must continue exactly.
  // Weights-only checkpoints (import-hf) carry none.
  if (!restore_rng || !j.contains("rng")) return s;
  try {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();  // a handle sharing the default
    cpu.set_state(from_hex(j.at("rng").at("cpu").get<std::string>(), state_path));
    if (at::hasCUDA() && j.at("rng").contains("cuda")) {
      at::Generator cuda = at::globalContext().defaultGenerator(at::kCUDA);
      cuda.set_state(from_hex(j["rng"]["cuda"].get<std::string>(), state_path));
    }
  } catch (const json::exception& e) {
    throw UserError("checkpoint: " + state_path + ": " + e.what());
  }
  return s;
}

}  // namespace moe::checkpoint
