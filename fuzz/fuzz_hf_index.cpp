// libFuzzer target: arbitrary bytes as a downloaded model's model.safetensors.index.json, in a
// directory holding two valid shards (tensors a, b in the first; c in the second) and a
// config.json, read as import-hf reads a model's weights (HfWeights: every cross-reference
// checked). A bad index is a UserError naming the file; anything else (crash, sanitizer report,
// other exception) is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <string>

#include "moe/hf/hf_files.h"
#include "moe/util/errors.h"

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// A safetensors file of float32 tensors of two elements each, named `names`.
std::string shard(std::initializer_list<const char*> names) {
  std::string header = "{";
  size_t at = 0;
  for (const char* n : names) {
    header += std::string(at ? "," : "") + "\"" + n + "\":{\"dtype\":\"F32\",\"shape\":[2]," +
              "\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + 8) + "]}";
    at += 8;
  }
  header += "}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(at, '\x01');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = "/tmp/moe-fuzz-hf-index-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    write_file(d + "/model-00001-of-00002.safetensors", shard({"a", "b"}));
    write_file(d + "/model-00002-of-00002.safetensors", shard({"c"}));
    write_file(d + "/config.json", "{\"architectures\": [\"MixtralForCausalLM\"]}");
    return d;
  }();
  write_file(dir + "/model.safetensors.index.json",
             std::string(reinterpret_cast<const char*>(data), size));
  try {
    const moe::hf::HfWeights w(dir);
    for (const auto& [name, ref] : w.tensors()) {
      if (ref.file == nullptr || ref.entry == nullptr) __builtin_trap();
      volatile char sink = ref.file->data(*ref.entry)[0];
      (void)sink;
    }
  } catch (const moe::UserError&) {
  }
  return 0;
}
