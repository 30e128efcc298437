#include "moe/data/prepare.h"

#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "moe/data/manifest.h"
#include "moe/data/token_shard.h"
#include "moe/data/verify.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::data {
namespace {

namespace fs = std::filesystem;

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_prepare_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ::moe::remove_tree(dir_);
    fs::create_directories(dir_ / "in");
  }
  void TearDown() override { ::moe::remove_tree(dir_); }
  std::string write_text(const std::string& name, const std::string& text) {
    auto p = dir_ / "in" / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::vector<int32_t> split_tokens(const std::string& out, const std::string& split) {
    std::vector<int32_t> all;
    const Manifest m = load_manifest(out);
    for (const auto& s : m.splits.at(split)) {
      ShardInfo i = inspect_shard((fs::path(out) / s.file).string());
      auto t = read_tokens(i, 0, i.num_tokens);
      all.insert(all.end(), t.begin(), t.end());
    }
    return all;
  }
  fs::path dir_;
};

std::string words(int n, unsigned seed) {
  static const char* vocab[] = {"alpha", "beta",   "gamma",  "delta",
                                "moe",   "expert", "router", "token"};
  std::mt19937 rng(seed);
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += vocab[rng() % 8];
    s += (i % 12 == 11) ? "\n" : " ";
  }
  return s;
}

TEST_F(PrepareTest, ByteTokensEqualBytesWithExactValidationTail) {
  std::string text = words(3000, 1);
  PrepareOptions o;
  o.inputs = {write_text("a.txt", text)};
  o.out_dir = (dir_ / "out").string();
  o.valid_fraction = 0.1;
  o.shard_tokens = 4000;  // several shards
  Manifest m = prepare_data(o);
  auto train = split_tokens(o.out_dir, "train");
  auto valid = split_tokens(o.out_dir, "valid");
  ASSERT_EQ(train.size() + valid.size(), text.size());
  const size_t cut = text.size() - static_cast<size_t>(static_cast<double>(text.size()) * 0.1);
  EXPECT_EQ(train.size(), cut);
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t t = i < cut ? train[i] : valid[i - cut];
    ASSERT_EQ(t, static_cast<unsigned char>(text[i])) << "offset " << i;
  }
  EXPECT_GT(m.splits.at("train").size(), 1u);
  EXPECT_TRUE(verify_dataset(o.out_dir, {}).empty());
}

TEST_F(PrepareTest, ValidationByFileDirectoriesAndGlobs) {
  write_text("a.txt", "aaaa");
  write_text("b.txt", "bb");
  auto v = write_text("v.log", "vvv");
  PrepareOptions o;
  o.inputs = {(dir_ / "in" / "*.txt").string()};
  o.valid_inputs = {v};
  o.out_dir = (dir_ / "out").string();
  Manifest m = prepare_data(o);
  EXPECT_EQ(split_tokens(o.out_dir, "train").size(), 6u);
  EXPECT_EQ(split_tokens(o.out_dir, "valid").size(), 3u);
  EXPECT_EQ(m.splits.at("train")[0].documents, 2);
  EXPECT_EQ(expand_inputs({(dir_ / "in").string()}).size(), 3u);
  EXPECT_THROW(expand_inputs({(dir_ / "nothing*").string()}), UserError);
  // The output directory now holds a dataset: a second run must not touch it.
  EXPECT_THROW(prepare_data(o), UserError);
}

TEST_F(PrepareTest, SentencePieceModelTokenizes) {
  const std::string corpus = write_text("corpus.txt", words(4000, 2));
  const std::string prefix = (dir_ / "spm").string();
  auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + prefix +
      " --vocab_size=24 --model_type=unigram --minloglevel=2");
  ASSERT_TRUE(status.ok()) << status.ToString();
  std::string text = words(200, 3);
  PrepareOptions o;
  o.inputs = {write_text("small.txt", text)};
  o.out_dir = (dir_ / "out").string();
  o.tokenizer = "sentencepiece";
  o.spm_model = prefix + ".model";
  Manifest m = prepare_data(o);
  EXPECT_EQ(m.vocab_size, 24);
  EXPECT_EQ(m.tokenizer, "sentencepiece:spm.model");
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(o.spm_model).ok());
  std::vector<int> expect;
  ASSERT_TRUE(sp.Encode(text, &expect).ok());
  auto got = split_tokens(o.out_dir, "train");
  EXPECT_EQ(std::vector<int>(got.begin(), got.end()), expect);
  o.spm_model = corpus;  // not a model
  o.out_dir = (dir_ / "out2").string();
  EXPECT_THROW(prepare_data(o), UserError);
}

TEST_F(PrepareTest, VerifyReportsEveryBadShard) {
  PrepareOptions o;
  o.inputs = {write_text("a.txt", words(2000, 4))};
  o.out_dir = (dir_ / "out").string();
  o.shard_tokens = 3000;
  Manifest m = prepare_data(o);
  ASSERT_GE(m.splits.at("train").size(), 3u);
  const auto& s = m.splits.at("train");
  fs::path out(o.out_dir);
  fs::remove(out / s[0].file);                                            // missing
  fs::resize_file(out / s[1].file, fs::file_size(out / s[1].file) - 10);  // truncated
  {
    std::fstream f(out / s[2].file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-50, std::ios::end);
    f.put('\x7f');  // flipped: same size, different md5
  }
  auto problems = verify_dataset(o.out_dir, {});
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_NE(problems[0].reason.find("missing"), std::string::npos) << problems[0].reason;
  EXPECT_NE(problems[1].reason.find("truncated"), std::string::npos) << problems[1].reason;
  EXPECT_NE(problems[2].reason.find("md5"), std::string::npos) << problems[2].reason;
  VerifyOptions model;
  model.model_vocab_size = 100;
  model.checksums = false;
  // Every shard now has a problem: the three above, and vocab 256 > 100 for the rest.
  EXPECT_EQ(verify_dataset(o.out_dir, model).size(), s.size());
}

TEST_F(PrepareTest, ManifestPathsCannotEscape) {
  fs::create_directories(dir_ / "ds");
  std::ofstream(dir_ / "ds" / "manifest.json")
      << R"({"format_version":1,"vocab_size":256,"tokenizer":"byte","splits":{"train":[)"
      << R"({"file":"../secret.h5","tokens":1,"bytes":1,"max_token":1,"md5":"x"}]}})";
  try {
    load_manifest((dir_ / "ds").string());
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("must be a plain file name"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moe::data
