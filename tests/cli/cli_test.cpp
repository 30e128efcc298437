// Runs the real moe-train binary: exit codes, one-line errors, nothing overwritten on bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/util/remove_tree.h"

#ifndef MOE_TRAIN_BIN
#error "MOE_TRAIN_BIN must name the moe-train binary"
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("moe_cli_test_" + std::to_string(::getpid()));
    ::moe::remove_tree(root_);
    fs::create_directories(root_);
    Result r = run("make-synthetic --out " + (root_ / "data").string() +
                   " --vocab 16 --programs 2 --doc-len 17 --train-docs 64 --valid-docs 16");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { ::moe::remove_tree(root_); }

  static Result run(const std::string& args) {
    static int n = 0;
    fs::path out = root_ / ("out" + std::to_string(n)), err = root_ / ("err" + std::to_string(n));
    ++n;
    std::string cmd = std::string("'") + MOE_TRAIN_BIN + "' " + args + " >'" + out.string() +
                      "' 2>'" + err.string() + "' </dev/null";
    int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static json good_config(const std::string& output_dir) {
    return {{"train_batch_size", 4},
            {"train_micro_batch_size_per_gpu", 4},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
            {"scheduler", {{"type", "Constant"}}},
            {"steps_per_print", 1},
            {"model",
             {{"vocab_size", 128},
              {"seq_len", 16},
              {"hidden_size", 16},
              {"num_layers", 1},
              {"num_heads", 2}}},
            {"moe", {{"num_experts", 2}, {"top_k", 1}, {"expert_hidden_size", 16}}},
            {"data",
             {{"train_path", (root_ / "data" / "train.h5").string()},
              {"valid_path", (root_ / "data" / "valid.h5").string()}}},
            {"training", {{"output_dir", output_dir}, {"train_iters", 3}, {"eval_iters", 1}}}};
  }

  static std::string write(const std::string& name, const std::string& text) {
    fs::path p = root_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

  // Expects exit 2, a single stderr line mentioning `needle`, and the output dir untouched.
  static void expect_user_error(const std::string& args, const std::string& needle) {
    fs::path dir = root_ / "precious";
    fs::create_directories(dir);
    std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1}\n";
    const std::string before = slurp(dir / "metrics.jsonl");
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos);
    EXPECT_EQ(slurp(dir / "metrics.jsonl"), before);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
  }

  static fs::path root_;
};

fs::path CliTest::root_;

TEST_F(CliTest, VersionAndHelp) {
  Result v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("LibTorch 2.11"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("CUDA kernels:"), std::string::npos) << v.out;
  Result h = run("--help");
  EXPECT_EQ(h.code, 0);
  for (const char* sub : {"train", "config", "make-synthetic"}) {
    EXPECT_NE(h.out.find(sub), std::string::npos) << h.out;
  }
}

TEST_F(CliTest, BadCommandLineIsExit2) {
  Result r = run("--no-such-flag");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
}

TEST_F(CliTest, SyntaxErrorHasLineAndColumn) {
  std::string p = write("syntax.json", "{\n  \"train_batch_size\": 4,\n  \"model\": {,}\n}\n");
  expect_user_error("--config " + p, "syntax.json:3:");
}

TEST_F(CliTest, UnknownKeySuggests) {
  json j = good_config((root_ / "precious").string());
  j["optimizer"]["params"]["lrr"] = 0.1;
  std::string p = write("unknown.json", j.dump());
  expect_user_error("--config " + p, "did you mean 'optimizer.params.lr'");
}

TEST_F(CliTest, NegativeLearningRate) {
  json j = good_config((root_ / "precious").string());
  j["optimizer"]["params"]["lr"] = -1e-3;
  expect_user_error("--config " + write("neg.json", j.dump()), "optimizer.params.lr = -0.001");
}

TEST_F(CliTest, InconsistentBatch) {
  json j = good_config((root_ / "precious").string());
  j["gradient_accumulation_steps"] = 3;
  expect_user_error("--config " + write("batch.json", j.dump()),
                    "train_batch_size = 4: must equal");
}

TEST_F(CliTest, MissingDataFile) {
  json j = good_config((root_ / "precious").string());
  j["data"]["train_path"] = (root_ / "nope.h5").string();
  expect_user_error("--config " + write("nodata.json", j.dump()), "nope.h5");
}

