#include "moe/data/manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"
#include "moe/util/json_nesting.h"

namespace moe::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw UserError("data: " + file + ": " + what);
}

template <class T>
T field(const json& j, const char* key, const std::string& file, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) bad(file, where + ": missing '" + key + "'");
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // nlohmann would convert a float (1.5, 2e106) to an integer: truncated, or undefined.
    const json& v = j.at(key);
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      bad(file, where + "." + key + " = " + v.dump() + ": wrong type (expected an integer)");
    }
  }
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    bad(file, where + "." + key + " = " + j.at(key).dump() + ": wrong type");
  }
}

void check_file_name(const std::string& name, const std::string& file, const std::string& where) {
  if (name.empty() || name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
      name == "." || name == "..") {
    bad(file,
        where + ".file = \"" + name + "\": must be a plain file name inside the dataset directory");
  }
}

}  // namespace

bool has_manifest(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "manifest.json", ec);
}

Manifest load_manifest(const std::string& dir) {
  const std::string file = (fs::path(dir) / "manifest.json").string();
  std::ifstream in(file);
  if (!in) bad(file, "cannot open for reading");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_manifest(ss.str(), file);
}

Manifest parse_manifest(const std::string& text, const std::string& file) {
  if (json_nests_deeper_than(text)) {
    bad(file, "JSON nested more than " + std::to_string(max_json_nesting()) + " levels deep" +
                  raise_hint("json.nesting"));
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for huge numbers
    bad(file, std::string("invalid JSON: ") + e.what());
  }
  Manifest m;
  m.format_version = field<int64_t>(j, "format_version", file, "manifest");
  if (m.format_version != kManifestVersion) {
    bad(file, "format_version = " + std::to_string(m.format_version) + "; expected " +
                  std::to_string(kManifestVersion));
  }
  m.vocab_size = field<int64_t>(j, "vocab_size", file, "manifest");
  m.tokenizer = field<std::string>(j, "tokenizer", file, "manifest");
  if (j.contains("eod_id")) m.eod_id = field<int64_t>(j, "eod_id", file, "manifest");
  if (j.contains("loss_mask")) {
    m.loss_mask = field<bool>(j, "loss_mask", file, "manifest");
    if (j.contains("target_tokens")) {
      m.target_tokens = field<int64_t>(j, "target_tokens", file, "manifest");
    }
  }
  if (j.contains("invalid_utf8_replaced")) {
    m.invalid_utf8_replaced = field<int64_t>(j, "invalid_utf8_replaced", file, "manifest");
  }
  if (j.contains("skipped_lines")) {
    m.skipped_lines = field<int64_t>(j, "skipped_lines", file, "manifest");
  }
  const json& splits = j.contains("splits") ? j.at("splits") : json();
  if (!splits.is_object() || splits.empty()) bad(file, "'splits' must be a non-empty object");
  for (const auto& [name, shards] : splits.items()) {
    if (!shards.is_array()) bad(file, "splits." + name + " must be an array");
    auto& out = m.splits[name];
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string where = "splits." + name + "[" + std::to_string(i) + "]";
      const json& s = shards[i];
      ManifestShard sh;
      sh.file = field<std::string>(s, "file", file, where);
      check_file_name(sh.file, file, where);
      sh.tokens = field<int64_t>(s, "tokens", file, where);
      sh.bytes = field<int64_t>(s, "bytes", file, where);
      sh.max_token = field<int64_t>(s, "max_token", file, where);
      sh.documents = s.value("documents", int64_t{0});
      sh.md5 = field<std::string>(s, "md5", file, where);
      sh.xxh3 = s.value("xxh3", std::string());
      if (sh.tokens < 0 || sh.bytes < 0) bad(file, where + ": negative tokens or bytes");
      out.push_back(sh);
    }
  }
  return m;
}

void save_manifest(const std::string& dir, const Manifest& m) {
  json j;
  j["format_version"] = m.format_version;
  j["vocab_size"] = m.vocab_size;
  j["tokenizer"] = m.tokenizer;
  if (m.eod_id >= 0) j["eod_id"] = m.eod_id;
  if (m.skipped_lines > 0) j["skipped_lines"] = m.skipped_lines;
  if (m.invalid_utf8_replaced > 0) j["invalid_utf8_replaced"] = m.invalid_utf8_replaced;
  if (m.loss_mask) {
    j["loss_mask"] = true;
    j["target_tokens"] = m.target_tokens;
  }
  j["splits"] = json::object();
  for (const auto& [name, shards] : m.splits) {
    json arr = json::array();
    for (const auto& s : shards) {
      arr.push_back({{"file", s.file},
                     {"tokens", s.tokens},
                     {"bytes", s.bytes},
                     {"max_token", s.max_token},
                     {"documents", s.documents},
                     {"md5", s.md5},
                     {"xxh3", s.xxh3}});
    }
    j["splits"][name] = arr;
  }
  const std::string path = (fs::path(dir) / "manifest.json").string();
  const std::string tmp = path + ".tmp";
  const std::string text = j.dump(2) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) bad(tmp, "cannot create");
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) bad(tmp, "write failed (disk full?)");
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) bad(path, "cannot rename into place: " + ec.message());
}

}  // namespace moe::data
