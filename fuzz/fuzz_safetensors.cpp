// libFuzzer target: arbitrary bytes as a safetensors file. The reader must reject junk with a
// UserError after checking sizes, never over-read or over-allocate.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "moe/util/errors.h"
#include "moe/util/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/moe-fuzz-safetensors-" + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    moe::SafetensorsFile st(path);
    for (const auto& [name, e] : st.entries()) {
      volatile char sink = e.end > e.begin ? st.data(e)[e.end - e.begin - 1] : 0;
      (void)sink;
    }
  } catch (const moe::UserError&) {
  }
  return 0;
}
