// FusedAdamW: the offloaded (host master weights, bucketed copies) update must be bitwise the
// on-device update, whatever the bucket size; a found_inf step changes nothing; a checkpoint
// load (reload_master_weights) is what the next offloaded update starts from.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "moe/optim/adamw.h"
#include "moe/quant/blockwise_quant.h"
#include "moe/train/step_runner.h"

namespace moe::optim {
namespace {

std::vector<AdamWGroup> make_groups(uint64_t seed) {
  torch::manual_seed(seed);
  AdamWGroup decay{{"w1", "w2", "w3"},
                   {torch::randn({17, 9}), torch::randn({64, 33}), torch::randn({5, 3, 7})},
                   0.1};
  AdamWGroup no_decay{{"norm", "bias"}, {torch::randn({33}), torch::randn({9})}, 0.0};
  return {decay, no_decay};
}

std::vector<AdamWGroup> clone_groups(const std::vector<AdamWGroup>& groups) {
  std::vector<AdamWGroup> out = groups;
  for (auto& g : out) {
    for (auto& p : g.params) p = p.detach().clone();
  }
  return out;
}

// Same gradients for both optimizers; step 3 leaves "w2" without a gradient.
void set_grads(std::vector<AdamWGroup>& groups, int step) {
  torch::manual_seed(1000 + step);
  for (auto& g : groups) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (step == 3 && g.names[i] == "w2") {
        g.params[i].mutable_grad() = torch::Tensor();
      } else {
        g.params[i].mutable_grad() = torch::randn_like(g.params[i]);
      }
    }
  }
}

void expect_bitwise_equal(FusedAdamW& a, std::vector<AdamWGroup>& ga, FusedAdamW& b,
                          std::vector<AdamWGroup>& gb) {
  for (size_t g = 0; g < ga.size(); ++g) {
    for (size_t i = 0; i < ga[g].params.size(); ++i) {
      EXPECT_TRUE(torch::equal(ga[g].params[i], gb[g].params[i])) << ga[g].names[i];
    }
  }
  auto sa = a.named_state(), sb = b.named_state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(torch::equal(sa[i].second->exp_avg, sb[i].second->exp_avg)) << sa[i].first;
    EXPECT_TRUE(torch::equal(sa[i].second->exp_avg_sq, sb[i].second->exp_avg_sq)) << sa[i].first;
    EXPECT_TRUE(torch::equal(sa[i].second->step, sb[i].second->step)) << sa[i].first;
  }
}

class OffloadBuckets : public ::testing::TestWithParam<int64_t> {};

TEST_P(OffloadBuckets, BitwiseEqualToOnDeviceUpdate) {
  auto ga = make_groups(7);
  auto gb = clone_groups(ga);
  FusedAdamW on_device(ga, 0.9, 0.95, 1e-8);
  OffloadOptions off;
  off.enabled = true;
  off.bucket_bytes = GetParam();
  FusedAdamW offloaded(gb, 0.9, 0.95, 1e-8, off);
  ASSERT_TRUE(offloaded.offloaded());
  for (int step = 1; step <= 6; ++step) {
    set_grads(ga, step);
    set_grads(gb, step);
    on_device.step(1e-2 * step);
    offloaded.step(1e-2 * step);
  }
  expect_bitwise_equal(on_device, ga, offloaded, gb);
  // The parameters moved: the test would not pass with an update that does nothing.
  auto fresh = make_groups(7);
  EXPECT_FALSE(torch::equal(fresh[0].params[0], ga[0].params[0]));
  // "w2" skipped step 3: its own step counter says 5.
  for (auto& [name, st] : offloaded.named_state()) {
    EXPECT_EQ(st->step.item<float>(), name == "w2" ? 5.0f : 6.0f) << name;
  }
}

// One bucket per parameter, a few buckets, everything in one bucket.
INSTANTIATE_TEST_SUITE_P(BucketSizes, OffloadBuckets,
                         ::testing::Values(int64_t{1}, int64_t{4096}, int64_t{64} << 20));

