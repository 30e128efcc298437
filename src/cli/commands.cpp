#include "moe/cli/commands.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "moe/build_info.h"
#include "moe/cli/completion.h"
#include "moe/cli/families_command.h"
#include "moe/cli/generate_commands.h"
#include "moe/cli/schema_command.h"
#include "moe/config/config.h"
#include "moe/convert/hf_checkpoint.h"
#include "moe/data/prepare.h"
#include "moe/data/remote_dataset.h"
#include "moe/data/synthetic.h"
#include "moe/data/token_shard.h"
#include "moe/data/verify.h"
#include "moe/env/environment.h"
#include "moe/hf/hf_files.h"
#include "moe/kernels/permute.h"  // cuda_kernels_compiled
#include "moe/parallel/launch_env.h"
#include "moe/plan/advice.h"
#include "moe/plan/memory_plan.h"
#include "moe/plan/plan_report.h"
#include "moe/train/inference.h"
#include "moe/train/run_config.h"
#include "moe/train/trainer.h"
#include "moe/util/errors.h"
#include "moe/util/input_limits.h"
#include "moe/util/remove_tree.h"
#include "moe/util/s3_client.h"
#include "torch/headeronly/version.h"

namespace moe::cli {

namespace {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  bool overwrite = false;
  bool no_resume = false;
  std::string resume_from;
};

struct LogArgs {
  std::string level = "info";
  bool quiet = false;
};

void add_config_options(CLI::App* app, TrainArgs& a) {
  app->add_option("-c,--config", a.config_path, "ds_config-style JSON file")
      ->check(CLI::ExistingFile);
  app->add_option("--set", a.overrides, "Override a config value: dotted.key=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
}

void setup_logging(const LogArgs& l) {
  auto logger =
      spdlog::stderr_color_mt("moe-train", isatty(STDERR_FILENO) ? spdlog::color_mode::automatic
                                                                 : spdlog::color_mode::never);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S] %^%l%$ %v");
  auto level = spdlog::level::from_str(l.level);
  if (l.quiet) level = spdlog::level::warn;
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

std::string version_string() {
  std::string s = std::string("moe-train ") + build_info::kVersion + " (commit " +
                  build_info::kGitCommit + ")\nLibTorch " + TORCH_VERSION;
  if (*build_info::kTorchCudaVersion != '\0') {
    s += std::string(" (CUDA ") + build_info::kTorchCudaVersion + " build)";
  }
  s += "\nCUDA kernels: ";
  s += build_info::kCudaKernels
           ? std::string("compiled in with CUDA ") + build_info::kCudaToolkitVersion + " (sm " +
                 build_info::kCudaArchitectures + ")"
           : std::string("not compiled (CPU-only build)");
  return s;
}

int cmd_train(const TrainArgs& a) {
  if (a.config_path.empty()) throw UserError("train: --config FILE is required");
  const parallel::LaunchEnv env = parallel::launch_env();  // torchrun / Slurm, or alone
  config::Config cfg = train::load_run_config(a.config_path, a.overrides, env.world_size);
  train::TrainOptions opt;
  opt.launch = env;
  opt.overwrite = a.overwrite;
  opt.resume = !a.no_resume;
  opt.resume_from = a.resume_from;
  train::TrainSummary s = train::run_training(cfg, opt);
  if (env.rank > 0) return kExitOk;  // data parallel: rank 0 reports
  if (s.interrupted) {
    std::printf("stopped after step %lld with a checkpoint; run the same command to resume\n",
                static_cast<long long>(s.steps));
    return kExitOk;
  }
  // The closing summary goes to stdout: scripts (and the demo) read it.
  std::printf("trained %lld steps; last training loss %.4f (first %.4f)\n",
              static_cast<long long>(s.steps), s.last_train_loss, s.first_train_loss);
  if (s.has_validation) {
    if (s.resumed_from < 0) {
      std::printf("validation loss %.4f (step 0: %.4f), perplexity %.3f\n", s.final_eval.loss,
                  s.initial_eval.loss, s.final_eval.perplexity);
    } else {
      std::printf("validation loss %.4f (resumed at step %lld), perplexity %.3f\n",
                  s.final_eval.loss, static_cast<long long>(s.resumed_from),
                  s.final_eval.perplexity);
    }
    std::printf("validation next-token accuracy %.4f (always-most-frequent-token baseline %.4f)\n",
                s.final_eval.accuracy, s.majority_baseline);
  }
  std::printf("metrics: %s/metrics.jsonl\n", s.output_dir.c_str());
  return kExitOk;
}

int cmd_config_show(const TrainArgs& a) {
  if (a.config_path.empty()) throw UserError("config show: --config FILE is required");
  // Under a launcher (torchrun, srun) the config resolves with its world size, as training does.
  config::Config cfg =
      train::load_run_config(a.config_path, a.overrides, parallel::launch_env().world_size);
  for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
  std::cout << config::to_json(cfg).dump(2) << "\n";
  spdlog::info("{} parameters in total, {} active per token", config::count_parameters(cfg),
               config::active_parameters_per_token(cfg));
  return kExitOk;
}

struct SynthArgs {
  std::string out_dir;
  data::SyntheticSpec spec;
  int64_t valid_docs = 200;
};

int cmd_make_synthetic(const SynthArgs& a) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(a.out_dir, ec);
  if (ec)
    throw UserError("make-synthetic: " + a.out_dir + ": cannot create directory: " + ec.message());
  data::SyntheticSpec train = a.spec, valid = a.spec;
  // Printable symbols ('0' onwards) in a byte-level vocabulary of 128, so that `moe-train
  // generate` shows the model's continuation as text.
  const bool printable = a.spec.vocab_size <= 78;
  train.first_token = valid.first_token = printable ? '0' : 0;
  const int64_t vocab = printable ? 128 : a.spec.vocab_size;
  valid.num_docs = a.valid_docs;
  valid.doc_seed = a.spec.doc_seed + 7919;  // disjoint document stream, same programs
  for (auto [name, spec] : {std::pair{"train.h5", &train}, std::pair{"valid.h5", &valid}}) {
    auto tokens = data::make_permutation_corpus(*spec);
    std::string path = (fs::path(a.out_dir) / name).string();
    data::write_shard(path, tokens, vocab, printable ? "byte" : "synthetic-permutation");
    spdlog::info("wrote {} ({} tokens)", path, tokens.size());
  }
  return kExitOk;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
}

// A private scratch directory under $TMPDIR (mkdtemp), removed by the destructor.
struct ScratchDir {
  std::string path;
  explicit ScratchDir(const std::string& what) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / ("moe-train-" + what + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw UserError(what + ": cannot create a scratch directory in " +
                      std::filesystem::temp_directory_path().string() + " (set TMPDIR)");
    }
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    remove_tree(path, ec);
  }
};

