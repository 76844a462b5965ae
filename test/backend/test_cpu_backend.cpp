#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <span>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/gradcheck.hpp"
#include "xfmr/layers/losses.hpp"

BOOST_AUTO_TEST_SUITE(test_cpu_backend)

using namespace xfmr;
using namespace xfmr::test;
namespace tt = boost::test_tools;

// Shapes for each path: Eigen (small), BLAS split over C's rows between the
// threads (M >= N), split over its columns (N > M), BLAS whole (large); and
// single rows (decoding): Eigen's GEMV, direct when alpha = 1 and beta = 0,
// and BLAS's threaded GEMV from 2^16 weights. With libxsmm, the split shapes
// and any other whose (K, N) operand fits in 256 KiB (1100 x 64 x 240, past
// the split's 2^24 multiply-adds) go to its kernels when alpha is 1 and beta
// 0 or 1 (accumulation), to BLAS otherwise.
BOOST_AUTO_TEST_CASE(gemm_all_transpose_combinations_with_alpha_beta_and_strides) {
  Rng rng(1);
  Be be;
  const int pad = 2;  // leading dimensions wider than the matrices
  for (auto [M, N, K] : {std::array{5, 4, 3}, {70, 40, 30}, {20, 100, 40}, {300, 260, 220}, {1100, 64, 240}, {1, 37, 29}, {1, 300, 260}})
    for (auto [alpha, beta] : {std::pair{0.7, -1.3}, {1.0, 0.0}, {1.0, 1.0}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          BOOST_TEST_CONTEXT("M " << M << ", N " << N << ", K " << K << ", ta " << ta << ", tb " << tb << ", alpha "
                                  << alpha << ", beta " << beta) {
            const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
            const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
            const Vec A = random_vector(a_rows * lda, rng), B = random_vector(b_rows * ldb, rng);
            Vec C = random_vector(M * ldc, rng);
            const Vec C0 = C;
            be.gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
            // op(A) by rows and op(B) by columns, each k fastest.
            Vec a(std::size_t(M) * K), b(std::size_t(N) * K);
            for (int i = 0; i < M; ++i)
              for (int k = 0; k < K; ++k) a[std::size_t(i) * K + k] = ta ? A[k * lda + i] : A[i * lda + k];
            for (int j = 0; j < N; ++j)
              for (int k = 0; k < K; ++k) b[std::size_t(j) * K + k] = tb ? B[j * ldb + k] : B[k * ldb + j];
            double worst = 0;  // of each element's error over 1e-14 of its terms' sizes
            int padding_changed = 0;
            for (int i = 0; i < M; ++i) {
              for (int j = 0; j < N; ++j) {
                const double *ai = &a[std::size_t(i) * K], *bj = &b[std::size_t(j) * K];
                double s = 0, terms = 0;
                for (int k = 0; k < K; ++k) {
                  const double t = ai[k] * bj[k];
                  s += t;
                  terms += std::abs(t);
                }
                const double magnitude = std::abs(alpha) * terms + std::abs(beta * C0[i * ldc + j]);  // the error's scale
                worst = std::max(worst, std::abs(C[i * ldc + j] - (alpha * s + beta * C0[i * ldc + j])) /
                                            (1e-14 * magnitude));
              }
              for (int j = N; j < ldc; ++j) padding_changed += C[i * ldc + j] != C0[i * ldc + j];
            }
            BOOST_TEST(worst <= 1.0);
            BOOST_TEST(padding_changed == 0);  // the padding untouched
          }
        }
}

// run_step (backend.hpp): a backend without graph steps runs the step once,
// directly, and its errors pass through.
BOOST_AUTO_TEST_CASE(run_step_calls_the_step_once_without_graph_steps) {
  CpuBackend<float> be;
  int calls = 0;
  run_step(be, "train", [&] { ++calls; });
  BOOST_TEST(calls == 1);
  BOOST_CHECK_THROW(run_step(be, "train", [&] {
    ++calls;
    throw Error("bad batch");
  }), Error);
  BOOST_TEST(calls == 2);
}

BOOST_AUTO_TEST_CASE(gemm_with_zero_beta_ignores_nan_in_c) {
  Be be;
  const Vec A = {1, 2, 3, 4}, B = {1, 0, 0, 1};
  Vec C(4, std::nan(""));
  be.gemm(false, false, 2, 2, 2, 1.0, A.data(), 2, B.data(), 2, 0.0, C.data(), 2);
  BOOST_TEST(C == A, tt::per_element());
}

BOOST_AUTO_TEST_CASE(bias_add_and_bias_grad) {
  Be be;
  Vec y = {1, 2, 3, 4, 5, 6};
  const Vec b = {10, 20, 30};
  be.bias_add(2, 3, b.data(), y.data());
  BOOST_TEST(y == (Vec{11, 22, 33, 14, 25, 36}), tt::per_element());
  Vec db = {1, 1, 1};
  be.bias_grad(2, 3, y.data(), db.data());  // accumulates
  BOOST_TEST(db == (Vec{26, 48, 70}), tt::per_element());
}

// The fused products (cpu/linear.hpp's contract) against the formulas
// written out in double: y = x w^T + b, GELU's tanh form and its
// derivative, dh = gelu'(h) (dy w); without a bias too.
BOOST_AUTO_TEST_CASE(fused_products_match_their_formulas) {
  Be be;
  const int rows = 3, in = 4, out = 5;
  Rng rng(9);
  const Vec x = random_vector(rows * in, rng), w = random_vector(out * in, rng), bias = random_vector(out, rng),
            dy = random_vector(rows * out, rng), h_in = random_vector(rows * in, rng, 3.0);
  auto gelu = [](double v) { return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); };
  auto gelu_grad = [](double v) {
    const double t = std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
  };
  for (bool with_bias : {true, false}) {
    Vec y(rows * out), h(rows * out), a(rows * out), dh(rows * in);
    const double* b = with_bias ? bias.data() : nullptr;
    be.linear_forward(rows, in, out, x.data(), w.data(), b, y.data());
    be.linear_gelu_forward(rows, in, out, x.data(), w.data(), b, h.data(), a.data());
    be.linear_dgelu_input_grad(rows, in, out, dy.data(), w.data(), h_in.data(), dh.data());
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double want = with_bias ? bias[o] : 0;
        for (int i = 0; i < in; ++i) want += x[r * in + i] * w[o * in + i];
        BOOST_TEST(y[r * out + o] == want, tt::tolerance(1e-12));
        BOOST_TEST(h[r * out + o] == want, tt::tolerance(1e-12));
        BOOST_TEST(a[r * out + o] == gelu(want), tt::tolerance(1e-12));
      }
      for (int i = 0; i < in; ++i) {
        double product = 0;
        for (int o = 0; o < out; ++o) product += dy[r * out + o] * w[o * in + i];
        BOOST_TEST(dh[r * in + i] == gelu_grad(h_in[r * in + i]) * product, tt::tolerance(1e-12));
      }
    }
  }
}

