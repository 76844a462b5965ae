// The CPU's row kernels at every level this processor runs
// (backend/cpu/kernels.hpp), each forced in turn with set_cpu_level:
// single rows against a double sum; a few rows at once, each the bits of
// its single row; float panels' outputs each its multiply-adds in order,
// bit for bit; bf16 rows against their exact products summed in double;
// int8 products equal to their formula, bit for bit, and so at every level
// the same bits; softmax rows against double, with padded keys, infinities
// and tails. The families' operations (backend/cpu/ops.hpp) follow the
// level: CpuBackend<float> runs that level's copy, which agrees with
// CpuBackend<double>. And the choice itself: the best level is the one the
// kernel (/proc/cpuinfo) says the processor has, a level it lacks is
// refused, and cpu_level() names the one forced.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/int8.hpp"
#include "xfmr/core/rng.hpp"

namespace xfmr {
std::ostream& operator<<(std::ostream& out, CpuLevel level) { return out << cpu_level_name(level); }
}  // namespace xfmr

BOOST_AUTO_TEST_SUITE(test_cpu_kernels)

using namespace xfmr;

namespace {

// Runs f(kernels) at each level the CPU runs, then puts back the level in use.
template <class F>
void at_every_level(F&& f) {
  const CpuLevel before = cpu_level();
  for (CpuLevel level : supported_cpu_levels()) {
    set_cpu_level(level);
    BOOST_TEST_CONTEXT("level " << cpu_level_name(level)) {
      BOOST_TEST(cpu_level() == level);
      f(detail::cpu_kernels());
    }
  }
  set_cpu_level(before);
}

std::vector<float> uniform(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.uniform() * 2 - 1);
  return v;
}

// Row n of W x in double, and the sum of its terms' magnitudes (the scale of
// float32's rounding).
std::array<double, 2> row_sum(const float* w, const float* x, int K) {
  double s = 0, magnitude = 0;
  for (int k = 0; k < K; ++k) {
    s += double(w[k]) * x[k];
    magnitude += std::abs(double(w[k]) * x[k]);
  }
  return {s, magnitude};
}

const std::array<std::array<int, 2>, 9> kShapes = {{{1, 1}, {3, 7}, {8, 8}, {17, 33}, {31, 64}, {45, 70},
                                                     {130, 256}, {16, 16}, {9, 1031}}};

}  // namespace

// y = W x for row ranges that start and end inside the 8- and 16-row
// blocks, widths around the vectors, leading dimensions wider than K;
// nothing written outside [n0, n1).
BOOST_AUTO_TEST_CASE(single_rows_match_a_double_sum_at_every_level) {
  at_every_level([](const detail::CpuKernels& k) {
    for (auto [N, K] : kShapes) {
      const int ldw = K + 3;
      const auto W = uniform(std::size_t(N) * ldw, 3), x = uniform(std::size_t(K), 4);
      for (auto [n0, n1] : {std::array{0, N}, {N / 3, N - N / 4}}) {
        if (n1 <= n0) continue;
        std::vector<float> y(std::size_t(N) + 1, 7.0f);
        k.gemv_rows(n0, n1, K, W.data(), ldw, x.data(), y.data());
        BOOST_TEST_CONTEXT("N " << N << ", K " << K << ", rows [" << n0 << ", " << n1 << ")") {
          for (int n = 0; n < N + 1; ++n) {
            if (n < n0 || n >= n1) {
              BOOST_TEST(y[std::size_t(n)] == 7.0f);
              continue;
            }
            const auto [s, magnitude] = row_sum(W.data() + std::size_t(n) * ldw, x.data(), K);
            BOOST_TEST(std::abs(y[std::size_t(n)] - s) <= 1e-6 * magnitude + 1e-30);
          }
        }
      }
    }
  });
}