int cmd_prepare_data_local(const data::PrepareOptions& opt);

// prepare-data --out s3://...: checked first (credentials, bucket, no dataset there yet), staged
// in a scratch directory, then uploaded with the manifest last.
int cmd_prepare_data(data::PrepareOptions opt) {
  if (!s3::is_s3_url(opt.out_dir)) return cmd_prepare_data_local(opt);
  const std::string url = opt.out_dir;
  auto client = s3::client_from_environment();
  data::require_no_remote_dataset(url, *client);
  ScratchDir stage("prepare-data");
  opt.out_dir = (std::filesystem::path(stage.path) / "dataset").string();
  const int rc = cmd_prepare_data_local(opt);
  if (rc != kExitOk) return rc;
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes = data::upload_dataset(opt.out_dir, url, *client);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("uploaded %s to %s in %.1f s (manifest.json last)\n",
              human_bytes(double(bytes)).c_str(), url.c_str(), secs);
  return kExitOk;
}

int cmd_prepare_data_local(const data::PrepareOptions& opt) {
  // A live progress line on a terminal; a plain line per 10% otherwise (logs, CI).
  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  int last_decile = -1;
  auto progress = [&](uint64_t done, uint64_t total) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
    int pct = total
                  ? static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total))
                  : 100;
    if (tty) {
      std::fprintf(stderr, "\rprepare-data: %s / %s (%3d%%) %s/s   ",
                   human_bytes(double(done)).c_str(), human_bytes(double(total)).c_str(), pct,
                   human_bytes(rate).c_str());
    } else if (pct / 10 != last_decile) {
      last_decile = pct / 10;
      spdlog::info("prepare-data: {} / {} ({}%) {}/s", human_bytes(double(done)),
                   human_bytes(double(total)), pct, human_bytes(rate));
    }
  };
  data::Manifest m = data::prepare_data(opt, progress);
  if (tty) std::fprintf(stderr, "\n");
  for (const auto& [split, shards] : m.splits) {
    int64_t tokens = 0;
    for (const auto& s : shards) tokens += s.tokens;
    std::printf("%s: %zu shard(s), %lld tokens\n", split.c_str(), shards.size(),
                static_cast<long long>(tokens));
  }
  std::printf("wrote %s/manifest.json (tokenizer %s, vocab_size %lld)\n", opt.out_dir.c_str(),
              m.tokenizer.c_str(), static_cast<long long>(m.vocab_size));
  if (m.eod_id >= 0) std::printf("end-of-document id %lld\n", static_cast<long long>(m.eod_id));
  if (m.skipped_lines > 0) {
    std::printf("skipped %lld malformed JSONL line(s) (--skip-bad-lines)\n",
                static_cast<long long>(m.skipped_lines));
  }
  if (m.loss_mask) {
    std::printf("supervised fine-tuning data: %lld training target tokens (loss_mask)\n",
                static_cast<long long>(m.target_tokens));
  }
  if (m.invalid_utf8_replaced > 0) {
    std::printf("replaced %lld invalid UTF-8 sequence(s) with U+FFFD (--invalid-utf8 replace)\n",
                static_cast<long long>(m.invalid_utf8_replaced));
  }
  return kExitOk;
}

