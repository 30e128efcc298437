// Config files as JSON (syntax errors with line:column), --set overrides, load(), and the sizes
// derived from a config. Reading, checking and writing walk the field lists (fields.h).
#include "moe/config/config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"
#include "moe/util/json_nesting.h"

namespace moe::config {

using nlohmann::json;

json parse_json_text(const std::string& text, const std::string& file, const std::string& label) {
  // Printing or copying a deeper value (error messages do) recurses once per level.
  if (json_nests_deeper_than(text)) {
    throw UserError(label + ": " + file + ": arrays and objects nested more than " +
                    std::to_string(max_json_nesting()) + " levels deep (the parser's limit)" +
                    raise_hint("json.nesting"));
  }
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
    throw UserError(label + ": " + file + ":" + std::to_string(line) + ":" + std::to_string(col) +
                    ": invalid JSON: " + reason);
  } catch (const json::exception& e) {
    // E.g. out_of_range for a number like 1e3000 (found by fuzz/fuzz_config.cpp).
    std::string what = e.what();
    auto pos = what.find("] ");
    throw UserError(label + ": " + file +
                    ": invalid JSON: " + (pos == std::string::npos ? what : what.substr(pos + 2)));
  }
}

namespace {
// Python's json writes inf and nan as bare Infinity, -Infinity and NaN (not JSON); Hugging Face
// config.json files hold them (Nemotron-H's time_step_limit [0.0, Infinity]). Outside strings they
// become the strings "Infinity", "-Infinity", "NaN", which the readers of such keys accept.
std::string quote_python_non_finite(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const size_t n = std::char_traits<char>::length(word);
      if (text.compare(i, n, word) == 0) {
        out += std::string("\"") + word + "\"";
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}
}  // namespace

json load_json_file(const std::string& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(label + ": " + path + ": cannot open file for reading");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw UserError(label + ": " + path + ": file is empty; expected a JSON object");
  }
  if (label == "hf") text = quote_python_non_finite(text);  // Hugging Face's files only
  json root = parse_json_text(text, path, label);
  if (!root.is_object()) {
    throw UserError(label + ": " + path + ": top level is " + std::string(root.type_name()) +
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

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  json root = load_json_file(path);
  for (const auto& o : overrides) apply_override(root, o);
  Config c = from_json(root, path);
  validate(c);
  return c;
}

int64_t expert_hidden_size(const Config& c) {
  if (c.moe.expert_hidden_size > 0) return c.moe.expert_hidden_size;
  // SwiGLU convention (LLaMA): 2/3 of 4h, rounded up to a multiple of 64.
  int64_t h = (8 * c.model.hidden_size) / 3;
  return ((h + 63) / 64) * 64;
}

int64_t expert_model_size(const Config& c) {
  return c.moe.latent_size > 0 ? c.moe.latent_size : c.model.hidden_size;
}

int64_t head_dim(const Config& c) {
  return c.model.head_dim > 0 ? c.model.head_dim : c.model.hidden_size / c.model.num_heads;
}

bool latent_attention(const Config& c) { return c.model.kv_lora_rank > 0; }

int64_t qk_head_dim(const Config& c) {
  return latent_attention(c) ? c.model.qk_nope_head_dim + c.model.qk_rope_head_dim : head_dim(c);
}

int64_t value_head_dim(const Config& c) {
  return latent_attention(c) ? c.model.v_head_dim : head_dim(c);
}

int64_t key_value_heads(const Config& c) {
  return c.model.num_key_value_heads > 0 ? c.model.num_key_value_heads : c.model.num_heads;
}

bool is_moe_layer(const Config& c, int64_t layer) {
  if (c.model.sublayer_blocks) return c.model.layer_types.at(static_cast<size_t>(layer)) == "moe";
  for (int64_t l : c.moe.mlp_only_layers) {
    if (l == layer) return false;
  }
  return (layer + 1) % c.moe.decoder_sparse_step == 0;
}

bool quantized_base(const Config& c) {
  return c.lora.r > 0 &&
         (c.quantization.load_in_4bit || c.quantization.quant_method == QuantMethod::kMxfp4);
}

int64_t attention_window(const Config& c, int64_t layer) {
  const auto& types = c.model.layer_types;
  if (c.model.sliding_window <= 0) return 0;
  if (types.empty() || types.at(static_cast<size_t>(layer)) == "sliding_attention") {
    return c.model.sliding_window;
  }
  return 0;
}

bool linear_attention_layer(const Config& c, int64_t layer) {
  const auto& types = c.model.layer_types;
  return !types.empty() && types.at(static_cast<size_t>(layer)) == "linear_attention";
}

bool mamba_layer(const Config& c, int64_t layer) {
  const auto& types = c.model.layer_types;
  return !types.empty() && types.at(static_cast<size_t>(layer)) == "mamba";
}

bool has_feed_forward(const Config& c, int64_t layer) {
  if (!c.model.sublayer_blocks) return true;
  const std::string& t = c.model.layer_types.at(static_cast<size_t>(layer));
  return t == "moe" || t == "mlp";
}

bool has_mixer(const Config& c, int64_t layer) {
  return !c.model.sublayer_blocks || !has_feed_forward(c, layer);
}

bool gated_mlp(const Config& c) { return c.moe.activation != ExpertActivation::kRelu2; }

bool learned_positions(const Config& c) {
  return c.model.rope_theta <= 0 && !c.model.no_position_encoding;
}

int64_t mamba_inner_size(const Config& c) {
  return c.model.mamba_num_heads * c.model.mamba_head_dim;
}

int64_t mamba_conv_channels(const Config& c) {
  return mamba_inner_size(c) + 2 * c.model.mamba_n_groups * c.model.ssm_state_size;
}

bool global_attention_layer(const Config& c, int64_t layer) {
  const auto& types = c.model.layer_types;
  return !types.empty() && types.at(static_cast<size_t>(layer)) == "full_attention";
}

int64_t layer_head_dim(const Config& c, int64_t layer) {
  if (c.model.global_head_dim > 0 && global_attention_layer(c, layer)) {
    return c.model.global_head_dim;
  }
  return head_dim(c);
}

int64_t layer_key_value_heads(const Config& c, int64_t layer) {
  if (c.model.global_num_key_value_heads > 0 && global_attention_layer(c, layer)) {
    return c.model.global_num_key_value_heads;
  }
  return key_value_heads(c);
}

bool keys_are_values(const Config& c, int64_t layer) {
  return c.model.attention_k_eq_v && global_attention_layer(c, layer);
}

int64_t moe_layer_count(const Config& c) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.model.num_layers; ++l) n += is_moe_layer(c, l) ? 1 : 0;
  return n;
}

