#include "json_reader.h"

#include <algorithm>
#include <cmath>

#include "moe/util/errors.h"

namespace moe::config {

namespace {
std::string short_value(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
}  // namespace

ObjectReader::ObjectReader(const nlohmann::json* node, std::string path, std::string file)
    : node_(node), path_(std::move(path)), file_(std::move(file)) {
  if (node_ != nullptr && node_->is_null()) node_ = nullptr;
  if (node_ != nullptr && !node_->is_object()) {
    throw UserError("config: " + file_ + ": " + (path_.empty() ? "<root>" : path_) + " = " +
                    short_value(*node_) + ": expected a JSON object");
  }
}

std::string ObjectReader::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool ObjectReader::has(std::string_view key) const {
  return node_ != nullptr && node_->contains(key) && !(*node_)[std::string(key)].is_null();
}

const nlohmann::json* ObjectReader::find(std::string_view key) {
  known_.emplace(key);
  if (node_ == nullptr) return nullptr;
  auto it = node_->find(key);
  if (it == node_->end() || it->is_null()) return nullptr;
  return &*it;
}

void ObjectReader::type_error(std::string_view key, const nlohmann::json& v,
                              std::string_view expected) const {
  throw UserError("config: " + file_ + ": " + path_of(key) + " = " + short_value(v) +
                  ": expected " + std::string(expected));
}

void ObjectReader::get(std::string_view key, bool& out) {
  if (const auto* v = find(key)) {
    if (!v->is_boolean()) type_error(key, *v, "true or false");
    out = v->get<bool>();
  }
}

void ObjectReader::get(std::string_view key, int64_t& out) {
  const auto* v = find(key);
  if (v == nullptr) return;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
      type_error(key, *v, "an integer below 2^63");
    }
    out = v->get<int64_t>();
    return;
  }
  // Accept 1e4-style integral floats, as Python's DeepSpeed would.
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      out = static_cast<int64_t>(d);
      return;
    }
  }
  type_error(key, *v, "an integer");
}

void ObjectReader::get(std::string_view key, uint64_t& out) {
  int64_t tmp = static_cast<int64_t>(out);
  get(key, tmp);
  if (tmp < 0) type_error(key, (*node_)[std::string(key)], "a non-negative integer");
  out = static_cast<uint64_t>(tmp);
}

void ObjectReader::get(std::string_view key, double& out) {
  if (const auto* v = find(key)) {
    if (!v->is_number()) type_error(key, *v, "a number");
    out = v->get<double>();
    if (!std::isfinite(out)) type_error(key, *v, "a finite number");
  }
}

void ObjectReader::get(std::string_view key, std::string& out) {
  if (const auto* v = find(key)) {
    if (!v->is_string()) type_error(key, *v, "a string");
    out = v->get<std::string>();
  }
}

void ObjectReader::get(std::string_view key, std::array<double, 2>& out) {
  if (const auto* v = find(key)) {
    if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
      type_error(key, *v, "an array of two numbers");
    }
    out = {(*v)[0].get<double>(), (*v)[1].get<double>()};
  }
}

void ObjectReader::get(std::string_view key, std::vector<int64_t>& out) {
  if (const auto* v = find(key)) {
    if (!v->is_array()) type_error(key, *v, "an array of integers");
    std::vector<int64_t> values;
    for (const auto& item : *v) {
      if (!item.is_number_integer()) type_error(key, *v, "an array of integers");
      values.push_back(item.get<int64_t>());
    }
    out = std::move(values);
  }
}

void ObjectReader::get(std::string_view key, std::vector<std::string>& out) {
  if (const auto* v = find(key)) {
    if (!v->is_array()) type_error(key, *v, "an array of strings");
    std::vector<std::string> values;
    for (const auto& item : *v) {
      if (!item.is_string()) type_error(key, *v, "an array of strings");
      values.push_back(item.get<std::string>());
    }
    out = std::move(values);
  }
}

void ObjectReader::get(std::string_view key, std::vector<BlendSource>& out) {
  const auto* v = find(key);
  if (v == nullptr) return;
  const char* expected = "an array of objects {\"path\": ..., \"weight\": ...}";
  if (!v->is_array()) type_error(key, *v, expected);
  std::vector<BlendSource> sources;
  for (size_t i = 0; i < v->size(); ++i) {
    const auto& item = (*v)[i];
    const std::string at = std::string(key) + "[" + std::to_string(i) + "]";
    if (!item.is_object()) type_error(at, item, expected);
    ObjectReader r(&item, path_of(at), file_);
    BlendSource s;
    r.get("name", s.name);
    r.get("path", s.path);
    r.get("weight", s.weight);
    r.get("valid_path", s.valid_path);
    r.finish();  // an unknown key in an entry is an error naming it
    sources.push_back(std::move(s));
  }
  out = std::move(sources);
}

ObjectReader ObjectReader::child(std::string_view key) {
  return ObjectReader(find(key), path_of(key), file_);
}

void ObjectReader::accept(std::string_view key) { known_.emplace(key); }

const nlohmann::json* ObjectReader::raw(std::string_view key) { return find(key); }

void ObjectReader::finish() const {
  if (node_ == nullptr) return;
  std::vector<std::string> candidates(known_.begin(), known_.end());
  for (const auto& [key, value] : node_->items()) {
    if (known_.count(key) != 0) continue;
    std::string msg = "config: " + file_ + ": unknown key '" + path_of(key) + "'";
    std::string near = closest_match(key, candidates);
    std::string alias = known_alias(key);
    if (!near.empty()) {
      msg += "; did you mean '" + path_of(near) + "'?";
    } else if (!alias.empty()) {
      msg += "; did you mean '" + alias + "'?";
    } else {
      msg +=
          " (see docs/config.md for the keys of " + (path_.empty() ? "the top level" : path_) + ")";
    }
    throw UserError(msg);
  }
}

std::string known_alias(std::string_view key) {
  // Names used by the seed guide, PyTorch scripts and Megatron for keys we spell otherwise.
  static const std::pair<std::string_view, std::string_view> kAliases[] = {
      {"learning_rate", "optimizer.params.lr"},
      {"lr", "optimizer.params.lr"},
      {"max_grad_norm", "gradient_clipping"},
      {"clip_grad", "gradient_clipping"},
      {"batch_size", "train_batch_size"},
      {"global_batch_size", "train_batch_size"},
      {"micro_batch_size", "train_micro_batch_size_per_gpu"},
      {"epochs", "training.epochs"},
      {"train_iters", "training.train_iters"},
      {"seed", "training.seed"},
      {"expert_dropout", "moe.expert_dropout"},
      {"num_experts", "moe.num_experts"},
      {"top_k", "moe.top_k"},
      {"moe_router_topk", "moe.top_k"},
      {"hidden_size", "model.hidden_size"},
      {"num_layers", "model.num_layers"},
      {"seq_length", "model.seq_len"},
      {"warmup_steps", "scheduler.params.warmup_num_steps"},
      {"data_path", "data.train_path"},
  };
  for (const auto& [from, to] : kAliases) {
    if (key == from) return std::string(to);
  }
  return "";
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : "";
}

}  // namespace moe::config