struct VerifyArgs {
  std::string dir;
  std::string config_path;
  bool no_checksums = false;
};

int cmd_verify_data(const VerifyArgs& a) {
  data::VerifyOptions opt;
  opt.checksums = !a.no_checksums;
  if (!a.config_path.empty())
    opt.model_vocab_size = train::load_run_config(a.config_path, {}).model.vocab_size;
  std::vector<data::ShardProblem> problems;
  if (s3::is_s3_url(a.dir)) {
    auto client = s3::client_from_environment();
    ScratchDir scratch("verify-data");
    problems = data::verify_remote_dataset(a.dir, opt, scratch.path, *client);
  } else {
    problems = data::verify_dataset(a.dir, opt);
  }
  for (const auto& p : problems) {
    std::fprintf(stderr, "verify-data: %s: %s\n", p.file.c_str(), p.reason.c_str());
  }
  if (!problems.empty()) {
    std::fprintf(stderr, "verify-data: %zu problem(s) in %s\n", problems.size(), a.dir.c_str());
    return kExitUserError;
  }
  std::printf("verify-data: %s: all shards match manifest.json%s\n", a.dir.c_str(),
              opt.checksums ? " (md5 and xxh3 recomputed)" : " (checksums skipped)");
  return kExitOk;
}

int cmd_env(const TrainArgs& a, std::vector<std::string> dirs, bool as_json) {
  if (!a.config_path.empty()) {
    config::Config cfg = train::load_run_config(a.config_path, a.overrides);
    dirs.push_back(cfg.training.output_dir);
    std::vector<std::string> data = {cfg.data.path.empty() ? cfg.data.train_path : cfg.data.path};
    if (!cfg.data.blend.empty()) data.clear();
    for (const auto& s : cfg.data.blend) data.push_back(s.path);
    for (const auto& p : data) {
      dirs.push_back(
          std::filesystem::is_directory(p) ? p : std::filesystem::path(p).parent_path().string());
    }
  }
  if (dirs.empty()) dirs.push_back(".");
  nlohmann::json report = env::environment_report(dirs);
  int worst = 0;
  for (const auto& c : report["checks"]) {
    const std::string v = c["verdict"];
    worst = std::max(worst, v == "fail" ? 2 : v == "warn" ? 1 : 0);
    if (!as_json) {
      std::printf("%-5s %-28s %s\n", v.c_str(), c["check"].get<std::string>().c_str(),
                  c["detail"].get<std::string>().c_str());
    }
  }
  report["verdict"] = worst == 2 ? "fail" : worst == 1 ? "warn" : "ok";
  if (as_json) std::cout << report.dump(2) << "\n";
  return worst == 2 ? kExitUserError : kExitOk;
}

