// 4-bit precision on the CPU (CpuOptions::q4, backend/cpu/q4_products.hpp,
// core/q4.hpp): a block's quantisation within its bound, the panels' bytes
// holding each weight where the format says; products through the 4-bit
// copies equal their formula recomputed plainly, bit for bit, at every
// level the CPU runs and whatever rows come with a row, and lie within the
// quantisation bound of float32's; a 4-bit checkpoint's panels are read in
// place and give the products of 4-bit precision on the float model; the
// input gradient through a copy multiplies the 4-bit weights themselves;
// decoding through the KV cache gives the tokens of recomputing the context.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "support/random.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/core/half.hpp"
#include "xfmr/core/q4.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/decoder.hpp"

BOOST_AUTO_TEST_SUITE(test_q4)

using namespace xfmr;

namespace {
using Cpu = CpuBackend<float>;

using xfmr::test::randn;  // support/random.hpp

std::vector<float> product(Cpu& be, const std::vector<float>& A, const float* W, int M, int N, int K) {
  std::vector<float> C(std::size_t(M) * N, -1.0f);
  be.gemm(false, true, M, N, K, 1.0f, A.data(), K, W, K, 0.0f, C.data(), N);
  return C;
}

// The format written out plainly: each block's scale (the value of largest
// magnitude over -8, in float16) and values, as the test reads q4.hpp.
struct Plain {
  std::vector<float> d;         // (N, blocks)
  std::vector<std::uint8_t> q;  // (N, blocks * 32)
};
Plain quantise_plainly(const std::vector<float>& W, int N, int K) {
  const int blocks = (K + 31) / 32;
  Plain p{std::vector<float>(std::size_t(N) * blocks), std::vector<std::uint8_t>(std::size_t(N) * blocks * 32, 8)};
  for (int n = 0; n < N; ++n)
    for (int b = 0; b < blocks; ++b) {
      float extreme = 0;
      for (int k = b * 32; k < std::min(K, b * 32 + 32); ++k)
        if (std::fabs(W[std::size_t(n) * K + k]) > std::fabs(extreme)) extreme = W[std::size_t(n) * K + k];
      const float d = detail::half_to_float(detail::float_to_half(extreme / -8.0f));
      p.d[std::size_t(n) * blocks + b] = d;
      for (int k = b * 32; k < std::min(K, b * 32 + 32); ++k) {
        const float v = d == 0 ? 8.0f : std::nearbyint(W[std::size_t(n) * K + k] / d) + 8.0f;
        p.q[std::size_t(n) * blocks * 32 + k] = std::uint8_t(std::clamp(v, 0.0f, 15.0f));
      }
    }
  return p;
}

// The product's formula (q4.hpp), computed plainly: each row of A's blocks
// quantised symmetric to int8, the integer sum in 64 bits, then one fused
// multiply-add a block in order.
std::vector<float> formula(const Plain& w, const float* A, int M, int N, int K) {
  const int blocks = (K + 31) / 32;
  std::vector<float> C(std::size_t(M) * N);
  for (int m = 0; m < M; ++m) {
    std::vector<float> s(blocks);
    std::vector<long> a(std::size_t(blocks) * 32, 0);
    for (int b = 0; b < blocks; ++b) {
      float amax = 0;
      bool finite = true;
      for (int k = b * 32; k < std::min(K, b * 32 + 32); ++k) {
        amax = std::max(amax, std::fabs(A[std::size_t(m) * K + k]));
        finite = finite && std::isfinite(A[std::size_t(m) * K + k]);
      }
      s[b] = !finite ? NAN : amax / 127.0f;
      if (!finite || amax == 0) continue;
      const float inv = 1.0f / s[b];
      for (int k = b * 32; k < std::min(K, b * 32 + 32); ++k)
        a[std::size_t(k)] = long(std::clamp(std::nearbyint(A[std::size_t(m) * K + k] * inv), -127.0f, 127.0f));
    }
    for (int n = 0; n < N; ++n) {
      float acc = 0;
      for (int b = 0; b < blocks; ++b) {
        long sum = 0;
        for (int k = b * 32; k < b * 32 + 32; ++k) sum += a[std::size_t(k)] * (long(w.q[std::size_t(n) * blocks * 32 + k]) - 8);
        BOOST_REQUIRE(sum >= INT32_MIN && sum <= INT32_MAX);
        acc = std::fma(float(sum), w.d[std::size_t(n) * blocks + b] * s[b], acc);
      }
      C[std::size_t(m) * N + n] = acc;
    }
  }
  return C;
}
}  // namespace