TEST(Offload, FoundInfSkipsAndGradScaleUnscales) {
  for (bool offload : {false, true}) {
    auto groups = make_groups(3);
    auto reference = clone_groups(groups);
    OffloadOptions off;
    off.enabled = offload;
    FusedAdamW opt(groups, 0.9, 0.95, 1e-8, off);
    FusedAdamW plain(reference, 0.9, 0.95, 1e-8);
    set_grads(groups, 1);
    set_grads(reference, 1);
    const auto before = groups[0].params[0].clone();
    opt.step(1e-2, torch::full({}, 4.0f), torch::ones({}));  // overflow: nothing changes
    EXPECT_TRUE(torch::equal(before, groups[0].params[0])) << "offload " << offload;
    for (auto& [name, st] : opt.named_state()) EXPECT_EQ(st->step.item<float>(), 0.0f) << name;
    // Scaled gradients x4 with grad_scale 4 give the same update as the unscaled ones.
    for (auto& g : groups) {
      for (auto& p : g.params) p.mutable_grad() = p.grad() * 4.0f;
    }
    opt.step(1e-2, torch::full({}, 4.0f), torch::zeros({}));
    plain.step(1e-2);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        EXPECT_TRUE(torch::allclose(groups[g].params[i], reference[g].params[i], 1e-6, 1e-7))
            << groups[g].names[i] << " offload " << offload;
      }
    }
  }
}

TEST(Offload, ReloadMasterWeightsAfterExternalLoad) {
  auto ga = make_groups(11);
  auto gb = clone_groups(ga);
  OffloadOptions off;
  off.enabled = true;
  FusedAdamW offloaded(ga, 0.9, 0.95, 1e-8, off);
  FusedAdamW on_device(gb, 0.9, 0.95, 1e-8);
  // A checkpoint load writes new weights into the model's parameters.
  {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < ga.size(); ++g) {
      for (size_t i = 0; i < ga[g].params.size(); ++i) {
        auto w = torch::randn_like(ga[g].params[i]);
        ga[g].params[i].copy_(w);
        gb[g].params[i].copy_(w);
      }
    }
  }
  offloaded.reload_master_weights();
  set_grads(ga, 1);
  set_grads(gb, 1);
  offloaded.step(1e-2);
  on_device.step(1e-2);
  expect_bitwise_equal(on_device, gb, offloaded, ga);
}

// The CUDA-graph update (lr and the skip decision in device tensors) is the same update.
TEST(CapturableStep, BitwiseEqualToHostLrStepAndSkipsOnFoundInf) {
  auto ga = make_groups(21);
  auto gb = clone_groups(ga);
  FusedAdamW host_lr(ga, 0.9, 0.95, 1e-8);
  FusedAdamW tensor_lr(gb, 0.9, 0.95, 1e-8);
  for (int step = 1; step <= 4; ++step) {
    set_grads(ga, step);
    set_grads(gb, step);
    const double lr = 1e-2 * step;
    if (step == 2) {  // a skipped step: nothing moves, the counters stay
      tensor_lr.step_capturable(torch::full({}, lr), torch::ones({}));
      continue;
    }
    host_lr.step(lr);
    tensor_lr.step_capturable(torch::full({}, lr), torch::zeros({}));
  }
  expect_bitwise_equal(host_lr, ga, tensor_lr, gb);
}

// ---- 16-bit working weights (training.param_dtype) ----