TEST_F(CliTest, EarlierRunIsKeptNotOverwritten) {
  fs::path dir = root_ / "earlier";
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl") << "{\"old\": true}\n";
  Result r = run("--config " + write("earlier.json", good_config(dir.string()).dump()));
  ASSERT_EQ(r.code, 0) << r.err;
  int kept = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind("metrics.jsonl.prev-", 0) == 0) {
      ++kept;
      EXPECT_EQ(slurp(e.path()), "{\"old\": true}\n");
    }
  }
  EXPECT_EQ(kept, 1);
  EXPECT_NE(slurp(dir / "metrics.jsonl").find("\"type\":\"train\""), std::string::npos);
  // --overwrite replaces instead of keeping.
  Result again =
      run("--config " + write("earlier.json", good_config(dir.string()).dump()) + " --overwrite");
  ASSERT_EQ(again.code, 0) << again.err;
  kept = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    kept += e.path().filename().string().rfind("metrics.jsonl.prev-", 0) == 0;
  }
  EXPECT_EQ(kept, 1);
}

TEST_F(CliTest, SetOverridesLearningRateInMetrics) {
  fs::path dir = root_ / "run_set";
  json j = good_config(dir.string());
  std::string p = write("good.json", j.dump());
  Result r = run("--config " + p + " --set optimizer.params.lr=3e-4");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  int train_lines = 0;
  while (std::getline(in, line)) {
    json m = json::parse(line);
    if (m["type"] != "train") continue;
    ++train_lines;
    EXPECT_DOUBLE_EQ(m["lr"].get<double>(), 3e-4);
  }
  EXPECT_EQ(train_lines, 3);
  json resolved = json::parse(slurp(dir / "config.json"));
  EXPECT_DOUBLE_EQ(resolved["optimizer"]["params"]["lr"].get<double>(), 3e-4);
  // Same via the explicit subcommand, with a type error in --set.
  Result bad = run("train --config " + p + " --set optimizer.params.lr=fast");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("optimizer.params.lr = \"fast\": expected a number"), std::string::npos)
      << bad.err;
}

// training.cuda_graph where the step cannot be captured: one warning naming the reason, then
// the same eager training (identical losses to a run without the switch).
TEST_F(CliTest, CudaGraphOnCpuFallsBackToEagerWithReason) {
  fs::path eager = root_ / "run_eager", graph = root_ / "run_graph";
  std::string p = write("graph.json", good_config(eager.string()).dump());
  ASSERT_EQ(run("--config " + p).code, 0);
  Result r = run("--config " + p +
                 " --set training.cuda_graph=true --set training.output_dir=" + graph.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("training.cuda_graph: not used because training runs on the CPU"),
            std::string::npos)
      << r.err;
  auto losses = [](const fs::path& dir) {
    std::vector<double> v;
    std::ifstream in(dir / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      json m = json::parse(line);
      if (m["type"] == "train") {
        v.push_back(m["loss"].get<double>());
        EXPECT_FALSE(m["cuda_graph"].get<bool>());
      }
    }
    return v;
  };
  EXPECT_EQ(losses(eager), losses(graph));
  EXPECT_EQ(losses(graph).size(), 3u);
}

// Every file under `dir` with its bytes: a run directory compared before and after.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? slurp(e.path()) : "<dir>";
  }
  return files;
}