// Two to multi_rows rows of X against one W: each row's outputs the bits
// gemv_rows gives it alone (a sequence decoded in a batch gets its own
// numbers), strided operands, nothing written past a row.
BOOST_AUTO_TEST_CASE(a_few_rows_give_each_rows_single_row_bits_at_every_level) {
  at_every_level([](const detail::CpuKernels& k) {
    if (k.multi_rows == 0) return;
    BOOST_TEST(k.multi_rows == 16);
    for (auto [N, K] : kShapes) {
      for (int M : {2, 3, 4, 5, 8, 9, 16}) {
        const int ldw = K + 5, ldx = K + 2, ldy = N + 3;
        const auto W = uniform(std::size_t(N) * ldw, 5), X = uniform(std::size_t(M) * ldx, 6);
        std::vector<float> Y(std::size_t(M) * ldy, 9.0f);
        k.gemv_rows_multi(M, 0, N, K, W.data(), ldw, X.data(), ldx, Y.data(), ldy);
        for (int m = 0; m < M; ++m) {
          std::vector<float> y(static_cast<std::size_t>(N));
          k.gemv_rows(0, N, K, W.data(), ldw, X.data() + std::size_t(m) * ldx, y.data());
          BOOST_TEST_CONTEXT("N " << N << ", K " << K << ", M " << M << ", row " << m) {
            BOOST_TEST(std::memcmp(y.data(), Y.data() + std::size_t(m) * ldy, y.size() * sizeof(float)) == 0);
            BOOST_TEST(Y[std::size_t(m) * ldy + N] == 9.0f);
          }
        }
      }
    }
  });
}

// Float panels: each output is std::fma over k in order from zero, bit for
// bit, for 1 to kPanelMaxRows rows of X (strided), any panel range (the
// threads' split), a last panel of fewer than 16 rows and fewer columns
// than packed; nothing written outside the range. Being that chain, a row's
// bits are the same whatever rows come with it and at every level.
BOOST_AUTO_TEST_CASE(float_panels_give_each_output_its_fma_chain_in_order_at_every_level) {
  at_every_level([](const detail::CpuKernels& k) {
    if (!k.panel_rows) return;
    for (auto [N, K] : kShapes) {
      const int ldw = K + 3, ldx = K + 2, ldy = N + 5;
      const auto W = uniform(std::size_t(N) * ldw, 11);
      const long panels = detail::float_panel_count(N);
      std::vector<float> P(std::size_t(panels) * detail::kPanelRows * K, 5.0f);
      detail::pack_float_panels(0, panels, N, K, W.data(), ldw, P.data());
      for (int M = 1; M <= detail::kPanelMaxRows; ++M) {
        const auto X = uniform(std::size_t(M) * ldx, 12 + M);
        for (const int used : {K, (K + 1) / 2}) {  // all the columns, or the first ones
          for (const long b0 : {0L, panels / 2}) {
            std::vector<float> Y(std::size_t(M) * ldy, 9.0f);
            k.panel_rows(int(b0), int(panels), N, M, used, P.data(), long(K) * detail::kPanelRows, X.data(), ldx,
                         Y.data(), ldy);
            BOOST_TEST_CONTEXT("N " << N << ", K " << K << " (" << used << " used), M " << M << ", from panel " << b0) {
              int wrong = 0;
              for (int m = 0; m < M; ++m)
                for (int n = 0; n < ldy; ++n) {
                  float want = 9.0f;
                  if (n >= b0 * detail::kPanelRows && n < N) {
                    want = 0.0f;
                    for (int i = 0; i < used; ++i)
                      want = std::fma(W[std::size_t(n) * ldw + i], X[std::size_t(m) * ldx + i], want);
                  }
                  const float got = Y[std::size_t(m) * ldy + n];
                  wrong += std::memcmp(&got, &want, sizeof got) != 0;
                }
              BOOST_TEST(wrong == 0);
            }
          }
        }
      }
    }
  });
}

