// prepare-data: text files -> tokenized HDF5 shards + manifest.json (with checksums).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe/data/manifest.h"

namespace moe::data {

struct PrepareOptions {
  std::vector<std::string> inputs;        // files, directories (recursive) or globs
  std::vector<std::string> valid_inputs;  // whole files for the validation split
  double valid_fraction = 0.0;            // else: this tail fraction of every input file
  std::string out_dir;
  std::string tokenizer = "byte";  // byte | sentencepiece
  std::string spm_model;
  std::string tokenizer_file;  // --tokenizer hf: a Hugging Face tokenizer.json
  // --tokenizer-from DIR: a Hugging Face model directory or an import-hf checkpoint (which
  // keeps the model's tokenizer files): its tokenizer.json, else its tokenizer.model.
  std::string tokenizer_from;
  int64_t shard_tokens = int64_t(16) << 20;
  int threads = 2;  // chunks tokenized (and shards hashed) concurrently
  // JSONL input (Megatron's preprocess_data.py input): files named *.jsonl, *.jsonl.gz or
  // *.jsonl.zst, or every input when `jsonl`; one document per line, its text under `jsonl_key`.
  bool jsonl = false;
  std::string jsonl_key = "text";
  bool skip_bad_lines = false;  // else a malformed line is an error naming file:line
  // An end-of-document token after every document: `eod_id`, or (-1) the tokenizer's EOS.
  bool append_eod = false;
  int64_t eod_id = -1;
  // The tokenizer's post-processor tokens around every document (--tokenizer hf: e.g. Llama's
  // BOS), as Hugging Face's encode(text, add_special_tokens=True).
  bool add_special_tokens = false;
  // Text that is not UTF-8 (tokenizers that need it): "error" (file and byte offset, or
  // file:line) or "replace" (U+FFFD as Python's errors="replace"; counted in the manifest).
  std::string invalid_utf8 = "error";
  // "text" (documents) or "sft": JSONL examples (messages / conversations / prompt+completion),
  // written with a per-token loss mask (sft.h); chats use the tokenizer directory's chat
  // template, or `chat_template` (a .jinja file).
  std::string format = "text";
  std::string chat_template;
};

// Reports progress: bytes of input done, bytes in all.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

Manifest prepare_data(const PrepareOptions& opt, const ProgressFn& progress = {});

// Files named by inputs: a file as is, a directory's regular files (recursive, sorted), a
// glob's matches (sorted). Throws UserError for an input that names nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

}  // namespace moe::data
