// CudaBackend against CpuBackend<float>: every backend operation, the layers,
// the blocks and the models (forward outputs, input gradients, parameter
// gradients, an AdamW step, cached decoding), on fresh random inputs.
//
// Needs a GPU: without one the program exits with 77, which ctest reports as
// skipped (SKIP_RETURN_CODE), so CPU-only CI stays green.
//
// Tolerances: float32 on both sides, different summation orders. Elementwise
// operations agree to a few ulp (rtol 1e-5); reductions and GEMMs to rtol
// 1e-4; whole models to rtol 2e-3 / atol 2e-4 (errors grow through the
// layers). With TF32 GEMMs (CudaOptions::tf32) rtol 2e-2 (10-bit mantissa).
#define BOOST_TEST_MODULE cuda_parity
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "support/configs.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/kv_cache.hpp"
#include "xfmr/layers/attention.hpp"
#include "xfmr/layers/feed_forward.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/linear.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/encoder.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/train/gradients.hpp"
#include "xfmr/train/losses.hpp"
#include "xfmr/train/optimizers.hpp"

using namespace xfmr;
using namespace xfmr::test;

namespace {

using Cpu = CpuBackend<float>;
using Gpu = CudaBackend;
using F = std::vector<float>;

F randn(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  F v(n);
  for (auto& x : v) x = float(scale * r.normal());
  return v;
}

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& i : ids) i = static_cast<std::int32_t>(r.below(vocab));
  return ids;
}

// A device copy of host data, and back.
template <class T>
struct Dev {
  cuda::DeviceArray<T> a;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) { cuda::upload(a.reserve(n), h.data(), n * sizeof(T)); }
  explicit Dev(std::size_t size) : n(size) { a.reserve(n); }
  T* p() { return a.data(); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cuda::download(h.data(), a.data(), n * sizeof(T));
    return h;
  }
};
using DevF = Dev<float>;

void expect_close(const F& cpu, const F& gpu, const std::string& what, double rtol = 1e-5, double atol = 1e-6) {
  BOOST_REQUIRE_EQUAL(cpu.size(), gpu.size());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    BOOST_REQUIRE_MESSAGE(std::isfinite(gpu[i]), what << ": element " << i << " is " << gpu[i] << " on the GPU");
    const double excess = std::abs(double(cpu[i]) - double(gpu[i])) - (atol + rtol * std::abs(double(cpu[i])));
    if (excess > worst) worst = excess, at = i;
  }
  BOOST_TEST(worst == 0.0, what << ": element " << at << " of " << cpu.size() << ": cpu " << cpu[at] << ", gpu "
                                << gpu[at] << " (rtol " << rtol << ", atol " << atol << ")");
}

// name -> host copy of every parameter value (or gradient) of a model.
template <class Model>
std::map<std::string, F> tensors_of(Model& m, bool grads) {
  std::map<std::string, F> out;
  m.visit([&](std::string_view name, auto& value, auto& grad) {
    auto& t = grads ? grad : value;
    F h(t.size());
    t.copy_to_host(h.data());
    out[std::string(name)] = std::move(h);
  });
  return out;
}

template <class CpuModel, class GpuModel>
void expect_same_tensors(CpuModel& c, GpuModel& g, bool grads, const std::string& what, double rtol, double atol) {
  const auto a = tensors_of(c, grads), b = tensors_of(g, grads);
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (const auto& [name, values] : a) {
    BOOST_REQUIRE_MESSAGE(b.count(name), what << ": the GPU model has no '" << name << "'");
    expect_close(values, b.at(name), what + (grads ? " d" : " ") + name, rtol, atol);
  }
}

template <class Model>
void zero_grads(Model& m) {
  m.visit([](std::string_view, auto&, auto& g) { g.zero(); });
}

struct Backends {
  Cpu cpu;
  Gpu gpu;
};

}  // namespace

int main(int argc, char** argv) {
  if (cuda::device_count() == 0) {
    std::cout << "test_cuda_parity: no CUDA device; skipped\n";
    return 77;  // ctest SKIP_RETURN_CODE
  }
  std::cout << "test_cuda_parity on " << cuda::device_name(0) << "\n";
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}

// ---- every backend operation ------------------------------------------------

BOOST_FIXTURE_TEST_SUITE(operations, Backends)

BOOST_AUTO_TEST_CASE(gemm_all_transposes_strides_and_beta) {
  const int M = 37, N = 29, K = 53;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
      F A = randn(std::size_t(a_rows) * lda, 1), B = randn(std::size_t(b_rows) * ldb, 2), C = randn(std::size_t(M) * ldc, 3);
      DevF dA(A), dB(B), dC(C);
      cpu.gemm(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.5f, C.data(), ldc);
      gpu.gemm(ta, tb, M, N, K, 0.7f, dA.p(), lda, dB.p(), ldb, 0.5f, dC.p(), ldc);
      expect_close(C, dC.host(), "gemm ta " + std::to_string(ta) + " tb " + std::to_string(tb), 1e-4, 1e-5);
    }
}