// bf16 weights times a row already rounded to bfloat16: the products are
// exact, so only float32's sums differ from the double sum.
BOOST_AUTO_TEST_CASE(bf16_rows_match_their_exact_products_summed_in_double) {
  at_every_level([](const detail::CpuKernels& k) {
    if (!k.gemv_rows_bf16) return;
    for (auto [N, K] : kShapes) {
      const int ldw = K + 1;
      const auto Wf = uniform(std::size_t(N) * ldw, 7);
      auto x = uniform(std::size_t(K), 8);
      std::vector<std::uint16_t> W(Wf.size());
      std::vector<float> widened(Wf.size());
      for (std::size_t i = 0; i < W.size(); ++i) {
        W[i] = bf16::from_float(Wf[i]);
        widened[i] = bf16::to_float(W[i]);
      }
      for (auto& v : x) v = bf16::round(v);
      std::vector<float> y(std::size_t(N) + 1, 7.0f);
      k.gemv_rows_bf16(0, N, K, W.data(), ldw, x.data(), y.data());
      BOOST_TEST_CONTEXT("N " << N << ", K " << K) {
        for (int n = 0; n < N; ++n) {
          const auto [s, magnitude] = row_sum(widened.data() + std::size_t(n) * ldw, x.data(), K);
          BOOST_TEST(std::abs(y[std::size_t(n)] - s) <= 1e-6 * magnitude + 1e-30);
        }
        BOOST_TEST(y[std::size_t(N)] == 7.0f);
      }
    }
  });
}

// The int8 product of quantised rows is its formula (int8_products.hpp),
// summed here in 64 bits: bit for bit at every level, so every level gives
// the same bits. Widths with and without 16- and 64-column tails, row counts
// around the kernels' blocks, the extreme values of u and q; each level's
// weights in its layout (VNNI's blocks of 16 rows).
BOOST_AUTO_TEST_CASE(int8_products_are_their_formula_bit_for_bit_at_every_level) {
  Rng rng(9);
  for (auto shape : {std::array{1, 1}, {7, 15}, {8, 16}, {17, 64}, {33, 100}, {40, 1031}}) {
    const int N = shape[0], K = shape[1];  // not a structured binding: Clang 14's lambdas cannot capture one
    for (int M : {1, 2, 3, 4, 5, 9, 16}) {
      const int ldq = K + 2;
      const long ldu = (K + 63) / 64 * 64;
      std::vector<std::int8_t> Q(std::size_t(N) * ldq);
      for (auto& q : Q) q = std::int8_t(int(rng.uniform() * 255) - 127);
      Q[0] = 127, Q[std::size_t(ldq) * (N - 1)] = -127;
      std::vector<float> scale(static_cast<std::size_t>(N));
      std::vector<std::int32_t> q_sum(static_cast<std::size_t>(N));
      for (int r = 0; r < N; ++r) {
        scale[std::size_t(r)] = float(rng.uniform() + 0.01);
        for (int c = 0; c < K; ++c) q_sum[std::size_t(r)] += Q[std::size_t(r) * ldq + c];
      }
      std::vector<std::uint8_t> U(std::size_t(M) * ldu, 0xAB);  // past K: not to be read as zeros
      std::vector<detail::ActivationScale> rows(static_cast<std::size_t>(M));
      for (int m = 0; m < M; ++m) {
        for (int c = 0; c < K; ++c) U[std::size_t(m) * ldu + c] = std::uint8_t(rng.uniform() * 256);
        U[std::size_t(m) * ldu] = 255;
        rows[std::size_t(m)] = {float(rng.uniform() + 0.01), int(rng.uniform() * 256)};
      }
      std::vector<float> want(std::size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int r = 0; r < N; ++r) {
          long long sum = 0;
          for (int c = 0; c < K; ++c) sum += long(U[std::size_t(m) * ldu + c]) * Q[std::size_t(r) * ldq + c];
          sum -= (long long)rows[std::size_t(m)].zero * q_sum[std::size_t(r)];
          want[std::size_t(m) * N + r] =
              detail::int8_output(std::int32_t(sum), scale[std::size_t(r)], rows[std::size_t(m)].scale);
        }
      std::vector<std::int8_t> blocks(detail::int8_blocked_bytes(N, K));
      detail::pack_int8_blocks(N, K, Q.data(), ldq, blocks.data());
      at_every_level([&](const detail::CpuKernels& k) {
        const int ldc = N + 1;
        std::vector<float> C(std::size_t(M) * ldc, 5.0f);
        // In two calls, as two threads split the rows: [0, 16) and the rest.
        const std::int8_t* q = k.int8_blocked ? blocks.data() : Q.data();
        const long width = k.int8_blocked ? detail::int8_block_width(K) : ldq;
        const int split = std::min(N, detail::kInt8BlockRows);
        k.int8_product_rows(0, split, M, K, q, width, scale.data(), q_sum.data(), U.data(), ldu, rows.data(), C.data(),
                            ldc);
        if (split < N)
          k.int8_product_rows(split, N, M, K, q, width, scale.data(), q_sum.data(), U.data(), ldu, rows.data(),
                              C.data(), ldc);
        BOOST_TEST_CONTEXT("N " << N << ", K " << K << ", M " << M << " through " << k.int8_isa) {
          for (int m = 0; m < M; ++m) {
            BOOST_TEST(std::memcmp(C.data() + std::size_t(m) * ldc, want.data() + std::size_t(m) * N,
                                   std::size_t(N) * sizeof(float)) == 0);
            BOOST_TEST(C[std::size_t(m) * ldc + N] == 5.0f);
          }
        }
      });
    }
  }
}

