// to_json: the field lists walked to write the resolved config (`config show`, the run's
// config.json, a checkpoint's state.json) in the input's key layout.
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "fields.h"
#include "moe/config/config.h"

namespace moe::config {

using nlohmann::json;

namespace {

class Writer {
 public:
  explicit Writer(json& root) : node_(&root) {}

  template <class T>
  void field(std::string_view key, const T& value, const Rule& = {}, bool applies = true) {
    if (applies) (*node_)[std::string(key)] = json_value(value);
  }

  template <class F>
  void object(std::string_view key, F&& visit) {
    json* parent = node_;
    json child = json::object();  // written even when empty (a Constant scheduler's params)
    node_ = &child;
    visit();
    node_ = parent;
    (*node_)[std::string(key)] = std::move(child);
  }

  void ignored(std::string_view) {}
  void multi_gpu(std::string_view) {}
  void no_effect(std::string_view, std::string_view) {}
  void refused(std::string_view, std::string_view) {}

 private:
  json* node_;
};

}  // namespace

json to_json(const Config& c) {
  json j = json::object();
  Writer writer(j);
  visit_fields(writer, c);
  // The resolved width, not 0 ("derive it"): what the model was built with.
  j["moe"]["expert_hidden_size"] = expert_hidden_size(c);
  return j;
}

}  // namespace moe::config
