// int8 precision on the CPU (CpuOptions::int8, backend/cpu/int8_products.hpp):
// weights' and activations' per-row quantisation within their bounds on
// random and adversarial rows; products through the int8 copies equal
// their formula recomputed plainly, bit for bit, whatever the number of
// rows, and lie within the quantisation bound of float32's on the original
// weights; products of other operands untouched; decoding through the KV
// cache gives the tokens of recomputing the context; training refuses the
// precision.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/random.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/decoder.hpp"

BOOST_AUTO_TEST_SUITE(test_int8)

using namespace xfmr;

namespace {
using Cpu = CpuBackend<float>;

using xfmr::test::randn;  // support/random.hpp

// C (M, N) = A (M, K) W^T through the backend, as a linear layer multiplies.
std::vector<float> product(Cpu& be, const std::vector<float>& A, const std::vector<float>& W, int M, int N, int K) {
  std::vector<float> C(std::size_t(M) * N, -1.0f);
  be.gemm(false, true, M, N, K, 1.0f, A.data(), K, W.data(), K, 0.0f, C.data(), N);
  return C;
}

// The int8 product's formula (int8_products.hpp), computed plainly: each
// row of A quantised by quantise_activation_u8, the integer sum in 64 bits
// (and checked to fit in int32), then int8_output.
std::vector<float> formula(const std::vector<std::int8_t>& q, const std::vector<float>& scale, const float* A, int M,
                           int N, int K) {
  std::vector<float> C(std::size_t(M) * N);
  std::vector<std::uint8_t> u(static_cast<std::size_t>(K));
  for (int m = 0; m < M; ++m) {
    const auto a = detail::quantise_activation_u8(A + std::size_t(m) * K, K, u.data());
    for (int r = 0; r < N; ++r) {
      std::int64_t sum = 0;
      for (int k = 0; k < K; ++k) sum += std::int64_t(u[k] - a.zero) * q[std::size_t(r) * K + k];
      BOOST_TEST_REQUIRE(std::abs(sum) <= std::int64_t(INT32_MAX));
      C[std::size_t(m) * N + r] = detail::int8_output(std::int32_t(sum), scale[std::size_t(r)], a.scale);
    }
  }
  return C;
}

struct Small {
  static constexpr int MAX_T = 16, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 2, D_FF = 256;
  using Norm = PreNorm;
  using Activation = Gelu;
};
}  // namespace

// |w - scale q| <= scale / 2 on every element, q within [-127, 127] with
// the row's largest magnitude at +-127: random rows, a row with one outlier
// (the rest quantise coarsely, still within the bound), a row of zeros.
BOOST_AUTO_TEST_CASE(quantisation_stays_within_half_a_step) {
  const int n = 200;
  std::vector<std::vector<float>> rows = {randn(n, 1), randn(n, 2, 1e-3f), randn(n, 3)};
  rows[2][17] = 1000.0f;              // an outlier
  rows.push_back(std::vector<float>(n, 0.0f));  // all zero
  rows.push_back(std::vector<float>(n, -2.5f)); // constant
  for (const auto& w : rows) {
    std::vector<std::int8_t> q(n);
    const float scale = detail::quantise_row_int8(w.data(), n, q.data());
    int largest = 0;
    for (int k = 0; k < n; ++k) {
      BOOST_TEST(std::abs(int(q[k])) <= 127);
      largest = std::max(largest, std::abs(int(q[k])));
      BOOST_TEST(std::fabs(w[k] - scale * float(q[k])) <= 0.5f * scale * (1 + 1e-5f) + 1e-30f);
    }
    BOOST_TEST(largest == (scale > 0 ? 127 : 0));
  }
}

