// key_specs(): the field lists walked to describe every accepted key, for the test that holds
// configs/schema.json to them.
#include "moe/config/key_specs.h"

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fields.h"

namespace moe::config {

namespace {

class KeyLister {
 public:
  template <class T>
  void field(std::string_view key, const T& value, const Rule& rule = {}, bool = true) {
    KeySpec k;
    k.path = paths_.of(key);
    k.type = json_type<T>();
    k.item_type = json_item_type<T>();
    if constexpr (Choice<T>) {
      for (std::string_view n : ChoiceNames<T>::kNames) k.choices.emplace_back(n);
    }
    for (std::string_view o : rule.options) k.choices.emplace_back(o);
    k.default_value = json_value(value);
    if (rule.kind == Rule::Kind::kRange) {
      k.minimum = rule.lo;
      k.maximum = rule.hi;
      k.exclusive_minimum = rule.lo_open;
      k.exclusive_maximum = rule.hi_open;
    }
    // An unsigned member reads only non-negative integers.
    if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
      if (!k.minimum) k.minimum = 0;
    }
    k.not_empty = rule.kind == Rule::Kind::kNotEmpty;
    specs_.push_back(std::move(k));
  }

  template <class F>
  void object(std::string_view key, F&& visit) {
    KeySpec k;
    k.kind = KeySpec::Kind::kObject;
    k.path = paths_.of(key);
    k.type = "object";
    specs_.push_back(std::move(k));
    paths_.push(key);
    visit();
    paths_.pop();
  }

  void ignored(std::string_view key, KeySpec::Kind kind = KeySpec::Kind::kIgnored) {
    KeySpec k;
    k.kind = kind;
    k.path = paths_.of(key);
    specs_.push_back(std::move(k));
  }
  void multi_gpu(std::string_view key) { ignored(key, KeySpec::Kind::kMultiGpu); }
  void no_effect(std::string_view key, std::string_view reason) {
    ignored(key, KeySpec::Kind::kNoEffect);
    specs_.back().no_effect = reason;
  }
  void refused(std::string_view key, std::string_view reason) {
    ignored(key, KeySpec::Kind::kRefused);
    specs_.back().refused = reason;
  }

  std::vector<KeySpec> take() { return std::move(specs_); }

 private:
  PathStack paths_;
  std::vector<KeySpec> specs_;
};

}  // namespace

std::vector<KeySpec> key_specs() {
  const Config defaults;
  KeyLister lister;
  visit_fields(lister, defaults);
  return lister.take();
}

}  // namespace moe::config
