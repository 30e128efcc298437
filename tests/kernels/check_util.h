// What every kernel family's checks share: verdicts, the exact / within comparisons, ulps, the
// test grids, and the helpers of the mutation tests.
//
// Each kernel is checked against an oracle computed in double precision from the very inputs the
// kernel saw (the fp32/bf16/fp16 values, widened exactly), never against another rounded
// implementation. A tolerance is derived per element from the kernel's arithmetic (where it
// accumulates in fp32, where it rounds to the output dtype) and written next to the check in the
// family's checks file (permute_checks.cpp, router_checks.cpp, experts_checks.cpp). Indices,
// counts and permutations compare exactly.
//
// The same functions run on CUDA tensors (the *_gpu_test.cpp files, oracles computed on the
// device) and on CPU tensors (the *_emulation_test.cpp files, where a CPU emulation of each
// kernel's order of operations stands in for the kernel): the emulation passing shows the
// tolerances admit the kernel's arithmetic; the mutation cases there show each check can fail.
#pragma once

#include <torch/types.h>

#include <ostream>
#include <string>
#include <vector>

namespace moe::kernel_checks {

constexpr double kU32 = 0x1p-24;  // fp32 unit roundoff: |fl(x) - x| <= kU32 * |x|

// One comparison: how many elements were checked and failed, and the first failure in words.
struct Verdict {
  std::string name;
  int64_t checked = 0;
  int64_t failed = 0;
  std::string detail;  // first failing element (or the reason), empty when ok
  // within(): the element whose tolerance is the smallest in ulps of the output's dtype, and
  // that many ulps (mutation tests move it by 4 ulp and expect a failure).
  int64_t tightest = -1;
  double tightest_ulps = 0;
  bool ok() const { return failed == 0 && detail.empty(); }
};
std::ostream& operator<<(std::ostream& os, const Verdict& v);
// All ok; else a message listing every failed verdict (for EXPECT_TRUE(...) << message).
bool all_ok(const std::vector<Verdict>& vs, std::string* message);
// The message of all_ok: every failed verdict, one a line (empty when all are ok).
std::string failures(const std::vector<Verdict>& vs);
// The verdict called `name` (a test asserts that a mutation failed exactly that check).
const Verdict& find(const std::vector<Verdict>& vs, const std::string& name);

// ulp of `dtype` at the magnitudes |m| (double tensor of m's shape; subnormals included).
torch::Tensor ulp(const torch::Tensor& m, torch::ScalarType dtype);

// got == want element for element (same shape; NaN never equals).
Verdict exact(const std::string& name, const torch::Tensor& got, const torch::Tensor& want);
// |got - ref| <= tol element for element (ref, tol double; a NaN in got fails).
Verdict within(const std::string& name, const torch::Tensor& got, const torch::Tensor& ref,
               const torch::Tensor& tol);
// Where an output is compared bit for bit with another implementation's only as a report (the
// equality depends on how a compiler built one of them, e.g. ATen's CUDA kernels): how many
// elements differ and the largest difference in ulps of got's dtype at |want|; NaN in either
// counts as differing, by infinitely many ulps.
struct Mismatch {
  std::string name;
  int64_t differ = 0, checked = 0;
  double max_ulps = 0;
};
std::ostream& operator<<(std::ostream& os, const Mismatch& m);
Mismatch mismatch(const std::string& name, const torch::Tensor& got, const torch::Tensor& want);
// Records it in the test's XML report (properties NAME_differ and NAME_max_ulps) and prints it as
// one line "[ mismatch ] NAME: ...".
void report(const Mismatch& m);
// The failed verdict of an output that is missing or of the wrong shape.
Verdict shape_mismatch(const std::string& name, const torch::Tensor& got,
                       const torch::Tensor& want);

// ---- the grids ----------------------------------------------------------------------------
struct PermuteCase {
  torch::ScalarType dtype;
  int64_t tokens, experts, k;
  int64_t d = 64;  // hidden size of the rows permuted and combined
};
struct PlanCase {
  int64_t tokens, experts, k;
};
struct RouterCase {
  torch::ScalarType dtype;  // of the activations the fp32 logits come from (bf16 makes ties)
  int64_t tokens, experts, k;
  bool sigmoid, bias;
};
// dtype {fp32, bf16, fp16} x T {1, 7, 4096, 65537} x E {1, 8, 64, 256} x k {1, 2, 8}, k <= E.
std::vector<PermuteCase> permute_cases();
// The row kernels' launch shapes: dtype x d {1, 3, 8, 72, 200, 1000, 2056} (one element per
// thread or 16-byte packs, 1 to 32 lanes per token, partial last packs per lane) x k 1..10
// (every unrolled K, the runtime fallback, two chunks), T = 33, E = 16.
std::vector<PermuteCase> permute_shape_cases();
std::vector<PlanCase> plan_cases();
// The permute grid's shapes; fp32 also with sigmoid scores and with an expert bias.
std::vector<RouterCase> router_cases();
std::string case_name(const PermuteCase& c);
std::string case_name(const PlanCase& c);
std::string case_name(const RouterCase& c);

// ---- mutation tests (GoogleTest assertions) -----------------------------------------------
// Moves element `i` of `t` by `ulps` ulp of t's dtype (a copy).
torch::Tensor nudged(const torch::Tensor& t, int64_t i, double ulps);
// Expects the verdict called `name` to fail and every other verdict to pass.
void expect_fails_only(const std::vector<Verdict>& vs, const std::string& name);

}  // namespace moe::kernel_checks
