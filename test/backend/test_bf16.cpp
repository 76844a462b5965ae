// bf16 mixed precision on the CPU (backend/bf16.hpp, CpuOptions::bf16):
// rounding to bfloat16 as PyTorch rounds; products within their stated
// bound of float32's on the same inputs, and exact sums of the rounded
// operands; a Decoder's logits and gradients near float32's; training that
// follows float32's losses. Without AVX512-BF16 (or oneDNN) the products
// refuse, naming why, and the rest is skipped with a message.
#define BOOST_TEST_MODULE bf16
#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/trainer.hpp"

using namespace xfmr;

namespace {
std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * float(rng.normal());
  return v;
}
// The products' cases run where bf16 products can (skipped otherwise, with the reason).
struct Bf16Here {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(bf16::available());
    r.message() << "bf16 products unavailable: " << bf16::unavailable_reason();
    return r;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(rounding_is_to_nearest_with_ties_to_even) {
  BOOST_TEST(bf16::round(1.0f) == 1.0f);
  BOOST_TEST(bf16::round(1.0f + 0x1p-8f) == 1.0f);                   // a tie: to the even 1.0
  BOOST_TEST(bf16::round(1.0f + 0x1p-7f + 0x1p-8f) == 1.0f + 0x1p-6f);  // a tie: to the even above
  BOOST_TEST(bf16::round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // past the tie: up
  BOOST_TEST(bf16::round(-3.0f) == -3.0f);
  BOOST_TEST(bf16::from_float(1.0f) == 0x3f80);
  BOOST_TEST(std::isinf(bf16::round(std::numeric_limits<float>::max())));  // past bf16's largest
  BOOST_TEST(std::isnan(bf16::round(std::numeric_limits<float>::quiet_NaN())));
  BOOST_TEST(std::isinf(bf16::round(std::numeric_limits<float>::infinity())));
  // Within 2^-8 of the value, relative (8 significant bits), and that close
  // to it: the largest of 1000 normal draws moves by more than 2^-9.
  double worst = 0;
  for (float x : randn(1000, 1)) worst = std::max(worst, double(std::abs(bf16::round(x) - x)) / std::abs(x));
  BOOST_TEST(worst <= 0x1p-8);
  BOOST_TEST(worst > 0x1p-9);
}

BOOST_AUTO_TEST_CASE(products_refuse_naming_why_where_they_cannot_run) {
  if (bf16::available()) {
    BOOST_TEST(bf16::unavailable_reason().empty());
    return;
  }
  BOOST_TEST_MESSAGE("bf16 products unavailable here: " << bf16::unavailable_reason());
  float a = 1, b = 1, c = 0;
  BOOST_CHECK_EXCEPTION(bf16::gemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1), Error, [](const Error& e) {
    return std::string(e.what()).find("bf16 products: ") == 0;
  });
  BOOST_CHECK_THROW(CpuBackend<float>({.bf16 = true}), Error);
}

// Every transpose, leading dimensions wider than the matrices, alpha and
// beta: against the float32 product of the same inputs, within (2^-7 +
// 2^-16) sum |a b| plus float32's summation error; and against the sums of
// the rounded operands in double, to float32's summation error alone.
BOOST_AUTO_TEST_CASE(products_are_within_their_bound_of_float32, *boost::unit_test::precondition(Bf16Here())) {
  for (auto [M, N, K] : {std::array{5, 4, 3}, {70, 40, 30}, {300, 260, 220}, {1, 37, 29}})
    for (auto [alpha, beta] : {std::array{0.7f, -1.3f}, {1.0f, 0.0f}, {1.0f, 1.0f}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          BOOST_TEST_CONTEXT("M " << M << ", N " << N << ", K " << K << ", ta " << ta << ", tb " << tb << ", alpha "
                                  << alpha << ", beta " << beta) {
            const int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 1;
            const auto A = randn(std::size_t(ta ? K : M) * lda, 2), B = randn(std::size_t(tb ? N : K) * ldb, 3);
            const auto C0 = randn(std::size_t(M) * ldc, 4);
            std::vector<float> C = C0;
            bf16::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
            auto a = [&](int m, int k) { return A[ta ? std::size_t(k) * lda + m : std::size_t(m) * lda + k]; };
            auto b = [&](int k, int n) { return B[tb ? std::size_t(n) * ldb + k : std::size_t(k) * ldb + n]; };
            double worst = 0, worst_rounded = 0;  // of the errors over their bounds
            for (int m = 0; m < M; ++m)
              for (int n = 0; n < N; ++n) {
                double exact = 0, rounded = 0, size = 0;
                for (int k = 0; k < K; ++k) {
                  exact += double(a(m, k)) * b(k, n);
                  rounded += double(bf16::round(a(m, k))) * bf16::round(b(k, n));
                  size += std::abs(double(a(m, k)) * b(k, n));
                }
                const double c0 = C0[std::size_t(m) * ldc + n], got = C[std::size_t(m) * ldc + n];
                const double summing = (K + 2) * 0x1p-24 * (std::abs(alpha) * size * 1.01 + std::abs(beta * c0));
                const double to_rounded = std::abs(got - (alpha * rounded + beta * c0));
                const double to_exact = std::abs(got - (alpha * exact + beta * c0));
                worst_rounded = std::max(worst_rounded, to_rounded / summing);
                const double bound = (0x1p-7 + 0x1p-16) * std::abs(alpha) * size + summing;
                worst = std::max(worst, to_exact / bound);
              }
            BOOST_TEST(worst_rounded <= 1.0);  // the rounded operands' products, summed in float32
            BOOST_TEST(worst <= 1.0);          // within the bound of float32's on the unrounded ones
            // The padding between rows is left alone.
            for (int m = 0; m < M; ++m) BOOST_TEST(C[std::size_t(m) * ldc + N] == C0[std::size_t(m) * ldc + N]);
          }
        }
}

namespace {
struct Small {
  static constexpr int MAX_T = 16, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 2, D_FF = 256;
  using Norm = PreNorm;
  using Activation = Gelu;
};
using Cpu = CpuBackend<float>;
using Model = Decoder<Small, Cpu>;
constexpr int kVocab = 40, kBatch = 8;

void batch(int step, std::vector<std::int32_t>& ids, std::vector<std::int32_t>& targets) {
  Rng rng(500 + std::uint64_t(step));
  ids.resize(std::size_t(kBatch) * Small::MAX_T);
  targets.resize(ids.size());
  for (auto& i : ids) i = std::int32_t(rng.below(kVocab));
  for (std::size_t i = 0; i < ids.size(); ++i) targets[i] = (ids[i] * 7 + 3) % kVocab;
}

double largest(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, double(std::abs(v)));
  return m;
}
double largest_difference(const std::vector<float>& x, const std::vector<float>& y) {
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(double(x[i]) - y[i]));
  return m;
}
}  // namespace