struct EvalArgs {
  TrainArgs cfg;
  std::string checkpoint;
  std::string dump_logits;
};

int cmd_eval(const EvalArgs& a) {
  if (a.cfg.config_path.empty()) throw UserError("eval: --config FILE is required");
  std::cout << train::eval_checkpoint(
                   {a.cfg.config_path, a.cfg.overrides, a.checkpoint, a.dump_logits})
                   .dump(2)
            << "\n";
  return kExitOk;
}

struct PlanArgs {
  TrainArgs cfg;
  std::string gpu_memory, host_memory;
  double link_gbps = 0;  // host -> device GB/s for the expert offload tier (0: assumed)
  int64_t world_size = 1;
  std::string device = "auto";
  bool json = false, largest = false;
};

// plan --largest: for each memory tier (with activation checkpointing), the deepest model of the
// config's family (its width, experts, heads) that fits --gpu-memory (and --host-memory).
int print_largest_models(const config::Config& cfg, const plan::PlanOptions& o, bool json) {
  nlohmann::json rows = nlohmann::json::array();
  if (!json) {
    std::printf(
        "largest model of this family (by layers) on %.0f GiB%s, every block checkpointed:\n",
        o.device_bytes / (1024.0 * 1024 * 1024),
        o.host_bytes > 0
            ? (" + " + std::to_string(static_cast<int64_t>(o.host_bytes / (1024.0 * 1024 * 1024))) +
               " GiB host")
                  .c_str()
            : "");
  }
  for (const plan::MemoryTier& t : plan::memory_tiers()) {
    if (!t.checkpointing) continue;
    config::Config c = cfg;
    plan::PlanOptions to = o;
    plan::apply_tier(t, c, to);
    const plan::LargestModel m = plan::largest_fitting_model(c, to);
    rows.push_back({{"tier", t.name},
                    {"num_layers", m.num_layers},
                    {"parameters", m.parameters},
                    {"reserved_bytes", m.reserved},
                    {"host_bytes", m.host}});
    if (!json) {
      std::printf("  %-62s %5lld layers  %8.2f B parameters  (device %.1f GiB, host %.1f GiB)\n",
                  t.name.c_str(), static_cast<long long>(m.num_layers), m.parameters / 1e9,
                  m.reserved / (1024.0 * 1024 * 1024), m.host / (1024.0 * 1024 * 1024));
    }
  }
  if (json) std::cout << rows.dump(2) << "\n";
  return kExitOk;
}

// moe-train plan: the memory of one training step from the config alone (memory_plan.h).
int cmd_plan(const PlanArgs& a) {
  if (a.cfg.config_path.empty()) throw UserError("plan: --config FILE is required");
  // The batch rule resolves with the world size (train_batch_size = micro x accumulation x N).
  const config::Config cfg =
      train::load_run_config(a.cfg.config_path, a.cfg.overrides, a.world_size);
  plan::PlanOptions o;
  o.world_size = a.world_size;
  o.cpu = a.device == "cpu" ||
          (a.device == "auto" && cfg.training.device == config::TrainingDevice::kCpu);
  o.cuda_kernels = kernels::cuda_kernels_compiled();
  if (!a.gpu_memory.empty())
    o.device_bytes = plan::parse_memory_size(a.gpu_memory, "plan: --gpu-memory");
  if (!a.host_memory.empty())
    o.host_bytes = plan::parse_memory_size(a.host_memory, "plan: --host-memory");
  o.host_link_bytes_per_s = a.link_gbps * 1e9;
  if (a.largest) {
    if (o.device_bytes <= 0) throw UserError("plan: --largest needs --gpu-memory");
    return print_largest_models(cfg, o, a.json);
  }
  const plan::MemoryPlan p = plan::plan_memory(cfg, o);
  if (!a.json) {
    std::cout << plan::format_plan(cfg, o, p);
    return kExitOk;
  }
  std::cout << plan::plan_json(o, p).dump(2) << "\n";
  return kExitOk;
}

