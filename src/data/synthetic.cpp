#include "moe/data/synthetic.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace moe::data {

std::vector<uint32_t> make_permutation_corpus(const SyntheticSpec& spec) {
  std::mt19937_64 perm_rng(spec.seed);
  std::vector<std::vector<uint32_t>> perms(static_cast<size_t>(spec.programs));
  for (auto& p : perms) {
    p.resize(static_cast<size_t>(spec.vocab_size));
    std::iota(p.begin(), p.end(), 0u);
    std::shuffle(p.begin(), p.end(), perm_rng);
  }
  std::mt19937_64 rng(spec.doc_seed);
  std::uniform_int_distribution<int64_t> pick_prog(0, spec.programs - 1);
  std::uniform_int_distribution<int64_t> pick_tok(0, spec.vocab_size - 1);
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(spec.num_docs * spec.doc_len));
  for (int64_t d = 0; d < spec.num_docs; ++d) {
    const auto& p = perms[static_cast<size_t>(pick_prog(rng))];
    uint32_t x = static_cast<uint32_t>(pick_tok(rng));
    for (int64_t t = 0; t < spec.doc_len; ++t) {
      out.push_back(spec.first_token + x);
      x = p[x];
    }
  }
  return out;
}

}  // namespace moe::data
