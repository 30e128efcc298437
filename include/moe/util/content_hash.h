// An incremental XXH3-64 over any bytes: a cheap content fingerprint (a LoRA run's base
// weights, recorded in its checkpoints and checked on resume).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace moe {

class ContentHash {
 public:
  ContentHash();
  ~ContentHash();
  ContentHash(const ContentHash&) = delete;
  ContentHash& operator=(const ContentHash&) = delete;
  void update(const void* data, size_t bytes);
  void update(const std::string& text) { update(text.data(), text.size()); }
  std::string hex() const;  // 16 lowercase hex digits

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace moe