// plan: its options, into `a`.
CLI::App* add_plan_command(CLI::App& app, PlanArgs& a) {
  auto* pl = app.add_subcommand(
      "plan", "Will it fit? Memory of one training step (weights, gradients, Adam, activations)");
  add_config_options(pl, a.cfg);
  pl->add_option("--gpu-memory", a.gpu_memory, "Device memory for a verdict, e.g. 141GiB, 80GB");
  pl->add_option("--world-size", a.world_size, "Data-parallel ranks (ZeRO partitions by it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  pl->add_option("--device", a.device, "gpu or cpu (default: training.device, auto = gpu)")
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}));
  pl->add_option("--host-memory", a.host_memory,
                 "Host memory for offloaded states in the verdict, e.g. 128GiB");
  pl->add_option("--link-gbps", a.link_gbps,
                 "Host -> device GB/s from pinned memory (`moe-train env` measures it) for the "
                 "expert offload tier's copies; default: PCIe 4.0 x16's ~25")
      ->check(CLI::Range(0.001, 10000.0));
  pl->add_flag("--largest", a.largest,
               "For each memory tier, the largest model of this family (by layers) that fits "
               "--gpu-memory (and --host-memory)");
  pl->add_flag("--json", a.json, "Print the figures as JSON (bytes)");
  return pl;
}

struct ImportArgs {
  std::string hf_dir, out, adapter;
};

int cmd_import_hf(const ImportArgs& a) {
  const convert::ImportReport r = convert::import_hf(a.hf_dir, a.out, a.adapter);
  for (const auto& w : r.warnings) spdlog::warn("import-hf: {}", w);
  std::printf(
      "imported %s (%lld tensors) into %s; tokenizer files: %zu; config sections: "
      "%s/moe-train.json\n",
      r.family->architecture(), static_cast<long long>(r.tensors), a.out.c_str(),
      r.tokenizer_files.size(), a.out.c_str());
  return kExitOk;
}

struct ExportArgs {
  std::string checkpoint, out, max_shard_size = "5GB";
  convert::ExportOptions opt;
};

int cmd_export_hf(ExportArgs a) {
  a.opt.max_shard_bytes = hf::parse_size(a.max_shard_size, "export-hf: --max-shard-size");
  const convert::ExportReport r = convert::export_hf(a.checkpoint, a.out, a.opt);
  for (const auto& w : r.warnings) spdlog::warn("export-hf: {}", w);
  std::printf("exported %s%s (%lld tensors, %lld file%s, %s) to %s; tokenizer files: %zu\n",
              r.family->architecture(),
              a.opt.adapter ? " PEFT adapter" : (a.opt.merge ? " (LoRA merged)" : ""),
              static_cast<long long>(r.tensors), static_cast<long long>(r.shards),
              r.shards == 1 ? "" : "s", a.opt.dtype.c_str(), a.out.c_str(),
              r.tokenizer_files.size());
  return kExitOk;
}