// One AdamW call over many tensors, laid end to end past the fork threshold
// so the threads' ranges cut across tensors (and one tensor is empty):
// every value as the scalar formula, with each tensor's own decay.
BOOST_AUTO_TEST_CASE(adamw_over_many_tensors_matches_the_scalar_formula) {
  Be be;
  const std::vector<std::size_t> sizes = {5000, 0, 1, 4099, 17, 9000, 3};
  std::vector<Vec> p, g, m, v;
  std::vector<AdamWTensor<double>> tensors;
  Rng rng(5);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t n = sizes[k];
    p.emplace_back(n), g.emplace_back(n), m.emplace_back(n), v.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i)
      p[k][i] = rng.normal(), g[k][i] = rng.normal(), m[k][i] = 0.1 * rng.normal(), v[k][i] = 0.01 + rng.uniform();
  }
  const std::vector<Vec> p0 = p, m0 = m, v0 = v;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    tensors.push_back({sizes[k], p[k].data(), g[k].data(), m[k].data(), v[k].data(), k % 2 ? 0.0 : 0.01});
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, bc1 = 1 - b1 * b1, bc2 = 1 - b2 * b2;
  be.adamw_step(std::span<const AdamWTensor<double>>(tensors), lr, b1, b2, eps, bc1, bc2);
  double worst = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::size_t i = 0; i < sizes[k]; ++i) {
      const double mi = b1 * m0[k][i] + (1 - b1) * g[k][i], vi = b2 * v0[k][i] + (1 - b2) * g[k][i] * g[k][i];
      const double pi = p0[k][i] * (1 - lr * tensors[k].weight_decay) - lr / bc1 * mi / (std::sqrt(vi / bc2) + eps);
      worst = std::max({worst, std::abs(p[k][i] - pi), std::abs(m[k][i] - mi), std::abs(v[k][i] - vi)});
    }
  BOOST_TEST(worst < 1e-12);
}

// Row i of sequence b of a masked softmax over Tk scores s, in double: what
// the attention kernels' masked_softmax_row should give (zero where the mask
// hides a key).
template <class T>
std::vector<double> softmax_reference(const T* s, int b, int i, int Tq, int Tk, const AttentionMask& mask) {
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < Tk; ++j)
    if (mask.allowed(b, i, j, Tq, Tk)) mx = std::max(mx, double(s[j]));
  std::vector<double> p(Tk, 0.0);
  for (int j = 0; j < Tk; ++j)
    if (mask.allowed(b, i, j, Tq, Tk)) sum += (p[j] = std::exp(double(s[j]) - mx));
  if (sum > 0)  // else every key is hidden: all zero
    for (auto& v : p) v /= sum;
  return p;
}