// A bf16 weight with an fp32 master steps exactly as an fp32 weight would (the master is that
// fp32 weight, bitwise) and holds the master rounded to bf16; offloaded, the same bitwise.
TEST(SixteenBitWeights, Fp32MasterStepsAsFp32AndRoundsIntoTheWeight) {
  torch::manual_seed(5);
  const auto init = torch::randn({64, 65}).to(torch::kBFloat16);
  AdamWGroup ref{{"w"}, {init.to(torch::kFloat)}, 0.1};
  AdamWGroup dev{{"w"}, {init.clone()}, 0.1};
  AdamWGroup host{{"w"}, {init.clone()}, 0.1};
  OffloadOptions off;
  off.enabled = true;
  off.bucket_bytes = 1024;
  FusedAdamW a({ref}, 0.9, 0.95, 1e-8), b({dev}, 0.9, 0.95, 1e-8), c({host}, 0.9, 0.95, 1e-8, off);
  EXPECT_TRUE(b.has_16bit_params());
  for (int step = 0; step < 6; ++step) {
    const auto g = (torch::randn({64, 65}) * 0.3).to(torch::kBFloat16);
    ref.params[0].mutable_grad() = g.to(torch::kFloat);
    dev.params[0].mutable_grad() = g.clone();
    host.params[0].mutable_grad() = g.clone();
    a.step(1e-2);
    b.step(1e-2);
    c.step(1e-2);
  }
  EXPECT_EQ(dev.params[0].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(b.master_weight_host("w"), ref.params[0]));
  EXPECT_TRUE(torch::equal(dev.params[0], ref.params[0].to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(c.master_weight_host("w"), ref.params[0]));
  EXPECT_TRUE(torch::equal(host.params[0], dev.params[0]));
}

// Updates far below bf16's resolution: a plain bf16 weight never moves (each step rounds back);
// with the Kahan compensation the weight + compensation follows the fp32 trajectory.
TEST(SixteenBitWeights, KahanCompensationKeepsUpdatesBelowBf16Resolution) {
  AdamWGroup ref{{"w"}, {torch::ones({4096})}, 0.0};
  AdamWGroup kahan{{"w"}, {torch::ones({4096}, torch::kBFloat16)}, 0.0};
  FusedAdamW a({ref}, 0.9, 0.95, 1e-8);
  FusedAdamW b({kahan}, 0.9, 0.95, 1e-8, {}, {}, MainParamsDtype::kBf16);
  for (int step = 0; step < 200; ++step) {
    ref.params[0].mutable_grad() = torch::ones({4096});
    kahan.params[0].mutable_grad() = torch::ones({4096}, torch::kBFloat16);
    a.step(1e-4);  // about -1e-4 per step; bf16's spacing at 1 is 2^-8 below, 2^-7 above
    b.step(1e-4);
  }
  const double fp32 = ref.params[0][0].item<double>();
  EXPECT_NEAR(fp32, 0.98, 1e-3);
  const auto value = b.master_weight_host("w");
  // The compensation is itself bf16: what it drops per step adds up to well under the 0.02 a
  // plain bf16 weight would miss here.
  EXPECT_LT((value - ref.params[0]).abs().max().item<double>(), 5e-4);
  EXPECT_LT(kahan.params[0][0].item<double>(), 0.99);  // the weight itself moved, too
  ASSERT_EQ(b.named_compensation().size(), 1u);
}

// A bf16 master's checkpoint value (weight + compensation in fp32) and its compensation give the
// weight and compensation back bitwise; without a compensation (an fp32 checkpoint), the value
// rounded and its rounding error.
TEST(SixteenBitWeights, Bf16MasterCheckpointValuesRoundTrip) {
  torch::manual_seed(7);
  AdamWGroup g{{"w"}, {torch::randn({300}).to(torch::kBFloat16)}, 0.01};
  FusedAdamW a({g}, 0.9, 0.95, 1e-8, {}, {}, MainParamsDtype::kBf16);
  for (int step = 0; step < 5; ++step) {
    g.params[0].mutable_grad() = torch::randn({300}).to(torch::kBFloat16);
    a.step(3e-3);
  }
  const auto value = a.master_weight_host("w");
  const auto comp = a.named_compensation().at(0).second.clone();
  EXPECT_GT(comp.abs().max().item<double>(), 0.0);
  AdamWGroup h{{"w"}, {torch::zeros({300}, torch::kBFloat16)}, 0.01};
  FusedAdamW b({h}, 0.9, 0.95, 1e-8, {}, {}, MainParamsDtype::kBf16);
  b.load_master_weight("w", value, comp.to(torch::kFloat));
  EXPECT_TRUE(torch::equal(h.params[0], g.params[0]));
  EXPECT_TRUE(torch::equal(b.named_compensation().at(0).second, comp));
  const auto fp32 = torch::randn({300});
  b.load_master_weight("w", fp32, std::nullopt);
  EXPECT_TRUE(torch::equal(h.params[0], fp32.to(torch::kBFloat16)));
  const auto sum =
      h.params[0].to(torch::kFloat) + b.named_compensation().at(0).second.to(torch::kFloat);
  // |error| <= |value| * 2^-16: the rounding error is under half a bf16 spacing (2^-8 |v|) and
  // the compensation keeps it to bf16's 8 bits.
  EXPECT_TRUE(((sum - fp32).abs() <= fp32.abs() * std::ldexp(1.0, -16)).all().item<bool>());
}

// Micro-batch gradients of 16-bit weights are summed in fp32; the sum is the gradient after
// the last micro-batch. fp32 parameters are left to autograd's own accumulation.
TEST(SixteenBitWeights, MicroBatchGradientsSumInFp32) {
  AdamWGroup g{{"w", "norm"}, {torch::zeros({1000}, torch::kBFloat16), torch::zeros({8})}, 0.0};
  FusedAdamW a({g}, 0.9, 0.95, 1e-8);
  const auto g1 = torch::full({1000}, 256.0, torch::kBFloat16);
  const auto g2 = torch::full({1000}, 1.0, torch::kBFloat16);
  g.params[0].mutable_grad() = g1;
  a.accumulate_micro_batch(false);
  EXPECT_FALSE(g.params[0].grad().defined());  // released: autograd starts a new one
  g.params[0].mutable_grad() = g2;
  g.params[1].mutable_grad() = torch::ones({8});
  a.accumulate_micro_batch(true);
  ASSERT_EQ(g.params[0].grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(g.params[0].grad()[0].item<double>(), 257.0);  // bf16 would round 257 to 256
  EXPECT_EQ(g.params[1].grad().scalar_type(), torch::kFloat);
  a.zero_grad();
  EXPECT_FALSE(g.params[0].grad().defined());
}

}  // namespace
}  // namespace moe::optim

