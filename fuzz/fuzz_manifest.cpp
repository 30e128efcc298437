// libFuzzer target: arbitrary bytes as a dataset's manifest.json text (parse_manifest: local
// datasets and s3:// ones, whose manifest comes over the network). A bad manifest is a UserError
// naming the file and field; anything else (crash, sanitizer report, other exception) is a bug.
// fuzz_data covers the same through load_manifest beside HDF5 shards; this one is seeded with
// manifests only, so its mutations stay JSON.
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe/data/manifest.h"
#include "moe/util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const moe::data::Manifest m = moe::data::parse_manifest(text, "s3://bucket/data/manifest.json");
    for (const auto& [split, shards] : m.splits) {
      for (const auto& s : shards) {
        // Shard paths never leave the dataset's directory.
        if (s.file.empty() || s.file.find('/') != std::string::npos ||
            s.file.find('\\') != std::string::npos || s.file == ".." || s.file == ".") {
          __builtin_trap();
        }
      }
    }
  } catch (const moe::UserError&) {
  }
  return 0;
}