int64_t dense_hidden_size(const Config& c) {
  if (c.model.dense_hidden_size > 0) return c.model.dense_hidden_size;
  const int64_t h = (8 * c.model.hidden_size) / 3;
  return ((h + 63) / 64) * 64;
}

namespace {
// Multi-head latent attention: q (one projection, or q_a -> norm -> q_b), kv_a -> norm -> kv_b,
// the output projection.
int64_t latent_attention_weights(const Config& c) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, H = m.num_heads, qk = qk_head_dim(c);
  const int64_t q =
      m.q_lora_rank > 0 ? d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * qk : d * H * qk;
  const int64_t kv = d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
                     m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim);
  return q + kv + H * m.v_head_dim * d;
}

// The q, k and v projections' rows of block `layer`: (H + 2 KV) hd, or (H + KV) hd where the
// keys are the values.
int64_t qkv_rows(const Config& c, int64_t layer) {
  const int64_t kv = layer_key_value_heads(c, layer) * (keys_are_values(c, layer) ? 1 : 2);
  return (c.model.num_heads + kv) * layer_head_dim(c, layer);
}

// q, k, v and output projections: d x (H + 2 KV) hd + H hd x d, their biases, the sinks.
int64_t attention_weights(const Config& c, int64_t layer) {
  if (latent_attention(c)) return latent_attention_weights(c);
  const int64_t d = c.model.hidden_size, H = c.model.num_heads, hd = layer_head_dim(c, layer);
  const int64_t qkv_width = qkv_rows(c, layer);
  return d * qkv_width + H * hd * d + (c.model.attention_bias ? qkv_width + d : 0) +
         (c.model.attention_sinks ? H : 0);
}

// Gated DeltaNet: the input projections (q, k, v, z, b, a in either layout), the depthwise
// conv over q, k, v, dt_bias and A_log, the gated norm and out_proj.
int64_t linear_attention_weights(const Config& c) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, nv = m.linear_num_value_heads;
  const int64_t kd = m.linear_num_key_heads * m.linear_key_head_dim;
  const int64_t vd = nv * m.linear_value_head_dim, conv = 2 * kd + vd;
  return d * (conv + vd + 2 * nv) + conv * m.linear_conv_kernel_dim + 2 * nv +
         m.linear_value_head_dim + vd * d;
}