BOOST_AUTO_TEST_CASE(softmax_with_masks_forward_and_backward) {
  Rng rng(2);
  Be be;
  const int B = 2, H = 1, T = 4;
  const Vec scores = random_vector(B * H * T * T, rng, 3.0);
  const std::vector<std::uint8_t> pad = {0, 0, 0, 1, 0, 1, 1, 1};
  const AttentionMask mask{true, pad.data()};
  Vec probs(scores.size());
  // (B, H, T, T) scores, one masked softmax a row, as attention's kernels take them.
  auto softmax = [&](const double* in, double* out) {
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < H * T; ++i)
        detail::masked_softmax_row<double>(b, i % T, T, T, in + (b * H * T + i) * T, out + (b * H * T + i) * T, mask);
  };
  softmax(scores.data(), probs.data());
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < T; ++i) {
      const auto want = softmax_reference(&scores[(b * T + i) * T], b, i, T, T, mask);
      for (int j = 0; j < T; ++j) BOOST_TEST(probs[(b * T + i) * T + j] == want[j], tt::tolerance(1e-13));
    }
  // Backward, checked by finite differences through the same masked softmax.
  GradCase c;
  c.name = "masked softmax";
  c.x = {scores};
  c.x_names = {"scores"};
  c.dx = {Vec(scores.size())};
  c.output(scores.size(), rng);
  c.forward = [&] { softmax(c.x[0].data(), c.y.data()); };
  c.backward = [&] {
    for (int r = 0; r < B * H * T; ++r)
      detail::softmax_backward_row<double>(T, c.y.data() + r * T, c.dy.data() + r * T, c.dx[0].data() + r * T);
  };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(cross_entropy_with_ignore_index) {
  Rng rng(3);
  Be be;
  const int rows = 5, V = 7, ignore = -100;
  const std::vector<std::int32_t> targets = {3, ignore, 0, 6, 3};
  GradCase c;
  c.name = "softmax cross-entropy";
  c.input("logits", rows * V, rng, 2.0);
  c.output(1, rng);
  Vec probs(rows * V);
  c.forward = [&] {
    c.y[0] = be.cross_entropy_forward(rows, V, c.x[0].data(), targets.data(), ignore, probs.data());
  };
  c.backward = [&] {
    be.cross_entropy_backward(rows, V, probs.data(), targets.data(), ignore, c.dy[0], c.dx[0].data());
  };
  check_case(c);
  // The value: mean over the 4 counted rows of logsumexp - logit[target].
  c.forward();
  double want = 0;
  for (int r = 0; r < rows; ++r) {
    if (targets[r] == ignore) continue;
    double lse = 0;
    for (int v = 0; v < V; ++v) lse += std::exp(c.x[0][r * V + v]);
    want += std::log(lse) - c.x[0][r * V + targets[r]];
  }
  BOOST_TEST(c.y[0] == want / 4, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(cross_entropy_with_label_smoothing) {
  Rng rng(4);
  Be be;
  const int rows = 4, V = 5, ignore = -1;
  const double eps = 0.1;
  const std::vector<std::int32_t> targets = {0, 4, ignore, 2};
  GradCase c;
  c.name = "softmax cross-entropy, label smoothing 0.1";
  c.input("logits", rows * V, rng, 2.0);
  c.output(1, rng);
  Vec probs(rows * V);
  c.forward = [&] {
    c.y[0] = be.cross_entropy_forward(rows, V, c.x[0].data(), targets.data(), ignore, probs.data(), eps);
  };
  c.backward = [&] {
    be.cross_entropy_backward(rows, V, probs.data(), targets.data(), ignore, c.dy[0], c.dx[0].data(), eps);
  };
  check_case(c);
  // Value: the cross-entropy against (1 - eps) onehot + eps / V, averaged over 3 rows.
  c.forward();
  double want = 0;
  for (int r = 0; r < rows; ++r) {
    if (targets[r] == ignore) continue;
    double lse = 0;
    for (int v = 0; v < V; ++v) lse += std::exp(c.x[0][r * V + v]);
    lse = std::log(lse);
    for (int v = 0; v < V; ++v)
      want -= ((v == targets[r] ? 1 - eps : 0) + eps / V) * (c.x[0][r * V + v] - lse);
  }
  BOOST_TEST(c.y[0] == want / 3, tt::tolerance(1e-12));
}

// The fused loss (the Trainer's) is forward then backward, bit for bit, in
// float and double, on one thread's rows and on rows split over threads,
// into its own buffer and in place over the logits. (Bit for bit between
// buffers of one alignment, as the backend's all are: Eigen's sums of a
// row start at its first aligned element.)
template <class S>
void fused_cross_entropy_case(int rows, int V, S smoothing, Rng& rng) {
  CpuBackend<S> be;
  AlignedVector<S> logits(std::size_t(rows) * V);
  for (auto& z : logits) z = S(rng.normal() * 3);
  std::vector<std::int32_t> targets(rows);
  for (int r = 0; r < rows; ++r)
    targets[r] = r % 5 == 2 ? kIgnoreIndex : std::int32_t(rng.next_u64() % std::uint64_t(V));
  AlignedVector<S> probs(logits.size()), want(logits.size()), got(logits.size(), S(NAN));
  const S dloss = S(0.7);
  const double loss = be.cross_entropy_forward(rows, V, logits.data(), targets.data(), kIgnoreIndex, probs.data(),
                                               smoothing);
  be.cross_entropy_backward(rows, V, probs.data(), targets.data(), kIgnoreIndex, dloss, want.data(), smoothing);
  BOOST_TEST(be.cross_entropy_forward_backward(rows, V, logits.data(), targets.data(), kIgnoreIndex, dloss, got.data(),
                                               smoothing) == loss);
  BOOST_TEST(std::memcmp(got.data(), want.data(), want.size() * sizeof(S)) == 0);
  AlignedVector<S> in_place = logits;
  BOOST_TEST(be.cross_entropy_forward_backward(rows, V, in_place.data(), targets.data(), kIgnoreIndex, dloss,
                                               in_place.data(), smoothing) == loss);
  BOOST_TEST(std::memcmp(in_place.data(), want.data(), want.size() * sizeof(S)) == 0);
}

BOOST_AUTO_TEST_CASE(fused_cross_entropy_is_forward_then_backward_bit_for_bit) {
  Rng rng(12);
  for (auto [rows, V] : {std::pair{5, 7}, {64, 5003}})
    for (double smoothing : {0.0, 0.1}) {
      BOOST_TEST_CONTEXT("rows " << rows << ", V " << V << ", smoothing " << smoothing) {
        fused_cross_entropy_case<float>(rows, V, float(smoothing), rng);
        fused_cross_entropy_case<double>(rows, V, smoothing, rng);
      }
    }
  Be be;
  const Vec logits(2 * 3, 0.0);
  Vec d(6);
  const std::vector<std::int32_t> targets = {1, 3};
  BOOST_CHECK_THROW(be.cross_entropy_forward_backward(2, 3, logits.data(), targets.data(), -100, 1.0, d.data()), Error);
}

BOOST_AUTO_TEST_CASE(mean_pool_over_unpadded_positions) {
  Rng rng(5);
  Be be;
  const int B = 2, T = 3, D = 4;
  const std::vector<std::uint8_t> exclude = {0, 0, 1, 0, 1, 1};
  GradCase c;
  c.name = "masked mean pool";
  c.input("x", B * T * D, rng);
  c.output(B * D, rng);
  c.forward = [&] { be.mean_pool_forward(B, T, D, c.x[0].data(), exclude.data(), c.y.data()); };
  c.backward = [&] { be.mean_pool_backward(B, T, D, c.dy.data(), exclude.data(), c.dx[0].data()); };
  check_case(c);
  c.forward();
  for (int d = 0; d < D; ++d) {
    BOOST_TEST(c.y[d] == (c.x[0][d] + c.x[0][D + d]) / 2, tt::tolerance(1e-14));
    BOOST_TEST(c.y[D + d] == c.x[0][3 * D + d], tt::tolerance(1e-14));
  }
}

BOOST_AUTO_TEST_CASE(cross_entropy_rejects_bad_targets) {
  Be be;
  const Vec logits(2 * 3, 0.0);
  Vec probs(6);
  const std::vector<std::int32_t> targets = {1, 3};
  try {
    be.cross_entropy_forward(2, 3, logits.data(), targets.data(), -100, probs.data());
    BOOST_FAIL("target 3 accepted with V = 3");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "target id 3 at row 1 out of range [0, 3) and not the ignore index -100");
  }
}

BOOST_AUTO_TEST_CASE(steady_state_allocates_nothing) {
  // Buffers grow only: a second call at the same or smaller size keeps them.
  Buffer<float> buf;
  float* p = buf.reserve(100);
  BOOST_TEST(buf.reserve(100) == p);
  BOOST_TEST(buf.reserve(10) == p);
  BOOST_TEST(buf.capacity() == 100u);
}

// Float single rows: y = W x (cpu/kernels.hpp's gemv_rows at the level in
// use; test_cpu_kernels tries every level), against a double sum. Row counts around the
// 16-row blocks, widths around the 16-float vectors, leading dimensions
// wider than the rows.
BOOST_AUTO_TEST_CASE(float_single_row_products_match_a_double_sum) {
  CpuBackend<float> be;
  Rng rng(11);
  for (auto [N, K] : {std::array{1, 1}, {3, 7}, {16, 16}, {17, 33}, {31, 64}, {65, 64}, {192, 64}, {64, 256},
                      {100, 40}, {384, 128}}) {
    const int ldb = K + 3;
    std::vector<float> W(std::size_t(N) * ldb), x(K), y(N + 1, 7.0f);
    for (auto& w : W) w = float(rng.uniform() * 2 - 1);
    for (auto& v : x) v = float(rng.uniform() * 2 - 1);
    be.gemm(false, true, 1, N, K, 1.0f, x.data(), K, W.data(), ldb, 0.0f, y.data(), N);
    for (int n = 0; n < N; ++n) {
      double s = 0, magnitude = 0;
      for (int k = 0; k < K; ++k) {
        s += double(W[std::size_t(n) * ldb + k]) * x[k];
        magnitude += std::abs(double(W[std::size_t(n) * ldb + k]) * x[k]);
      }
      BOOST_TEST_CONTEXT("N " << N << ", K " << K << ", row " << n) {
        BOOST_TEST(std::abs(y[n] - s) <= 1e-6 * magnitude + 1e-30);
      }
    }
    BOOST_TEST(y[N] == 7.0f);  // nothing written past the row
  }
}

// Float GELU (Eigen's vectorised tanh and exp) against the formula in double, over
// the range where tanh bends and beyond it, forward and backward; lengths
// around the vector width and the backward pass's 256-element chunks.
BOOST_AUTO_TEST_CASE(float_gelu_matches_double) {
  CpuBackend<float> be;
  for (std::size_t n : {1, 15, 17, 255, 257, 5000}) {
    std::vector<float> x(n), dy(n), y(n), dx(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = -12.0f + 24.0f * float(i) / float(std::max<std::size_t>(1, n - 1));
      dy[i] = 1.0f - 0.5f * float(i % 3);
    }
    be.gelu_forward(n, x.data(), y.data());
    be.gelu_backward(n, x.data(), dy.data(), dx.data());
    const double c = std::sqrt(2.0 / M_PI);
    for (std::size_t i = 0; i < n; ++i) {
      const double v = x[i], t = std::tanh(c * (v + 0.044715 * v * v * v));
      const double want_y = 0.5 * v * (1 + t);
      const double dinner = c * (1 + 3 * 0.044715 * v * v);
      const double want_dx = dy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * dinner);
      // Absolute error of a few float roundings of the terms, also in the
      // tail (x < -4) where tanh rounds to -1 and the derivative is 1e-5 or
      // less: the backward takes 1 - t^2 from exp(-2|u|), not from t.
      BOOST_TEST_CONTEXT("n " << n << ", x " << v) {
        BOOST_TEST(std::abs(y[i] - want_y) <= 1e-6 * std::abs(want_y) + 1e-6);
        BOOST_TEST(std::abs(dx[i] - want_dx) <= 1e-6 * std::abs(want_dx) + 2e-7 * std::abs(dy[i]));
      }
    }
  }
}