// Softmax rows against double: lengths around the vectors, padded keys, a
// row whose keys are all padded (all zero), scores of -infinity (zero
// probability), scores far below the maximum (exp underflows to 0 or a
// subnormal, as in double), the tail of Tk past n zeroed, nothing written
// past Tk.
BOOST_AUTO_TEST_CASE(softmax_rows_match_double_at_every_level) {
  at_every_level([](const detail::CpuKernels& k) {
    Rng rng(10);
    for (int Tk : {1, 5, 8, 9, 16, 17, 40, 100}) {
      for (int n : {Tk, Tk / 2, 0}) {
        for (bool padded : {false, true}) {
          std::vector<float> in(static_cast<std::size_t>(Tk));
          for (auto& s : in) s = float(rng.uniform() * 16 - 8);
          if (Tk > 3) in[1] = -std::numeric_limits<float>::infinity(), in[2] = -150.0f, in[3] = 85.0f;
          std::vector<std::uint8_t> pad(std::size_t(Tk), 0);
          for (int j = 0; j < Tk; ++j) pad[std::size_t(j)] = padded && j % 3 == 0;
          std::vector<float> out(std::size_t(Tk) + 1, 9.0f);
          k.softmax_row(in.data(), out.data(), n, Tk, padded ? pad.data() : nullptr);
          double mx = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int j = 0; j < n; ++j)
            if (!pad[std::size_t(j)]) mx = std::max(mx, double(in[std::size_t(j)]));
          for (int j = 0; j < n; ++j)
            if (!pad[std::size_t(j)]) sum += std::exp(double(in[std::size_t(j)]) - mx);
          BOOST_TEST_CONTEXT("Tk " << Tk << ", n " << n << (padded ? ", padded" : "")) {
            for (int j = 0; j < Tk; ++j) {
              const bool live = j < n && !pad[std::size_t(j)] && mx > -std::numeric_limits<double>::infinity();
              const double want = live ? std::exp(double(in[std::size_t(j)]) - mx) / sum : 0.0;
              // Masked keys are exactly zero; an exponential below float32's
              // smallest normal may come out as 0 or as a subnormal
              // (Eigen's, the portable level's, clamps its argument).
              if (!live) BOOST_TEST(out[std::size_t(j)] == 0.0f);
              else BOOST_TEST(std::abs(out[std::size_t(j)] - want) <= 2e-6 * want + std::numeric_limits<float>::min());
            }
            BOOST_TEST(out[std::size_t(Tk)] == 9.0f);
          }
        }
      }
    }
  });
}

