// libFuzzer target: arbitrary bytes as a dataset's manifest.json and as an HDF5 shard.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "moe/data/manifest.h"
#include "moe/data/token_shard.h"
#include "moe/util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/tmp/moe-fuzz-data-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  for (const char* name : {"manifest.json", "shard.h5"}) {
    std::FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    (void)moe::data::load_manifest(dir);
  } catch (const moe::UserError&) {
  }
  try {
    auto info = moe::data::inspect_shard(dir + "/shard.h5");
    (void)moe::data::read_tokens(info, 0, std::min<int64_t>(info.num_tokens, 1 << 16));
  } catch (const moe::UserError&) {
  }
  return 0;
}