// A model's forward and backward in bf16 against float32 on the same
// weights. Each product moves by at most 2^-8 of the sum of its terms'
// sizes; through the model's products and normalisations the logits and
// gradients move by a few times 2^-8 of their scale (measured about 0.5%):
// the bound, 2^-8 x 4, at 4x what was measured.
BOOST_AUTO_TEST_CASE(a_models_logits_and_gradients_are_near_float32s, *boost::unit_test::precondition(Bf16Here())) {
  Cpu fp32, bf({.bf16 = true});
  Model a(kVocab, 9), b(kVocab, 9);
  std::vector<std::int32_t> ids, targets;
  batch(0, ids, targets);
  auto run = [&](Model& m, Cpu& be) {
    zero_grad(m);
    const auto logits = m.forward(be, ids, Shape{kBatch, Small::MAX_T});
    std::vector<float> out(logits.begin(), logits.end());
    CrossEntropyLoss<Cpu> ce;
    std::vector<float> dlogits(logits.size());
    ce.forward(be, logits, targets, kVocab);
    ce.backward(be, dlogits, 1.0);
    m.backward(be, std::span<const float>(dlogits));
    std::vector<float> grads;
    m.visit([&](std::string_view, auto&, auto& g) { grads.insert(grads.end(), g.begin(), g.end()); });
    return std::pair(out, grads);
  };
  const auto [l32, g32] = run(a, fp32);
  const auto [l16, g16] = run(b, bf);
  const double tol = 4 * 0x1p-8;
  BOOST_TEST_MESSAGE("logits differ by " << largest_difference(l32, l16) / largest(l32) << " of their scale, gradients by "
                                         << largest_difference(g32, g16) / largest(g32));
  BOOST_TEST(largest_difference(l32, l16) <= tol * largest(l32));
  BOOST_TEST(largest_difference(g32, g16) <= tol * largest(g32));
  BOOST_TEST(largest_difference(l32, l16) > 0.0);  // the products did run in bf16
}

// Training follows float32's: 60 AdamW steps, every loss within 1% of
// float32's, and the run repeats bit for bit.
BOOST_AUTO_TEST_CASE(training_follows_float32_and_repeats, *boost::unit_test::precondition(Bf16Here())) {
  auto train = [](CpuOptions options, int shards) {
    Cpu be(options);
    Model model(kVocab, 4);
    AdamW<Cpu> opt(model);
    Trainer<Model, Cpu> trainer(model, be, opt, {.clip = 1.0, .schedule = LrSchedule{.lr = 3e-3}, .shards = shards},
                                [] { return std::make_unique<Model>(kVocab, 4); });
    std::vector<std::int32_t> ids, targets;
    std::vector<double> losses;
    for (int s = 0; s < 60; ++s) {
      batch(s, ids, targets);
      losses.push_back(trainer
                           .step([&](int) { return BatchTargets{kBatch, targets}; },
                                 [&](const Shard& sh, Model& m, Cpu& b) {
                                   return m.forward(b, std::span(ids).subspan(std::size_t(sh.begin) * Small::MAX_T,
                                                                              std::size_t(sh.size()) * Small::MAX_T),
                                                    Shape{sh.size(), Small::MAX_T});
                                 })
                           .loss);
    }
    return losses;
  };
  const auto fp32 = train({}, 1), bf = train({.bf16 = true}, 1);
  for (std::size_t s = 0; s < fp32.size(); ++s)
    BOOST_TEST(std::abs(bf[s] - fp32[s]) <= 0.01 * fp32[s], "step " << s + 1 << ": " << bf[s] << " vs " << fp32[s]);
  BOOST_TEST(bf.back() < 0.5 * bf.front());  // it learned
  BOOST_TEST(train({.bf16 = true}, 1) == bf, boost::test_tools::per_element());
  // Replicas multiply in bf16 too: two shards follow one.
  const auto two = train({.bf16 = true}, 2);
  for (std::size_t s = 0; s < bf.size(); ++s) BOOST_TEST(std::abs(two[s] - bf[s]) <= 1e-3 * bf[s]);
}