// The families' operations at each level: CpuBackend<float> calls the
// level's own copy (a table of its own, compiled for it), and its results
// agree with CpuBackend<double>'s on the same inputs: a product small enough
// for Eigen, layer norm forward and backward, GELU, tiled attention forward
// and backward (causal, two tiles of keys), an AdamW step.
BOOST_AUTO_TEST_CASE(the_families_operations_run_at_the_level_and_agree_with_double) {
  const auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  const auto close = [](const std::vector<float>& got, const std::vector<double>& want, double tol) {
    BOOST_REQUIRE_EQUAL(got.size(), want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    BOOST_TEST(worst <= tol, "largest difference " << worst << " over " << tol);
  };
  CpuBackend<float> f;
  CpuBackend<double> d;
  std::set<const void*> tables;
  at_every_level([&](const detail::CpuKernels& k) {
    BOOST_TEST((&detail::cpu_ops<float>() == k.ops));
    BOOST_TEST((detail::cpu_ops<float>().level == cpu_level()));
    tables.insert(k.ops);

    const int M = 7, N = 9, K = 13;  // C = A B^T
    const auto A = uniform(M * K, 1), B = uniform(N * K, 2);
    std::vector<float> C(M * N);
    std::vector<double> Cd(M * N);
    f.gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    d.gemm(false, true, M, N, K, 1.0, as_double(A).data(), K, as_double(B).data(), K, 0.0, Cd.data(), N);
    close(C, Cd, 1e-5);

    const int rows = 5, n = 300;
    const auto x = uniform(rows * n, 3), g = uniform(n, 4), b = uniform(n, 5), dy = uniform(rows * n, 6);
    std::vector<float> y(rows * n), mean(rows), rstd(rows), dx(rows * n), dg(n), db(n);
    std::vector<double> yd(rows * n), meand(rows), rstdd(rows), dxd(rows * n), dgd(n), dbd(n);
    f.layer_norm_forward(rows, n, x.data(), g.data(), b.data(), 1e-5f, y.data(), mean.data(), rstd.data());
    d.layer_norm_forward(rows, n, as_double(x).data(), as_double(g).data(), as_double(b).data(), 1e-5, yd.data(),
                         meand.data(), rstdd.data());
    close(y, yd, 1e-5);
    f.layer_norm_backward(rows, n, dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                          db.data());
    d.layer_norm_backward(rows, n, as_double(dy).data(), as_double(x).data(), as_double(g).data(), meand.data(),
                          rstdd.data(), dxd.data(), dgd.data(), dbd.data());
    close(dx, dxd, 1e-4);
    close(dg, dgd, 1e-5);
    close(db, dbd, 1e-5);

    f.gelu_forward(x.size(), x.data(), y.data());
    d.gelu_forward(x.size(), as_double(x).data(), yd.data());
    close(y, yd, 1e-6);

    AttentionDims a;
    a.B = 2, a.H = 2, a.Tq = a.Tk = 150, a.QK_DIM = a.V_DIM = 16;  // 150 keys: two tiles of 128
    const long elems = long(a.B) * a.Tq * a.H * a.QK_DIM;
    const auto q = uniform(elems, 7), kk = uniform(elems, 8), v = uniform(elems, 9), dya = uniform(elems, 10);
    const AttentionMask causal{true, nullptr};
    const int ld = a.H * a.QK_DIM;
    std::vector<float> ya(elems), lse(a.B * a.H * a.Tq), dq(elems), dk(elems), dv(elems);
    std::vector<double> yad(elems), lsed(a.B * a.H * a.Tq), dqd(elems), dkd(elems), dvd(elems);
    f.flash_attention_forward(a, q.data(), ld, kk.data(), ld, v.data(), ld, ya.data(), ld, lse.data(), causal);
    d.flash_attention_forward(a, as_double(q).data(), ld, as_double(kk).data(), ld, as_double(v).data(), ld,
                              yad.data(), ld, lsed.data(), causal);
    close(ya, yad, 1e-5);
    f.flash_attention_backward(a, dya.data(), ld, ya.data(), ld, q.data(), ld, kk.data(), ld, v.data(), ld, lse.data(),
                               causal, dq.data(), dk.data(), dv.data());
    d.flash_attention_backward(a, as_double(dya).data(), ld, yad.data(), ld, as_double(q).data(), ld,
                               as_double(kk).data(), ld, as_double(v).data(), ld, lsed.data(), causal, dqd.data(),
                               dkd.data(), dvd.data());
    close(dq, dqd, 1e-4);
    close(dk, dkd, 1e-4);
    close(dv, dvd, 1e-4);

    auto p = uniform(n, 11), m = uniform(n, 12), vv = uniform(n, 13);
    for (auto& e : vv) e = std::abs(e);
    auto pd = as_double(p), md = as_double(m), vd = as_double(vv);
    const auto grad = uniform(n, 14);
    const auto gradd = as_double(grad);
    const AdamWTensor<float> t{std::size_t(n), p.data(), grad.data(), m.data(), vv.data(), 0.1f};
    const AdamWTensor<double> td{std::size_t(n), pd.data(), gradd.data(), md.data(), vd.data(), 0.1};
    f.adamw_step(std::span(&t, 1), 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.001f);
    d.adamw_step(std::span(&td, 1), 1e-2, 0.9, 0.999, 1e-8, 0.1, 0.001);
    close(p, pd, 1e-6);
  });
  BOOST_TEST(tables.size() == supported_cpu_levels().size());  // one copy a level
}

// The best level is the one the kernel reports the processor's flags for
// (/proc/cpuinfo, read independently of cpuid's bits): x86-64-v4's AVX-512
// subsets for avx512, x86-64-v3's set for avx2. And a level the processor
// lacks is refused by name.
BOOST_AUTO_TEST_CASE(the_best_level_is_the_processors_and_others_are_refused) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
  const auto has = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* f) { return flags.count(f) > 0; });
  };