// sum_squares (eight running sums in double) against a long double sum, for
// lengths around its eight-wide blocks, in float and double.
BOOST_AUTO_TEST_CASE(sum_squares_matches_a_long_double_sum) {
  CpuBackend<float> bf;
  CpuBackend<double> bd;
  Rng rng(5);
  for (std::size_t n : {0, 1, 7, 8, 9, 17, 1000, 100003}) {
    std::vector<float> xf(n);
    std::vector<double> xd(n);
    long double want = 0;
    for (std::size_t i = 0; i < n; ++i) {
      xf[i] = float(rng.uniform() * 4 - 2);
      xd[i] = xf[i];
      want += (long double)xf[i] * xf[i];
    }
    // Each running sum adds n / 8 terms: rounding grows with n.
    const double tol = (1e-15 + 2e-16 * double(n)) * double(want);
    BOOST_TEST_CONTEXT("n " << n) {
      BOOST_TEST(std::abs(double(bf.sum_squares(n, xf.data()) - want)) <= tol);
      BOOST_TEST(std::abs(double(bd.sum_squares(n, xd.data()) - want)) <= tol);
    }
  }
}

// A single-row product large enough to split its rows over the threads
// (from detail::kGemvSplitWork weights; blocks of 16 rows) gives the bits of
// the same product on one thread, for row counts that do and do not divide
// into the blocks, in float and double.
template <class S>
void check_split_single_row_product() {
  CpuBackend<S> be;
  Rng rng(21);
  for (auto [N, K] : {std::array{2304, 768}, {1027, 256}, {1000, 133}}) {
    BOOST_REQUIRE(long(N) * K >= detail::kGemvSplitWork);
    const int ldb = K + 1;
    std::vector<S> W(std::size_t(N) * ldb), x(K), one(N + 1, S(7)), split(N + 1, S(7));
    for (auto& w : W) w = S(rng.uniform() * 2 - 1);
    for (auto& v : x) v = S(rng.uniform() * 2 - 1);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    be.gemm(false, true, 1, N, K, S(1), x.data(), K, W.data(), ldb, S(0), one.data(), N);
    omp_set_num_threads(std::max(2, threads));
    be.gemm(false, true, 1, N, K, S(1), x.data(), K, W.data(), ldb, S(0), split.data(), N);
    omp_set_num_threads(threads);
    BOOST_TEST_CONTEXT("N " << N << ", K " << K) {
      BOOST_TEST(std::memcmp(one.data(), split.data(), one.size() * sizeof(S)) == 0);
      BOOST_TEST(split[N - 1] != S(7));
      BOOST_TEST(split[N] == S(7));
    }
  }
}
BOOST_AUTO_TEST_CASE(split_single_row_products_give_the_one_thread_bits) {
  check_split_single_row_product<float>();
  check_split_single_row_product<double>();
}

