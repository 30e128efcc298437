// libFuzzer target: arbitrary bytes as a downloaded tokenizer.json (prepare-data --tokenizer hf):
// loaded (vocabulary, merges, normalizer, pre-tokenizer regexes, added tokens, post-processor),
// then used on multilingual text. What it cannot use is a UserError naming the file; a regex that
// hits PCRE2's limits is one too. Anything else (crash, sanitizer report, other exception) is a
// bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "moe/tokenizers/hf_bpe_tokenizer.h"
#include "moe/util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/moe-fuzz-tokenizer-" + std::to_string(::getpid()) + ".json";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const moe::tokenizers::HfBpeTokenizer tok(path);
    (void)tok.name();
    (void)tok.special_tokens();
    (void)tok.special_token_texts();
    std::vector<uint32_t> ids;
    for (const char* text :
         {"Hello, world! It's 2024: 12345 tokens.\n\n  x\ny\r\n\tz  ",
          "e\u0301t\u00e9 \u212b \ufb01le \uff21\uff11 stra\u00dfe \u0130stanbul",
          "\u4e2d\u6587\u65e5\u672c\u8a9e\u30c6\u30ad\u30b9\u30c8 \u0645\u0631\u062d\u0628\u0627 "
          "\U0001F600\U0001F44D\U0001F3FD",
          "<s></s><|endoftext|><|im_start|>user\nhi<|im_end|>", "", " ", "aaaaaaaaaaaaaaaaaaaab"}) {
      ids.clear();
      tok.encode(text, ids);
      for (uint32_t id : ids) {
        if (static_cast<int64_t>(id) >= tok.vocab_size())
          __builtin_trap();  // an id past the vocabulary
      }
      (void)tok.last_cut(text);
    }
  } catch (const moe::UserError&) {
  }
  return 0;
}