// An activation row's uint8 quantisation: |a - scale (u - zero)| <= scale
// / 2 (and a little float rounding), 0 exact, u spanning [0, 255] where
// the row has both signs: random rows, one with an outlier, rows of one
// sign, a constant row, zeros; a row with a NaN or an infinity gives a
// NaN scale.
BOOST_AUTO_TEST_CASE(activations_quantise_within_half_a_step) {
  const int n = 300;
  std::vector<std::vector<float>> rows = {randn(n, 31), randn(n, 32, 1e-4f), randn(n, 33)};
  rows[2][7] = -500.0f;  // an outlier
  rows.push_back(rows[0]);
  for (auto& x : rows.back()) x = std::fabs(x);  // all >= 0: zero at u = 0
  rows.push_back(rows.back());
  for (auto& x : rows.back()) x = -x;  // all <= 0: zero at u = 255
  rows.push_back(std::vector<float>(n, 3.25f));
  rows.back()[5] = 0.0f;
  for (const auto& a : rows) {
    std::vector<std::uint8_t> u(n);
    const auto q = detail::quantise_activation_u8(a.data(), n, u.data());
    BOOST_TEST(q.scale > 0.0f);
    BOOST_TEST((q.zero >= 0 && q.zero <= 255));
    int lo = 255, hi = 0;
    for (int k = 0; k < n; ++k) {
      lo = std::min(lo, int(u[k])), hi = std::max(hi, int(u[k]));
      BOOST_TEST(std::fabs(a[k] - q.scale * float(int(u[k]) - q.zero)) <= 0.5f * q.scale * (1 + 1e-4f));
      if (a[k] == 0.0f) BOOST_TEST(int(u[k]) == q.zero);
    }
    BOOST_TEST((lo == 0 && hi == 255));
  }
  std::vector<std::uint8_t> u(n, 7);
  const std::vector<float> zeros(n, 0.0f);
  const auto z = detail::quantise_activation_u8(zeros.data(), n, u.data());
  BOOST_TEST((z.scale == 0.0f && z.zero == 0 && u == std::vector<std::uint8_t>(n, 0)));
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    auto a = randn(n, 34);
    a[11] = bad;
    BOOST_TEST(std::isnan(detail::quantise_activation_u8(a.data(), n, u.data()).scale));
  }
}

// A kept weight: every row of A, one (a decoding step) or many (a batch of
// streams, a prompt), against it gives the formula's bits, and lies within
// sum_k (|a_k| scale_r + |scale_r q_rk| scale_m) / 2 (plus float32's
// rounding) of the product with the original weights. A product of
// anything else is float32's, bit for bit.
BOOST_AUTO_TEST_CASE(products_give_the_formula_bit_for_bit) {
  const int N = 37, K = 90;  // a partial block of rows; one 64-column step and a tail
  const auto W = randn(std::size_t(N) * K, 4, 0.05f);
  std::vector<std::int8_t> q(W.size());
  std::vector<float> scale(N);
  for (int r = 0; r < N; ++r) scale[r] = detail::quantise_row_int8(W.data() + r * K, K, q.data() + r * K);
  Cpu int8({.int8 = true}), fp32;
  int8.keep_weight_copy(W.data(), N, K);
  BOOST_TEST(int8.weight_copy_bytes() == 0u);  // quantised at the first product that reads it
  for (int M : {1, 2, 5, 8, 9, 20, 130}) {
    const auto A = randn(std::size_t(M) * K, 5 + M);
    const auto got = product(int8, A, W, M, N, K), exact = product(fp32, A, W, M, N, K);
    BOOST_TEST(int8.weight_copy_bytes() == detail::Int8Products::copy_bytes(N, K));
    BOOST_TEST(got == formula(q, scale, A.data(), M, N, K), boost::test_tools::per_element());
    std::vector<std::uint8_t> u(K);
    for (int m = 0; m < M; ++m) {
      const float row_scale = detail::quantise_activation_u8(A.data() + m * K, K, u.data()).scale;
      for (int r = 0; r < N; ++r) {
        double bound = 0;
        for (int k = 0; k < K; ++k)
          bound += (std::fabs(A[m * K + k]) * scale[r] + std::fabs(scale[r] * q[r * K + k]) * row_scale) / 2;
        BOOST_TEST(std::fabs(got[m * N + r] - exact[m * N + r]) <= bound * 1.001 + 1e-5);
      }
    }
  }
  // Another operand (an activation, or the weight transposed otherwise) is float32's product.
  const auto other = randn(W.size(), 9);
  const auto A = randn(std::size_t(3) * K, 10);
  BOOST_TEST(product(int8, A, other, 3, N, K) == product(fp32, A, other, 3, N, K), boost::test_tools::per_element());
  int8.drop_weight_copies();
  BOOST_TEST(int8.weight_copy_bytes() == 0u);
  BOOST_TEST(product(int8, A, W, 3, N, K) == product(fp32, A, W, 3, N, K), boost::test_tools::per_element());
}