// prepare-data: its options, into `prep`.
CLI::App* add_prepare_command(CLI::App& app, data::PrepareOptions& prep) {
  auto* pd = app.add_subcommand("prepare-data",
                                "Tokenize text files into HDF5 shards with a checksummed manifest");
  pd->add_option("inputs", prep.inputs, "Text files, directories or globs")->required();
  pd->add_option("-o,--out", prep.out_dir,
                 "New dataset directory, or s3://bucket/prefix (staged in $TMPDIR, then uploaded)")
      ->required();
  pd->add_option("--tokenizer", prep.tokenizer, "byte (default), sentencepiece or hf")
      ->check(CLI::IsMember({"byte", "sentencepiece", "hf"}));
  pd->add_option("--tokenizer-file", prep.tokenizer_file,
                 "Hugging Face tokenizer.json (byte-level BPE) for --tokenizer hf")
      ->check(CLI::ExistingFile);
  pd->add_option("--spm-model", prep.spm_model, "SentencePiece model file")
      ->check(CLI::ExistingFile);
  pd->add_option("--tokenizer-from", prep.tokenizer_from,
                 "A Hugging Face model directory or an import-hf checkpoint: its tokenizer.json "
                 "(or tokenizer.model)");
  pd->add_option("--shard-tokens", prep.shard_tokens, "Tokens per shard")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  pd->add_option("--valid-fraction", prep.valid_fraction,
                 "Tail fraction of each input for validation")
      ->check(CLI::Range(0.0, 0.99));
  pd->add_option("--valid-input", prep.valid_inputs, "Files (or dirs, globs) for validation");
  pd->add_flag("--jsonl", prep.jsonl,
               "Every input is JSONL (default: only *.jsonl, *.jsonl.gz, *.jsonl.zst)");
  pd->add_option("--jsonl-key", prep.jsonl_key, "JSONL key holding a document's text (text)");
  pd->add_flag("--skip-bad-lines", prep.skip_bad_lines,
               "Skip and count malformed JSONL lines instead of stopping at the first");
  pd->add_flag("--append-eod", prep.append_eod,
               "An end-of-document token after every document (the tokenizer's EOS)");
  pd->add_option("--eod-id", prep.eod_id,
                 "The end-of-document id (needed for byte vocabularies, e.g. 256)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  pd->add_option("--format", prep.format,
                 "text (documents; default) or sft (JSONL chat or prompt/completion examples, "
                 "written with a loss mask: only the answers are trained)")
      ->check(CLI::IsMember({"text", "sft"}));
  pd->add_option("--chat-template", prep.chat_template,
                 "--format sft: a Jinja chat template file instead of the tokenizer directory's")
      ->check(CLI::ExistingFile);
  pd->add_flag("--add-special-tokens", prep.add_special_tokens,
               "The tokenizer's post-processor tokens around every document (e.g. BOS), as "
               "encode(add_special_tokens=True)");
  pd->add_option("--invalid-utf8", prep.invalid_utf8,
                 "Text that is not UTF-8: error (default; names the file and offset) or replace "
                 "(U+FFFD as Python's errors=\"replace\", counted in manifest.json)")
      ->check(CLI::IsMember({"error", "replace"}));
  pd->add_option("--threads", prep.threads, "Chunks tokenized concurrently")
      ->check(CLI::Range(1, 256));
  return pd;
}

// import-hf and export-hf: their options, into `imp` / `exp`.
std::pair<CLI::App*, CLI::App*> add_hf_commands(CLI::App& app, ImportArgs& imp, ExportArgs& exp) {
  auto* ih =
      app.add_subcommand("import-hf", "Hugging Face model directory -> moe-train checkpoint (" +
                                          families_in_one_line() + ")");
  ih->add_option("hf_dir", imp.hf_dir, "Directory with config.json and safetensors")->required();
  ih->add_option("--out", imp.out, "New checkpoint directory")->required();
  ih->add_option("--adapter", imp.adapter,
                 "A PEFT LoRA adapter directory of that model, merged into the imported weights");
  auto* eh = app.add_subcommand("export-hf",
                                "moe-train checkpoint -> Hugging Face directory (transformers)");
  eh->add_option("checkpoint", exp.checkpoint, "Checkpoint directory")->required();
  eh->add_option("--out", exp.out, "New Hugging Face model directory")->required();
  eh->add_option("--max-shard-size", exp.max_shard_size,
                 "Largest safetensors file, e.g. 5GB (default), 500MB, 2GiB");
  eh->add_option("--dtype", exp.opt.dtype, "float32 (default), bfloat16 or float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  eh->add_flag("--merge", exp.opt.merge,
               "LoRA checkpoint: fold the adapters into the base and write full weights");
  eh->add_flag("--adapter", exp.opt.adapter,
               "LoRA checkpoint: write the PEFT adapter (adapter_config.json + "
               "adapter_model.safetensors) for peft.PeftModel.from_pretrained");
  eh->add_option("--architecture", exp.opt.architecture,
                 "The family to write: " + family_model_types() +
                     " or its architecture name (default: the family whose features the "
                     "checkpoint's architecture has; `moe-train families` lists them)");
  return {ih, eh};
}

