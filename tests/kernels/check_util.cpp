// The shared half of the kernel checks (check_util.h): verdicts, comparisons, ulps, the grids
// and the mutation-test helpers.
#include "check_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace moe::kernel_checks {

// ---- verdicts -------------------------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const Verdict& v) {
  os << v.name << ": " << v.failed << " of " << v.checked << " failed";
  if (!v.detail.empty()) os << "; " << v.detail;
  return os;
}

bool all_ok(const std::vector<Verdict>& vs, std::string* message) {
  std::ostringstream os;
  bool ok = true;
  for (const auto& v : vs) {
    if (v.ok()) continue;
    ok = false;
    os << v << "\n";
  }
  if (message) *message = os.str();
  return ok;
}

std::string failures(const std::vector<Verdict>& vs) {
  std::string m;
  all_ok(vs, &m);
  return m;
}

const Verdict& find(const std::vector<Verdict>& vs, const std::string& name) {
  for (const auto& v : vs) {
    if (v.name == name) return v;
  }
  throw std::runtime_error("no verdict named " + name);
}

torch::Tensor ulp(const torch::Tensor& m, torch::ScalarType dtype) {
  int mantissa = 23, min_exp = -126;  // explicit mantissa bits, smallest normal exponent
  if (dtype == torch::kBFloat16) mantissa = 7;
  if (dtype == torch::kHalf) mantissa = 10, min_exp = -14;
  if (dtype == torch::kDouble) mantissa = 52, min_exp = -1022;
  auto a = m.to(torch::kDouble).abs();
  auto [frac, exp] = torch::frexp(a);  // a = frac * 2^exp, frac in [0.5, 1)
  auto e = (exp.to(torch::kDouble) - 1).clamp_min(min_exp);
  e = torch::where(a == 0, torch::full_like(e, min_exp), e);
  return torch::pow(2.0, e - mantissa);
}

namespace {

std::string describe_at(const torch::Tensor& shape_of, int64_t flat) {
  std::ostringstream os;
  os << "[";
  int64_t rest = flat;
  std::vector<int64_t> idx(static_cast<size_t>(shape_of.dim()));
  for (int64_t i = shape_of.dim() - 1; i >= 0; --i) {
    idx[static_cast<size_t>(i)] = rest % shape_of.size(i);
    rest /= shape_of.size(i);
  }
  for (size_t i = 0; i < idx.size(); ++i) os << (i ? ", " : "") << idx[i];
  os << "]";
  return os.str();
}

}  // namespace

Verdict shape_mismatch(const std::string& name, const torch::Tensor& got,
                       const torch::Tensor& want) {
  Verdict v{name, 1, 1, ""};
  std::ostringstream os;
  if (!got.defined()) {
    os << "no output";
  } else {
    os << "shape " << got.sizes() << ", expected " << want.sizes();
  }
  v.detail = os.str();
  return v;
}

Verdict exact(const std::string& name, const torch::Tensor& got, const torch::Tensor& want) {
  if (!got.defined() || got.sizes() != want.sizes()) return shape_mismatch(name, got, want);
  Verdict v{name, want.numel(), 0, ""};
  auto g = got.to(want.device(), want.scalar_type());
  auto bad = (g != want).reshape(-1);
  v.failed = bad.sum().item<int64_t>();
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os << "first at " << describe_at(want, i) << ": got " << g.reshape(-1)[i].item<double>()
       << ", expected " << want.reshape(-1)[i].item<double>();
    v.detail = os.str();
  }
  return v;
}

Verdict within(const std::string& name, const torch::Tensor& got, const torch::Tensor& ref,
               const torch::Tensor& tol) {
  if (!got.defined() || got.sizes() != ref.sizes()) return shape_mismatch(name, got, ref);
  Verdict v{name, ref.numel(), 0, ""};
  auto g = got.to(ref.device(), torch::kDouble);
  auto diff = (g - ref).abs();
  if (ref.numel() > 0) {
    auto ulps = (tol / ulp(ref, got.scalar_type())).reshape(-1);
    v.tightest = ulps.argmin().item<int64_t>();
    v.tightest_ulps = ulps[v.tightest].item<double>();
  }
  auto bad = (~(diff <= tol)).reshape(-1);  // NaN compares false: fails
  v.failed = bad.sum().item<int64_t>();
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os.precision(9);
    os << "first at " << describe_at(ref, i) << ": got " << g.reshape(-1)[i].item<double>()
       << ", reference " << ref.reshape(-1)[i].item<double>() << ", |diff| "
       << diff.reshape(-1)[i].item<double>() << " > tolerance "
       << tol.reshape(-1)[i].item<double>();
    v.detail = os.str();
  }
  return v;
}

