// Attention options: rotary embeddings (Hugging Face's rotate-half layout), grouped-query heads,
// an explicit head_dim and q/k RMSNorm, against direct formulas in double.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "moe/model/transformer.h"

namespace moe::model {
namespace {

// x [1, 1, S, hd] rotated by hand: pair (i, i + hd/2) at position p turns by p * theta^(-2i/hd).
TEST(Rotary, MatchesThePairRotationInDouble) {
  const int64_t S = 9, hd = 8;
  const double theta = 10000.0;
  torch::manual_seed(3);
  auto x = torch::randn({1, 1, S, hd});
  auto got = apply_rotary(x, theta).to(torch::kDouble);
  auto xd = x.to(torch::kDouble);
  auto want = torch::empty_like(xd);
  for (int64_t p = 0; p < S; ++p) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / hd);
      const double a = xd[0][0][p][i].item<double>(), b = xd[0][0][p][i + hd / 2].item<double>();
      want[0][0][p][i] = a * std::cos(angle) - b * std::sin(angle);
      want[0][0][p][i + hd / 2] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max();
}

// What rotary embeddings are for: q_m . k_n depends on m - n only.
TEST(Rotary, ScoresDependOnRelativePositionOnly) {
  const int64_t S = 12, hd = 16;
  torch::manual_seed(4);
  auto q = torch::randn({hd}), k = torch::randn({hd});
  auto qs = apply_rotary(q.expand({1, 1, S, hd}).contiguous(), 500.0)[0][0];
  auto ks = apply_rotary(k.expand({1, 1, S, hd}).contiguous(), 500.0)[0][0];
  for (int64_t m = 0; m + 3 < S; ++m) {
    const double a = qs[m + 2].dot(ks[m]).item<double>();
    const double b = qs[m + 3].dot(ks[m + 1]).item<double>();
    EXPECT_NEAR(a, b, 1e-4 * (std::abs(a) + 1)) << m;
  }
}

config::RopeScalingConfig yarn(double factor, int64_t original) {
  config::RopeScalingConfig s;
  s.type = config::RopeScalingType::kYarn;
  s.factor = factor;
  s.original_max_position_embeddings = original;
  return s;
}

// YaRN's frequencies by the paper's rule, in double: dimension pair i turns r_i = L / (2 pi
// theta^(2i/hd)) times over the pretraining window L; with beta_slow <= r_i <= beta_fast a linear
// ramp over i (its bounds rounded outward) blends theta^(-2i/hd) / factor (i past the ramp: slow
// frequencies, interpolated) into theta^(-2i/hd) (before it: fast ones, kept).
TEST(Rotary, YarnFrequenciesFollowThePaper) {
  const int64_t hd = 64, L = 256;
  const double theta = 1e6, factor = 4;
  for (const bool truncate : {true, false}) {
    auto s = yarn(factor, L);
    s.truncate = truncate;
    s.beta_fast = 16, s.beta_slow = 2;
    const auto got = rotary_inv_freq(hd, theta, s).to(torch::kDouble);
    auto bound = [&](double rotations) {  // the i at which r_i = rotations
      return hd * std::log(L / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
    };
    double low = bound(16), high = bound(2);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, hd - 1.0);
    int kept = 0, interpolated = 0;
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double base = std::pow(theta, -2.0 * i / hd);
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double want = base / factor * ramp + base * (1 - ramp);
      EXPECT_NEAR(got[i].item<double>(), want, 1e-6 * want) << i << " truncate " << truncate;
      kept += ramp == 0, interpolated += ramp == 1;
    }
    EXPECT_GT(kept, 0) << "the fastest frequencies are kept";
    EXPECT_GT(interpolated, 0) << "the slowest are divided by the factor";
  }
  // Without scaling: the plain frequencies, bitwise what the default tables use.
  EXPECT_TRUE(torch::equal(
      rotary_inv_freq(hd, theta, {}),
      1.0 / torch::pow(theta, torch::arange(0, hd, 2).to(torch::kFloat) / double(hd))));
}

// Linear scaling is position interpolation: the angles at positions 2p under factor 2 are those
// at p unscaled (exactly: halving is exact in binary floating point).
TEST(Rotary, LinearScalingDividesThePositions) {
  config::RopeScalingConfig linear;
  linear.type = config::RopeScalingType::kLinear;
  linear.factor = 2;
  torch::manual_seed(5);
  const auto x = torch::randn({2, 3, 7, 16});
  const auto p = torch::arange(7).repeat({2, 1});
  EXPECT_TRUE(torch::equal(apply_rotary(x, 1e4, 2 * p, linear), apply_rotary(x, 1e4, p)));
  EXPECT_FALSE(torch::equal(apply_rotary(x, 1e4, p, linear), apply_rotary(x, 1e4, p)));
}

