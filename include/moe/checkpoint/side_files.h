// The Hugging Face side files a checkpoint carries beside its weights (the model's config.json as
// hf_config.json, generation config, tokenizer files), so that a fine-tune of an import exports
// with the model's own settings and tokenizer. Here rather than in hf/: checkpoints are written
// below the HF import/export code, which reads them.
#pragma once

#include <string>
#include <vector>

namespace moe::checkpoint {

// The tokenizer files copied alongside a model when present.
const std::vector<std::string>& tokenizer_file_names();
// Copies those of `from` that exist into `to`; returns their names.
std::vector<std::string> copy_tokenizer_files(const std::string& from, const std::string& to);

// The directory whose Hugging Face side files (the model's config.json, generation config,
// tokenizer) a model descending from `dir` carries: `dir` itself when it is an import or a
// checkpoint that carries them (hf_config.json), or an HF model directory (config.json, no
// state.json); "" otherwise (a model trained from scratch).
std::string hf_side_source(const std::string& dir);

// A vision-language release's tensors outside its text model (the vision tower), as import-hf
// read them: carried from checkpoint to checkpoint, written back by export-hf.
inline constexpr const char* kCarriedTensorsFile = "hf_carried.safetensors";

// Copies those files from `from` (hf_side_source) into the checkpoint directory `to`: the HF
// config as hf_config.json, generation_config.json, the tokenizer files, the carried tensors
// (hard-linked where the file system allows: they never change). Every checkpoint of a
// run that started from an import carries them, so a fine-tune of a fine-tune exports with the
// model's own settings and tokenizer.
void copy_hf_side_files(const std::string& from, const std::string& to);

}  // namespace moe::checkpoint