#if defined(__x86_64__)
  BOOST_REQUIRE(!flags.empty());
  // (LZCNT, "abm", is left out: some hypervisors' kernels do not list it.)
  const bool v3 = has({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"});
  const bool v4 = v3 && has({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"});
  const CpuLevel want = v4 ? CpuLevel::avx512 : v3 ? CpuLevel::avx2 : CpuLevel::portable;
#else
  const CpuLevel want = CpuLevel::portable;
#endif
  BOOST_TEST(best_cpu_level() == want);
  BOOST_TEST(supported_cpu_levels().back() == best_cpu_level());
  BOOST_TEST(supported_cpu_levels().front() == CpuLevel::portable);
  const CpuLevel before = cpu_level();
  for (CpuLevel level : {CpuLevel::portable, CpuLevel::avx2, CpuLevel::avx512}) {
    if (level <= best_cpu_level()) continue;
    const std::string message = test::error_of([&] { set_cpu_level(level); });
    BOOST_TEST(message.find(cpu_level_name(level)) != std::string::npos, message);
    BOOST_TEST(message.find("this CPU lacks it") != std::string::npos, message);
  }
  BOOST_TEST(cpu_level() == before);
  set_cpu_level(CpuLevel::portable);
  BOOST_TEST(cpu_level_description().find("portable (set_cpu_level") == 0);
  set_cpu_level(before);
}

BOOST_AUTO_TEST_SUITE_END()