BOOST_AUTO_TEST_CASE(bias_add_and_grad) {
  const int n = 70;
  for (int rows : {45, 1024, 1500}) {  // one pass, and several chunks, of the column sums
    F y = randn(rows * n, 4), bias = randn(n, 5), dbias = randn(n, 6);
    DevF dy_(y), db(bias), ddb(dbias);
    cpu.bias_add(rows, n, bias.data(), y.data());
    gpu.bias_add(rows, n, db.p(), dy_.p());
    expect_close(y, dy_.host(), "bias_add");
    cpu.bias_grad(rows, n, y.data(), dbias.data());
    gpu.bias_grad(rows, n, dy_.p(), ddb.p());
    expect_close(dbias, ddb.host(), "bias_grad rows " + std::to_string(rows), 1e-4, 1e-5);
  }
}

BOOST_AUTO_TEST_CASE(add_add_to_copy_scale) {
  const std::size_t n = 100003;
  F a = randn(n, 7), b = randn(n, 8), y(n);
  DevF da(a), db(b), dy(n);
  cpu.add(n, a.data(), b.data(), y.data());
  gpu.add(n, da.p(), db.p(), dy.p());
  expect_close(y, dy.host(), "add");
  cpu.add_to(n, a.data(), y.data());
  gpu.add_to(n, da.p(), dy.p());
  expect_close(y, dy.host(), "add_to");
  cpu.copy(n, b.data(), y.data());
  gpu.copy(n, db.p(), dy.p());
  expect_close(y, dy.host(), "copy", 0, 0);
  cpu.scale(n, 0.3f, y.data());
  gpu.scale(n, 0.3f, dy.p());
  expect_close(y, dy.host(), "scale");
  BOOST_TEST(std::abs(cpu.sum_squares(n, a.data()) - gpu.sum_squares(n, da.p())) <= 1e-9 * cpu.sum_squares(n, a.data()));
}

BOOST_AUTO_TEST_CASE(positions_forward_backward) {
  const int B = 3, T = 11, D = 24;
  F x = randn(B * T * D, 9), table = randn(T * D, 10), y(B * T * D), dtable = randn(T * D, 11);
  DevF dx(x), dt(table), dy(y.size()), ddt(dtable);
  cpu.add_positions_forward(B, T, D, x.data(), table.data(), y.data());
  gpu.add_positions_forward(B, T, D, dx.p(), dt.p(), dy.p());
  expect_close(y, dy.host(), "add_positions_forward");
  cpu.add_positions_backward(B, T, D, x.data(), dtable.data());
  gpu.add_positions_backward(B, T, D, dx.p(), ddt.p());
  expect_close(dtable, ddt.host(), "add_positions_backward", 1e-5, 1e-6);
}

BOOST_AUTO_TEST_CASE(layer_norm_forward_backward) {
  for (auto [rows, n] : {std::pair{33, 24}, {33, 200}, {33, 768}, {600, 200}, {1300, 100}}) {
    F x = randn(rows * n, 12, 2.0), g = randn(n, 13), b = randn(n, 14), y(rows * n), mean(rows), rstd(rows);
    DevF dx(x), dg(g), db(b), dy(y.size()), dmean(rows), drstd(rows);
    cpu.layer_norm_forward(rows, n, x.data(), g.data(), b.data(), 1e-5f, y.data(), mean.data(), rstd.data());
    gpu.layer_norm_forward(rows, n, dx.p(), dg.p(), db.p(), 1e-5f, dy.p(), dmean.p(), drstd.p());
    expect_close(y, dy.host(), "layer_norm_forward y", 1e-4, 1e-5);
    expect_close(rstd, drstd.host(), "layer_norm_forward rstd", 1e-4, 1e-6);
    F up = randn(rows * n, 15), gin(rows * n), dgam = randn(n, 16), dbet = randn(n, 17);
    DevF dup(up), dgin(gin.size()), ddgam(dgam), ddbet(dbet);
    cpu.layer_norm_backward(rows, n, up.data(), x.data(), g.data(), mean.data(), rstd.data(), gin.data(), dgam.data(),
                            dbet.data());
    gpu.layer_norm_backward(rows, n, dup.p(), dx.p(), dg.p(), dmean.p(), drstd.p(), dgin.p(), ddgam.p(), ddbet.p());
    expect_close(gin, dgin.host(), "layer_norm_backward dx", 1e-4, 1e-5);
    expect_close(dgam, ddgam.host(), "layer_norm_backward dgamma", 1e-4, 1e-5);
    expect_close(dbet, ddbet.host(), "layer_norm_backward dbeta", 1e-4, 1e-5);
  }
}

BOOST_AUTO_TEST_CASE(masked_softmax_forward_backward) {
  const int B = 2, H = 3, Tq = 5, Tk = 40;
  std::vector<std::uint8_t> pad(B * Tk, 0);
  for (int j = 30; j < Tk; ++j) pad[Tk + j] = 1;  // sequence 1: 10 padded keys
  for (bool causal : {false, true}) {
    const AttentionMask mask{causal, pad.data()};
    const std::size_t n = std::size_t(B) * H * Tq * Tk;
    F s = randn(n, 18, 3.0), p(n);
    DevF ds(s), dp(n);
    cpu.softmax_forward(B, H, Tq, Tk, s.data(), p.data(), mask);
    gpu.softmax_forward(B, H, Tq, Tk, ds.p(), dp.p(), mask);
    expect_close(p, dp.host(), causal ? "softmax causal+padding" : "softmax padding", 1e-5, 1e-7);
    F up = randn(n, 19), gs(n);
    DevF dup(up), dgs(n);
    cpu.softmax_backward(B * H * Tq, Tk, p.data(), up.data(), gs.data());
    gpu.softmax_backward(B * H * Tq, Tk, dp.p(), dup.p(), dgs.p());
    expect_close(gs, dgs.host(), "softmax_backward", 1e-4, 1e-6);
  }
  // A row with every key masked gives zeros, not NaN.
  std::vector<std::uint8_t> all(Tk, 1);
  F s = randn(Tk, 20);
  DevF ds(s), dp(Tk);
  gpu.softmax_forward(1, 1, 1, Tk, ds.p(), dp.p(), AttentionMask{false, all.data()});
  expect_close(F(Tk, 0.0f), dp.host(), "softmax all masked", 0, 0);
}

