// int8 precision on the CPU (CpuOptions::int8, backend/cpu/int8_products.hpp):
// per-row quantisation within its bound on random and adversarial rows;
// products through the int8 copies equal their documented sum order
// recomputed lane by lane, bit for bit, and lie within the
// quantisation bound of float32's on the original weights; products of
// other operands untouched; decoding through the KV cache gives the tokens
// of recomputing the context; training refuses the precision.
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * float(rng.normal());
  return v;
}

// C (M, N) = A (M, K) W^T through the backend, as a linear layer multiplies.
std::vector<float> product(Cpu& be, const std::vector<float>& A, const std::vector<float>& W, int M, int N, int K) {
  std::vector<float> C(std::size_t(M) * N, -1.0f);
  be.gemm(false, true, M, N, K, 1.0f, A.data(), K, W.data(), K, 0.0f, C.data(), N);
  return C;
}

#ifdef XFMR_SIMD_ROWS
// gemm_rows_int8's documented order, lane by lane (std::fma is the vector
// multiply-add's rounding): per row one accumulator over the sixteen-column
// blocks in order, the tail last, then sum16 over each block of sixteen
// rows, times the row's scale.
std::vector<float> documented_order(const std::vector<std::int8_t>& q, const std::vector<float>& scale,
                                    const float* x, int N, int K) {
  std::vector<float> y(std::size_t(N + 16));
  for (int r0 = 0; r0 < N; r0 += 16) {
    __m512 acc[16];
    float s[16] = {};
    for (int r = 0; r < 16; ++r) {
      float a[16] = {};
      if (r0 + r < N) {
        s[r] = scale[std::size_t(r0 + r)];
        const std::int8_t* qr = q.data() + std::size_t(r0 + r) * K;
        for (int k = 0; k < K; k += 16)
          for (int l = 0; l < 16 && k + l < K; ++l) a[l] = std::fma(float(qr[k + l]), x[k + l], a[l]);
      }
      acc[r] = _mm512_loadu_ps(a);
    }
    _mm512_storeu_ps(y.data() + r0, _mm512_mul_ps(detail::sum16(acc), _mm512_loadu_ps(s)));
  }
  y.resize(std::size_t(N));
  return y;
}
#endif

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

