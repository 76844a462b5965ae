// CudaBackend against CpuBackend<float>: every backend operation (this file),
// the layers, the blocks and the models (test_cuda_parity_models.cpp; forward
// outputs, input gradients, parameter gradients, an AdamW step, cached
// decoding), on fresh random inputs.
//
// Needs a GPU: without one the program exits with 77, which ctest reports as
// skipped (SKIP_RETURN_CODE), so CPU-only CI stays green.
//
// Tolerances: float32 on both sides, different summation orders. Elementwise
// operations agree to a few ulp (rtol 1e-5); reductions and GEMMs to rtol
// 1e-4; whole models to rtol 2e-3 / atol 2e-4 (errors grow through the
// layers). With TF32 GEMMs (CudaOptions::tf32) rtol 2e-2 (10-bit mantissa);
// with bf16 products (CudaOptions::bf16) backend/bf16.hpp's bound.
#define BOOST_TEST_MODULE cuda_parity
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/parity.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/layers/losses.hpp"

using namespace xfmr;
using namespace xfmr::test;

using namespace xfmr::test::parity;

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

// Rotary positions, forward and back, from an offset, on interleaved columns.
BOOST_AUTO_TEST_CASE(rope_forward_backward) {
  const int B = 3, T = 7, H = 8, hd = 16, ld = 3 * H * hd, offset = 5, max_t = 16;
  F table(std::size_t(max_t) * hd);
  for (int t = 0; t < max_t; ++t)
    for (int i = 0; i < hd; i += 2) {
      table[std::size_t(t) * hd + i] = std::cos(t / std::pow(10000.0f, float(i) / hd));
      table[std::size_t(t) * hd + i + 1] = std::sin(t / std::pow(10000.0f, float(i) / hd));
    }
  F x = randn(std::size_t(B) * T * ld, 58);
  DevF d_table(table), d_x(x);
  cpu.rope_forward(B, T, offset, H, hd, table.data(), x.data(), ld);
  gpu.rope_forward(B, T, offset, H, hd, d_table.p(), d_x.p(), ld);
  expect_close(x, d_x.host(), "rope_forward", 1e-5, 1e-6);
  cpu.rope_backward(B, T, offset, 2 * H, hd, table.data(), x.data(), ld);
  gpu.rope_backward(B, T, offset, 2 * H, hd, d_table.p(), d_x.p(), ld);
  expect_close(x, d_x.host(), "rope_backward", 1e-5, 1e-6);
}