// `moe-train [train] --config F ...` and `moe-train config show`.
std::pair<CLI::App*, CLI::App*> add_train_commands(CLI::App& app, TrainArgs& a) {
  const char* overwrite_help =
      "Delete an earlier run's files in training.output_dir (default: keep them as *.prev-TIME)";
  add_config_options(&app, a);
  app.add_flag("--overwrite", a.overwrite, overwrite_help);
  app.add_flag("--no-resume", a.no_resume,
               "Start over even if training.output_dir holds checkpoints (they are kept)");
  app.add_option("--resume", a.resume_from, "Resume from this checkpoint directory");
  auto* train = app.add_subcommand("train", "Train a model (same as moe-train --config FILE)");
  train->add_flag("--no-resume", a.no_resume, "Start over even if checkpoints exist");
  train->add_option("--resume", a.resume_from, "Resume from this checkpoint directory");
  add_config_options(train, a);
  train->add_flag("--overwrite", a.overwrite, overwrite_help);
  auto* cfg_cmd = app.add_subcommand("config", "Inspect configurations");
  cfg_cmd->require_subcommand(1);
  auto* show = cfg_cmd->add_subcommand("show", "Print the resolved config (defaults filled in)");
  add_config_options(show, a);
  return {train, show};
}

CLI::App* add_synthetic_command(CLI::App& app, SynthArgs& synth) {
  auto* mk = app.add_subcommand("make-synthetic",
                                "Write a small learnable HDF5 dataset (train.h5, valid.h5)");
  mk->add_option("--out", synth.out_dir, "Output directory")->required();
  mk->add_option("--vocab", synth.spec.vocab_size, "Vocabulary size")->check(CLI::Range(2, 65536));
  mk->add_option("--programs", synth.spec.programs, "Number of permutation programs")
      ->check(CLI::Range(1, 1024));
  mk->add_option("--doc-len", synth.spec.doc_len, "Tokens per document (seq_len + 1)")
      ->check(CLI::Range(2, 1 << 20));
  mk->add_option("--train-docs", synth.spec.num_docs, "Training documents")
      ->check(CLI::Range(1, 1 << 26));
  mk->add_option("--valid-docs", synth.valid_docs, "Validation documents")
      ->check(CLI::Range(1, 1 << 26));
  mk->add_option("--seed", synth.spec.seed, "Seed of the permutations");
  return mk;
}

CLI::App* add_verify_command(CLI::App& app, VerifyArgs& verify) {
  auto* vd = app.add_subcommand("verify-data",
                                "Recompute checksums and check shards against manifest.json");
  vd->add_option("dir", verify.dir,
                 "Dataset directory (holds manifest.json), or s3://bucket/prefix")
      ->required();
  vd->add_option("-c,--config", verify.config_path,
                 "Also check against this config's model.vocab_size")
      ->check(CLI::ExistingFile);
  vd->add_flag("--no-checksums", verify.no_checksums, "Only sizes, structure and attributes");
  return vd;
}

CLI::App* add_eval_command(CLI::App& app, EvalArgs& eval_args) {
  auto* ev = app.add_subcommand(
      "eval", "Validation loss, perplexity and accuracy of a checkpoint, as JSON");
  add_config_options(ev, eval_args.cfg);
  ev->add_option("--checkpoint", eval_args.checkpoint,
                 "Checkpoint directory (default: the newest)");
  ev->add_option("--dump-logits", eval_args.dump_logits,
                 "Also write the evaluated windows and logits to this safetensors file");
  return ev;
}

struct EnvArgs {
  bool json = false;
  std::vector<std::string> dirs;
  TrainArgs cfg;
};