// A few rows through gemm (the kernels' gemv_rows_multi): each row's outputs
// are bit for bit its own single-row product's, for row counts up to the
// kernel's bound (sixteen), widths with and without a tail, strided
// operands; past the bound, BLAS's sums agree closely.
BOOST_AUTO_TEST_CASE(few_row_products_give_each_rows_single_row_bits) {
  CpuBackend<float> be;
  Rng rng(17);
  for (auto [N, K] : {std::array{45, 64}, {33, 70}, {130, 256}, {16, 16}, {2304, 768}}) {
    for (int M : {2, 3, 5, 8, 9, 13, 16, 17}) {
      const int lda = K + 2, ldb = K + 5, ldc = N + 3;
      std::vector<float> W(std::size_t(N) * ldb), X(std::size_t(M) * lda), Y(std::size_t(M) * ldc, 9.0f);
      for (auto& w : W) w = float(rng.uniform() * 2 - 1);
      for (auto& v : X) v = float(rng.uniform() * 2 - 1);
      be.gemm(false, true, M, N, K, 1.0f, X.data(), lda, W.data(), ldb, 0.0f, Y.data(), ldc);
      for (int m = 0; m < M; ++m) {
        std::vector<float> y(N);
        be.gemm(false, true, 1, N, K, 1.0f, X.data() + std::size_t(m) * lda, K, W.data(), ldb, 0.0f, y.data(), N);
        BOOST_TEST_CONTEXT("N " << N << ", K " << K << ", M " << M << ", row " << m) {
          if (M <= detail::cpu_kernels().multi_rows) {
            BOOST_TEST(std::memcmp(y.data(), Y.data() + std::size_t(m) * ldc, N * sizeof(float)) == 0);
          } else {  // BLAS: another order of sums
            for (int n = 0; n < N; ++n)
              BOOST_TEST(std::abs(Y[std::size_t(m) * ldc + n] - y[n]) <= 1e-5f * float(K));
          }
          BOOST_TEST(Y[std::size_t(m) * ldc + N] == 9.0f);  // nothing written past the row
        }
      }
    }
  }
}