// RmsNorm's two ops, on the same shapes (one chunk of rows and several for the
// weight's column sums); the backward in place (dx aliasing dy) as blocks may.
BOOST_AUTO_TEST_CASE(rms_norm_forward_backward) {
  for (auto [rows, n] : {std::pair{33, 24}, {33, 200}, {33, 768}, {600, 200}, {1300, 100}}) {
    F x = randn(rows * n, 52, 2.0), g = randn(n, 53), y(rows * n), rstd(rows);
    DevF dx(x), dg(g), dy(y.size()), drstd(rows);
    cpu.rms_norm_forward(rows, n, x.data(), g.data(), 1e-5f, y.data(), rstd.data());
    gpu.rms_norm_forward(rows, n, dx.p(), dg.p(), 1e-5f, dy.p(), drstd.p());
    expect_close(y, dy.host(), "rms_norm_forward y", 1e-4, 1e-5);
    expect_close(rstd, drstd.host(), "rms_norm_forward rstd", 1e-4, 1e-6);
    F gin = randn(rows * n, 54), dgam = randn(n, 55);
    DevF dgin(gin), ddgam(dgam);
    cpu.rms_norm_backward(rows, n, gin.data(), x.data(), g.data(), rstd.data(), gin.data(), dgam.data());
    gpu.rms_norm_backward(rows, n, dgin.p(), dx.p(), dg.p(), drstd.p(), dgin.p(), ddgam.p());
    expect_close(gin, dgin.host(), "rms_norm_backward dx", 1e-4, 1e-5);
    expect_close(dgam, ddgam.host(), "rms_norm_backward dgamma", 1e-4, 1e-5);
  }
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
  {  // SwiGLU over rows of [gate | up]: 700 rows of 50
    const int rows = 700, w = 50;
    F h = randn(std::size_t(rows) * 2 * w, 56, 3.0), up2 = randn(std::size_t(rows) * w, 57);
    F sy(std::size_t(rows) * w), sdh(h.size());
    DevF d_h(h), d_sy(sy.size()), d_up2(up2), d_sdh(h.size());
    cpu.swiglu_forward(rows, w, h.data(), sy.data());
    gpu.swiglu_forward(rows, w, d_h.p(), d_sy.p());
    expect_close(sy, d_sy.host(), "swiglu_forward", 1e-5, 1e-6);
    cpu.swiglu_backward(rows, w, h.data(), up2.data(), sdh.data());
    gpu.swiglu_backward(rows, w, d_h.p(), d_up2.p(), d_sdh.p());
    expect_close(sdh, d_sdh.host(), "swiglu_backward", 1e-5, 1e-6);
    cpu.geglu_forward(rows, w, h.data(), sy.data());
    gpu.geglu_forward(rows, w, d_h.p(), d_sy.p());
    expect_close(sy, d_sy.host(), "geglu_forward", 1e-5, 1e-6);
    cpu.geglu_backward(rows, w, h.data(), up2.data(), sdh.data());
    gpu.geglu_backward(rows, w, d_h.p(), d_up2.p(), d_sdh.p());
    expect_close(sdh, d_sdh.host(), "geglu_backward", 1e-5, 1e-6);
  }
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

// The output head's fused loss: one pass for the row's max and sum of
// exponentials (online), one writing the gradient; into a poisoned buffer
// and in place, GPT-2's vocabulary too. Both ways: the fused kernel
// (CudaOptions::fused_loss) and, while it is off by default, the forward
// and backward kernels through a buffer of probabilities.
BOOST_AUTO_TEST_CASE(fused_cross_entropy_matches_the_cpu) {
  for (bool fused : {true, false}) {
    CudaBackend loss_gpu({.fused_loss = fused});
    for (auto [rows, V] : {std::pair{37, 7}, {37, 65}, {37, 5000}, {9, 50257}}) {
      const F logits = randn(std::size_t(rows) * V, 33, 3.0);
      auto targets = random_ids(rows, V, 34);
      targets[3] = kIgnoreIndex;
      F dlogits(logits.size());
      for (float smoothing : {0.0f, 0.1f}) {
        BOOST_TEST_CONTEXT("fused " << fused << ", rows " << rows << ", V " << V << ", smoothing " << smoothing) {
          const double lc = cpu.cross_entropy_forward_backward(rows, V, logits.data(), targets.data(), kIgnoreIndex,
                                                               0.5f, dlogits.data(), smoothing);
          DevF d_logits(logits), d_dlogits(F(logits.size(), NAN));
          const double lg = loss_gpu.cross_entropy_forward_backward(rows, V, d_logits.p(), targets.data(),
                                                                    kIgnoreIndex, 0.5f, d_dlogits.p(), smoothing);
          BOOST_TEST(std::abs(lc - lg) <= 1e-5 * std::abs(lc), "loss: cpu " << lc << ", gpu " << lg);
          expect_close(dlogits, d_dlogits.host(), "fused cross_entropy", 1e-4, 1e-7);
          const double in_place = loss_gpu.cross_entropy_forward_backward(rows, V, d_logits.p(), targets.data(),
                                                                          kIgnoreIndex, 0.5f, d_logits.p(), smoothing);
          BOOST_TEST(in_place == lg);
          expect_close(dlogits, d_logits.host(), "fused cross_entropy in place", 1e-4, 1e-7);
        }
      }
    }
  }
}

// The fused products (CudaOptions::lt_epilogues: one cuBLASLt call with the
// bias and GELU, or GELU's gradient, in its epilogue): in strict FP32
// against the CPU's operations in turn; in each precision (FP32, TF32, bf16
// products) against the same backend without the epilogues, which rounds
// the same operands and differs only in the order of its float32 sums.
// With a bias and without, into poisoned outputs, at widths cuBLASLt's GELU
// takes (multiples of 8), and at odd ones, where GELU's fall back to the
// product and the kernels. With bf16 operands (llm.c's case) the aligned
// shapes must have run fused; in FP32 and TF32 the log says whether they did.
struct FusedProducts {
  F y, h, a, dh;
  CudaBackend::EpilogueStats ran;
};
FusedProducts fused_products(Gpu& g, int rows, int in, int out, bool with_bias) {
  const F x = randn(std::size_t(rows) * in, 81), w = randn(std::size_t(out) * in, 82, 0.2), bias = randn(out, 83),
          dy = randn(std::size_t(rows) * out, 84), h_in = randn(std::size_t(rows) * in, 85, 2.0);
  DevF d_x(x), d_w(w), d_bias(bias), d_dy(dy), d_h_in(h_in);
  DevF d_y(F(std::size_t(rows) * out, NAN)), d_h(F(std::size_t(rows) * out, NAN)), d_a(F(std::size_t(rows) * out, NAN)),
      d_dh(F(x.size(), NAN));
  const auto before = g.epilogue_stats();
  const float* b = with_bias ? d_bias.p() : nullptr;
  g.linear_forward(rows, in, out, d_x.p(), d_w.p(), b, d_y.p());
  g.linear_gelu_forward(rows, in, out, d_x.p(), d_w.p(), b, d_h.p(), d_a.p());
  g.linear_dgelu_input_grad(rows, in, out, d_dy.p(), d_w.p(), d_h_in.p(), d_dh.p());
  const auto after = g.epilogue_stats();
  return {d_y.host(), d_h.host(), d_a.host(), d_dh.host(),
          {after.fused - before.fused, after.unfused - before.unfused}};
}

BOOST_AUTO_TEST_CASE(lt_epilogues_match_the_cpu) {
  const CudaOptions fp32{}, tf32{.tf32 = true}, bf16{.bf16 = true};
  for (auto [precision, opts] : {std::pair{"fp32", fp32}, {"tf32", tf32}, {"bf16", bf16}}) {
    CudaOptions with_lt = opts, without = opts;
    with_lt.lt_epilogues = true;
    Gpu lt(with_lt), plain(without);
    for (auto [rows, in, out] : {std::tuple{64, 96, 128}, {37, 48, 64}, {37, 50, 65}, {5, 40, 24}}) {
      for (bool with_bias : {true, false}) {
        BOOST_TEST_CONTEXT(precision << ", rows " << rows << ", in " << in << ", out " << out << ", bias "
                                     << with_bias) {
          const FusedProducts f = fused_products(lt, rows, in, out, with_bias);
          const FusedProducts u = fused_products(plain, rows, in, out, with_bias);
          expect_close(u.y, f.y, "linear_forward, fused against not", 1e-4, 1e-4);
          expect_close(u.h, f.h, "linear_gelu_forward's pre-activation, fused against not", 1e-4, 1e-4);
          expect_close(u.a, f.a, "linear_gelu_forward, fused against not", 1e-4, 1e-4);
          expect_close(u.dh, f.dh, "linear_dgelu_input_grad, fused against not", 1e-4, 1e-4);
          const std::size_t calls = with_bias ? 3 : 2;  // linear_forward has nothing to fuse without a bias
          BOOST_TEST(f.ran.fused + f.ran.unfused == calls);
          BOOST_TEST(u.ran.fused == 0u);
          BOOST_TEST(u.ran.unfused == calls);
          const bool aligned = out % 8 == 0 && in % 8 == 0;
          if (std::string(precision) == "bf16" && aligned) BOOST_TEST(f.ran.fused == calls);
          BOOST_TEST_MESSAGE(precision << " " << rows << "x" << in << "->" << out << (with_bias ? " bias" : "")
                                       << ": " << f.ran.fused << " of " << calls << " fused");
          if (std::string(precision) != "fp32") continue;
          const F x = randn(std::size_t(rows) * in, 81), w = randn(std::size_t(out) * in, 82, 0.2),
                  bias = randn(out, 83), dy = randn(std::size_t(rows) * out, 84),
                  h_in = randn(std::size_t(rows) * in, 85, 2.0);
          const float* b = with_bias ? bias.data() : nullptr;
          F y(f.y.size()), h(y.size()), a(y.size()), dh(x.size());
          cpu.linear_forward(rows, in, out, x.data(), w.data(), b, y.data());
          cpu.linear_gelu_forward(rows, in, out, x.data(), w.data(), b, h.data(), a.data());
          cpu.linear_dgelu_input_grad(rows, in, out, dy.data(), w.data(), h_in.data(), dh.data());
          expect_close(y, f.y, "linear_forward", 1e-4, 1e-5);
          expect_close(h, f.h, "linear_gelu_forward's pre-activation", 1e-4, 1e-5);
          expect_close(a, f.a, "linear_gelu_forward", 1e-4, 1e-5);
          expect_close(dh, f.dh, "linear_dgelu_input_grad", 1e-4, 1e-5);
        }
      }
    }
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

  // Sums of squares of the 41 tensors in one call (two launches, one read):
  // each bit for bit the single-tensor sum, and close to the CPU's.
  std::vector<SquaresTensor<float>> squares;
  for (std::size_t k = 0; k < sizes.size(); ++k) squares.push_back({dg[k].p(), sizes[k]});
  std::vector<double> sums(squares.size());
  gpu.sum_squares_each(std::span<const SquaresTensor<float>>(squares), std::span<double>(sums));
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    BOOST_TEST(sums[k] == gpu.sum_squares(sizes[k], dg[k].p()), "tensor " << k);
    const double want = cpu.sum_squares(sizes[k], g[k].data());
    BOOST_TEST(std::abs(sums[k] - want) <= 1e-9 * want, "tensor " << k << ": " << sums[k] << " vs " << want);
  }
  BOOST_CHECK_THROW(gpu.sum_squares_each(std::span<const SquaresTensor<float>>(squares), std::span<double>(sums).first(3)),
                    Error);
}

BOOST_AUTO_TEST_CASE(attention_forward_backward) {
  // Interleaved q|k|v columns (as SelfAttention's fused projection leaves
  // them). Shapes for both paths: the fused kernels (up to 32 keys, up to
  // 256 keys) and cuBLAS (more keys, or heads over 128 wide).
  // KVH < 4: grouped-query attention (key/value heads shared by query heads).
  struct Shape {
    int T, QK, VD, KVH;
  };
  for (const Shape sh : {Shape{13, 8, 6, 4}, Shape{40, 16, 16, 4}, Shape{300, 8, 6, 4}, Shape{20, 130, 6, 4},
                         Shape{13, 8, 6, 2}, Shape{40, 16, 16, 1}, Shape{300, 8, 6, 2}}) {
    const int B = 3, H = 4, T = sh.T, QK = sh.QK, VD = sh.VD, KVH = sh.KVH;
    const int kc = H * QK, vc = kc + KVH * QK, ld = vc + KVH * VD;  // q | k | v columns
    const std::string base_what =
        " T " + std::to_string(T) + " QK " + std::to_string(QK) + " key/value heads " + std::to_string(KVH);
    std::vector<std::uint8_t> pad(B * T, 0);
    for (int j = 2 * T / 3; j < T; ++j) pad[2 * T + j] = 1;  // sequence 2: padded tail
    for (bool causal : {false, true}) {
      for (bool all_masked : {false, true}) {
        if (all_masked) std::fill(pad.begin() + T, pad.begin() + 2 * T, 1);  // sequence 1: no visible key
        for (float rate : {0.0f, 0.3f}) {  // attention dropout: the same mask from the same key
        AttentionDims dims{B, H, T, T, QK, VD, 0, KVH};
        dims.dropout = rate;
        dims.dropout_key = 0xa77e0000ULL + T;
        const std::string what = base_what + (rate > 0 ? " dropout 0.3" : "");
        const AttentionMask mask{causal, pad.data()};
        F qkv = randn(std::size_t(B) * T * ld, 36), y(std::size_t(B) * T * H * VD), probs(std::size_t(B) * H * T * T);
        DevF d_qkv(qkv), d_y(y.size()), d_probs(probs.size());
        const float* q = qkv.data();
        cpu.attention_forward(dims, q, ld, q + kc, ld, q + vc, ld, y.data(), H * VD, probs.data(), mask);
        const float* dq = d_qkv.p();
        gpu.attention_forward(dims, dq, ld, dq + kc, ld, dq + vc, ld, d_y.p(), H * VD, d_probs.p(), mask);
        expect_close(y, d_y.host(), "attention_forward y" + what, 1e-4, 1e-5);
        expect_close(probs, d_probs.host(), "attention_forward probs" + what, 1e-4, 1e-6);

        F up = randn(y.size(), 37), g(qkv.size());
        DevF d_up(up), d_g(g.size());
        cpu.attention_backward(dims, up.data(), H * VD, q, ld, q + kc, ld, q + vc, ld, probs.data(), g.data(),
                               g.data() + kc, g.data() + vc);
        float* dg = d_g.p();
        gpu.attention_backward(dims, d_up.p(), H * VD, dq, ld, dq + kc, ld, dq + vc, ld, d_probs.p(), dg, dg + kc,
                               dg + vc);
        expect_close(g, d_g.host(), std::string(causal ? "attention_backward causal" : "attention_backward") + what,
                     1e-4, 1e-5);
        }
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

// A tiled attention case: sizes, causal or not, dropout; sequence 0's last
// five keys padded and sequence 1 (where there is one) with no key at all.
struct TiledCase {
  int B, H, KVH, Tq, Tk, hd;
  bool causal;
  float rate;
  AttentionDims dims(std::uint64_t key) const { return {B, H, Tq, Tk, hd, hd, 0, KVH, rate, key + Tq}; }
  std::vector<std::uint8_t> padding() const {
    std::vector<std::uint8_t> pad(std::size_t(B) * Tk, 0);
    for (int j = Tk - 5; j < Tk; ++j) pad[j] = 1;
    if (B > 1) std::fill(pad.begin() + Tk, pad.begin() + 2 * Tk, std::uint8_t(1));
    return pad;
  }
  std::string name() const {
    return " Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk) + " hd " + std::to_string(hd) +
           (causal ? " causal" : "") + " dropout " + std::to_string(rate);
  }
  int ldq() const { return H * hd; }
  int ldk() const { return KVH * hd; }
  // Queries, keys, values and the output's gradient, from seeds s to s + 3.
  std::array<F, 4> inputs(std::uint64_t s) const {
    const std::size_t nq = std::size_t(B) * Tq * ldq(), nk = std::size_t(B) * Tk * ldk();
    return {randn(nq, s), randn(nk, s + 1), randn(nk, s + 2), randn(nq, s + 3)};
  }
};

// Tiled attention (CudaBackend::flash_attention_*) against the CPU's tiled
// attention and the CPU's materialised one: masks (causal, padded, a
// sequence with no visible key), dropout, grouped heads, cross lengths, T up
// to 1024, heads of 32, 64 and 128; the log-sum-exps too. And the layer's
// choice: with CudaOptions::flash_attention a training forward past 256 keys
// goes tiled.
BOOST_AUTO_TEST_CASE(tiled_attention_matches_the_cpu) {
  for (const TiledCase c : {TiledCase{3, 2, 2, 300, 300, 32, true, 0.0f}, TiledCase{3, 2, 2, 300, 300, 32, false, 0.2f},
                            TiledCase{2, 4, 2, 257, 257, 64, true, 0.1f}, TiledCase{2, 2, 1, 70, 400, 128, false, 0.0f},
                            TiledCase{1, 2, 2, 1024, 1024, 64, true, 0.1f},
                            TiledCase{2, 2, 2, 33, 20, 64, false, 0.3f}}) {
    const int ldq = c.ldq(), ldk = c.ldk();
    const AttentionDims dims = c.dims(0xf1a5b0ULL);
    const std::vector<std::uint8_t> pad = c.padding();
    const AttentionMask mask{c.causal, pad.data()};
    const std::string what = c.name();
    const auto [q, k, v, up] = c.inputs(60);
    F y(q.size()), lse(std::size_t(c.B) * c.H * c.Tq), ym(q.size()), probs(std::size_t(c.B) * c.H * c.Tq * c.Tk);
    F dq(q.size()), dk(k.size()), dv(v.size()), dqm(q.size()), dkm(k.size()), dvm(v.size());
    DevF d_q(q), d_k(k), d_v(v), d_up(up), d_y(y.size()), d_lse(lse.size()), d_dq(q.size()), d_dk(k.size()),
        d_dv(v.size());
    cpu.flash_attention_forward(dims, q.data(), ldq, k.data(), ldk, v.data(), ldk, y.data(), ldq, lse.data(), mask);
    cpu.flash_attention_backward(dims, up.data(), ldq, y.data(), ldq, q.data(), ldq, k.data(), ldk, v.data(), ldk,
                                 lse.data(), mask, dq.data(), dk.data(), dv.data());
    cpu.attention_forward(dims, q.data(), ldq, k.data(), ldk, v.data(), ldk, ym.data(), ldq, probs.data(), mask);
    cpu.attention_backward(dims, up.data(), ldq, q.data(), ldq, k.data(), ldk, v.data(), ldk, probs.data(), dqm.data(),
                           dkm.data(), dvm.data());
    gpu.flash_attention_forward(dims, d_q.p(), ldq, d_k.p(), ldk, d_v.p(), ldk, d_y.p(), ldq, d_lse.p(), mask);
    gpu.flash_attention_backward(dims, d_up.p(), ldq, d_y.p(), ldq, d_q.p(), ldq, d_k.p(), ldk, d_v.p(), ldk,
                                 d_lse.p(), mask, d_dq.p(), d_dk.p(), d_dv.p());
    const F gy = d_y.host(), glse = d_lse.host();
    for (std::size_t r = 0; r < lse.size(); ++r)
      BOOST_TEST((std::isinf(lse[r]) == std::isinf(glse[r])), "lse row " << r << what);
    F finite_cpu, finite_gpu;
    for (std::size_t r = 0; r < lse.size(); ++r)
      if (!std::isinf(lse[r])) finite_cpu.push_back(lse[r]), finite_gpu.push_back(glse[r]);
    expect_close(finite_cpu, finite_gpu, "flash lse" + what, 1e-4, 1e-5);
    expect_close(y, gy, "flash_attention_forward y against the CPU's tiled" + what, 1e-4, 1e-5);
    expect_close(ym, gy, "flash_attention_forward y against the CPU's materialised" + what, 1e-4, 1e-5);
    for (const auto& [cpu_g, mat_g, gpu_g, name] :
         {std::tuple{&dq, &dqm, &d_dq, "dq"}, std::tuple{&dk, &dkm, &d_dk, "dk"}, std::tuple{&dv, &dvm, &d_dv, "dv"}}) {
      const F g = gpu_g->host();
      expect_close(*cpu_g, g, std::string("flash_attention_backward ") + name + what, 1e-4, 1e-5);
      expect_close(*mat_g, g, std::string("flash_attention_backward (materialised) ") + name + what, 1e-4, 1e-5);
    }
  }
  CudaBackend flash({.flash_attention = true});
  auto path = [](const CudaBackend& be, AttentionDims d) {
    return plan_attention(d, AttentionUse::training, be.attention_kernels());
  };
  BOOST_TEST((path(flash, AttentionDims{2, 12, 1024, 1024, 64, 64}) == AttentionPath::tiled));
  BOOST_TEST((path(flash, AttentionDims{2, 12, 100, 100, 64, 64}) == AttentionPath::rows));  // the fused kernels' length
  BOOST_TEST((path(gpu, AttentionDims{2, 12, 1024, 1024, 64, 64}) == AttentionPath::heads));  // off by default
}

// With bf16 products the tiled attention runs on the tensor cores
// (attention_bf16.cu; heads of 64 and 128): against the CPU's float tiled
// attention within bf16's error (rounded operands: 1e-2 of the norm for
// the output, 2e-2 for the gradients), the log-sum-exps within 0.05, into
// poisoned outputs; masks, a sequence with no visible key, dropout, grouped
// heads, cross lengths, partial tiles.
BOOST_AUTO_TEST_CASE(bf16_tiled_attention_on_tensor_cores) {
  CudaBackend tc({.bf16 = true, .flash_attention = true});
  for (const TiledCase c : {TiledCase{2, 4, 2, 257, 257, 64, true, 0.1f}, TiledCase{2, 2, 1, 70, 400, 128, false, 0.0f},
                            TiledCase{1, 2, 2, 1024, 1024, 64, true, 0.0f}, TiledCase{2, 2, 2, 33, 20, 64, false, 0.3f},
                            TiledCase{3, 2, 2, 130, 130, 128, true, 0.0f}}) {
    const int ldq = c.ldq(), ldk = c.ldk();
    const AttentionDims dims = c.dims(0xb16ULL);
    const std::vector<std::uint8_t> pad = c.padding();
    const AttentionMask mask{c.causal, pad.data()};
    const std::string what = c.name();
    const auto [q, k, v, up] = c.inputs(70);
    F y(q.size()), lse(std::size_t(c.B) * c.H * c.Tq), dq(q.size()), dk(k.size()), dv(v.size());
    DevF d_q(q), d_k(k), d_v(v), d_up(up), d_y(F(y.size(), NAN)), d_lse(F(lse.size(), NAN)),
        d_dq(F(q.size(), NAN)), d_dk(F(k.size(), NAN)), d_dv(F(v.size(), NAN));
    cpu.flash_attention_forward(dims, q.data(), ldq, k.data(), ldk, v.data(), ldk, y.data(), ldq, lse.data(), mask);
    cpu.flash_attention_backward(dims, up.data(), ldq, y.data(), ldq, q.data(), ldq, k.data(), ldk, v.data(), ldk,
                                 lse.data(), mask, dq.data(), dk.data(), dv.data());
    tc.flash_attention_forward(dims, d_q.p(), ldq, d_k.p(), ldk, d_v.p(), ldk, d_y.p(), ldq, d_lse.p(), mask);
    tc.flash_attention_backward(dims, d_up.p(), ldq, d_y.p(), ldq, d_q.p(), ldq, d_k.p(), ldk, d_v.p(), ldk,
                                d_lse.p(), mask, d_dq.p(), d_dk.p(), d_dv.p());
    const F glse = d_lse.host();
    double worst = 0.0;
    for (std::size_t r = 0; r < lse.size(); ++r) {
      BOOST_TEST((std::isinf(lse[r]) == std::isinf(glse[r])), "lse row " << r << " cpu " << lse[r] << " gpu "
                                                                          << glse[r] << what);
      if (!std::isinf(lse[r])) worst = std::max(worst, double(std::abs(lse[r] - glse[r])));  // NaN fails below
      BOOST_TEST(!std::isnan(glse[r]), "lse row " << r << what);
    }
    BOOST_TEST(worst <= 0.05, "lse off by " << worst << what);
    const double ey = relative_error(y, d_y.host(), "bf16 tiled y" + what);
    BOOST_TEST(ey <= 1e-2, "y relative error " << ey << what);
    for (const auto& [cpu_g, gpu_g, name] :
         {std::tuple{&dq, &d_dq, "dq"}, std::tuple{&dk, &d_dk, "dk"}, std::tuple{&dv, &d_dv, "dv"}}) {
      const double e = relative_error(*cpu_g, gpu_g->host(), std::string("bf16 tiled ") + name + what);
      BOOST_TEST(e <= 2e-2, name << " relative error " << e << what);
    }
  }
}

// GPU ranks sum their gradients through NCCL (CudaBackend::all_reduce_sum).
// One process is a group of one: the sum is the buffers themselves, bit for
// bit, so a one-rank run through NCCL is the plain run. (Two ranks need two
// GPUs.)
BOOST_AUTO_TEST_CASE(nccl_sum_over_one_rank_is_the_identity) {
  if (!cuda::nccl_available()) {
    BOOST_TEST_MESSAGE("built without NCCL: all_reduce_sum refuses");
    BOOST_CHECK_THROW(gpu.all_reduce_sum(ProcessGroup::world(), {}), Error);
    return;
  }
  BOOST_TEST(ProcessGroup::world().size() == 1);
  const F a = randn(1000, 51), b = randn(37, 52);
  DevF da(a), db(b), empty(std::size_t(0));
  const std::span<float> spans[] = {{da.p(), a.size()}, {empty.p(), 0}, {db.p(), b.size()}};
  for (int call = 0; call < 2; ++call) {  // the communicator made, then reused
    gpu.all_reduce_sum(ProcessGroup::world(), spans);
    gpu.synchronize();
    BOOST_TEST(da.host() == a, boost::test_tools::per_element());
    BOOST_TEST(db.host() == b, boost::test_tools::per_element());
  }
}

// memory_use() counts what allocate() holds: a new array adds its bytes
// now and to the peak, and freeing it takes them off again, not off the peak.
BOOST_AUTO_TEST_CASE(device_memory_is_counted) {
  const cuda::MemoryUse before = cuda::memory_use();
  BOOST_TEST(before.peak_bytes >= before.bytes);
  {
    cuda::DeviceArray<float> a;
    a.reserve(std::size_t(1) << 20);
    const cuda::MemoryUse during = cuda::memory_use();
    BOOST_TEST(during.bytes == before.bytes + (std::size_t(4) << 20));
    BOOST_TEST(during.peak_bytes >= during.bytes);
  }
  const cuda::MemoryUse after = cuda::memory_use();
  BOOST_TEST(after.bytes == before.bytes);
  BOOST_TEST(after.peak_bytes >= before.bytes + (std::size_t(4) << 20));
  cuda::reset_peak_memory();
  BOOST_TEST(cuda::memory_use().peak_bytes == after.bytes);
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

// bf16 products (CudaOptions::bf16): every transpose, strides, alpha and
// beta within the bound of backend/bf16.hpp, (2^-7 + 2^-16) |alpha| sum |ab|
// plus float32's summation error, of the exact product; and somewhere
// further from it than float32's own error (they ran in bf16). Where the
// CPU has bf16 products, both backends' results within twice the bound of
// each other's.
BOOST_AUTO_TEST_CASE(bf16_gemm_within_its_bound) {
  Gpu bf({.device = 0, .bf16 = true});
  const int M = 37, N = 29, K = 253;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
      const F A = randn(std::size_t(a_rows) * lda, 61), B = randn(std::size_t(b_rows) * ldb, 62);
      const F C0 = randn(std::size_t(M) * ldc, 63);
      DevF dA(A), dB(B), dC(C0);
      bf.gemm(ta, tb, M, N, K, 0.7f, dA.p(), lda, dB.p(), ldb, 0.5f, dC.p(), ldc);
      const F C = dC.host();
      F C_cpu = C0;
      const bool cpu_bf16 = bf16::available();
      if (cpu_bf16) Cpu({.bf16 = true}).gemm(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.5f, C_cpu.data(), ldc);
      auto a = [&](int m, int k) { return A[ta ? std::size_t(k) * lda + m : std::size_t(m) * lda + k]; };
      auto b = [&](int k, int n) { return B[tb ? std::size_t(n) * ldb + k : std::size_t(k) * ldb + n]; };
      double worst = 0, furthest = 0, worst_cpu = 0;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double exact = 0, size = 0;
          for (int k = 0; k < K; ++k) exact += double(a(m, k)) * b(k, n), size += std::abs(double(a(m, k)) * b(k, n));
          const std::size_t i = std::size_t(m) * ldc + n;
          const double want = 0.7 * exact + 0.5 * C0[i];
          const double summing = (K + 2) * 0x1p-24 * (0.7 * size * 1.01 + 0.5 * std::abs(C0[i]));
          const double bound = (0x1p-7 + 0x1p-16) * 0.7 * size + summing;
          worst = std::max(worst, std::abs(C[i] - want) / bound);
          furthest = std::max(furthest, std::abs(C[i] - want) / summing);
          if (cpu_bf16) worst_cpu = std::max(worst_cpu, std::abs(double(C[i]) - C_cpu[i]) / (2 * bound));
        }
      BOOST_TEST_CONTEXT("ta " << ta << " tb " << tb) {
        BOOST_TEST(worst <= 1.0);
        BOOST_TEST(furthest > 1.0);  // not float32's products
        BOOST_TEST(worst_cpu <= 1.0);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()