// A row's outputs do not depend on the rows beside it: each row of a
// product of 45 rows (a prompt and a batch's decoding rows together) has
// the bits of that row's product alone, over a weight wider than the
// kernels' 64-column steps and taller than their 16-row blocks. Rows of
// zeros, of one sign, with an outlier, and the widest weight row the
// int32 sums allow, with the largest values, stay exact.
BOOST_AUTO_TEST_CASE(a_row_gets_the_same_bits_in_any_batch) {
  const int N = 50, K = 333, M = 45;
  const auto W = randn(std::size_t(N) * K, 40, 0.02f);
  auto A = randn(std::size_t(M) * K, 41);
  std::fill_n(A.begin() + 3 * K, K, 0.0f);
  for (int k = 0; k < K; ++k) A[std::size_t(4 * K + k)] = std::fabs(A[std::size_t(4 * K + k)]);
  A[std::size_t(5 * K + 17)] = 1e4f;
  Cpu int8({.int8 = true});
  int8.keep_weight_copy(W.data(), N, K);
  const auto all = product(int8, A, W, M, N, K);
  for (int m = 0; m < M; ++m) {
    const std::vector<float> row(A.begin() + std::ptrdiff_t(m) * K, A.begin() + std::ptrdiff_t(m + 1) * K);
    const auto alone = product(int8, row, W, 1, N, K);
    for (int r = 0; r < N; ++r) BOOST_TEST_REQUIRE(all[std::size_t(m) * N + r] == alone[std::size_t(r)]);
  }
  // The widest row: every u 255 or 0 against every q +-127, the sums at int32's edge.
  const int wide = detail::Int8Products::kMaxCols;
  std::vector<float> w(2 * std::size_t(wide), 1.0f), x(std::size_t(wide), 1.0f);
  std::fill_n(w.begin() + wide, wide, -1.0f);
  Cpu big({.int8 = true});
  big.keep_weight_copy(w.data(), 2, wide);
  std::vector<float> y = product(big, x, w, 1, 2, wide);
  BOOST_TEST(y[0] == float(wide), boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(y[1] == -float(wide), boost::test_tools::tolerance(1e-6f));
  std::vector<float> too_wide(std::size_t(wide + 1), 1.0f);
  BOOST_CHECK_THROW(big.keep_weight_copy(too_wide.data(), 1, wide + 1), Error);
}

// Decoding in int8: greedy tokens through the KV cache are those of
// recomputing the whole context (the products give a row the same bits
// either way; attention's float32 sums may differ in the last bits), and
// the tokens are reported against float32's.
BOOST_AUTO_TEST_CASE(cached_decoding_equals_recomputed_decoding) {
  Cpu int8({.int8 = true}), fp32;
  Decoder<Small, Cpu> model(40, 11, {.tie_weights = true});
  Generator<Decoder<Small, Cpu>, Cpu> cached(model, int8), recomputed(model, int8), reference(model, fp32);
  Rng unused(3);
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  const GenerateOptions greedy{.sampling = {.temperature = 0}, .max_tokens = Small::MAX_T - 3};
  GenerateOptions plain = greedy;
  plain.use_cache = false;
  const auto with_cache = cached(prompt, greedy, unused), without = recomputed(prompt, plain, unused);
  BOOST_TEST(with_cache == without, boost::test_tools::per_element());
  const auto fp = reference(prompt, greedy, unused);
  int same = 0;
  for (std::size_t i = 0; i < fp.size(); ++i) same += fp[i] == with_cache[i];
  BOOST_TEST_MESSAGE(same << " of " << fp.size() << " greedy tokens as in float32");
  BOOST_TEST(int8.weight_copy_bytes() == 0u);  // generation's scope dropped its copies
}

// An int8 checkpoint (io/checkpoint.hpp's quantise_checkpoint) decodes from
// its own rows: loaded deferred (defer_parameters), WeightCopies keeps
// them as they are, so a product is the formula over the file's q and
// scales, a forward pass is close to float32's on the dequantised weights
// (on a float32 backend the lent matrices are read from the file), and
// generation's own scope, nested, leaves them in place.
BOOST_AUTO_TEST_CASE(an_int8_checkpoint_decodes_from_its_rows) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("xfmr_int8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Decoder<Small, Cpu> model(40, 11, {.tie_weights = true}), loaded(40, 12, {.tie_weights = true});
  SafeTensorsWriter mw, ow;
  add_parameters(mw, model);
  write_checkpoint(dir / "f32", mw, ow, TrainerState{});
  quantise_checkpoint(dir / "f32", dir / "i8");
  const SafeTensors file = SafeTensors::load(dir / "i8" / kModelFile);
  fs::remove_all(dir);
  // One matrix's rows halved (the largest |q| 63, not 127): quantising its
  // dequantised values again would give other rows, so only rows kept as
  // they are give the products below.
  const std::string fc1 = "blocks.1.ff.fc1.weight";
  SafeTensorsWriter edited;
  for (const auto& n : file.names()) {
    const auto bytes = file.bytes(n);
    std::vector<std::byte> data(bytes.begin(), bytes.end());
    if (n == fc1)
      for (auto& b : data) b = std::byte(std::int8_t(std::int8_t(b) / 2));
    edited.add(n, file.info(n).dtype, file.info(n).shape, data.data());
  }
  const SafeTensors st = SafeTensors::parse(edited.serialize(), "edited.safetensors");
  defer_parameters(loaded, st);  // the matrices read from the file when needed

  Cpu int8({.int8 = true}), fp32;
  const WeightCopies saved(int8, loaded);
  const float* w = nullptr;
  loaded.visit([&](std::string_view name, auto& v, auto&) {
    if (name == fc1) w = v.product_data();  // the lent matrix's address: its copy, made from the file's rows
  });
  BOOST_TEST_REQUIRE(w != nullptr);
  const int N = Small::D_FF, K = Small::D_MODEL;
  const auto x = randn(std::size_t(K), 21);
  std::vector<float> y(std::size_t(N), 0.0f);
  int8.gemm(false, true, 1, N, K, 1.0f, x.data(), K, w, K, 0.0f, y.data(), N);
  BOOST_TEST(int8.weight_copy_bytes() == detail::Int8Products::copy_bytes(N, K));  // this matrix's alone so far
  const auto q = st.bytes(fc1);
  std::vector<std::int8_t> file_q(q.size());
  std::transform(q.begin(), q.end(), file_q.begin(), [](std::byte b) { return std::int8_t(b); });
  BOOST_TEST(y == formula(file_q, st.values<float>(fc1 + kScaleSuffix), x.data(), 1, N, K),
             boost::test_tools::per_element());

  // A whole forward pass in int8 against float32 on the same (dequantised)
  // weights: only the activations' rounding apart.
  const std::vector<std::int32_t> ids = {1, 5, 9, 2, 7, 3, 8, 4, 6, 0, 11, 12, 1, 2, 3, 4,
                                         5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const auto a = loaded.forward(int8, ids, Shape{2, Small::MAX_T});
  const std::vector<float> from_int8(a.begin(), a.end());
  const auto b = loaded.forward(fp32, ids, Shape{2, Small::MAX_T});
  const std::vector<float> from_fp32(b.begin(), b.end());
  double diff = 0, size = 0;
  for (std::size_t i = 0; i < from_fp32.size(); ++i) {
    diff = std::max(diff, double(std::fabs(from_int8[i] - from_fp32[i])));
    size = std::max(size, double(std::fabs(from_fp32[i])));
  }
  BOOST_TEST_MESSAGE("int8 logits within " << diff << " of float32's (largest " << size << ")");
  BOOST_TEST(diff > 0.0);
  BOOST_TEST(diff < 0.05 * size);

  Generator<Decoder<Small, Cpu>, Cpu> cached(loaded, int8), recomputed(loaded, int8);
  Rng unused(3);
  const GenerateOptions greedy{.sampling = {.temperature = 0}, .max_tokens = Small::MAX_T - 3};
  GenerateOptions plain = greedy;
  plain.use_cache = false;
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  BOOST_TEST(cached(prompt, greedy, unused) == recomputed(prompt, plain, unused), boost::test_tools::per_element());
  std::size_t bytes = 0;  // every matrix a product reads (the position table is only looked up)
  loaded.visit([&](std::string_view name, auto& v, auto&) {
    if (v.shape().size() == 2 && !name.starts_with("pos_emb"))
      bytes += detail::Int8Products::copy_bytes(int(v.dim(0)), int(v.dim(1)));
  });
  BOOST_TEST(int8.weight_copy_bytes() == bytes);  // still the file's rows, now every matrix's
}

// int8 is for decoding: a training run refuses it, a CUDA backend too.
BOOST_AUTO_TEST_CASE(training_refuses_int8) {
  BOOST_CHECK_NO_THROW(check_precision_name("int8"));
  BOOST_CHECK_THROW(check_training_precision("int8", "--precision"), Error);
  BOOST_CHECK_NO_THROW(check_training_precision("bf16"));
  BOOST_TEST(describe(make_backend<Cpu>("cpu", "int8")) == "cpu (int8 weights)");
  BOOST_TEST(precision_of(make_backend<Cpu>("cpu", "int8")) == "int8");
  BOOST_CHECK_THROW(CpuBackend<double>({.int8 = true}), Error);
}

// check_backend: what make_backend would refuse, found with the options.
BOOST_AUTO_TEST_CASE(backend_and_precision_are_checked_together) {
  const auto error = [](std::string_view name, std::string_view precision) {
    try {
      check_backend(name, precision, "--backend", "--precision");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BOOST_TEST(error("cpu", "int8") == "");
  BOOST_TEST(error("cpu", "bf16") == "");
  BOOST_TEST(error("gpu", "fp32") == "unknown --backend 'gpu' (expected cpu, cuda, cuda-tf32 or cuda-bf16)");
  BOOST_TEST(error("cuda", "int8") == "--precision int8 runs on the CPU backend (not --backend cuda)");
  BOOST_TEST(error("cuda-bf16", "int8") == "--precision int8 runs on the CPU backend (not --backend cuda-bf16)");
  BOOST_TEST(error("cuda-tf32", "bf16") == "--precision bf16 goes with --backend cpu, cuda or cuda-bf16 (not cuda-tf32)");
  // A CUDA name with no GPU to run it: refused before a model is loaded.
#ifdef XFMR_WITH_CUDA
  if (cuda::device_count() == 0)
    BOOST_TEST(error("cuda", "fp32").starts_with("--backend cuda: no usable CUDA device"));
  else
    BOOST_TEST(error("cuda", "bf16") == "");
#else
  BOOST_TEST(error("cuda", "fp32") == "--backend cuda: this xfmr was built without CUDA (CMake found no CUDA compiler)");
#endif
}

BOOST_AUTO_TEST_SUITE_END()
