// `moe-train bench-generate`: what a user waits for when generating, measured on the device.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/generate/generate_command.h"
#include "moe/generate/generation_session.h"
#include "moe/util/errors.h"

namespace moe::generate {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Peak memory so far in MiB: the CUDA caching allocator's peak on a GPU, else the process's
// peak resident set.
double peak_mib(const torch::Device& device) {
  if (device.is_cuda()) {
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return static_cast<double>(stats.allocated_bytes[agg].peak) / (1 << 20);
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

struct BatchResult {
  int64_t batch = 0;
  double ttft_s = 0, prefill_tps = 0, decode_tps = 0, peak_mib = 0;
};

BatchResult bench_batch(GenerationSession& s, const BenchGenerateOptions& opt, int64_t batch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(batch));
  const auto ids = torch::randint(0, s.cfg.model.vocab_size, {batch, opt.prompt_tokens}, gen,
                                  torch::TensorOptions().dtype(torch::kLong));
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < batch; ++r) {
    const auto row = ids[r].contiguous();
    prompts.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + opt.prompt_tokens);
  }
  SamplingParams greedy;  // transformers' defaults, do_sample false
  GenerationLimits limits = s.limits(opt.new_tokens);
  limits.eos_ids.clear();  // every row runs its whole budget
  std::vector<double> ttft, prefill, decode;
  for (int64_t round = 0; round <= opt.rounds; ++round) {
    GenerationTimes t;
    generate_batch(s.model, prompts, greedy, limits, {}, nullptr, &t);
    if (round == 0) continue;  // warm-up
    ttft.push_back(t.prefill_s);
    prefill.push_back(static_cast<double>(t.prefill_tokens) / t.prefill_s);
    decode.push_back(static_cast<double>(batch * t.decode_steps) / t.decode_s);
  }
  const auto device = s.model->parameters().front().device();
  return {batch, median(ttft), median(prefill), median(decode), peak_mib(device)};
}

}  // namespace

int run_bench_generate(const BenchGenerateOptions& opt) {
  if (opt.prompt_tokens < 1 || opt.new_tokens < 2 || opt.rounds < 1)
    throw UserError("bench-generate: --prompt-tokens >= 1, --new-tokens >= 2, --rounds >= 1");
  if (opt.threads > 0) torch::set_num_threads(static_cast<int>(opt.threads));
  DecodingFlags flags;
  flags.checkpoint = opt.checkpoint;
  flags.device = opt.device;
  GenerationSession s(flags, /*need_tokenizer=*/false);  // random prompts
  const auto device = s.model->parameters().front().device();
  nlohmann::json out = {{"checkpoint", opt.checkpoint},        {"device", device.str()},
                        {"threads", torch::get_num_threads()}, {"prompt_tokens", opt.prompt_tokens},
                        {"new_tokens", opt.new_tokens},        {"rounds", opt.rounds},
                        {"results", nlohmann::json::array()}};
  for (int64_t b : opt.batches) {
    if (b < 1) throw UserError("bench-generate: --batch sizes must be >= 1");
    const BatchResult r = bench_batch(s, opt, b);
    out["results"].push_back({{"batch", r.batch},
                              {"ttft_s", r.ttft_s},
                              {"prefill_tokens_per_s", r.prefill_tps},
                              {"decode_tokens_per_s", r.decode_tps},
                              {"peak_memory_mib", r.peak_mib}});
  }
  if (opt.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf(
      "bench-generate %s on %s, %d threads: prompts of %lld tokens, %lld new (greedy), "
      "medians of %lld rounds\n",
      opt.checkpoint.c_str(), device.str().c_str(), torch::get_num_threads(),
      static_cast<long long>(opt.prompt_tokens), static_cast<long long>(opt.new_tokens),
      static_cast<long long>(opt.rounds));
  std::printf("%6s %14s %18s %18s %14s\n", "batch", "TTFT (ms)", "prefill tok/s", "decode tok/s",
              "peak MiB");
  for (const auto& r : out["results"]) {
    std::printf("%6lld %14.2f %18.1f %18.1f %14.0f\n", r["batch"].get<long long>(),
                1e3 * r["ttft_s"].get<double>(), r["prefill_tokens_per_s"].get<double>(),
                r["decode_tokens_per_s"].get<double>(), r["peak_memory_mib"].get<double>());
  }
  return 0;
}

}  // namespace moe::generate