// Device and kernel settings that cannot be honoured are refused before an earlier run is set
// aside (rotation to *.prev-TIME) or a new config.json written: exit 2, one line, and the
// finished run directory is byte-for-byte what it was.
TEST_F(CliTest, DeviceSettingsRefusedBeforeAnyWrite) {
  fs::path dir = root_ / "finished_run";
  std::string p = write("finished.json", good_config(dir.string()).dump());
  ASSERT_EQ(run("--config " + p).code, 0);
  const auto before = snapshot(dir);
  ASSERT_TRUE(before.count("config.json") && before.count("metrics.jsonl"));
  const Result env = run("env");
  const bool have_gpu = (env.out + env.err).find("no CUDA device visible") == std::string::npos;
  struct Case {
    std::string set, needle;
  };
  std::vector<Case> cases = {
      {"--set moe.kernels=cuda --set training.device=cpu",
       "moe.kernels = \"cuda\": "}};  // the model runs on the CPU (or: no kernels in this build)
  if (!have_gpu) {
    cases.push_back({"--set moe.kernels=cuda", "moe.kernels = \"cuda\""});
    cases.push_back({"--set training.device=cuda", "training.device = \"cuda\": no CUDA device"});
  }
  for (const Case& c : cases) {
    Result r = run("--config " + p + " " + c.set);
    EXPECT_EQ(r.code, 2) << c.set << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("finished.json"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(snapshot(dir), before) << c.set;
  }
}

// Loading is strict: a checkpoint of another architecture is refused naming the first
// difference (an extra tensor here, which used to be ignored: a 2-layer checkpoint evaluated as
// a 1-layer model), and `eval` takes the architecture from the checkpoint, refusing a --config
// value that contradicts it; evaluation settings may differ.
TEST_F(CliTest, CheckpointsLoadStrictlyAndEvalKeepsTheirArchitecture) {
  fs::path dir = root_ / "two_layers";
  json two = good_config(dir.string());
  two["model"]["num_layers"] = 2;
  std::string p2 = write("two_layers.json", two.dump());
  ASSERT_EQ(run("--config " + p2).code, 0);
  std::string ckpt;  // the final checkpoint (step-N; `latest` is a file naming it)
  for (const auto& e : fs::directory_iterator(dir / "checkpoints")) {
    if (e.path().filename().string().rfind("step-", 0) == 0) ckpt = e.path().string();
  }
  ASSERT_FALSE(ckpt.empty());
  {  // as an older checkpoint without expert biases, whose check used to be the only one
    json state = json::parse(slurp(fs::path(ckpt) / "state.json"));
    state.erase("expert_biases");
    std::ofstream(fs::path(ckpt) / "state.json") << state.dump();
  }

  json one = two;
  one["model"]["num_layers"] = 1;
  one["training"]["output_dir"] = (root_ / "one_layer").string();
  std::string p1 = write("one_layer.json", one.dump());
  Result resume = run("--config " + p1 + " --resume " + ckpt);
  EXPECT_EQ(resume.code, 2) << resume.err;
  EXPECT_NE(resume.err.find("tensor 'blocks.1."), std::string::npos) << resume.err;
  EXPECT_NE(resume.err.find("is not in the model"), std::string::npos) << resume.err;
  EXPECT_FALSE(fs::exists(root_ / "one_layer"));

  Result eval = run("eval --config " + p1 + " --checkpoint " + ckpt);
  EXPECT_EQ(eval.code, 2) << eval.err;
  EXPECT_NE(eval.err.find("model.num_layers = 1 contradicts the checkpoint"), std::string::npos)
      << eval.err;
  EXPECT_EQ(std::count(eval.err.begin(), eval.err.end(), '\n'), 1) << eval.err;

  json settings = two;  // evaluation settings may differ from the checkpoint's
  settings["moe"]["capacity_factor"] = 2.0;
  settings["model"]["dropout"] = 0.1;
  Result ok =
      run("eval --config " + write("two_eval.json", settings.dump()) + " --checkpoint " + ckpt);
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("\"loss\""), std::string::npos) << ok.out;
}

TEST_F(CliTest, ConfigShowPrintsResolvedJson) {
  json j = good_config((root_ / "unused").string());
  Result r = run("config show --config " + write("show.json", j.dump()));
  ASSERT_EQ(r.code, 0) << r.err;
  json shown = json::parse(r.out);
  EXPECT_EQ(shown["gradient_accumulation_steps"], 1);
  EXPECT_EQ(shown["moe"]["expert_hidden_size"], 16);
  EXPECT_FALSE(fs::exists(root_ / "unused"));
}

// `config schema` writes the schema and the doc's tables, --check says when a file is stale
// (exit 1, the file untouched), and a doc without the markers is refused (exit 2).
TEST_F(CliTest, ConfigSchemaWritesAndChecks) {
  Result printed = run("config schema");
  ASSERT_EQ(printed.code, 0) << printed.err;
  EXPECT_EQ(json::parse(printed.out)["properties"]["optimizer"]["properties"]["type"]["default"],
            "AdamW");

  const std::string doc =
      write("doc.md",
            "# t\n<!-- generated by `moe-train config schema --docs`: edit "
            "src/config/key_descriptions.cpp -->\nSTALE-BLOCK\n<!-- end of generated "
            "key tables -->\ntail\n");
  const std::string schema = write("schema.json", "{}\n");
  Result stale = run("config schema --check --out " + schema + " --docs " + doc);
  EXPECT_EQ(stale.code, 1) << stale.err;
  EXPECT_NE(stale.err.find("schema.json is not what the code generates"), std::string::npos)
      << stale.err;
  EXPECT_EQ(slurp(schema), "{}\n");

  Result wrote = run("config schema --out " + schema + " --docs " + doc);
  ASSERT_EQ(wrote.code, 0) << wrote.err;
  EXPECT_EQ(slurp(schema), printed.out);
  const std::string text = slurp(doc);
  EXPECT_NE(text.find("| `moe.top_k` |"), std::string::npos);
  EXPECT_EQ(text.find("STALE-BLOCK"), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 5), "tail\n");
  EXPECT_EQ(run("config schema --check --out " + schema + " --docs " + doc).code, 0);

  Result bare = run("config schema --docs " + write("bare.md", "# no markers\n"));
  EXPECT_EQ(bare.code, 2) << bare.err;
  EXPECT_NE(bare.err.find("bare.md: lacks the markers"), std::string::npos) << bare.err;
}

}  // namespace