// A block's scale is its value of largest magnitude over -8 (float16), that
// value exact and every other within half a step (the clamped far end of
// the range, +8 steps, within one); the panels hold each weight where the
// format puts it (q4_dequantise_row reads them back), and rows and columns
// past the matrix are weights of zero.
BOOST_AUTO_TEST_CASE(blocks_quantise_within_their_bound_and_panels_hold_them) {
  const int N = 37, K = 70;  // a partial panel and a partial block
  auto W = randn(std::size_t(N) * K, 3, 0.05f);
  std::fill_n(W.begin() + 5 * K, K, 0.0f);  // a row of zeros: scales 0
  W[std::size_t(7 * K + 40)] = 3.0f;          // an outlier in a block
  std::vector<std::byte> P(detail::q4_bytes(N, K));
  for (long p = 0; p < detail::q4_panels(N); ++p)
    detail::q4_pack_panel(0, std::min(16, N - int(p) * 16), K, W.data() + p * 16 * K, K,
                          P.data() + detail::q4_offset(K, p, 0));
  const Plain plain = quantise_plainly(W, N, K);
  const int blocks = (K + 31) / 32;
  std::vector<float> row(K);
  for (int n = 0; n < N; ++n) {
    detail::q4_dequantise_row(P.data(), K, n, row.data());
    for (int k = 0; k < K; ++k) {
      const float d = plain.d[std::size_t(n) * blocks + k / 32];
      const float want = d * float(int(plain.q[std::size_t(n) * blocks * 32 + k]) - 8);
      BOOST_TEST_REQUIRE(row[std::size_t(k)] == want, "row " << n << ", column " << k);
      const float w = W[std::size_t(n) * K + k];
      BOOST_TEST_REQUIRE(std::fabs(row[std::size_t(k)] - w) <= std::fabs(d) * 1.0001f + 1e-12f);
      if (std::fabs(w) < std::fabs(d) * 7)  // inside the range: to the nearest step
        BOOST_TEST_REQUIRE(std::fabs(row[std::size_t(k)] - w) <= std::fabs(d) * 0.5001f + 1e-12f);
    }
  }
  BOOST_TEST(plain.d[std::size_t(5) * blocks] == 0.0f);
  detail::q4_dequantise_row(P.data(), K, 7, row.data());
  BOOST_TEST(std::fabs(row[40] - 3.0f) <= 3.0f * 0x1p-11f);  // the outlier itself: its float16 scale's rounding
  // Past the matrix: the last panel's missing rows and the last block's missing columns decode to zero.
  std::uint8_t q[32];
  const float d = detail::q4_unpack_row(P.data() + detail::q4_offset(K, 2, 2), 15, q);
  BOOST_TEST(d == 0.0f);
  for (int k = 0; k < 32; ++k) BOOST_TEST(q[k] == 8);
  detail::q4_unpack_row(P.data() + detail::q4_offset(K, 0, 2), 3, q);
  for (int k = K - 64; k < 32; ++k) BOOST_TEST(q[k] == 8);
}

// Products through the 4-bit copy give the formula bit for bit at every
// level the CPU runs, for rows counts below, at and past the kernels'
// tiles, with rows of zeros, an infinity (NaN outputs, as float32's), an
// outlier; within the quantisation bound of float32's product; products of
// other operands are float32's.
BOOST_AUTO_TEST_CASE(products_give_the_formula_bit_for_bit_at_every_level) {
  const int N = 53, K = 100;  // a partial panel, a partial block
  const auto W = randn(std::size_t(N) * K, 4, 0.05f);
  const Plain plain = quantise_plainly(W, N, K);
  const CpuLevel before = cpu_level();
  for (const CpuLevel level : supported_cpu_levels()) {
    set_cpu_level(level);
    Cpu q4({.q4 = true}), fp32;
    q4.keep_weight_copy(W.data(), N, K);
    BOOST_TEST(q4.weight_copy_bytes() == 0u);  // quantised at the first product that reads it
    for (int M : {1, 2, 3, 5, 8, 9, 17, 40}) {
      auto A = randn(std::size_t(M) * K, 5 + M);
      if (M > 2) std::fill_n(A.begin() + K, K, 0.0f);
      if (M > 3) A[std::size_t(2 * K + 7)] = 50.0f;
      const auto got = product(q4, A, W.data(), M, N, K), exact = product(fp32, A, W.data(), M, N, K);
      BOOST_TEST(q4.weight_copy_bytes() == detail::q4_bytes(N, K));
      const auto want = formula(plain, A.data(), M, N, K);
      BOOST_TEST_CONTEXT(cpu_level_name(level) << ", M " << M) {
        BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            double bound = 0;  // |a| d / 2 per weight (+ the far end's full step) and |w| s / 2 per activation
            for (int k = 0; k < K; ++k)
              bound += std::fabs(A[std::size_t(m) * K + k]) * std::fabs(plain.d[std::size_t(n) * 4 + k / 32]) +
                       std::fabs(W[std::size_t(n) * K + k]) * 60.0 / 127;
            BOOST_TEST_REQUIRE(std::fabs(got[std::size_t(m) * N + n] - exact[std::size_t(m) * N + n]) <= bound);
          }
      }
    }
    auto A = randn(std::size_t(3) * K, 50);
    A[std::size_t(K + 3)] = INFINITY;
    const auto got = product(q4, A, W.data(), 3, N, K);
    for (int n = 0; n < N; ++n) BOOST_TEST((std::isnan(got[std::size_t(N + n)]) && std::isfinite(got[std::size_t(n)])));
    const auto other = randn(W.size(), 9);  // not a kept matrix: float32's product
    BOOST_TEST(product(q4, A, other.data(), 3, N, K) == product(fp32, A, other.data(), 3, N, K),
               boost::test_tools::per_element());
  }
  set_cpu_level(before);
}