CLI::App* add_env_command(CLI::App& app, EnvArgs& e) {
  auto* en = app.add_subcommand(
      "env", "Check the environment: LibTorch, CUDA, cuDNN, NCCL, GPUs, CPU, memory, disks");
  en->add_flag("--json", e.json, "Print the report as JSON");
  en->add_option("-c,--config", e.cfg.config_path,
                 "Also check this config's output and data directories")
      ->check(CLI::ExistingFile);
  en->add_option("--dir", e.dirs, "Directories to check for free space and write speed");
  return en;
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"moe-train: train Mixture-of-Experts language models from a ds_config.json",
               "moe-train"};
  app.footer("Hugging Face families (import-hf, export-hf): " + families_in_one_line());
  app.set_version_flag("--version", version_string);
  app.require_subcommand(0, 1);

  TrainArgs train_args;
  LogArgs log_args;
  app.add_option("--log-level", log_args.level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_flag("-q,--quiet", log_args.quiet, "Only warnings and errors on the console");
  std::vector<std::string> limits;
  app.add_option("--limit", limits,
                 "Raise (or lower) a budget of the parsers of downloaded input: NAME=N "
                 "(repeatable; before the subcommand). Names and defaults: docs/reliability.md")
      ->allow_extra_args(false);
  auto [train, show] = add_train_commands(app, train_args);
  SchemaArgs schema_args;
  auto* schema = add_schema_command(*app.get_subcommand("config"), schema_args);

  SynthArgs synth;
  auto* mk = add_synthetic_command(app, synth);

  data::PrepareOptions prep;
  auto* pd = add_prepare_command(app, prep);

  VerifyArgs verify;
  auto* vd = add_verify_command(app, verify);
  EvalArgs eval_args;
  auto* ev = add_eval_command(app, eval_args);

  PlanArgs plan_args;
  auto* pl = add_plan_command(app, plan_args);
  ImportArgs imp;
  ExportArgs exp;
  auto [ih, eh] = add_hf_commands(app, imp, exp);

  GenerateCommands generation;
  add_generate_commands(app, generation);

  EnvArgs env_args;
  auto* en = add_env_command(app, env_args);
  FamiliesArgs families_args;
  auto* fam = add_families_command(app, families_args);
  std::string info_dir;
  auto* ck = app.add_subcommand("checkpoint", "Inspect checkpoints");
  ck->require_subcommand(1);
  auto* ci =
      ck->add_subcommand("info", "List the tensors (name, dtype, shape) of a checkpoint as JSON");
  ci->add_option("dir", info_dir, "Checkpoint directory")->required();
  std::string shell;
  auto* co = app.add_subcommand("completion", "Print a shell completion script (bash)");
  co->add_option("shell", shell, "bash")->required()->check(CLI::IsMember({"bash"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    throw UserError(std::string("command line: ") + e.what() + " (see moe-train --help)");
  }
  setup_logging(log_args);
  for (const auto& l : limits) set_input_limit(l);

  if (*train) return cmd_train(train_args);
  if (*show) return cmd_config_show(train_args);
  if (*schema) return cmd_config_schema(schema_args);
  if (*fam) return cmd_families(families_args);
  if (*mk) return cmd_make_synthetic(synth);
  if (*pd) return cmd_prepare_data(prep);
  if (*en) return cmd_env(env_args.cfg, env_args.dirs, env_args.json);
  if (*ev) return cmd_eval(eval_args);
  if (*pl) return cmd_plan(plan_args);
  if (*ih) return cmd_import_hf(imp);
  if (*eh) return cmd_export_hf(exp);
  if (const auto rc = run_generate_commands(generation)) return *rc;
  if (*ci) {
    std::cout << train::describe_checkpoint(info_dir).dump(2) << "\n";
    return kExitOk;
  }
  if (*vd) return cmd_verify_data(verify);
  if (*co) {
    std::cout << bash_completion(app);
    return kExitOk;
  }
  if (!train_args.config_path.empty()) return cmd_train(train_args);
  std::cout << app.help();
  return kExitUserError;
}

}  // namespace moe::cli