// A kept decoding copy (float_panels.hpp): packed at the first product that
// reads it, each row of any product then the bits it gets alone (M = 1:
// two to sixteen rows in one pass, more a chunk at a time) and close to the
// row-major product's; products it does not serve (a scale, another
// matrix) go on as before; a matrix that stays in cache is not kept;
// dropping frees it.
BOOST_AUTO_TEST_CASE(decoding_panels_serve_products_each_row_its_own_bits) {
  if (!detail::cpu_kernels().panel_rows) return;  // the portable level has no panels
  Rng rng(23);
  for (auto [N, K] : {std::array{181, 1031}, {2305, 64}, {2304, 768}}) {
    std::vector<float> W(std::size_t(N) * K), X(std::size_t(17) * K);
    for (auto& w : W) w = float(rng.uniform() * 2 - 1);
    for (auto& v : X) v = float(rng.uniform() * 2 - 1);
    CpuBackend<float> plain, be;
    BOOST_TEST(be.keep_weight_copy(W.data(), N, K));
    BOOST_TEST(be.holds_weight_copies());
    BOOST_TEST(be.weight_copy_bytes() == 0u);  // not packed yet
    std::vector<float> one(std::size_t(17) * N), reference(N);
    for (int m = 0; m < 17; ++m)
      be.gemm(false, true, 1, N, K, 1.0f, &X[std::size_t(m) * K], K, W.data(), K, 0.0f, &one[std::size_t(m) * N], N);
    BOOST_TEST(be.weight_copy_bytes() == detail::FloatPanels::bytes(N, K));
    for (int m = 0; m < 17; ++m) {
      plain.gemm(false, true, 1, N, K, 1.0f, &X[std::size_t(m) * K], K, W.data(), K, 0.0f, reference.data(), N);
      for (int n = 0; n < N; ++n) BOOST_TEST(std::abs(one[std::size_t(m) * N + n] - reference[n]) <= 1e-5f * K);
    }
    for (int M : {2, 8, 16, 17, 40}) {
      const int ldc = N + 3;
      std::vector<float> Y(std::size_t(M) * ldc, 9.0f), XM(std::size_t(M) * K);
      for (int m = 0; m < M; ++m) std::copy_n(&X[std::size_t(m % 17) * K], K, &XM[std::size_t(m) * K]);
      be.gemm(false, true, M, N, K, 1.0f, XM.data(), K, W.data(), K, 0.0f, Y.data(), ldc);
      BOOST_TEST_CONTEXT("N " << N << ", K " << K << ", M " << M) {
        for (int m = 0; m < M; ++m)
          BOOST_TEST(std::memcmp(&Y[std::size_t(m) * ldc], &one[std::size_t(m % 17) * N], N * sizeof(float)) == 0);
        for (int m = 0; m < M; ++m) BOOST_TEST(Y[std::size_t(m) * ldc + N] == 9.0f);
      }
    }
    std::vector<float> y(N), yplain(N);  // alpha 2: not the panels' product
    be.gemm(false, true, 1, N, K, 2.0f, X.data(), K, W.data(), K, 0.0f, y.data(), N);
    plain.gemm(false, true, 1, N, K, 2.0f, X.data(), K, W.data(), K, 0.0f, yplain.data(), N);
    BOOST_TEST(y == yplain);
    be.drop_weight_copies();
    BOOST_TEST(!be.holds_weight_copies());
    BOOST_TEST(be.weight_copy_bytes() == 0u);
    be.gemm(false, true, 1, N, K, 1.0f, X.data(), K, W.data(), K, 0.0f, y.data(), N);
    plain.gemm(false, true, 1, N, K, 1.0f, X.data(), K, W.data(), K, 0.0f, yplain.data(), N);
    BOOST_TEST(y == yplain);
  }
  std::vector<float> W(std::size_t(detail::kGemvSplitWork), 0.5f);
  CpuBackend<float> fp32;
  BOOST_TEST(!fp32.keep_weight_copy(W.data(), int(detail::kGemvSplitWork / 64) - 1, 64));  // in cache: not kept
  BOOST_TEST(!fp32.holds_weight_copies());
}

