// bf16 mixed precision on the CPU (backend/bf16.hpp, CpuOptions::bf16):
// rounding to bfloat16 as PyTorch rounds; products within their stated
// bound of float32's on the same inputs, and exact sums of the rounded
// operands; a Decoder's logits and gradients near float32's; training that
// follows float32's losses; bf16 weight copies for decoding. Without AVX512-BF16 (or oneDNN) the products
// refuse, naming why, and the rest is skipped with a message.
#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support/random.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/train/trainer.hpp"

BOOST_AUTO_TEST_SUITE(test_bf16)

using namespace xfmr;

namespace {
using xfmr::test::randn;  // support/random.hpp
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

// Under ONEDNN_MAX_CPU_ISA=AVX2 (the ctest test_bf16@sgemm), oneDNN sees no
// AVX512-BF16, so every case of this suite runs the float32 products of the
// rounded operands; on a processor without AVX512-BF16 they always do.
BOOST_AUTO_TEST_CASE(products_run_natively_only_with_avx512_bf16) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && std::string(cap) == "AVX2") BOOST_TEST(!bf16::native());
  BOOST_TEST_MESSAGE("bf16 products " << (bf16::native() ? "on AVX512-BF16" : "as float32 products of the rounded operands"));
}

// Every transpose, leading dimensions wider than the matrices, alpha and
// beta: against the float32 product of the same inputs, within (2^-7 +
// 2^-16) sum |a b| plus float32's summation error; and against the sums of
// the rounded operands in double, to float32's summation error alone.
BOOST_AUTO_TEST_CASE(products_are_within_their_bound_of_float32, *boost::unit_test::precondition(Bf16Here())) {
  // The last three shapes' A, then B (more than 2^23 values each), are
  // rounded and multiplied a block at a time: of A's rows (279, then 21);
  // where the products are not native, of B's rows, summed, then of its
  // columns (27962, then 2038, each). Either orientation of the operand
  // split, B from floats and from its bits.
  for (auto [M, N, K] : {std::array{5, 4, 3}, {70, 40, 30}, {150, 130, 110}, {1, 37, 29}, {300, 4, 30000},
                         {3, 300, 30000}, {2, 30000, 300}})
    for (auto [alpha, beta] : {std::array{0.7f, -1.3f}, {1.0f, 0.0f}, {1.0f, 1.0f}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const bool large = long(std::max(M, N)) * K > (1L << 23);
          if (large && (beta == 0.0f || beta == 1.0f || (M > N ? !tb : ta))) continue;
          BOOST_TEST_CONTEXT("M " << M << ", N " << N << ", K " << K << ", ta " << ta << ", tb " << tb << ", alpha "
                                  << alpha << ", beta " << beta) {
            const int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 1;
            const auto A = randn(std::size_t(ta ? K : M) * lda, 2), B = randn(std::size_t(tb ? N : K) * ldb, 3);
            const auto C0 = randn(std::size_t(M) * ldc, 4);
            std::vector<float> C = C0;
            bf16::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
            if (large) {  // B given as its bits (a bf16 weight copy): the same product
              std::vector<std::uint16_t> bits(B.size());
              for (std::size_t i = 0; i < B.size(); ++i) bits[i] = bf16::from_float(B[i]);
              std::vector<float> from_bits = C0;
              bf16::gemm(ta, tb, M, N, K, alpha, A.data(), lda, nullptr, ldb, beta, from_bits.data(), ldc, bits.data());
              BOOST_TEST(from_bits == C);
            }
            // A and B, and their rounded values, by (m, k) and (k, n), k fastest.
            std::vector<float> a_(std::size_t(M) * K), b_(std::size_t(N) * K), ar(a_.size()), br(b_.size());
            for (int m = 0; m < M; ++m)
              for (int k = 0; k < K; ++k)
                ar[std::size_t(m) * K + k] =
                    bf16::round(a_[std::size_t(m) * K + k] = A[ta ? std::size_t(k) * lda + m : std::size_t(m) * lda + k]);
            for (int n = 0; n < N; ++n)
              for (int k = 0; k < K; ++k)
                br[std::size_t(n) * K + k] =
                    bf16::round(b_[std::size_t(n) * K + k] = B[tb ? std::size_t(n) * ldb + k : std::size_t(k) * ldb + n]);
            double worst = 0, worst_rounded = 0;  // of the errors over their bounds
            for (int m = 0; m < M; ++m)
              for (int n = 0; n < N; ++n) {
                double exact = 0, rounded = 0, size = 0;
                const float *a = &a_[std::size_t(m) * K], *b = &b_[std::size_t(n) * K];
                const float *a_r = &ar[std::size_t(m) * K], *b_r = &br[std::size_t(n) * K];
                for (int k = 0; k < K; ++k) {
                  exact += double(a[k]) * b[k];
                  rounded += double(a_r[k]) * b_r[k];
                  size += std::abs(double(a[k]) * b[k]);
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
using Lm = Decoder<Small, Cpu>;
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
  Lm a(kVocab, 9), b(kVocab, 9);
  std::vector<std::int32_t> ids, targets;
  batch(0, ids, targets);
  auto run = [&](Lm& m, Cpu& be) {
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
    Lm model(kVocab, 4);
    AdamW<Cpu> opt(model);
    Trainer<Lm, Cpu> trainer(model, be, opt, {.clip = 1.0, .schedule = LrSchedule{.lr = 3e-3}, .split = {.shards = shards}},
                                [] { return std::make_unique<Lm>(kVocab, 4); });
    std::vector<std::int32_t> ids, targets;
    std::vector<double> losses;
    for (int s = 0; s < 60; ++s) {
      batch(s, ids, targets);
      losses.push_back(trainer
                           .step([&](int) { return BatchTargets{kBatch, targets}; },
                                 [&](const Shard& sh, Lm& m, Cpu& b) {
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

// keep_weight_copy: a product whose B is a kept matrix reads the copy, made
// at the first such product. With
// more than one row, the bits of the product rounding B itself; one row
// times the matrix (a decoding step's y = W x) the rounded operands' sums
// to float32's summation error. The float32 matrix is not read while kept
// (changed under the copy, the products stay), and is again once dropped;
// a product over more rows than were kept does not read past the copy.
BOOST_AUTO_TEST_CASE(weight_copies_serve_the_products_that_read_them, *boost::unit_test::precondition(Bf16Here())) {
  const int N = 70, K = 33;
  std::vector<float> W = randn(std::size_t(N) * K, 5);
  const std::vector<float> W0 = W, x = randn(std::size_t(5) * K, 6), dy = randn(std::size_t(5) * N, 7);
  Cpu be({.bf16 = true});
  auto forward = [&](int M) {  // (M, N) = x W^T
    std::vector<float> y(std::size_t(M) * N);
    be.gemm(false, true, M, N, K, 1.0f, x.data(), K, W.data(), K, 0.0f, y.data(), N);
    return y;
  };
  auto backward = [&] {  // (5, K) = dy W
    std::vector<float> dx(std::size_t(5) * K);
    be.gemm(false, false, 5, K, N, 1.0f, dy.data(), N, W.data(), K, 0.0f, dx.data(), K);
    return dx;
  };
  const auto rows = forward(5), grads = backward(), row = forward(1);
  be.keep_weight_copy(W.data(), N, K);
  BOOST_TEST(be.weight_copy_bytes() == 0u);  // made at the first product that reads it
  BOOST_TEST(forward(5) == rows, boost::test_tools::per_element());
  BOOST_TEST(be.weight_copy_bytes() == std::size_t(N) * K * 2);
  BOOST_TEST(backward() == grads, boost::test_tools::per_element());
  const auto kept_row = forward(1);
  for (int n = 0; n < N; ++n) {
    double rounded = 0, size = 0;
    for (int k = 0; k < K; ++k) {
      rounded += double(bf16::round(x[std::size_t(k)])) * bf16::round(W[std::size_t(n) * K + k]);
      size += std::abs(double(x[std::size_t(k)]) * W[std::size_t(n) * K + k]);
    }
    BOOST_TEST(std::abs(kept_row[std::size_t(n)] - rounded) <= (K + 2) * 0x1p-24 * size * 1.01, "output " << n);
  }
  if (detail::cpu_kernels().gemv_rows_bf16)
    BOOST_TEST(largest_difference(kept_row, row) > 0.0);  // one row ran the copy's kernel, in its own order
  else
    BOOST_TEST(largest_difference(kept_row, row) == 0.0);  // the portable level: bf16::gemm on the copy's bits
  for (float& w : W) w = 2 * w + 1;  // under the copy: the products do not see it
  BOOST_TEST(forward(5) == rows, boost::test_tools::per_element());
  BOOST_TEST(forward(1) == kept_row, boost::test_tools::per_element());
  be.drop_weight_copies();
  BOOST_TEST(be.weight_copy_bytes() == 0u);
  BOOST_TEST(largest_difference(forward(5), rows) > 1.0);  // the float32 weights again
  // Kept over fewer rows than a product reads: that product rounds W itself.
  W = W0;
  be.keep_weight_copy(W.data(), 10, K);
  BOOST_TEST(forward(5) == rows, boost::test_tools::per_element());
  BOOST_TEST(forward(1) == row, boost::test_tools::per_element());
  be.drop_weight_copies();
  // A float32 backend keeps nothing.
  Cpu fp32;
  fp32.keep_weight_copy(W.data(), N, K);
  BOOST_TEST(fp32.weight_copy_bytes() == 0u);
}

// Decoding in a WeightCopies scope (tied head: the embedding's copy
// serves it): every weight matrix read from its copy (changing the float32
// ones the tokens never look up changes nothing), the logits those of bf16
// products, within the model bound of float32's, and the copies gone with
// the scope.
BOOST_AUTO_TEST_CASE(decoding_reads_the_bf16_weight_copies_of_its_scope, *boost::unit_test::precondition(Bf16Here())) {
  Cpu be({.bf16 = true}), fp32;
  Lm model(kVocab, 11, {.tie_weights = true});
  model.set_training(false);
  const std::vector<std::int32_t> prompt = {1, 2, 3, 1}, next = {2};
  auto decode = [&](Cpu& b) {
    DecodingCache<Cpu> cache;
    model.start_cache(cache, 1);
    std::vector<float> out;
    for (auto ids : {std::span(prompt), std::span(next)}) {
      const auto logits = model.forward_cached(b, ids, 1, cache);
      out.insert(out.end(), logits.begin(), logits.end());
    }
    return out;
  };
  const auto reference = decode(fp32), plain = decode(be);
  std::size_t matrices = 0;
  model.visit([&](std::string_view name, auto& value, auto&) {  // those the products read (not the positions')
    matrices += value.shape().size() == 2 && !name.starts_with("pos_emb") ? value.size() : 0;
  });
  {
    const WeightCopies copies(be, model);
    BOOST_TEST(be.weight_copy_bytes() == 0u);  // each made at the first product that reads it
    const auto kept = decode(be);
    BOOST_TEST(be.weight_copy_bytes() == 2 * matrices);
    BOOST_TEST(largest_difference(kept, plain) <= 1e-5 * largest(plain));  // another order of float32 sums
    BOOST_TEST(largest_difference(kept, reference) <= 4 * 0x1p-8 * largest(reference));
    model.visit([&](std::string_view name, auto& value, auto&) {
      if (value.shape().size() != 2 || name.starts_with("pos_emb")) return;
      // Token rows 4 on (never looked up; the head reads them all) and every other matrix.
      const std::size_t from = name.starts_with("tok_emb") ? std::size_t(4) * value.dim(1) : 0;
      for (std::size_t i = from; i < value.size(); ++i) value.data()[i] = -3 * value.data()[i];
    });
    BOOST_TEST(decode(be) == kept, boost::test_tools::per_element());
  }
  BOOST_TEST(be.weight_copy_bytes() == 0u);
  BOOST_TEST(largest_difference(decode(be), plain) > 0.1 * largest(plain));  // the changed float32 weights
}

namespace {
// Post-norm, sinusoidal positions; GELU, as Small: at ReLU's kink a
// pre-activation that rounds across zero flips its derivative between 0 and
// 1, so under ReLU no elementwise bound holds for the gradients of any
// change of precision (measured: 5% of their scale here).
struct SmallPost : Small {
  using Norm = PostNorm;
  using Positions = Sinusoidal;
};

std::vector<float> gradients_of(auto& layer) {
  std::vector<float> g;
  layer.visit([&](std::string_view, auto&, auto& grad) { g.insert(g.end(), grad.begin(), grad.end()); });
  return g;
}

// run(be, layer) does a forward and a backward pass and returns what they
// give (outputs, input gradients); the layer's parameter gradients are
// compared too. Layers a and b are built alike (one seed), so hold the same
// weights; each of their results in bf16 is within the model bound of
// float32's, 2^-8 x 4 of its scale (see above).
template <class Layer, class Run>
void near_float32(const std::string& what, Layer& a, Layer& b, Run run) {
  Cpu fp32, bf({.bf16 = true});
  const std::vector<std::vector<float>> r32 = run(fp32, a), r16 = run(bf, b);
  const std::vector<float> g32 = gradients_of(a), g16 = gradients_of(b);
  const double tol = 4 * 0x1p-8;
  BOOST_TEST_MESSAGE(what << ": output differs by " << largest_difference(r32.front(), r16.front()) / largest(r32.front())
                          << " of its scale, parameter gradients by " << largest_difference(g32, g16) / largest(g32));
  for (std::size_t i = 0; i < r32.size(); ++i)
    BOOST_TEST(largest_difference(r32[i], r16[i]) <= tol * largest(r32[i]), what << ", result " << i << ": " << largest_difference(r32[i], r16[i]) / largest(r32[i]));
  BOOST_TEST(largest_difference(g32, g16) <= tol * largest(g32), what << ", parameter gradients: " << largest_difference(g32, g16) / largest(g32));
  BOOST_TEST(largest_difference(r32.front(), r16.front()) > 0.0, what << " ran in bf16");
}
}  // namespace

BOOST_AUTO_TEST_CASE(every_layer_block_and_model_is_near_float32, *boost::unit_test::precondition(Bf16Here())) {
  constexpr int D = Small::D_MODEL;
  const Shape bt{3, 10}, src{3, 12};
  std::vector<std::uint8_t> pad(std::size_t(bt.rows()), 0), src_pad(std::size_t(src.rows()), 0);
  for (int t = 7; t < 10; ++t) pad[std::size_t(20 + t)] = 1;
  for (int t = 8; t < 12; ++t) src_pad[std::size_t(12 + t)] = 1;
  const auto x = randn(std::size_t(bt.rows()) * D, 20), up = randn(x.size(), 21);
  const auto mem = randn(std::size_t(src.rows()) * D, 22);
  // One forward and backward of a rows x D -> rows x D layer: (y, dx).
  auto rows_layer = [&](auto forward) {
    return [&, forward](Cpu& be, auto& l) {
      std::vector<float> y(x.size()), dx(x.size());
      forward(be, l, Rows<float, D>(y.data(), bt.rows()));
      l.backward(be, ConstRows<float, D>(up.data(), bt.rows()), Rows<float, D>(dx.data(), bt.rows()));
      return std::vector{y, dx};
    };
  };
  const ConstRows<float, D> in(x.data(), bt.rows());
  {
    Rng r1(3), r2(3);
    Linear<D, D, Cpu> a(r1), b(r2);
    near_float32("Linear", a, b, rows_layer([&](Cpu& be, auto& l, Rows<float, D> y) { l.forward(be, in, y); }));
  }
  {
    Rng r1(4), r2(4);
    FeedForward<Small, Cpu> a(r1), b(r2);
    near_float32("FeedForward", a, b, rows_layer([&](Cpu& be, auto& l, Rows<float, D> y) { l.forward(be, in, y); }));
  }
  {
    Rng r1(5), r2(5);
    SelfAttention<Small, Cpu> a(r1), b(r2);
    near_float32("SelfAttention (causal, padded)", a, b, rows_layer([&](Cpu& be, auto& l, Rows<float, D> y) {
                   l.forward(be, in, y, bt, AttentionMask{true, pad.data()});
                 }));
  }
  {
    Rng r1(6), r2(6);
    SelfAttentionBlock<SmallPost, Cpu, false> a(r1), b(r2);
    near_float32("encoder block (post-norm)", a, b,
                 rows_layer([&](Cpu& be, auto& l, Rows<float, D> y) { l.forward(be, in, y, bt, pad.data()); }));
  }
  {
    Rng r1(7), r2(7);
    DecoderBlock<Small, Cpu> a(r1), b(r2);
    near_float32("DecoderBlock (cross-attention)", a, b, [&](Cpu& be, auto& l) {
      std::vector<float> y(x.size()), dx(x.size()), dmem(mem.size());
      l.forward(be, in, ConstRows<float, D>(mem.data(), src.rows()), Rows<float, D>(y.data(), bt.rows()), bt, src,
                pad.data(), src_pad.data());
      l.backward(be, ConstRows<float, D>(up.data(), bt.rows()), Rows<float, D>(dx.data(), bt.rows()),
                 Rows<float, D>(dmem.data(), src.rows()));
      return std::vector{y, dx, dmem};
    });
  }
  Rng ids_rng(23);
  std::vector<std::int32_t> ids(std::size_t(src.rows())), tgt(std::size_t(bt.rows()));
  for (auto& i : ids) i = std::int32_t(ids_rng.below(kVocab));
  for (auto& i : tgt) i = std::int32_t(ids_rng.below(kVocab));
  {
    Classifier<SmallPost, Cpu> a(kVocab, 3, 5), b(kVocab, 3, 5);
    near_float32("Classifier", a, b, [&](Cpu& be, auto& m) {
      const auto logits = m.forward(be, ids, src, src_pad.data());
      std::vector<float> out(logits.begin(), logits.end());
      m.backward(be, std::span<const float>(randn(out.size(), 24)));
      return std::vector<std::vector<float>>{out};
    });
  }
  {
    const Seq2SeqOptions opts{.tie_output = true, .share_embeddings = true};
    Seq2Seq<SmallPost, Small, Cpu> a(kVocab, kVocab, 11, opts), b(kVocab, kVocab, 11, opts);
    near_float32("Seq2Seq (shared, tied embeddings)", a, b, [&](Cpu& be, auto& m) {
      const auto logits = m.forward(be, ids, src, src_pad.data(), tgt, bt, pad.data());
      std::vector<float> out(logits.begin(), logits.end());
      m.backward(be, std::span<const float>(randn(out.size(), 25)));
      return std::vector<std::vector<float>>{out};
    });
  }
}

// Attention's own products: in bf16 where they are GEMMs (more than 64
// query rows, or dropout on), within the model bound of float32's; the
// row-by-row kernels of a few query rows (decoding) stay float32, bit for bit.
BOOST_AUTO_TEST_CASE(attention_products_run_in_bf16_beyond_the_row_kernels,
                     *boost::unit_test::precondition(Bf16Here())) {
  for (int T : {20, 80})
    for (float dropout : {0.0f, 0.2f}) {
      BOOST_TEST_CONTEXT("T " << T << ", dropout " << dropout) {
        const AttentionDims a{.B = 2, .H = 2, .Tq = T, .Tk = T, .QK_DIM = 32, .V_DIM = 32, .dropout = dropout,
                              .dropout_key = 7};
        const int ld = a.H * 32;
        const std::size_t n = std::size_t(a.B) * T * ld;
        const auto q = randn(n, 30), k = randn(n, 31), v = randn(n, 32), dy = randn(n, 33);
        std::vector<std::uint8_t> pad(std::size_t(a.B) * T, 0);
        for (int t = T - 3; t < T; ++t) pad[std::size_t(T + t)] = 1;
        const AttentionMask mask{true, pad.data()};
        auto run = [&](Cpu& be) {
          std::vector<float> y(n), probs(std::size_t(a.B) * a.H * T * T), dq(n), dk(n), dv(n);
          be.attention_forward(a, q.data(), ld, k.data(), ld, v.data(), ld, y.data(), ld, probs.data(), mask);
          be.attention_backward(a, dy.data(), ld, q.data(), ld, k.data(), ld, v.data(), ld, probs.data(), dq.data(),
                                dk.data(), dv.data());
          return std::vector{y, dq, dk, dv};
        };
        Cpu fp32, bf({.bf16 = true});
        const auto r32 = run(fp32), r16 = run(bf);
        const bool products = T > 64 || dropout > 0.0f;
        for (std::size_t i = 0; i < r32.size(); ++i) {
          BOOST_TEST(largest_difference(r32[i], r16[i]) <= 4 * 0x1p-8 * largest(r32[i]), "result " << i);
          if (products) BOOST_TEST(largest_difference(r32[i], r16[i]) > 0.0, "result " << i << " ran in bf16");
          else BOOST_TEST(r32[i] == r16[i], boost::test_tools::per_element());
        }
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()
