#include "moe/util/content_hash.h"

#include <cstdio>
#include <stdexcept>

#include <xxhash.h>

namespace moe {

struct ContentHash::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

ContentHash::ContentHash() : state_(std::make_unique<State>()) {
  if (state_->s == nullptr || XXH3_64bits_reset(state_->s) != XXH_OK) {
    throw std::runtime_error("content hash: cannot initialise XXH3");
  }
}

ContentHash::~ContentHash() = default;

void ContentHash::update(const void* data, size_t bytes) {
  XXH3_64bits_update(state_->s, data, bytes);
}

std::string ContentHash::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(state_->s)));
  return buf;
}

}  // namespace moe