// Float masked softmax rows (the kernels' softmax_row at the level in use;
// test_cpu_kernels tries every level) against double: rows shorter and
// longer than a vector, causal and padded keys, a row with every key padded
// (all zero), and nothing written past the rows.
BOOST_AUTO_TEST_CASE(float_masked_softmax_matches_double) {
  Rng rng(12);
  for (int T : {1, 5, 16, 17, 40}) {
    const int B = 2;
    std::vector<float> scores(std::size_t(B) * T * T + 1), probs(scores.size(), 9.0f);
    for (auto& s : scores) s = float(rng.uniform() * 8 - 4);
    std::vector<std::uint8_t> pad(std::size_t(B) * T, 0);
    for (int j = 0; j < T; ++j) pad[T + j] = (j % 3 == 1);  // sequence 1: every third key padded
    pad[T] = 1;                                              // ... and its first, so its row 0 sees no key
    const AttentionMask mask{true, pad.data()};
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T; ++i)
        detail::masked_softmax_row<float>(b, i, T, T, &scores[(std::size_t(b) * T + i) * T],
                                          &probs[(std::size_t(b) * T + i) * T], mask);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T; ++i) {
        const float* p = &probs[(std::size_t(b) * T + i) * T];
        const auto ref = softmax_reference(&scores[(std::size_t(b) * T + i) * T], b, i, T, T, mask);
        for (int j = 0; j < T; ++j) {
          const double want = ref[j];
          BOOST_TEST_CONTEXT("T " << T << ", b " << b << ", row " << i << ", key " << j) {
            if (want == 0) BOOST_TEST(p[j] == 0.0f);
            else BOOST_TEST(std::abs(p[j] - want) <= 2e-6 * want + 1e-9);
          }
        }
      }
    BOOST_TEST(probs.back() == 9.0f);
  }
}

