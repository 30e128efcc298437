// A small learnable corpus for the demo and the smoke tests: "permutation programs".
// Each document follows one of `programs` random permutations of the vocabulary:
// x[t+1] = P_k[x[t]], with k and x[0] drawn per document. Predicting the next token needs the
// context (which program is running must be inferred from earlier tokens), every token is about
// equally frequent (the majority-token baseline is ~1/vocab), and a model that learned the rule
// reaches ~(doc_len - 2) / (doc_len - 1) next-token accuracy.
#pragma once

#include <cstdint>
#include <vector>

namespace moe::data {

struct SyntheticSpec {
  int64_t vocab_size = 64;
  int64_t programs = 4;
  int64_t doc_len = 65;  // tokens per document (= model.seq_len + 1 aligns documents to windows)
  int64_t num_docs = 1000;
  uint64_t seed = 1;         // seeds the permutations (shared by train and validation)
  uint64_t doc_seed = 2;     // seeds the documents (differs between train and validation)
  uint32_t first_token = 0;  // symbols are first_token .. first_token + vocab_size - 1
};

std::vector<uint32_t> make_permutation_corpus(const SyntheticSpec& spec);

}  // namespace moe::data
