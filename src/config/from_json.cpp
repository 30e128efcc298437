// from_json: the field lists walked with strict readers, so unknown keys, wrong types and
// names outside a closed set fail while reading, naming the JSON path.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fields.h"
#include "json_reader.h"
#include "moe/config/config.h"
#include "moe/util/errors.h"

namespace moe::config {

using nlohmann::json;

void throw_not_a_choice(const std::string& prefix, std::string_view path, std::string_view value,
                        const std::string& names) {
  throw UserError(prefix + std::string(path) + " = \"" + std::string(value) +
                  "\": expected one of " + names);
}

namespace {

class Reader {
 public:
  Reader(const json* root, const std::string& file, std::vector<std::string>& warnings)
      : file_(file), warnings_(warnings) {
    readers_.emplace_back(root, "", file);
  }

  template <class T>
  void field(std::string_view key, T& value, const Rule& rule = {}, bool applies = true) {
    if (!applies) return;
    ObjectReader& r = readers_.back();
    if constexpr (Choice<T>) {
      std::string s(name(value));
      r.get(key, s);
      const auto e = parse_choice<T>(s);
      if (!e) {
        throw_not_a_choice("config: " + file_ + ": ", r.path_of(key), s, choice_list<T>());
      }
      value = *e;
    } else {
      r.get(key, value);
    }
  }

  template <class F>
  void object(std::string_view key, F&& visit) {
    readers_.push_back(readers_.back().child(key));
    visit();
    readers_.back().finish();
    readers_.pop_back();
  }

  void ignored(std::string_view key) { readers_.back().accept(key); }

  void multi_gpu(std::string_view key) {
    ObjectReader& r = readers_.back();
    if (r.has(key)) warnings_.push_back(r.path_of(key) + " is a multi-GPU setting; ignored");
    r.accept(key);
  }

  void no_effect(std::string_view key, std::string_view reason) {
    ObjectReader& r = readers_.back();
    if (r.raw(key) != nullptr) {
      warnings_.push_back(r.path_of(key) + " has no effect here: " + std::string(reason));
    }
  }

  // A block that asks for nothing (false, or "enabled": false) is ignored with a warning.
  void refused(std::string_view key, std::string_view reason) {
    ObjectReader& r = readers_.back();
    const json* v = r.raw(key);
    if (v == nullptr) return;
    const bool disabled =
        *v == false || (v->is_object() && v->contains("enabled") && (*v)["enabled"] == false);
    if (!disabled) {
      throw UserError("config: " + file_ + ": " + r.path_of(key) +
                      " is not supported: " + std::string(reason));
    }
    warnings_.push_back(r.path_of(key) +
                        " is disabled; ignored (not supported: " + std::string(reason) + ")");
  }

  void finish() const { readers_.back().finish(); }

 private:
  std::string file_;
  std::vector<std::string>& warnings_;
  std::vector<ObjectReader> readers_;  // the objects being read, outermost first
};

}  // namespace

Config from_json(const json& root, const std::string& file) {
  Config c;
  c.source_file = file;
  Reader reader(&root, file, c.warnings);
  visit_fields(reader, c);
  reader.finish();
  // 0 in these members means "not given, derive it by DeepSpeed's batch rule"; a 0 written in
  // the file (or by --set) is refused, as DeepSpeed does, here where presence is known.
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    const auto it = root.find(key);
    if (it != root.end() && it->is_number() && *it == 0) {
      throw UserError("config: " + file + ": " + key + " = 0: must be > 0");
    }
  }
  // This schedule's warmup is linear by definition (it takes no warmup_type).
  if (c.scheduler.type == SchedulerType::kLinearWarmupCosineDecay) {
    c.scheduler.warmup_type = WarmupType::kLinear;
  }
  return c;
}

}  // namespace moe::config
