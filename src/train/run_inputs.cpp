#include "moe/train/run_inputs.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>

#include "moe/env/environment.h"
#include "moe/model/attention_backend.h"
#include "moe/parallel/launch_env.h"
#include "moe/train/device.h"
#include "moe/util/errors.h"
#include "moe/util/s3_client.h"

namespace moe::train {

namespace fs = std::filesystem;

namespace {

void require_path(const config::Config& cfg, const std::string& key, const std::string& path) {
  if (s3::is_s3_url(path)) return;  // its manifest is fetched when the data is opened
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw UserError("config: " + cfg.source_file + ": " + key + " = " + path +
                    ": no such file or directory");
  }
}

void check_output_dir(const config::Config& cfg) {
  const std::string& dir = cfg.training.output_dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw UserError("config: " + cfg.source_file + ": training.output_dir = " + dir +
                    ": exists and is not a directory");
  }
}

}  // namespace

data::RemoteCacheOptions shard_cache_options(const config::Config& cfg) {
  data::RemoteCacheOptions c;
  c.dir = cfg.data.cache_dir.empty() ? (fs::path(cfg.training.output_dir) / "shard-cache").string()
                                     : cfg.data.cache_dir;
  // Ranks of one node keep separate caches: one rank's eviction never removes a file another
  // is reading. The rank as the launcher gave it (torchrun's RANK or srun's SLURM_PROCID).
  const parallel::LaunchEnv launch = parallel::launch_env();
  if (launch.world_size > 1) {
    c.dir = (fs::path(c.dir) / ("rank-" + std::to_string(launch.rank))).string();
  }
  c.max_bytes = cfg.data.cache_max_bytes;
  return c;
}

data::DatasetShards open_training_data(const config::Config& cfg) {
  const auto& d = cfg.data;
  const data::RemoteCacheOptions cache = shard_cache_options(cfg);
  if (d.blend.empty()) {
    return data::open_dataset({d.path, d.train_path, d.valid_path}, cfg.model.vocab_size,
                              cfg.model.seq_len, d.verify_checksums, cache);
  }
  std::vector<data::BlendSourcePaths> sources;
  for (const auto& s : d.blend) sources.push_back({s.name, s.weight, s.path, s.valid_path});
  return data::open_blend(sources, cfg.model.vocab_size, cfg.model.seq_len, d.verify_checksums,
                          cache);
}

RunInputs check_run_inputs(const config::Config& cfg, const TrainOptions& opt,
                           spdlog::logger& log) {
  RunInputs in;
  in.device = pick_device(cfg);
  if (in.device.is_cuda()) {
    log.info("attention: SDPA kernels tried in the order {} (model.attention_backend = {})",
             model::attention_priority_names(), config::name(cfg.model.attention_backend));
  }
  // 16-bit working weights (training.param_dtype) compute in their dtype on the CPU too.
  const bool sixteen_bit_weights = cfg.training.param_dtype != config::ParamDtype::kFp32;
  if (in.device.is_cpu() && (cfg.fp16.enabled || cfg.bf16.enabled) && !sixteen_bit_weights) {
    log.warn("{} is enabled but training runs on the CPU: computing in fp32",
             cfg.fp16.enabled ? "fp16" : "bf16");
  }
  if (in.device.is_cpu() && sixteen_bit_weights && !env::cpu_has_native_bf16()) {
    log.warn(
        "training.param_dtype = {} on a CPU without AVX512-BF16 or AMX: LibTorch multiplies "
        "16-bit matrices on a slow fallback (20x fp32's time and more); 16-bit working weights "
        "are for GPUs and CPUs with native bf16",
        config::name(cfg.training.param_dtype));
  }
  in.fp16 = (in.device.is_cuda() || sixteen_bit_weights) && cfg.fp16.enabled;
  in.bf16 = in.device.is_cuda() && cfg.bf16.enabled;
  if (!cfg.data.path.empty()) require_path(cfg, "data.path", cfg.data.path);
  if (!cfg.data.train_path.empty()) require_path(cfg, "data.train_path", cfg.data.train_path);
  if (!cfg.data.valid_path.empty()) require_path(cfg, "data.valid_path", cfg.data.valid_path);
  if (!opt.resume_from.empty()) require_path(cfg, "--resume", opt.resume_from);
  if (cfg.data.verify_checksums) log.info("data: verifying shard checksums");
  for (size_t i = 0; i < cfg.data.blend.size(); ++i) {
    require_path(cfg, "data.blend[" + std::to_string(i) + "].path", cfg.data.blend[i].path);
  }
  if (!cfg.checkpoint.remote.empty()) {  // credentials and bucket, before anything is written
    s3::client_from_environment()->check_access(
        s3::parse_url(cfg.checkpoint.remote, "checkpoint.remote"));
  }
  in.shards = open_training_data(cfg);
  in.has_valid = !in.shards.valid.empty();
  for (const auto& s : in.shards.train) in.train_windows += s.num_tokens / (cfg.model.seq_len + 1);
  check_output_dir(cfg);
  const int64_t steps_per_epoch =
      (in.train_windows + cfg.train_batch_size - 1) / cfg.train_batch_size;
  in.total_steps = cfg.training.train_iters > 0 ? cfg.training.train_iters
                                                : cfg.training.epochs * steps_per_epoch;
  return in;
}

}  // namespace moe::train