// A row's outputs do not depend on the rows beside it: each row of a
// product of 45 rows (a prompt and a batch's decoding rows together) has
// the bits of its product alone.
BOOST_AUTO_TEST_CASE(a_row_gets_the_same_bits_in_any_batch) {
  const int N = 70, K = 256, M = 45;
  const auto W = randn(std::size_t(N) * K, 40, 0.02f);
  const auto A = randn(std::size_t(M) * K, 41);
  Cpu q4({.q4 = true});
  q4.keep_weight_copy(W.data(), N, K);
  const auto all = product(q4, A, W.data(), M, N, K);
  for (int m = 0; m < M; ++m) {
    const std::vector<float> row(A.begin() + std::ptrdiff_t(m) * K, A.begin() + std::ptrdiff_t(m + 1) * K);
    const auto alone = product(q4, row, W.data(), 1, N, K);
    BOOST_TEST_REQUIRE(std::memcmp(&all[std::size_t(m) * N], alone.data(), N * sizeof(float)) == 0, "row " << m);
  }
}

// The input gradient through a 4-bit copy (a frozen 4-bit base's dx =
// dy W, W untransposed): the product of the 4-bit weights themselves, d (q
// - 8) as the format gives them, within float32's summation error of that
// product summed in double; the float32 weights it was made from are not
// read (they are overwritten with NaN once the copy is made). A matrix of
// more than 2^21 weights is widened a block at a time: of its rows when
// they are the longer side, summed into C (beta once), else of its columns
// (C's); and beta 1 adds to C.
BOOST_AUTO_TEST_CASE(the_input_gradient_multiplies_the_4bit_weights) {
  struct Case { int rows, cols, M; float beta; };
  for (const Case c : {Case{53, 100, 3, 0.0f}, Case{53, 100, 2, 1.0f}, Case{4100, 600, 3, 0.0f},
                       Case{4100, 600, 2, 1.0f}, Case{600, 4100, 3, 0.0f}}) {
    BOOST_TEST_CONTEXT(c.rows << " x " << c.cols << ", M " << c.M << ", beta " << c.beta) {
      auto W = randn(std::size_t(c.rows) * c.cols, 60, 0.05f);
      const Plain plain = quantise_plainly(W, c.rows, c.cols);
      Cpu q4({.q4 = true});
      q4.keep_weight_copy(W.data(), c.rows, c.cols);
      const auto X = randn(std::size_t(c.M) * c.cols, 61);
      (void)product(q4, X, W.data(), c.M, c.rows, c.cols);  // the forward makes the copy
      std::fill(W.begin(), W.end(), NAN);
      const auto dY = randn(std::size_t(c.M) * c.rows, 62);
      std::vector<float> dX = randn(std::size_t(c.M) * c.cols, 63);
      const std::vector<float> before = dX;
      q4.gemm(false, false, c.M, c.cols, c.rows, 1.0f, dY.data(), c.rows, W.data(), c.cols, c.beta, dX.data(), c.cols);
      const int blocks = (c.cols + 31) / 32;
      for (int m = 0; m < c.M; ++m)
        for (int k = 0; k < c.cols; ++k) {
          double want = c.beta * double(before[std::size_t(m) * c.cols + k]), magnitude = std::fabs(want);
          for (int n = 0; n < c.rows; ++n) {
            const double w = double(plain.d[std::size_t(n) * blocks + k / 32]) *
                             (int(plain.q[std::size_t(n) * blocks * 32 + k]) - 8);
            want += double(dY[std::size_t(m) * c.rows + n]) * w;
            magnitude += std::fabs(double(dY[std::size_t(m) * c.rows + n]) * w);
          }
          BOOST_TEST_REQUIRE(std::fabs(dX[std::size_t(m) * c.cols + k] - want) <= 1e-7 * (c.rows + 2) * magnitude,
                             "row " << m << ", column " << k << ": " << dX[std::size_t(m) * c.cols + k] << ", want "
                                    << want);
        }
    }
  }
}