// Mamba-2: in_proj to z, x, B, C and dt, the conv over x, B, C (and its bias), dt_bias, A_log
// and D, the gated norm, out_proj (and the projections' biases).
int64_t mamba_weights(const Config& c) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, inner = mamba_inner_size(c), conv = mamba_conv_channels(c);
  const int64_t in = inner + conv + m.mamba_num_heads;
  return d * in + conv * m.mamba_conv_kernel + (m.mamba_conv_bias ? conv : 0) +
         3 * m.mamba_num_heads + inner + inner * d + (m.mamba_proj_bias ? in + d : 0);
}

// The token mixer of block `layer`: none (a feed-forward-only block), Gated DeltaNet, Mamba-2
// or attention (its output gate included).
int64_t mixer_weights(const Config& c, int64_t layer) {
  if (!has_mixer(c, layer)) return 0;
  if (linear_attention_layer(c, layer)) return linear_attention_weights(c);
  if (mamba_layer(c, layer)) return mamba_weights(c);
  const int64_t gate = c.model.attention_output_gate
                           ? c.model.hidden_size * c.model.num_heads * layer_head_dim(c, layer)
                           : 0;
  return attention_weights(c, layer) + gate;
}

int64_t mamba_layer_count(const Config& c) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.model.num_layers; ++l) n += mamba_layer(c, l) ? 1 : 0;
  return n;
}

int64_t linear_layer_count(const Config& c) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.model.num_layers; ++l) n += linear_attention_layer(c, l) ? 1 : 0;
  return n;
}

// The router's weight and bias, its input scale and per-expert scale.
int64_t router_weights(const Config& c) {
  return (c.model.hidden_size + (c.moe.router_bias ? 1 : 0)) * c.moe.num_experts +
         (c.moe.router_input_norm ? c.model.hidden_size : 0) +
         (c.moe.per_expert_scale ? c.moe.num_experts : 0);
}

// The block's RMSNorm weights (and its scalar): two, the sandwich's two output norms, the
// parallel dense MLP's three beside the experts.
int64_t block_norm_weights(const Config& c, int64_t layer) {
  const auto& m = c.model;
  const bool parallel = c.moe.parallel_dense && is_moe_layer(c, layer);
  if (m.sublayer_blocks) return m.hidden_size;  // the sublayer's one norm
  return m.hidden_size * (2 + (m.sandwich_norms ? 2 : 0) + (parallel ? 3 : 0)) +
         (m.layer_scalar ? 1 : 0);
}

// The matrices of an MLP or expert: gate, up and down, or up and down (relu2).
int64_t mlp_matrices(const Config& c) { return gated_mlp(c) ? 3 : 2; }

// One routed expert: gate, up, down and their biases (at the latent width under moe.latent_size).
int64_t expert_weights(const Config& c) {
  const int64_t d = expert_model_size(c), f = expert_hidden_size(c);
  return mlp_matrices(c) * d * f + (c.moe.expert_bias ? 2 * f + d : 0);
}

// The blocks with a dense MLP: dense layers, and MoE layers with moe.parallel_dense.
int64_t dense_mlp_count(const Config& c) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.model.num_layers; ++l) {
    const bool moe = is_moe_layer(c, l);
    n += has_feed_forward(c, l) && (!moe || c.moe.parallel_dense) ? 1 : 0;
  }
  return n;
}
}  // namespace

// The shared expert and its sigmoid gate, and the latent projections in and out of the routed
// experts' width (moe.latent_size): what an MoE layer holds beside its router and experts.
static int64_t shared_and_latent_weights(const Config& c) {
  const int64_t latent = c.moe.latent_size > 0 ? 2 * c.model.hidden_size * c.moe.latent_size : 0;
  return mlp_matrices(c) * c.model.hidden_size * c.moe.shared_expert_hidden_size +
         (c.moe.shared_expert_gate ? c.model.hidden_size : 0) + latent;
}

static int64_t qk_norm_weights(const Config& c, int64_t layer) {
  if (!c.model.qk_norm) return 0;
  if (c.model.qk_norm_scope == QkNormScope::kFull) {
    return (c.model.num_heads + layer_key_value_heads(c, layer)) * layer_head_dim(c, layer);
  }
  return 2 * layer_head_dim(c, layer);
}

