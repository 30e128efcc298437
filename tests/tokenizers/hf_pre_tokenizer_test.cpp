// A downloaded tokenizer.json's Split regex that backtracks catastrophically on some text stops at
// PCRE2's limits, set explicitly (match steps, depth, heap), as a user error naming the file and
// the pattern: exit 2, not an internal error, a crash or a hang.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/tokenizers/hf_pre_tokenizer.h"
#include "moe/util/errors.h"

namespace moe::tokenizers {
namespace {

TEST(HfPreTokenizerLimits, CatastrophicBacktrackingIsAUserErrorNamingFileAndPattern) {
  const nlohmann::json spec = {
      {"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}};
  const HfPreTokenizer::Refuse refuse = [](const std::string& what) { throw UserError(what); };
  const HfPreTokenizer pre(spec, refuse, "/models/x/tokenizer.json");
  std::vector<std::string> pieces;
  pre.split("aaaa", true, pieces);  // ordinary text: fine
  EXPECT_EQ(pieces, std::vector<std::string>({"aaaa"}));
  pieces.clear();
  try {
    pre.split(std::string(60, 'a') + "b", true, pieces);
    FAIL() << "the exponential match finished";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tokenizer: /models/x/tokenizer.json: the pre-tokenizer regex (a|aa)+$"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
    std::printf("%s\n", msg.c_str());
  }
}

}  // namespace
}  // namespace moe::tokenizers