namespace {
// Floats that end where an unreadable page begins: a kernel that reads even
// one float past them stops the test with a segmentation fault.
class GuardedFloats {
 public:
  explicit GuardedFloats(std::size_t n) : page_(std::size_t(sysconf(_SC_PAGESIZE))) {
    pages_ = (n * sizeof(float) + page_ - 1) / page_ + 1;
    base_ = mmap(nullptr, pages_ * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    BOOST_REQUIRE(base_ != MAP_FAILED);
    BOOST_REQUIRE(mprotect(static_cast<char*>(base_) + (pages_ - 1) * page_, page_, PROT_NONE) == 0);
    data_ = reinterpret_cast<float*>(static_cast<char*>(base_) + (pages_ - 1) * page_) - n;
  }
  ~GuardedFloats() { munmap(base_, pages_ * page_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* data() { return data_; }

 private:
  std::size_t page_, pages_;
  void* base_;
  float* data_;
};
}  // namespace

// The float row kernels read nothing past their operands (masked loads for
// the tails): a softmax row, a single-row product and a decoding step's
// attention row, each operand ending at an unreadable page.
BOOST_AUTO_TEST_CASE(float_row_kernels_read_nothing_past_their_operands) {
  CpuBackend<float> be;
  Rng rng(14);
  auto fill = [&](float* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) p[i] = float(rng.uniform() * 2 - 1);
  };
  for (int n : {1, 7, 17, 33}) {
    GuardedFloats scores(n), probs(n);
    fill(scores.data(), n);
    detail::masked_softmax_row<float>(0, 0, 1, n, scores.data(), probs.data(), AttentionMask{false, nullptr});
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += probs.data()[j];
    BOOST_TEST(std::abs(sum - 1) < 1e-5, "softmax of " << n << " keys sums to " << sum);
  }
  for (auto [N, K] : {std::array{3, 7}, {17, 33}, {192, 64}}) {
    GuardedFloats W(std::size_t(N) * K), x(K), y(N);
    fill(W.data(), std::size_t(N) * K);
    fill(x.data(), K);
    be.gemm(false, true, 1, N, K, 1.0f, x.data(), K, W.data(), K, 0.0f, y.data(), N);
    double want = 0;
    for (int k = 0; k < K; ++k) want += double(W.data()[std::size_t(N - 1) * K + k]) * x.data()[k];
    BOOST_TEST(std::abs(y.data()[N - 1] - want) < 1e-5, "N " << N << ", K " << K);
  }
  for (int width : {16, 17}) {
    const int Tk = 5;
    GuardedFloats q(width), k(std::size_t(Tk) * width), v(std::size_t(Tk) * width), y(width), p(Tk);
    for (auto* g : {&q, &k, &v}) fill(g->data(), g == &q ? width : std::size_t(Tk) * width);
    be.attention_forward(AttentionDims{1, 1, 1, Tk, width, width}, q.data(), width, k.data(), width, v.data(), width,
                         y.data(), width, p.data(), AttentionMask{true, nullptr});
    double sum = 0;
    for (int j = 0; j < Tk; ++j) sum += p.data()[j];
    BOOST_TEST(std::abs(sum - 1) < 1e-5, "head width " << width);
  }
}

// Float attention row by row (query rows up to kCpuRowQueries: the
// decoding step and short sequences) for 16-, 32- and 64-wide heads and one
// of another width, queries at the end of a longer cached context, against
// double.
BOOST_AUTO_TEST_CASE(float_row_attention_matches_double) {
  CpuBackend<float> be;
  Rng rng(13);
  for (int W : {16, 32, 64, 24})
    for (auto [Tq, Tk] : {std::pair{1, 1}, {1, 20}, {3, 37}, {33, 33}}) {
      const int H = 2, ld = H * W;
      std::vector<float> q(std::size_t(Tq) * ld), k(std::size_t(Tk) * ld), v(k.size()), y(q.size());
      std::vector<float> probs(std::size_t(H) * Tq * Tk);
      for (auto* t : {&q, &k, &v})
        for (auto& e : *t) e = float(rng.uniform() * 2 - 1);
      const AttentionDims dims{1, H, Tq, Tk, W, W};
      const AttentionMask mask{true, nullptr};
      be.attention_forward(dims, q.data(), ld, k.data(), ld, v.data(), ld, y.data(), ld, probs.data(), mask);
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < Tq; ++i) {
          std::vector<double> s(Tk);
          for (int j = 0; j < Tk; ++j) {
            for (int d = 0; d < W; ++d) s[j] += double(q[i * ld + h * W + d]) * k[j * ld + h * W + d];
            s[j] /= std::sqrt(double(W));
          }
          const auto ref = softmax_reference(s.data(), 0, i, Tq, Tk, mask);
          BOOST_TEST_CONTEXT("W " << W << ", Tq " << Tq << ", Tk " << Tk << ", head " << h << ", row " << i) {
            for (int j = 0; j < Tk; ++j)
              BOOST_TEST(std::abs(probs[(std::size_t(h) * Tq + i) * Tk + j] - ref[j]) <= 1e-6);
            for (int d = 0; d < W; ++d) {
              double want = 0;
              for (int j = 0; j < Tk; ++j) want += ref[j] * v[j * ld + h * W + d];
              BOOST_TEST(std::abs(y[i * ld + h * W + d] - want) <= 1e-5);
            }
          }
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