int64_t layer_parameters(const Config& c, int64_t layer) {
  const int64_t d = c.model.hidden_size, E = c.moe.num_experts;
  const bool attends =
      has_mixer(c, layer) && !linear_attention_layer(c, layer) && !mamba_layer(c, layer);
  const int64_t mixer = mixer_weights(c, layer) + (attends ? qk_norm_weights(c, layer) : 0) +
                        block_norm_weights(c, layer);
  const int64_t dense = mlp_matrices(c) * d * dense_hidden_size(c);
  if (!has_feed_forward(c, layer)) return mixer;
  if (!is_moe_layer(c, layer)) return mixer + dense;
  return mixer + router_weights(c) + E * expert_weights(c) + shared_and_latent_weights(c) +
         (c.moe.parallel_dense ? dense : 0);
}

int64_t count_parameters(const Config& c) {
  const int64_t d = c.model.hidden_size, V = c.model.vocab_size;
  int64_t blocks = 0;
  for (int64_t l = 0; l < c.model.num_layers; ++l) blocks += layer_parameters(c, l);
  int64_t embed = V * d + (learned_positions(c) ? c.model.seq_len * d : 0);
  int64_t head = c.model.tie_embeddings ? 0 : V * d;
  return blocks + embed + head + d;  // + final norm
}

int64_t fp32_parameters_under_16bit_weights(const Config& c) {
  const int64_t d = c.model.hidden_size;
  int64_t n = d;  // the final norm
  for (int64_t l = 0; l < c.model.num_layers; ++l) {
    n += block_norm_weights(c, l) + (is_moe_layer(c, l) ? router_weights(c) : 0);
    if (linear_attention_layer(c, l)) {  // dt_bias, A_log and the gated norm are vectors
      n += 2 * c.model.linear_num_value_heads + c.model.linear_value_head_dim;
      continue;
    }
    if (mamba_layer(c, l)) {  // dt_bias, A_log, D, the gated norm and the biases
      const auto& m = c.model;
      const int64_t conv = mamba_conv_channels(c), inner = mamba_inner_size(c);
      n += 3 * m.mamba_num_heads + inner + (m.mamba_conv_bias ? conv : 0) +
           (m.mamba_proj_bias ? inner + conv + m.mamba_num_heads + d : 0);
      continue;
    }
    if (!has_mixer(c, l)) continue;
    n += qk_norm_weights(c, l);
    // Vectors stay fp32 too: the attention biases and sinks (the experts' [E, n] biases are
    // matrices, held 16-bit).
    const int64_t qkv_width = qkv_rows(c, l);
    n += (c.model.attention_bias ? qkv_width + d : 0) +
         (c.model.attention_sinks ? c.model.num_heads : 0) +
         (latent_attention(c) ? c.model.q_lora_rank + c.model.kv_lora_rank : 0);  // MLA's norms
  }
  return n;
}