BOOST_AUTO_TEST_CASE(activations) {
  const std::size_t n = 70001;
  F x = randn(n, 21, 3.0), y(n), up = randn(n, 22), dx(n);
  DevF d_x(x), d_y(n), d_up(up), d_dx(n);
  cpu.relu_forward(n, x.data(), y.data());
  gpu.relu_forward(n, d_x.p(), d_y.p());
  expect_close(y, d_y.host(), "relu_forward", 0, 0);
  cpu.relu_backward(n, x.data(), up.data(), dx.data());
  gpu.relu_backward(n, d_x.p(), d_up.p(), d_dx.p());
  expect_close(dx, d_dx.host(), "relu_backward", 0, 0);
  cpu.gelu_forward(n, x.data(), y.data());
  gpu.gelu_forward(n, d_x.p(), d_y.p());
  expect_close(y, d_y.host(), "gelu_forward", 1e-5, 1e-6);
  cpu.gelu_backward(n, x.data(), up.data(), dx.data());
  gpu.gelu_backward(n, d_x.p(), d_up.p(), d_dx.p());
  expect_close(dx, d_dx.host(), "gelu_backward", 1e-5, 1e-6);
}

BOOST_AUTO_TEST_CASE(dropout_masks_are_identical) {
  const std::size_t n = 50000;
  F x = randn(n, 23), y(n), up = randn(n, 24), dx(n);
  std::vector<std::uint8_t> keep(n);
  DevF d_x(x), d_y(n), d_up(up), d_dx(n);
  Dev<std::uint8_t> d_keep(n);
  cpu.dropout_forward(n, 0.3f, 0xabcdefULL, x.data(), y.data(), keep.data());
  gpu.dropout_forward(n, 0.3f, 0xabcdefULL, d_x.p(), d_y.p(), d_keep.p());
  BOOST_TEST(keep == d_keep.host());  // the counter-based draw: same bits on both
  expect_close(y, d_y.host(), "dropout_forward");
  cpu.dropout_backward(n, 0.3f, keep.data(), up.data(), dx.data());
  gpu.dropout_backward(n, 0.3f, d_keep.p(), d_up.p(), d_dx.p());
  expect_close(dx, d_dx.host(), "dropout_backward");
  BOOST_CHECK_THROW(gpu.dropout_forward(n, 1.0f, 1, d_x.p(), d_y.p(), d_keep.p()), Error);
}