namespace moe::optim {
namespace {

// Groups with parameters above and below bitsandbytes' 4096-value floor for 8-bit moments.
std::vector<AdamWGroup> large_groups(uint64_t seed) {
  torch::manual_seed(seed);
  AdamWGroup decay{{"big", "small"}, {torch::randn({80, 70}), torch::randn({17, 9})}, 0.1};
  AdamWGroup no_decay{{"norm"}, {torch::randn({5000})}, 0.0};
  return {decay, no_decay};
}

void set_large_grads(std::vector<AdamWGroup>& groups, int step, double scale = 1.0) {
  torch::manual_seed(2000 + step);
  for (auto& g : groups) {
    for (auto& p : g.params) p.mutable_grad() = torch::randn_like(p) * scale;
  }
}

MomentPrecision eight_bit() { return {config::StateDtype::k8Bit, config::StateDtype::k8Bit}; }

// The reference update on host masters (offload) is the same update as on the weights.
TEST(MomentPrecision, OffloadedBitwiseEqualToOnDeviceWith8BitAndBf16Moments) {
  for (MomentPrecision precision :
       {eight_bit(), MomentPrecision{config::StateDtype::kBf16, config::StateDtype::k8Bit}}) {
    auto ga = large_groups(7), gb = clone_groups(ga);
    FusedAdamW a(ga, 0.9, 0.99, 1e-8, {}, precision);
    FusedAdamW b(gb, 0.9, 0.99, 1e-8, {.enabled = true, .bucket_bytes = 4096}, precision);
    for (int step = 0; step < 4; ++step) {
      set_large_grads(ga, step);
      set_large_grads(gb, step);
      a.step(1e-2);
      b.step(1e-2);
    }
    expect_bitwise_equal(a, ga, b, gb);
  }
}

// 8-bit storage where bitsandbytes uses it: codes + block scales for >= 4096 values only.
TEST(MomentPrecision, EightBitStorageAboveTheFloorOnly) {
  auto g = large_groups(8);
  FusedAdamW opt(g, 0.9, 0.99, 1e-8, {}, eight_bit());
  for (auto& [name, st] : opt.named_state()) {
    const bool big = name != "small";
    EXPECT_EQ(st->exp_avg.scalar_type(), big ? torch::kByte : torch::kFloat) << name;
    EXPECT_EQ(st->exp_avg_absmax.defined(), big) << name;
    if (big) {
      EXPECT_EQ(st->exp_avg_sq_absmax.numel(), quant::quant_blocks(st->exp_avg_sq.numel())) << name;
    }
  }
}

// fp16 loss scaling: an overflowed step changes nothing; a scaled gradient with its scale is the
// unscaled gradient.
TEST(MomentPrecision, FoundInfSkipsAndGradScaleUnscales) {
  auto ga = large_groups(9), gb = clone_groups(ga);
  FusedAdamW a(ga, 0.9, 0.99, 1e-8, {}, eight_bit());
  FusedAdamW b(gb, 0.9, 0.99, 1e-8, {}, eight_bit());
  set_large_grads(ga, 0);
  set_large_grads(gb, 0, 1024.0);
  a.step(1e-2);
  b.step(1e-2, torch::full({}, 1024.0f), torch::zeros({}));
  expect_bitwise_equal(a, ga, b, gb);
  auto before = clone_groups(gb);
  set_large_grads(gb, 1);
  b.step(1e-2, torch::full({}, 1.0f), torch::ones({}));
  for (size_t i = 0; i < gb.size(); ++i) {
    for (size_t k = 0; k < gb[i].params.size(); ++k) {
      EXPECT_TRUE(torch::equal(gb[i].params[k], before[i].params[k]));
    }
  }
  EXPECT_EQ(b.named_state()[0].second->step.item<float>(), 1.0f);
}

// The dynamic map is sorted with 1.0 on top, and quantising takes the nearest code: the error
// of a value, relative to its block's absmax, is at most half the widest gap of the map.
TEST(MomentPrecision, QuantisationRoundTrip) {
  torch::manual_seed(3);
  const auto x = torch::randn({3 * 256 + 11});
  auto codes = torch::empty(x.sizes(), torch::kByte);
  auto absmax = torch::empty({quant::quant_blocks(x.numel())});
  const auto map = quant::dynamic_map(true, torch::kCPU);
  quant::quantize_blockwise(x, map, codes, absmax);
  const auto back = quant::dequantize_blockwise(codes, absmax, map);
  const auto rel = (back - x).abs() / absmax.repeat_interleave(256).slice(0, 0, x.numel());
  // Nearest code: within half the widest gap of the map, or below its lowest code (-1 maps to
  // -0.9925).
  const float half_gap = ((map.slice(0, 1) - map.slice(0, 0, 255)).max() / 2).item<float>();
  const float bound = std::max(half_gap, 1.0f + map[0].item<float>());
  EXPECT_LE(rel.max().item<float>(), bound * (1 + 1e-6f));
  EXPECT_EQ(map.size(0), 256);
  EXPECT_EQ(map[255].item<float>(), 1.0f);
  EXPECT_TRUE(torch::all(map.slice(0, 1) >= map.slice(0, 0, 255)).item<bool>());
}

// Clipping folded into the update: clip_divisor as grad_scale is clip_grad_norm_ followed by the
// step (within fp32 rounding while clipping; bitwise when the norm is under the limit), for the
// fused fp32 update, its offloaded twin and the bf16-moment reference update.
std::vector<torch::Tensor> grads_of(std::vector<AdamWGroup>& groups) {
  std::vector<torch::Tensor> out;
  for (auto& g : groups) {
    for (auto& p : g.params) {
      if (p.grad().defined()) out.push_back(p.grad());
    }
  }
  return out;
}

double worst_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max() /
          b.to(torch::kFloat).abs().max().clamp_min(1e-30))
      .item<double>();
}