std::vector<ModuleCost> module_costs(const Config& c, bool causal_half) {
  const int64_t d = c.model.hidden_size, V = c.model.vocab_size, S = c.model.seq_len;
  const int64_t E = c.moe.num_experts, k = c.moe.top_k, f = expert_hidden_size(c);
  const int64_t fs = c.moe.shared_expert_hidden_size, H = c.model.num_heads;
  const int64_t L = c.model.num_layers, M = moe_layer_count(c), fd = dense_hidden_size(c);
  // The routed experts' width, and the latent projections' weights (moe.latent_size).
  const int64_t de = expert_model_size(c), latent = c.moe.latent_size > 0 ? 2 * d * de : 0;
  const auto dbl = [](int64_t x) { return static_cast<double>(x); };
  const int64_t Lin = linear_layer_count(c);
  // Attention layers' weights (and their norms) and forward FLOPs: one row of L - Lin alike, or
  // one summed row where full-attention layers have a shape of their own (Gemma 4).
  int64_t attn_count = 0, attn_params = 0, first_params = -1;
  double attn_flops = 0, first_flops = 0;
  bool alike = true;
  for (int64_t l = 0; l < L; ++l) {
    if (!has_mixer(c, l) || linear_attention_layer(c, l) || mamba_layer(c, l)) continue;
    const bool parallel = c.moe.parallel_dense && is_moe_layer(c, l);
    // The block's other norms with it; the MoE norm is the router's row, the parallel dense
    // MLP's pre-norm the dense row's.
    const int64_t p = mixer_weights(c, l) + qk_norm_weights(c, l) + block_norm_weights(c, l) -
                      (c.model.sublayer_blocks ? 0 : d * (parallel ? 2 : 1));
    const int64_t width = latent_attention(c) ? qk_head_dim(c) + value_head_dim(c)
                                              : 2 * layer_head_dim(c, l);  // QK^T and AV
    const double flops =
        2 * dbl(mixer_weights(c, l)) + (causal_half ? 1 : 2) * dbl(S) * dbl(H * width);
    if (first_params < 0) first_params = p, first_flops = flops;
    alike = alike && p == first_params && flops == first_flops;
    ++attn_count, attn_params += p, attn_flops += flops;
  }
  const ModuleCost attention =
      alike ? ModuleCost{"attention", attn_count, std::max<int64_t>(first_params, 0), first_flops}
            : ModuleCost{"attention", 1, attn_params, attn_flops};
  std::vector<ModuleCost> costs = {
      {"embedding", 1, V * d + (learned_positions(c) ? S * d : 0), 0.0},
      attention,
      {"router", M, router_weights(c) + d, 2 * dbl(d * E)},  // + the MoE RMSNorm
      {"dispatch", M, 0, 0.0},                               // a gather: no FLOPs
      {"experts", M, E * expert_weights(c) + mlp_matrices(c) * d * fs + latent,
       2 * dbl(mlp_matrices(c)) * (dbl(k) * dbl(de * f) + dbl(d * fs)) + 2 * dbl(latent)},
      {"combine", M, 0, 2 * dbl(k * de)},  // weighted sum
  };
  if (Lin > 0) {
    // Projections, plus per value head the chunked delta rule: the state's three dk x dv
    // products per token and the 64-wide intra-chunk attention over dk and dv.
    const auto& m = c.model;
    const int64_t lin = linear_attention_weights(c);
    costs.push_back(
        {"linear_attention", Lin, lin + d,
         2 * dbl(lin) + dbl(m.linear_num_value_heads) *
                            (6 * dbl(m.linear_key_head_dim * m.linear_value_head_dim) +
                             2 * 64 * dbl(m.linear_key_head_dim + m.linear_value_head_dim))});
  }
  if (const int64_t Lm = mamba_layer_count(c); Lm > 0) {
    // Projections, plus per head the chunked scan: the chunk's C B^T and its product with x
    // (Q wide, the full square), the chunk's state and its readout (N x P each).
    const auto& m = c.model;
    const int64_t w = mamba_weights(c), Q = m.mamba_chunk_size;
    const double N = dbl(m.ssm_state_size), P = dbl(m.mamba_head_dim);
    costs.push_back({"mamba", Lm, w + d,
                     2 * dbl(w) + dbl(m.mamba_num_heads) * (2 * dbl(Q) * (N + P) + 4 * N * P)});
  }
  // Dense layers, and the dense MLPs beside the experts (moe.parallel_dense).
  const int64_t mats = mlp_matrices(c);
  if (const int64_t dense_layers = dense_mlp_count(c); dense_layers > 0) {
    costs.push_back({"dense_ffn", dense_layers, mats * d * fd + d, 2 * dbl(mats * d * fd)});
  }
  costs.push_back({"head", 1, d + (c.model.tie_embeddings ? 0 : V * d), 2 * dbl(d * V)});
  return costs;
}

double training_flops_per_token(const Config& c, bool causal_half) {
  double sum = 0;
  for (const ModuleCost& m : module_costs(c, causal_half)) {
    sum += m.forward_flops_per_token * static_cast<double>(m.count);
  }
  return 3 * sum;
}

int64_t active_parameters_per_token(const Config& c) {
  const int64_t d = c.model.hidden_size, L = c.model.num_layers;
  const int64_t M = moe_layer_count(c);
  int64_t mixers = 0;
  for (int64_t l = 0; l < L; ++l) mixers += mixer_weights(c, l);
  return mixers +
         M * (router_weights(c) + c.moe.top_k * expert_weights(c) + shared_and_latent_weights(c)) +
         dense_mlp_count(c) * mlp_matrices(c) * d * dense_hidden_size(c) + c.model.vocab_size * d;
}

DataParallelMode data_parallel_mode(const Config& c, int64_t world_size) {
  DataParallelMode m;
  m.world_size = std::max<int64_t>(1, world_size);
  if (!m.distributed()) return m;
  m.zero_stage = c.zero_optimization.stage;
  m.expert_parallel = std::max<int64_t>(1, c.moe.expert_parallel_size);
  m.reduction = !c.zero_optimization.overlap_comm || m.expert_parallel > 1
                    ? GradientReduction::kAllReduceAfterBackward
                : m.shards_gradients() ? GradientReduction::kReduceToOwnersInBackward
                                       : GradientReduction::kReducerInBackward;
  return m;
}

int64_t reduce_bucket_bytes(const Config& c) { return c.zero_optimization.reduce_bucket_size * 4; }
int64_t allgather_bucket_bytes(const Config& c) {
  return c.zero_optimization.allgather_bucket_size * 4;
}

}  // namespace moe::config