BOOST_AUTO_TEST_CASE(embedding_gather_scatter_and_bad_ids) {
  const int n = 300, V = 50, D = 40;
  auto ids = random_ids(n, V, 25);  // many repeats: the scatter-add sums them
  F table = randn(V * D, 26), y(n * D), up = randn(n * D, 27), dtable = randn(V * D, 28);
  DevF d_table(table), d_y(y.size()), d_up(up), d_dtable(dtable);
  cpu.embedding_forward(n, V, D, ids.data(), table.data(), y.data());
  gpu.embedding_forward(n, V, D, ids.data(), d_table.p(), d_y.p());
  expect_close(y, d_y.host(), "embedding_forward", 0, 0);
  // Each entry adds its rows in input order on both backends: equal bits.
  cpu.embedding_backward(n, D, ids.data(), up.data(), dtable.data());
  gpu.embedding_backward(n, D, ids.data(), d_up.p(), d_dtable.p());
  expect_close(dtable, d_dtable.host(), "embedding_backward", 0, 0);
  {  // wider rows than one block of threads, ids far apart
    const int wide = 300, big_v = 5000;
    auto sparse = random_ids(n, big_v, 29);
    F up_w = randn(n * wide, 30), dt_w = randn(std::size_t(big_v) * wide, 31);
    DevF d_up_w(up_w), d_dt_w(dt_w);
    cpu.embedding_backward(n, wide, sparse.data(), up_w.data(), dt_w.data());
    gpu.embedding_backward(n, wide, sparse.data(), d_up_w.p(), d_dt_w.p());
    expect_close(dt_w, d_dt_w.host(), "embedding_backward wide", 0, 0);
  }
  ids[7] = V;
  try {
    gpu.embedding_forward(n, V, D, ids.data(), d_table.p(), d_y.p());
    BOOST_FAIL("out-of-range id accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "token id 50 at position 7 out of range [0, 50)");
  }
}

BOOST_AUTO_TEST_CASE(mean_pool_forward_backward) {
  const int B = 4, T = 9, D = 16;
  std::vector<std::uint8_t> exclude(B * T, 0);
  for (int t = 5; t < T; ++t) exclude[T + t] = 1;
  for (int t = 0; t < T; ++t) exclude[2 * T + t] = 1;  // nothing counted: zeros
  const std::uint8_t* none = nullptr;
  const std::uint8_t* some = exclude.data();
  for (const std::uint8_t* ex : {none, some}) {
    F x = randn(B * T * D, 29), y(B * D), up = randn(B * D, 30), dx(B * T * D);
    DevF d_x(x), d_y(y.size()), d_up(up), d_dx(dx.size());
    cpu.mean_pool_forward(B, T, D, x.data(), ex, y.data());
    gpu.mean_pool_forward(B, T, D, d_x.p(), ex, d_y.p());
    expect_close(y, d_y.host(), "mean_pool_forward");
    cpu.mean_pool_backward(B, T, D, up.data(), ex, dx.data());
    gpu.mean_pool_backward(B, T, D, d_up.p(), ex, d_dx.p());
    expect_close(dx, d_dx.host(), "mean_pool_backward");
  }
}

BOOST_AUTO_TEST_CASE(cross_entropy_with_ignore_and_smoothing) {
  for (int V : {7, 65, 5000}) {
    const int rows = 37;
    F logits = randn(rows * V, 31, 2.0), probs(rows * V), dlogits(rows * V);
    auto targets = random_ids(rows, V, 32);
    targets[3] = targets[20] = kIgnoreIndex;
    DevF d_logits(logits), d_probs(probs.size()), d_dlogits(dlogits.size());
    for (float smoothing : {0.0f, 0.1f}) {
      const double lc = cpu.cross_entropy_forward(rows, V, logits.data(), targets.data(), kIgnoreIndex, probs.data(), smoothing);
      const double lg = gpu.cross_entropy_forward(rows, V, d_logits.p(), targets.data(), kIgnoreIndex, d_probs.p(), smoothing);
      BOOST_TEST(std::abs(lc - lg) <= 1e-5 * std::abs(lc), "loss V " << V << ": cpu " << lc << ", gpu " << lg);
      expect_close(probs, d_probs.host(), "cross_entropy probs", 1e-4, 1e-7);
      cpu.cross_entropy_backward(rows, V, probs.data(), targets.data(), kIgnoreIndex, 0.5f, dlogits.data(), smoothing);
      gpu.cross_entropy_backward(rows, V, d_probs.p(), targets.data(), kIgnoreIndex, 0.5f, d_dlogits.p(), smoothing);
      expect_close(dlogits, d_dlogits.host(), "cross_entropy_backward", 1e-4, 1e-7);
    }
    targets[0] = V;
    BOOST_CHECK_THROW(gpu.cross_entropy_forward(rows, V, d_logits.p(), targets.data(), kIgnoreIndex, d_probs.p()), Error);
  }
}

BOOST_AUTO_TEST_CASE(optimizer_updates) {
  // 40 tensors (two launches of up to 32), sizes from 0 to past a block's
  // 1024 values, each with its own decay; then one large tensor.
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < 40; ++k) sizes.push_back(k * 53 % 1500);
  sizes.push_back(10007);
  std::vector<F> p, g, m, v;
  std::vector<DevF> dp, dg, dm, dv;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t n = sizes[k];
    p.push_back(randn(n, 33 + 4 * k));
    g.push_back(randn(n, 34 + 4 * k));
    m.push_back(randn(n, 35 + 4 * k, 0.1));
    v.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) v[k][i] = float(0.01 * (1 + i % 7));
    dp.emplace_back(p[k]), dg.emplace_back(g[k]), dm.emplace_back(m[k]), dv.emplace_back(v[k]);
  }
  std::vector<AdamWTensor<float>> on_cpu, on_gpu;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const float decay = k % 3 ? 0.01f : 0.0f;
    on_cpu.push_back({sizes[k], p[k].data(), g[k].data(), m[k].data(), v[k].data(), decay});
    on_gpu.push_back({sizes[k], dp[k].p(), dg[k].p(), dm[k].p(), dv[k].p(), decay});
  }
  for (int step = 1; step <= 3; ++step) {
    const float bc1 = 1 - std::pow(0.9f, step), bc2 = 1 - std::pow(0.999f, step);
    cpu.adamw_step(std::span<const AdamWTensor<float>>(on_cpu), 1e-3f, 0.9f, 0.999f, 1e-8f, bc1, bc2);
    gpu.adamw_step(std::span<const AdamWTensor<float>>(on_gpu), 1e-3f, 0.9f, 0.999f, 1e-8f, bc1, bc2);
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::string t = " tensor " + std::to_string(k);
    expect_close(p[k], dp[k].host(), "adamw p" + t, 1e-5, 1e-6);
    expect_close(m[k], dm[k].host(), "adamw m" + t, 1e-5, 1e-7);
    expect_close(v[k], dv[k].host(), "adamw v" + t, 1e-5, 1e-8);
  }
  const std::size_t n = sizes.back();
  F p1 = p.back(), g1 = g.back();
  DevF dp1(p1), dg1(g1);
  F buf(n);
  DevF dbuf(n);
  cpu.sgd_step(n, p1.data(), g1.data(), buf.data(), 0.1f, 0.9f, 1e-4f);
  gpu.sgd_step(n, dp1.p(), dg1.p(), dbuf.p(), 0.1f, 0.9f, 1e-4f);
  expect_close(p1, dp1.host(), "sgd p", 1e-5, 1e-6);
  expect_close(buf, dbuf.host(), "sgd buffer", 1e-5, 1e-6);
}