// ---- mismatch reports -----------------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const Mismatch& m) {
  os << m.name << ": " << m.differ << " of " << m.checked << " differ";
  if (m.differ > 0) os << ", by at most " << m.max_ulps << " ulp";
  return os;
}

Mismatch mismatch(const std::string& name, const torch::Tensor& got, const torch::Tensor& want) {
  Mismatch m{name, 0, want.numel(), 0};
  if (!got.defined() || got.sizes() != want.sizes()) {
    m.differ = want.numel();
    m.max_ulps = std::numeric_limits<double>::infinity();
    return m;
  }
  const auto g = got.to(want.device(), torch::kDouble), w = want.to(torch::kDouble);
  const auto bad = (g != w).reshape(-1);  // NaN != anything
  m.differ = bad.sum().item<int64_t>();
  if (m.differ > 0) {
    const auto ulps = ((g - w).abs() / ulp(w, got.scalar_type())).reshape(-1);
    m.max_ulps = torch::where(ulps.isnan(), std::numeric_limits<double>::infinity(), ulps)
                     .masked_select(bad)
                     .max()
                     .item<double>();
  }
  return m;
}

void report(const Mismatch& m) {
  std::ostringstream ulps;
  ulps << m.max_ulps;  // 6 significant digits
  ::testing::Test::RecordProperty(m.name + "_differ", std::to_string(m.differ));
  ::testing::Test::RecordProperty(m.name + "_max_ulps", ulps.str());
  std::cout << "[ mismatch ] " << m << std::endl;
}

// ---- grids ----------------------------------------------------------------------------------

namespace {
const char* dtype_name(torch::ScalarType t) {
  return t == torch::kFloat ? "fp32" : t == torch::kHalf ? "fp16" : "bf16";
}
}  // namespace

std::vector<PermuteCase> permute_cases() {
  std::vector<PermuteCase> v;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const PlanCase& p : plan_cases()) v.push_back({dt, p.tokens, p.experts, p.k});
  }
  return v;
}

std::vector<PermuteCase> permute_shape_cases() {
  std::vector<PermuteCase> v;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t d : {1, 3, 8, 72, 200, 1000, 2056}) {
      for (int64_t k = 1; k <= 10; ++k) v.push_back({dt, 33, 16, k, d});
    }
  }
  return v;
}

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> v;
  for (int64_t t : {1, 7, 4096, 65537}) {
    for (int64_t e : {1, 8, 64, 256}) {
      for (int64_t k : {1, 2, 8}) {
        if (k <= e) v.push_back({t, e, k});
      }
    }
  }
  return v;
}

std::vector<RouterCase> router_cases() {
  std::vector<RouterCase> v;
  for (const PermuteCase& p : permute_cases()) {
    v.push_back({p.dtype, p.tokens, p.experts, p.k, false, false});
    if (p.dtype == torch::kFloat) {  // score function and bias: once per shape
      v.push_back({p.dtype, p.tokens, p.experts, p.k, true, false});
      v.push_back({p.dtype, p.tokens, p.experts, p.k, false, true});
    }
  }
  return v;
}

std::string case_name(const PermuteCase& c) {
  return std::string(dtype_name(c.dtype)) + "_" + case_name(PlanCase{c.tokens, c.experts, c.k}) +
         (c.d != 64 ? "_d" + std::to_string(c.d) : "");
}

std::string case_name(const PlanCase& c) {
  return "T" + std::to_string(c.tokens) + "_E" + std::to_string(c.experts) + "_k" +
         std::to_string(c.k);
}

std::string case_name(const RouterCase& c) {
  return case_name(PermuteCase{c.dtype, c.tokens, c.experts, c.k}) + (c.sigmoid ? "_sigmoid" : "") +
         (c.bias ? "_bias" : "");
}

// ---- mutation tests -------------------------------------------------------------------------

torch::Tensor nudged(const torch::Tensor& t, int64_t i, double ulps) {
  auto m = t.clone();
  auto flat = m.view({-1});
  const double v = flat[i].item<double>();
  const double step = ulp(torch::tensor({v}, torch::kDouble), t.scalar_type())[0].item<double>();
  flat[i] = v + ulps * step;
  return m;
}

void expect_fails_only(const std::vector<Verdict>& vs, const std::string& name) {
  for (const auto& v : vs) {
    if (v.name == name) {
      EXPECT_FALSE(v.ok()) << name << " did not catch the mutation";
    } else {
      EXPECT_TRUE(v.ok()) << v;
    }
  }
}

}  // namespace moe::kernel_checks