// A kept weight: every row of A (one row as in decoding, several as in
// beam search) against it equals the documented order's sum, and lies within sum_k |a_k|
// scale_r / 2 (plus float32's rounding) of the product with the original
// weights. A product of anything else is float32's, bit for bit.
BOOST_AUTO_TEST_CASE(products_read_the_int8_rows) {
  const int N = 37, K = 90;  // a partial block of rows; five 16-column steps and a tail
  const auto W = randn(std::size_t(N) * K, 4, 0.05f);
  std::vector<std::int8_t> q(W.size());
  std::vector<float> scale(N), integers(W.size());
  for (int r = 0; r < N; ++r) scale[r] = detail::quantise_row_int8(W.data() + r * K, K, q.data() + r * K);
  for (std::size_t i = 0; i < q.size(); ++i) integers[i] = float(q[i]);
  Cpu int8({.int8 = true}), fp32;
  int8.keep_weight_copy(W.data(), N, K);
  BOOST_TEST(int8.weight_copy_bytes() == W.size() + N * sizeof(float));
  for (int M : {1, 5, 20}) {  // 20: past kRowKernelRows, the rows widened to float32 (one tile here)
    const auto A = randn(std::size_t(M) * K, 5 + M);
    const auto got = product(int8, A, W, M, N, K), exact = product(fp32, A, W, M, N, K);
    for (int m = 0; m < M; ++m) {
      for (int r = 0; r < N; ++r) {
        double bound = 0;
        for (int k = 0; k < K; ++k) bound += std::fabs(A[m * K + k]) * scale[r] / 2;
        BOOST_TEST(std::fabs(got[m * N + r] - exact[m * N + r]) <= bound + 1e-5);
      }
#ifdef XFMR_SIMD_ROWS
      if (M <= detail::Int8Products::kRowKernelRows) {
        const auto y = documented_order(q, scale, A.data() + m * K, N, K);
        for (int r = 0; r < N; ++r) BOOST_TEST(got[m * N + r] == y[r]);
      }
#endif
    }
    if (M > detail::Int8Products::kRowKernelRows || !detail::kSimdRows) {
      std::vector<float> widened(W.size());
      for (std::size_t i = 0; i < W.size(); ++i) widened[i] = scale[i / K] * integers[i];
      BOOST_TEST(got == product(fp32, A, widened, M, N, K), boost::test_tools::per_element());
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

// A product of many rows over more weight rows than a tile widens at a
// time: each tile's columns are float32's product on its dequantised rows.
BOOST_AUTO_TEST_CASE(many_rows_widen_a_tile_at_a_time) {
  const int K = 96, tile = int(detail::Int8Products::kWidenBytes / sizeof(float) / K) / 16 * 16;
  const int N = 2 * tile + 40, M = 12;
  const auto W = randn(std::size_t(N) * K, 6, 0.05f);
  std::vector<float> widened(W.size());
  std::vector<std::int8_t> q(std::size_t(K), 0);
  for (int r = 0; r < N; ++r) {
    const float scale = detail::quantise_row_int8(W.data() + std::size_t(r) * K, K, q.data());
    for (int k = 0; k < K; ++k) widened[std::size_t(r) * K + k] = scale * float(q[std::size_t(k)]);
  }
  Cpu int8({.int8 = true}), fp32;
  int8.keep_weight_copy(W.data(), N, K);
  const auto A = randn(std::size_t(M) * K, 7);
  const auto got = product(int8, A, W, M, N, K);
  for (int n0 = 0; n0 < N; n0 += tile) {
    const int rows = std::min(tile, N - n0);
    const std::vector<float> part(widened.begin() + std::ptrdiff_t(n0) * K, widened.begin() + std::ptrdiff_t(n0 + rows) * K);
    const auto want = product(fp32, A, part, M, rows, K);
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < rows; ++r) BOOST_TEST_REQUIRE(got[std::size_t(m) * N + n0 + r] == want[std::size_t(m) * rows + r]);
  }
}

// Decoding in int8: greedy tokens through the KV cache are those of
// recomputing the whole context while the context has at most
// kRowKernelRows tokens (then both read the int8 rows in the same order;
// longer recomputed contexts take the widened path, other float32 sums),
// and the tokens are reported against float32's.
BOOST_AUTO_TEST_CASE(cached_decoding_equals_recomputed_decoding) {
  Cpu int8({.int8 = true}), fp32;
  Decoder<Small, Cpu> model(40, 11, {.tie_weights = true});
  Generator<Decoder<Small, Cpu>, Cpu> cached(model, int8), recomputed(model, int8), reference(model, fp32);
  Rng unused(3);
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  const GenerateOptions greedy{.sampling = {.temperature = 0}, .max_tokens = detail::Int8Products::kRowKernelRows - 3};
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
// its own rows: WeightCopies opened with its file keeps them as they are,
// so a single row's product is the documented sum over the file's q and
// scales, a product of many rows equals float32's on the loaded
// (dequantised) weights bit for bit (each matrix one tile), and
// generation's own scope, nested,
// leaves them in place.
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
  load_parameters(loaded, st);

  Cpu int8({.int8 = true}), fp32;
  const WeightCopies saved(int8, loaded, st);
  std::size_t bytes = 0;
  loaded.visit([&](std::string_view, auto& v, auto&) {
    if (v.shape().size() == 2) bytes += v.size() + std::size_t(v.dim(0)) * sizeof(float);
  });
  BOOST_TEST(int8.weight_copy_bytes() == bytes);

  const float* w = nullptr;
  loaded.visit([&](std::string_view name, auto& v, auto&) {
    if (name == fc1) w = v.data();
  });
  BOOST_TEST_REQUIRE(w != nullptr);
  const int N = Small::D_FF, K = Small::D_MODEL;
  const auto x = randn(std::size_t(K), 21);
  std::vector<float> y(std::size_t(N), 0.0f);
  int8.gemm(false, true, 1, N, K, 1.0f, x.data(), K, w, K, 0.0f, y.data(), N);
#ifdef XFMR_SIMD_ROWS
  const auto q = st.bytes(fc1);
  std::vector<std::int8_t> file_q(q.size());
  std::transform(q.begin(), q.end(), file_q.begin(), [](std::byte b) { return std::int8_t(b); });
  BOOST_TEST(y == documented_order(file_q, st.values<float>(fc1 + kScaleSuffix), x.data(), N, K),
             boost::test_tools::per_element());
#endif

  const std::vector<std::int32_t> ids = {1, 5, 9, 2, 7, 3, 8, 4, 6, 0, 11, 12, 1, 2, 3, 4,
                                         5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const auto a = loaded.forward(int8, ids, Shape{2, Small::MAX_T});
  const std::vector<float> from_int8(a.begin(), a.end());
  const auto b = loaded.forward(fp32, ids, Shape{2, Small::MAX_T});
  BOOST_TEST(from_int8 == std::vector<float>(b.begin(), b.end()), boost::test_tools::per_element());

  Generator<Decoder<Small, Cpu>, Cpu> cached(loaded, int8), recomputed(loaded, int8);
  Rng unused(3);
  const GenerateOptions greedy{.sampling = {.temperature = 0}, .max_tokens = detail::Int8Products::kRowKernelRows - 3};
  GenerateOptions plain = greedy;
  plain.use_cache = false;
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  BOOST_TEST(cached(prompt, greedy, unused) == recomputed(prompt, plain, unused), boost::test_tools::per_element());
  BOOST_TEST(int8.weight_copy_bytes() == bytes);  // still the file's rows
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
