// manifest.json of a dataset directory: which shard files make each split, with token counts,
// byte sizes, checksums and the largest token id. Paths are file names inside the directory;
// anything that could escape it ("..", "/", "\") is rejected.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moe::data {

inline constexpr int64_t kManifestVersion = 1;

struct ManifestShard {
  std::string file;  // name inside the dataset directory
  int64_t tokens = 0;
  int64_t bytes = 0;
  int64_t max_token = -1;  // largest token id in the shard (-1: empty)
  int64_t documents = 0;
  std::string md5;
  std::string xxh3;
};

struct Manifest {
  int64_t format_version = kManifestVersion;
  int64_t vocab_size = 0;
  std::string tokenizer;
  std::map<std::string, std::vector<ManifestShard>> splits;  // "train", "valid"
  int64_t eod_id = -1;        // the end-of-document token appended to every document; -1: none
  int64_t skipped_lines = 0;  // JSONL lines skipped with --skip-bad-lines
  int64_t invalid_utf8_replaced = 0;  // sequences replaced with --invalid-utf8 replace
  // Supervised fine-tuning data (prepare-data --format sft): the shards hold a `loss_mask`, and
  // this many of their tokens are training targets.
  bool loss_mask = false;
  int64_t target_tokens = 0;
};

// Reads DIR/manifest.json; throws UserError naming the file and the bad field.
Manifest load_manifest(const std::string& dir);
// The same from manifest.json's text; `file` names it in errors (a path or an s3:// URL).
Manifest parse_manifest(const std::string& text, const std::string& file);
// Writes DIR/manifest.json atomically (temporary file, fsync, rename).
void save_manifest(const std::string& dir, const Manifest& m);
bool has_manifest(const std::string& dir);

}  // namespace moe::data