namespace {
struct Small {
  static constexpr int D_MODEL = 64, N_HEADS = 4, N_LAYERS = 2, D_FF = 128, MAX_T = 16;
  static constexpr float DROPOUT = 0.0f;
  using Norm = PreNorm;
  using Activation = Gelu;
};
}  // namespace

// A 4-bit checkpoint (quantise_checkpoint) loaded for decoding: its panels
// read in place (no copy made), the products those of 4-bit precision on
// the float checkpoint (the same panels), cached decoding equal to
// recomputing the context, and a weight too large for a float16 scale
// refused by name.
BOOST_AUTO_TEST_CASE(a_4bit_checkpoint_decodes_from_its_panels_in_place) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("xfmr_q4_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Decoder<Small, Cpu> model(40, 11, {.tie_weights = true}), loaded(40, 12, {.tie_weights = true});
  SafeTensorsWriter mw, ow;
  add_parameters(mw, model);
  write_checkpoint(dir / "f32", mw, ow, TrainerState{});
  const QuantisedCheckpoint report = quantise_checkpoint(dir / "f32", dir / "q4", "q4");
  BOOST_TEST(quantised_weights(read_checkpoint_metadata(dir / "q4")) == "q4");
  BOOST_TEST(report.quantised_bytes < report.float_bytes / 5);
  defer_parameters(loaded, SafeTensors::load(dir / "q4" / kModelFile));

  Cpu q4({.q4 = true}), q4_on_float({.q4 = true});
  const WeightCopies from_file(q4, loaded), from_float(q4_on_float, model);
  const float* w = nullptr;
  loaded.visit([&](std::string_view name, auto& v, auto&) {
    if (name == "blocks.1.ff.fc1.weight") w = v.product_data();
  });
  const float* w_float = nullptr;
  model.visit([&](std::string_view name, auto& v, auto&) {
    if (name == "blocks.1.ff.fc1.weight") w_float = v.data();
  });
  BOOST_TEST_REQUIRE((w && w_float));
  const auto x = randn(std::size_t(3) * Small::D_MODEL, 21);
  const auto y = product(q4, x, w, 3, Small::D_FF, Small::D_MODEL);
  BOOST_TEST(q4.weight_copy_bytes() == 0u);  // the file's panels, read where they are
  BOOST_TEST(product(q4_on_float, x, w_float, 3, Small::D_FF, Small::D_MODEL) == y, boost::test_tools::per_element());

  Generator<Decoder<Small, Cpu>, Cpu> cached(loaded, q4), recomputed(loaded, q4);
  Rng unused(3);
  const GenerateOptions greedy{.sampling = {.temperature = 0}, .max_tokens = Small::MAX_T - 3};
  GenerateOptions plain = greedy;
  plain.use_cache = false;
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  BOOST_TEST(cached(prompt, greedy, unused) == recomputed(prompt, plain, unused), boost::test_tools::per_element());

  // A weight past 8 x 65504: refused when quantised, naming it.
  model.visit([&](std::string_view name, auto& v, auto&) {
    if (name == "blocks.0.attn.proj.weight") v.data()[5] = 1e6f;
  });
  SafeTensorsWriter big, none;
  add_parameters(big, model);
  write_checkpoint(dir / "big", big, none, TrainerState{});
  try {
    quantise_checkpoint(dir / "big", dir / "big4", "q4");
    BOOST_ERROR("a weight of 1e6 quantised to 4 bits");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("'blocks.0.attn.proj.weight' holds 1e+06") != std::string::npos, e.what());
  }
  fs::remove_all(dir);
}

// q4 is for decoding: training every weight refuses it (a LoRA run's
// frozen base takes it: test_peft), a CUDA backend too.
BOOST_AUTO_TEST_CASE(training_refuses_q4) {
  BOOST_CHECK_NO_THROW(check_precision_name("q4"));
  BOOST_CHECK_THROW(check_training_precision("q4", "--precision"), Error);
  BOOST_TEST(describe(make_backend<Cpu>("cpu", "q4")) == "cpu (4-bit weights)");
  BOOST_TEST(precision_of(make_backend<Cpu>("cpu", "q4")) == "q4");
  BOOST_CHECK_THROW(CpuBackend<double>({.q4 = true}), Error);
  BOOST_CHECK_THROW(Cpu({.int8 = true, .q4 = true}), Error);
}

BOOST_AUTO_TEST_SUITE_END()