TEST(ClipFolding, DivisorAsGradScaleIsTheClippedUpdate) {
  EXPECT_EQ(clip_divisor(torch::tensor(2.0f), 0.5).item<float>(), (2.0f + 1e-6f) / 0.5f);
  EXPECT_EQ(clip_divisor(torch::tensor(0.3f), 0.5).item<float>(), 1.0f);
  EXPECT_EQ(clip_divisor(torch::tensor(NAN), 0.5).item<float>(), 1.0f);
  EXPECT_FALSE(clip_divisor(torch::tensor(2.0f), INFINITY).defined());  // clipping off
  const MomentPrecision bf16_moments{config::StateDtype::kBf16, config::StateDtype::kBf16};
  for (const MomentPrecision precision : {MomentPrecision{}, bf16_moments}) {
    for (const bool offload : {false, true}) {
      for (const double max_norm : {0.5, 1e9, double(INFINITY)}) {
        SCOPED_TRACE("offload " + std::to_string(offload) + " max_norm " +
                     std::to_string(max_norm) + (precision.fp32() ? " fp32" : " bf16 moments"));
        auto ga = make_groups(21), gb = clone_groups(ga);
        OffloadOptions off;
        off.enabled = offload;
        FusedAdamW separate(ga, 0.9, 0.95, 1e-8, off, precision);
        FusedAdamW folded(gb, 0.9, 0.95, 1e-8, off, precision);
        for (int step = 1; step <= 4; ++step) {
          set_grads(ga, step);
          set_grads(gb, step);
          const auto norm_a = clip_grad_norm(grads_of(ga), max_norm);
          const auto norm_b = gradient_norm(grads_of(gb));
          EXPECT_TRUE(torch::equal(norm_a, norm_b));
          separate.step(1e-2);
          const auto divisor = clip_divisor(norm_b, max_norm);
          if (divisor.defined()) {
            folded.step(1e-2, divisor);
          } else {
            folded.step(1e-2);
          }
        }
        if (max_norm > 1e8) {  // nothing clipped: a divisor of exactly 1
          expect_bitwise_equal(separate, ga, folded, gb);
          continue;
        }
        auto sa = separate.named_state(), sb = folded.named_state();
        const double bar = precision.fp32() ? 1e-6 : 1e-2;  // bf16 moments round to 2^-8
        for (size_t i = 0; i < sa.size(); ++i) {
          // Adam's step hardly depends on the gradients' scale: the moments are what show a
          // wrong divisor, so they are compared too.
          EXPECT_LT(worst_rel(sb[i].second->exp_avg, sa[i].second->exp_avg), bar) << sa[i].first;
          EXPECT_LT(worst_rel(sb[i].second->exp_avg_sq, sa[i].second->exp_avg_sq), 2 * bar)
              << sa[i].first;
        }
        for (size_t g = 0; g < ga.size(); ++g) {
          for (size_t i = 0; i < ga[g].params.size(); ++i) {
            EXPECT_LT(worst_rel(gb[g].params[i], ga[g].params[i]), 1e-5) << ga[g].names[i];
          }
        }
      }
    }
  }
}

// The comparison above sees a divisor applied the wrong way round (times instead of divided).
TEST(ClipFolding, AnInvertedDivisorIsCaught) {
  auto ga = make_groups(22), gb = clone_groups(ga);
  FusedAdamW separate(ga, 0.9, 0.95, 1e-8);
  FusedAdamW wrong(gb, 0.9, 0.95, 1e-8);
  set_grads(ga, 1);
  set_grads(gb, 1);
  (void)clip_grad_norm(grads_of(ga), 0.5);
  separate.step(1e-2);
  wrong.step(1e-2, 1.0 / clip_divisor(gradient_norm(grads_of(gb)), 0.5));
  EXPECT_GT(
      worst_rel(wrong.named_state()[0].second->exp_avg, separate.named_state()[0].second->exp_avg),
      1.0);
}

}  // namespace
}  // namespace moe::optim