// YaRN scales cos and sin by its attention factor: 0.1 ln(factor) + 1 unless one is given.
TEST(Rotary, YarnScalesCosAndSinByTheAttentionFactor) {
  const auto x = torch::zeros({1, 1, 5, 8});
  auto s = yarn(4, 16);
  const float derived = static_cast<float>(0.1 * std::log(4.0) + 1.0);
  EXPECT_DOUBLE_EQ(rotary_attention_factor(s), 0.1 * std::log(4.0) + 1.0);
  auto [cos, sin] = rotary_tables(x, 1e4, {}, s);
  EXPECT_TRUE(torch::equal(cos[0], torch::full({8}, derived)));  // position 0: angle 0
  EXPECT_TRUE(torch::equal(sin[0], torch::zeros({8})));
  const auto [cos1, sin1] = rotary_tables(x, 1e4, {}, config::RopeScalingConfig{});
  EXPECT_LT((cos.pow(2) + sin.pow(2) - derived * derived).abs().max().item<float>(), 1e-5);
  EXPECT_LT((cos1.pow(2) + sin1.pow(2) - 1).abs().max().item<float>(), 1e-6);
  s.attention_factor = 0.5;
  std::tie(cos, sin) = rotary_tables(x, 1e4, {}, s);
  EXPECT_TRUE(torch::equal(cos[0], torch::full({8}, 0.5f)));
  EXPECT_EQ(rotary_attention_factor(config::RopeScalingConfig{}), 1.0);
}

// The tables one forward shares are rebuilt when the scaling differs (a cache keyed on theta
// alone would hand a scaled model the unscaled tables).
TEST(Rotary, TableCacheIsKeyedOnTheScaling) {
  RotaryTableCache cache;
  const auto x = torch::zeros({1, 2, 6, 8});
  const auto plain = cache.get(x, 1e4, {});
  EXPECT_EQ(cache.builds(), 1);
  cache.get(x, 1e4, {});
  EXPECT_EQ(cache.builds(), 1);
  const auto scaled = cache.get(x, 1e4, {}, yarn(4, 3));
  EXPECT_EQ(cache.builds(), 2);
  EXPECT_FALSE(torch::equal(plain.first, scaled.first));
  EXPECT_TRUE(torch::equal(scaled.first, rotary_tables(x, 1e4, {}, yarn(4, 3)).first));
}

// Grouped-query attention with explicit head_dim and q/k norms, against the same computation
// written out: every query head h reads key/value head h / (H / KV).
TEST(Attention, GroupedQueryHeadsMatchTheWrittenOutComputation) {
  AttentionOptions o;
  o.hidden = 24, o.heads = 4, o.kv_heads = 2, o.head_dim = 8, o.rope_theta = 1000.0;
  o.qk_norm = true;
  torch::manual_seed(5);
  CausalSelfAttention attn(o);
  attn->eval();
  const int64_t B = 2, S = 7, H = 4, KV = 2, hd = 8;
  auto x = torch::randn({B, S, o.hidden});
  auto y = attn->forward(x);
  ASSERT_EQ(y.sizes(), x.sizes());
  torch::NoGradGuard g;
  auto proj = x.matmul(attn->qkv->weight.t()).to(torch::kDouble);
  auto rms = [&](const torch::Tensor& t, const torch::Tensor& w) {
    return t * (t.square().mean(-1, true) + o.norm_eps).rsqrt() * w.to(torch::kDouble);
  };
  auto q = rms(proj.narrow(-1, 0, H * hd).view({B, S, H, hd}), attn->q_norm->weight);
  auto k = rms(proj.narrow(-1, H * hd, KV * hd).view({B, S, KV, hd}), attn->k_norm->weight);
  auto v = proj.narrow(-1, (H + KV) * hd, KV * hd).view({B, S, KV, hd});
  q = apply_rotary(q.transpose(1, 2).to(torch::kFloat), o.rope_theta).to(torch::kDouble);
  k = apply_rotary(k.transpose(1, 2).to(torch::kFloat), o.rope_theta).to(torch::kDouble);
  v = v.transpose(1, 2);
  auto ctx = torch::empty({B, H, S, hd}, torch::kDouble);
  auto mask = torch::ones({S, S}, torch::kBool).tril();
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g_kv = h / (H / KV);
    auto scores = q.select(1, h).matmul(k.select(1, g_kv).transpose(-1, -2)) / std::sqrt(hd);
    scores = scores.masked_fill(~mask, -INFINITY).softmax(-1);
    ctx.select(1, h).copy_(scores.matmul(v.select(1, g_kv)));
  }
  auto want =
      ctx.transpose(1, 2).reshape({B, S, H * hd}).matmul(attn->out->weight.t().to(torch::kDouble));
  EXPECT_TRUE(torch::allclose(y.to(torch::kDouble), want, 1e-4, 1e-5))
      << (y.to(torch::kDouble) - want).abs().max();
  // Parameter layout: q (4 heads) | k (2) | v (2) of 8, output from 32 back to 24.
  EXPECT_EQ(attn->qkv->weight.sizes(), torch::IntArrayRef({(H + 2 * KV) * hd, o.hidden}));
  EXPECT_EQ(attn->out->weight.sizes(), torch::IntArrayRef({o.hidden, H * hd}));
}

}  // namespace
}  // namespace moe::model