BOOST_AUTO_TEST_CASE(attention_forward_backward) {
  // Interleaved q|k|v columns (as SelfAttention's fused projection leaves
  // them). Shapes for both paths: the fused kernels (up to 32 keys, up to
  // 256 keys) and cuBLAS (more keys, or heads over 128 wide).
  struct Shape {
    int T, QK, VD;
  };
  for (const Shape sh : {Shape{13, 8, 6}, Shape{40, 16, 16}, Shape{300, 8, 6}, Shape{20, 130, 6}}) {
    const int B = 3, H = 4, T = sh.T, QK = sh.QK, VD = sh.VD, ld = H * (2 * QK + VD);
    const std::string what = " T " + std::to_string(T) + " QK " + std::to_string(QK);
    std::vector<std::uint8_t> pad(B * T, 0);
    for (int j = 2 * T / 3; j < T; ++j) pad[2 * T + j] = 1;  // sequence 2: padded tail
    for (bool causal : {false, true}) {
      for (bool all_masked : {false, true}) {
        if (all_masked) std::fill(pad.begin() + T, pad.begin() + 2 * T, 1);  // sequence 1: no visible key
        const AttentionDims dims{B, H, T, T, QK, VD, 0};
        const AttentionMask mask{causal, pad.data()};
        F qkv = randn(std::size_t(B) * T * ld, 36), y(std::size_t(B) * T * H * VD), probs(std::size_t(B) * H * T * T);
        DevF d_qkv(qkv), d_y(y.size()), d_probs(probs.size());
        const float* q = qkv.data();
        cpu.attention_forward(dims, q, ld, q + H * QK, ld, q + 2 * H * QK, ld, y.data(), H * VD, probs.data(), mask);
        const float* dq = d_qkv.p();
        gpu.attention_forward(dims, dq, ld, dq + H * QK, ld, dq + 2 * H * QK, ld, d_y.p(), H * VD, d_probs.p(), mask);
        expect_close(y, d_y.host(), "attention_forward y" + what, 1e-4, 1e-5);
        expect_close(probs, d_probs.host(), "attention_forward probs" + what, 1e-4, 1e-6);

        F up = randn(y.size(), 37), g(qkv.size());
        DevF d_up(up), d_g(g.size());
        cpu.attention_backward(dims, up.data(), H * VD, q, ld, q + H * QK, ld, q + 2 * H * QK, ld, probs.data(),
                               g.data(), g.data() + H * QK, g.data() + 2 * H * QK);
        float* dg = d_g.p();
        gpu.attention_backward(dims, d_up.p(), H * VD, dq, ld, dq + H * QK, ld, dq + 2 * H * QK, ld, d_probs.p(), dg,
                               dg + H * QK, dg + 2 * H * QK);
        expect_close(g, d_g.host(), std::string(causal ? "attention_backward causal" : "attention_backward") + what,
                     1e-4, 1e-5);
      }
      std::fill(pad.begin() + T, pad.begin() + 2 * T, 0);
    }
  }
  // Keys and values in a cache of capacity 20 rows per sequence, 13 filled;
  // one or three new query rows per sequence (decoding steps), causal, with
  // and without padded keys.
  const int B = 3, H = 4, T = 13, QK = 8, VD = 6, CAP = 20;
  std::vector<std::uint8_t> pad(B * T, 0);
  pad[T + 2] = pad[T + 5] = 1;
  const std::uint8_t* no_padding = nullptr;
  for (int Tq : {1, 3})
    for (const std::uint8_t* padding : {no_padding, static_cast<const std::uint8_t*>(pad.data())}) {
      const AttentionDims dims{B, H, Tq, T, QK, VD, CAP};
      F q = randn(std::size_t(B) * Tq * H * QK, 38), k = randn(std::size_t(B) * CAP * H * QK, 39);
      F v = randn(std::size_t(B) * CAP * H * VD, 40), y(std::size_t(B) * Tq * H * VD), probs(std::size_t(B) * H * Tq * T);
      DevF dq(q), dk(k), dv(v), d_y(y.size()), d_probs(probs.size());
      const AttentionMask mask{true, padding};
      cpu.attention_forward(dims, q.data(), H * QK, k.data(), H * QK, v.data(), H * VD, y.data(), H * VD, probs.data(),
                            mask);
      gpu.attention_forward(dims, dq.p(), H * QK, dk.p(), H * QK, dv.p(), H * VD, d_y.p(), H * VD, d_probs.p(), mask);
      const std::string what = " from a cache, Tq " + std::to_string(Tq) + (padding ? ", padded" : "");
      expect_close(y, d_y.host(), "attention_forward" + what, 1e-4, 1e-5);
      expect_close(probs, d_probs.host(), "attention_forward probs" + what, 1e-4, 1e-6);
    }
}

BOOST_AUTO_TEST_CASE(tf32_gemm_within_its_tolerance) {
  Gpu tf32({.device = 0, .tf32 = true});
  const int M = 64, N = 96, K = 256;
  F A = randn(M * K, 41), B = randn(K * N, 42), C(M * N);
  DevF dA(A), dB(B), dC(C.size());
  cpu.gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  tf32.gemm(false, false, M, N, K, 1.0f, dA.p(), K, dB.p(), N, 0.0f, dC.p(), N);
  expect_close(C, dC.host(), "TF32 gemm", 2e-2, 2e-2);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- layers, blocks and models: same seed, same weights on both -----------

namespace {

struct Small {
  static constexpr int MAX_T = 16, D_MODEL = 32, N_HEADS = 4, N_LAYERS = 2, D_FF = 64;
  using Norm = PreNorm;
  using Activation = Gelu;
};
struct SmallPost : Small {
  using Norm = PostNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};

constexpr double kLayerRtol = 5e-4, kLayerAtol = 5e-5;
constexpr double kModelRtol = 2e-3, kModelAtol = 2e-4;

// Forward x -> y, backward dy -> dx of a layer built twice from one seed.
template <class LayerC, class LayerG, class Fwd, class Bwd>
void layer_parity(const std::string& what, LayerC& lc, LayerG& lg, int rows, int width, Fwd fwd, Bwd bwd) {
  Cpu cpu;
  Gpu gpu;
  const F x = randn(std::size_t(rows) * width, 50), up = randn(std::size_t(rows) * width, 51);
  F y(x.size()), dx(x.size());
  DevF d_x(x), d_y(x.size()), d_up(up), d_dx(x.size());
  fwd(cpu, lc, x.data(), y.data());
  fwd(gpu, lg, d_x.p(), d_y.p());
  expect_close(y, d_y.host(), what + " forward", kLayerRtol, kLayerAtol);
  bwd(cpu, lc, up.data(), dx.data());
  bwd(gpu, lg, d_up.p(), d_dx.p());
  expect_close(dx, d_dx.host(), what + " input gradient", kLayerRtol, kLayerAtol);
  expect_same_tensors(lc, lg, true, what, kLayerRtol, kLayerAtol);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(layers_blocks_models)

BOOST_AUTO_TEST_CASE(linear_layer_norm_feed_forward) {
  constexpr int D = 32, rows = 20;
  {
    Rng r1(3), r2(3);
    Linear<D, D, Cpu> c(r1);
    Linear<D, D, Gpu> g(r2);
    expect_same_tensors(c, g, false, "Linear init", 0, 0);
    layer_parity("Linear", c, g, rows, D,
        [](auto& be, auto& l, const float* x, float* y) { l.forward(be, ConstRows<float, D>(x, rows), Rows<float, D>(y, rows)); },
        [](auto& be, auto& l, const float* dy, float* dx) { l.backward(be, ConstRows<float, D>(dy, rows), Rows<float, D>(dx, rows)); });
  }
  {
    LayerNorm<D, Cpu> c;
    LayerNorm<D, Gpu> g;
    layer_parity("LayerNorm", c, g, rows, D,
        [](auto& be, auto& l, const float* x, float* y) { l.forward(be, ConstRows<float, D>(x, rows), Rows<float, D>(y, rows)); },
        [](auto& be, auto& l, const float* dy, float* dx) { l.backward(be, ConstRows<float, D>(dy, rows), Rows<float, D>(dx, rows)); });
  }
  {
    Rng r1(4), r2(4);
    FeedForward<Small, Cpu> c(r1);
    FeedForward<Small, Gpu> g(r2);
    layer_parity("FeedForward", c, g, rows, D,
        [](auto& be, auto& l, const float* x, float* y) { l.forward(be, ConstRows<float, D>(x, rows), Rows<float, D>(y, rows)); },
        [](auto& be, auto& l, const float* dy, float* dx) { l.backward(be, ConstRows<float, D>(dy, rows), Rows<float, D>(dx, rows)); });
  }
}

BOOST_AUTO_TEST_CASE(self_attention_and_encoder_block_with_padding) {
  constexpr int D = 32;
  const Shape bt{3, 10};
  static std::vector<std::uint8_t> pad(30, 0);
  for (int t = 7; t < 10; ++t) pad[20 + t] = 1;
  {
    Rng r1(5), r2(5);
    SelfAttention<Small, Cpu> c(r1);
    SelfAttention<Small, Gpu> g(r2);
    layer_parity("SelfAttention (causal)", c, g, bt.rows(), D,
        [&](auto& be, auto& l, const float* x, float* y) {
          l.forward(be, ConstRows<float, D>(x, bt.rows()), Rows<float, D>(y, bt.rows()), bt, AttentionMask{true, pad.data()});
        },
        [&](auto& be, auto& l, const float* dy, float* dx) {
          l.backward(be, ConstRows<float, D>(dy, bt.rows()), Rows<float, D>(dx, bt.rows()));
        });
  }
  {
    Rng r1(6), r2(6);
    SelfAttentionBlock<SmallPost, Cpu, false> c(r1);
    SelfAttentionBlock<SmallPost, Gpu, false> g(r2);
    layer_parity("encoder block (post-norm, ReLU)", c, g, bt.rows(), D,
        [&](auto& be, auto& l, const float* x, float* y) {
          l.forward(be, ConstRows<float, D>(x, bt.rows()), Rows<float, D>(y, bt.rows()), bt, pad.data());
        },
        [&](auto& be, auto& l, const float* dy, float* dx) {
          l.backward(be, ConstRows<float, D>(dy, bt.rows()), Rows<float, D>(dx, bt.rows()));
        });
  }
}

BOOST_AUTO_TEST_CASE(decoder_block_with_cross_attention) {
  constexpr int D = 32;
  const Shape tgt{2, 7}, src{2, 9};
  std::vector<std::uint8_t> src_pad(18, 0), tgt_pad(14, 0);
  src_pad[17] = src_pad[16] = tgt_pad[13] = 1;
  Rng r1(7), r2(7);
  DecoderBlock<Small, Cpu> c(r1);
  DecoderBlock<Small, Gpu> g(r2);
  Cpu cpu;
  Gpu gpu;
  const F x = randn(tgt.rows() * D, 52), mem = randn(src.rows() * D, 53), up = randn(tgt.rows() * D, 54);
  F y(x.size()), dx(x.size()), dmem(mem.size());
  DevF d_x(x), d_mem(mem), d_up(up), d_y(x.size()), d_dx(x.size()), d_dmem(mem.size());
  c.forward(cpu, ConstRows<float, D>(x.data(), tgt.rows()), ConstRows<float, D>(mem.data(), src.rows()),
            Rows<float, D>(y.data(), tgt.rows()), tgt, src, tgt_pad.data(), src_pad.data());
  g.forward(gpu, ConstRows<float, D>(d_x.p(), tgt.rows()), ConstRows<float, D>(d_mem.p(), src.rows()),
            Rows<float, D>(d_y.p(), tgt.rows()), tgt, src, tgt_pad.data(), src_pad.data());
  expect_close(y, d_y.host(), "DecoderBlock forward", kLayerRtol, kLayerAtol);
  c.backward(cpu, ConstRows<float, D>(up.data(), tgt.rows()), Rows<float, D>(dx.data(), tgt.rows()),
             Rows<float, D>(dmem.data(), src.rows()));
  g.backward(gpu, ConstRows<float, D>(d_up.p(), tgt.rows()), Rows<float, D>(d_dx.p(), tgt.rows()),
             Rows<float, D>(d_dmem.p(), src.rows()));
  expect_close(dx, d_dx.host(), "DecoderBlock input gradient", kLayerRtol, kLayerAtol);
  expect_close(dmem, d_dmem.host(), "DecoderBlock memory gradient", kLayerRtol, kLayerAtol);
  expect_same_tensors(c, g, true, "DecoderBlock", kLayerRtol, kLayerAtol);
}

BOOST_AUTO_TEST_CASE(decoder_lm_training_steps_and_cached_generation) {
  const int V = 40;
  const Shape bt{4, Small::MAX_T};
  Decoder<Small, Cpu> c(V, 99, {.dropout = 0.1f, .tie_weights = true});
  Decoder<Small, Gpu> g(V, 99, {.dropout = 0.1f, .tie_weights = true});
  expect_same_tensors(c, g, false, "Decoder init", 0, 0);
  Cpu cpu;
  Gpu gpu;
  AdamW<Cpu> oc(c);
  AdamW<Gpu> og(g);
  CrossEntropyLoss<Cpu> cec;
  CrossEntropyLoss<Gpu> ceg;
  std::vector<float> dl(std::size_t(bt.rows()) * V);
  Gpu::Buffer<float> d_dl;
  float* dlg = d_dl.reserve(dl.size());
  for (int step = 0; step < 3; ++step) {  // dropout on: the masks must agree too
    const auto ids = random_ids(bt.rows(), V, 60 + step), targets = random_ids(bt.rows(), V, 70 + step);
    zero_grads(c);
    zero_grads(g);
    const auto lc = c.forward(cpu, ids, bt), lg = g.forward(gpu, ids, bt);
    std::vector<float> staging;
    const auto lg_host = gpu.host_view(lg, staging);
    expect_close(F(lc.begin(), lc.end()), F(lg_host.begin(), lg_host.end()), "Decoder logits", kModelRtol, kModelAtol);
    const double loss_c = cec.forward(cpu, lc, targets, V), loss_g = ceg.forward(gpu, lg, targets, V);
    BOOST_TEST(std::abs(loss_c - loss_g) <= 1e-4 * loss_c, "step " << step << " loss cpu " << loss_c << " gpu " << loss_g);
    cec.backward(cpu, dl);
    ceg.backward(gpu, std::span<float>(dlg, dl.size()));
    c.backward(cpu, dl);
    g.backward(gpu, std::span<const float>(dlg, dl.size()));
    expect_same_tensors(c, g, true, "Decoder step " + std::to_string(step), kModelRtol, kModelAtol);
    BOOST_TEST(std::abs(gradient_norm(cpu, c) - gradient_norm(gpu, g)) <= 1e-4 * gradient_norm(cpu, c));
    oc.step(cpu, 1e-3);
    og.step(gpu, 1e-3);
    expect_same_tensors(c, g, false, "Decoder after AdamW step " + std::to_string(step), kModelRtol, kModelAtol);
  }
  // Greedy decoding with the KV cache: the same tokens on both.
  c.set_training(false);
  g.set_training(false);
  DecodingCache<Cpu> kc;
  DecodingCache<Gpu> kg;
  c.start_cache(kc, 1);
  g.start_cache(kg, 1);
  std::vector<std::int32_t> tc{1}, tg{1};
  std::vector<float> staging;
  for (int i = 0; i < Small::MAX_T - 1; ++i) {
    const auto lc = c.forward_cached(cpu, std::span<const std::int32_t>(&tc.back(), 1), 1, kc);
    const auto lg = gpu.host_view(g.forward_cached(gpu, std::span<const std::int32_t>(&tg.back(), 1), 1, kg), staging);
    expect_close(F(lc.begin(), lc.end()), F(lg.begin(), lg.end()), "cached logits", kModelRtol, kModelAtol);
    tc.push_back(std::int32_t(std::max_element(lc.begin(), lc.end()) - lc.begin()));
    tg.push_back(std::int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin()));
  }
  BOOST_TEST(tc == tg);
}

BOOST_AUTO_TEST_CASE(classifier_with_padding) {
  const int V = 30, classes = 3;
  const Shape bt{5, 12};
  std::vector<std::uint8_t> pad(bt.rows(), 0);
  for (int t = 8; t < 12; ++t) pad[12 + t] = 1;
  for (Pooling pooling : {Pooling::Mean, Pooling::Cls}) {
    Classifier<SmallPost, Cpu> c(V, classes, 5, {.dropout = 0.0f, .pooling = pooling});
    Classifier<SmallPost, Gpu> g(V, classes, 5, {.dropout = 0.0f, .pooling = pooling});
    Cpu cpu;
    Gpu gpu;
    const auto ids = random_ids(bt.rows(), V, 80);
    const auto lc = c.forward(cpu, ids, bt, pad.data());
    std::vector<float> staging;
    const auto lg = gpu.host_view(g.forward(gpu, ids, bt, pad.data()), staging);
    expect_close(F(lc.begin(), lc.end()), F(lg.begin(), lg.end()), "Classifier logits", kModelRtol, kModelAtol);
    const F up = randn(std::size_t(bt.B) * classes, 81);
    DevF d_up(up);
    c.backward(cpu, up);
    g.backward(gpu, std::span<const float>(d_up.p(), up.size()));
    expect_same_tensors(c, g, true, "Classifier", kModelRtol, kModelAtol);
  }
}

BOOST_AUTO_TEST_CASE(encoder_and_seq2seq_with_shared_embeddings) {
  const int V = 25;
  const Shape src{3, 11}, tgt{3, 9};
  std::vector<std::uint8_t> src_pad(src.rows(), 0), tgt_pad(tgt.rows(), 0);
  for (int t = 6; t < 11; ++t) src_pad[11 + t] = 1;
  for (int t = 5; t < 9; ++t) tgt_pad[18 + t] = 1;
  const Seq2SeqOptions opts{.dropout = 0.0f, .tie_output = true, .share_embeddings = true};
  Seq2Seq<SmallPost, Small, Cpu> c(V, V, 11, opts);
  Seq2Seq<SmallPost, Small, Gpu> g(V, V, 11, opts);
  Cpu cpu;
  Gpu gpu;
  const auto s = random_ids(src.rows(), V, 90), t = random_ids(tgt.rows(), V, 91);
  const auto lc = c.forward(cpu, s, src, src_pad.data(), t, tgt, tgt_pad.data());
  std::vector<float> staging;
  const auto lg = gpu.host_view(g.forward(gpu, s, src, src_pad.data(), t, tgt, tgt_pad.data()), staging);
  expect_close(F(lc.begin(), lc.end()), F(lg.begin(), lg.end()), "Seq2Seq logits", kModelRtol, kModelAtol);
  const F up = randn(lc.size(), 92);
  DevF d_up(up);
  c.backward(cpu, up);
  g.backward(gpu, std::span<const float>(d_up.p(), up.size()));
  expect_same_tensors(c, g, true, "Seq2Seq", kModelRtol, kModelAtol);

  // Cached decoding against the encoded source, two beams per input.
  typename Seq2Seq<SmallPost, Small, Cpu>::DecodeState sc;
  typename Seq2Seq<SmallPost, Small, Gpu>::DecodeState sg;
  c.encode(cpu, s, src, src_pad.data());
  g.encode(gpu, s, src, src_pad.data());
  c.start_decoding(cpu, sc, 2);
  g.start_decoding(gpu, sg, 2);
  const std::vector<std::int32_t> step_ids = random_ids(6, V, 93);
  for (int i = 0; i < 3; ++i) {
    const auto dc = c.decode(cpu, step_ids, sc);
    const auto dg = gpu.host_view(g.decode(gpu, step_ids, sg), staging);
    expect_close(F(dc.begin(), dc.end()), F(dg.begin(), dg.end()), "Seq2Seq cached decode", kModelRtol, kModelAtol);
  }
}

BOOST_AUTO_TEST_CASE(weights_move_between_backends) {
  Decoder<Small, Cpu> c(40, 1);
  Decoder<Small, Gpu> g(40, 2);  // other weights
  copy_parameters(c, g);
  expect_same_tensors(c, g, false, "copy_parameters CPU -> GPU", 0, 0);
  Decoder<Small, Cpu> back(40, 3);
  copy_parameters(g, back);
  expect_same_tensors(c, back, false, "copy_parameters GPU -> CPU", 0, 0);
}

BOOST_AUTO_TEST_SUITE_END()
