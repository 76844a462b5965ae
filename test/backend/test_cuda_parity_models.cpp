// test_cuda_parity, second file: layers, blocks and models built twice from
// one seed, one on each backend (see test_cuda_parity.cpp for the tolerances
// and the skip without a GPU).
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "support/configs.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/layers/kv_cache.hpp"
#include "xfmr/layers/attention.hpp"
#include "xfmr/layers/feed_forward.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/linear.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/encoder.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/train/gradients.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"

#include "backend/parity.hpp"

using namespace xfmr;
using namespace xfmr::test;
using namespace xfmr::test::parity;

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
struct SmallLlama : Small {  // RmsNorm, SwiGLU, no biases, rotary positions, 4 query heads over 2 key/value heads
  static constexpr int N_KV_HEADS = 2;
  template <int D, class Be>
  using NormLayer = RmsNorm<D, Be>;
  using Activation = SwiGlu;
  using Positions = Rope;
  static constexpr bool BIAS = false;
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
  {
    Rng r1(7), r2(7);
    SelfAttentionBlock<SmallLlama, Cpu, true> c(r1);
    SelfAttentionBlock<SmallLlama, Gpu, true> g(r2);
    layer_parity("decoder-only block (pre-norm, RmsNorm, SwiGLU, rotary, grouped-query)", c, g, bt.rows(), D,
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

// `steps` training steps of a Decoder built on each backend from one seed
// (fresh ids and targets from `seed` on): logits, loss, gradients, their
// norm and the weights after AdamW agree at the models' tolerance.
template <class Cfg>
void train_alike(Decoder<Cfg, Cpu>& c, Decoder<Cfg, Gpu>& g, Cpu& cpu, Gpu& gpu, int V, int steps, int seed,
                 const std::string& what) {
  const Shape bt{4, Cfg::MAX_T};
  AdamW<Cpu> oc(c);
  AdamW<Gpu> og(g);
  CrossEntropyLoss<Cpu> cec;
  CrossEntropyLoss<Gpu> ceg;
  std::vector<float> dl(std::size_t(bt.rows()) * V);
  Gpu::Buffer<float> d_dl;
  float* dlg = d_dl.reserve(dl.size());
  for (int step = 0; step < steps; ++step) {
    const auto ids = random_ids(bt.rows(), V, seed + step), targets = random_ids(bt.rows(), V, seed + 10 + step);
    zero_grads(c);
    zero_grads(g);
    const auto lc = c.forward(cpu, ids, bt), lg = g.forward(gpu, ids, bt);
    std::vector<float> staging;
    const auto lg_host = gpu.host_view(lg, staging);
    expect_close(F(lc.begin(), lc.end()), F(lg_host.begin(), lg_host.end()), what + " logits", kModelRtol, kModelAtol);
    const double loss_c = cec.forward(cpu, lc, targets, V), loss_g = ceg.forward(gpu, lg, targets, V);
    BOOST_TEST(std::abs(loss_c - loss_g) <= 1e-4 * loss_c, what << " step " << step << " loss cpu " << loss_c
                                                                 << " gpu " << loss_g);
    cec.backward(cpu, dl);
    ceg.backward(gpu, std::span<float>(dlg, dl.size()));
    c.backward(cpu, dl);
    g.backward(gpu, std::span<const float>(dlg, dl.size()));
    expect_same_tensors(c, g, true, what + " step " + std::to_string(step), kModelRtol, kModelAtol);
    BOOST_TEST(std::abs(gradient_norm(cpu, c) - gradient_norm(gpu, g)) <= 1e-4 * gradient_norm(cpu, c));
    oc.step(cpu, 1e-3);
    og.step(gpu, 1e-3);
    expect_same_tensors(c, g, false, what + " after AdamW step " + std::to_string(step), kModelRtol, kModelAtol);
  }
}

BOOST_AUTO_TEST_CASE(decoder_lm_training_steps_and_cached_generation) {
  const int V = 40;
  Decoder<Small, Cpu> c(V, 99, {.dropout = 0.1f, .attention_dropout = 0.1f, .tie_weights = true});
  Decoder<Small, Gpu> g(V, 99, {.dropout = 0.1f, .attention_dropout = 0.1f, .tie_weights = true});
  expect_same_tensors(c, g, false, "Decoder init", 0, 0);
  Cpu cpu;
  Gpu gpu;
  // dropout on (branches, attention): the masks must agree too
  train_alike(c, g, cpu, gpu, V, 3, 60, "Decoder");
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

// The fused products through cuBLASLt (CudaOptions::lt_epilogues): in
// strict FP32 a Decoder's training steps (GELU feed-forwards, biases, a tied
// head) and their AdamW updates agree with the CPU's as the unfused path's
// do (the log says how many products ran fused: cuBLASLt may have no FP32
// epilogue kernel for a shape); with bf16 products a forward and backward
// agree with the same model's without the epilogues (the same rounded
// operands, float32 sums in another order, bf16 roundings that may flip on
// the way: 2e-2), and every product ran fused.
BOOST_AUTO_TEST_CASE(decoder_with_lt_epilogues) {
  const int V = 40;
  {
    Decoder<Small, Cpu> c(V, 97, {.tie_weights = true});
    Decoder<Small, Gpu> g(V, 97, {.tie_weights = true});
    Cpu cpu;
    Gpu gpu({.device = 0, .lt_epilogues = true});
    train_alike(c, g, cpu, gpu, V, 2, 90, "Decoder (cuBLASLt)");
    BOOST_TEST_MESSAGE("FP32 Decoder: " << gpu.epilogue_stats().fused << " products fused, "
                                        << gpu.epilogue_stats().unfused << " not");
  }
  const Shape bt{4, Small::MAX_T};
  Decoder<Small, Gpu> f(V, 96, {.tie_weights = true}), u(V, 96, {.tie_weights = true});
  Gpu lt({.device = 0, .bf16 = true, .lt_epilogues = true}), plain({.device = 0, .bf16 = true});
  const auto ids = random_ids(bt.rows(), V, 98);
  std::vector<float> sf, su;
  const auto lf = lt.host_view(f.forward(lt, ids, bt), sf);
  const auto lu = plain.host_view(u.forward(plain, ids, bt), su);
  expect_close(F(lu.begin(), lu.end()), F(lf.begin(), lf.end()), "bf16 Decoder logits, fused against not", 2e-2,
               2e-3);
  const F up = randn(std::size_t(bt.rows()) * V, 99);
  DevF d_up(up);
  f.backward(lt, std::span<const float>(d_up.p(), up.size()));
  u.backward(plain, std::span<const float>(d_up.p(), up.size()));
  expect_same_tensors(u, f, true, "bf16 Decoder, fused against not", 2e-2, 2e-3);
  BOOST_TEST(lt.epilogue_stats().fused > 0u);
  BOOST_TEST(lt.epilogue_stats().unfused == 0u);  // Small's widths are multiples of 8
}

// Activation recompute on the GPU: cheap and block give the gradients of
// none bit for bit (dropout on, masks replayed); and with tiled attention
// (CudaOptions::flash_attention) past the fused kernels' 256 keys, a
// Decoder's logits and gradients agree with the CPU's (tiled there too).
struct Long : Small {
  static constexpr int MAX_T = 300;
};
template <class Model>
F device_gradients(Model& m) {
  F all;
  m.visit([&](auto&&, auto&, auto& grad) {
    F h(grad.size());
    grad.copy_to_host(h.data());
    all.insert(all.end(), h.begin(), h.end());
  });
  return all;
}
BOOST_AUTO_TEST_CASE(recompute_and_tiled_attention_on_the_gpu) {
  const int V = 40;
  for (const Shape bt : {Shape{4, Small::MAX_T}, Shape{2, Long::MAX_T}}) {
    const bool long_rows = bt.T > Small::MAX_T;
    Gpu gpu({.flash_attention = true});
    Cpu cpu;
    const auto ids = random_ids(bt.rows(), V, 90);
    const F up = randn(std::size_t(bt.rows()) * V, 91);
    DevF d_up(up);
    auto run = [&]<class Cfg>(Recompute mode, F& logits) {
      Decoder<Cfg, Gpu> g(V, 99, {.dropout = 0.1f, .attention_dropout = 0.1f, .recompute = mode});
      zero_grads(g);
      std::vector<float> staging;
      const auto l = gpu.host_view(g.forward(gpu, ids, bt), staging);
      logits.assign(l.begin(), l.end());
      g.backward(gpu, std::span<const float>(d_up.p(), up.size()));
      return device_gradients(g);
    };
    auto check = [&]<class Cfg>() {
      F l_none, l_cheap, l_block;
      const F none = run.template operator()<Cfg>(Recompute::none, l_none);
      const F cheap = run.template operator()<Cfg>(Recompute::cheap, l_cheap);
      const F block = run.template operator()<Cfg>(Recompute::block, l_block);
      const std::string at = " T " + std::to_string(bt.T);
      BOOST_TEST((l_none == l_cheap && l_none == l_block), "GPU recompute logits" << at);
      BOOST_TEST((none == cheap), "GPU cheap recompute gradients, bit for bit" << at);
      BOOST_TEST((none == block), "GPU block recompute gradients, bit for bit" << at);
      // Against the CPU, without dropout (the masks agree, but keep it to the attention paths).
      Decoder<Cfg, Cpu> c(V, 99);
      Decoder<Cfg, Gpu> g(V, 99);
      zero_grads(c);
      zero_grads(g);
      const auto lc = c.forward(cpu, ids, bt);
      std::vector<float> staging;
      const auto lg = gpu.host_view(g.forward(gpu, ids, bt), staging);
      expect_close(F(lc.begin(), lc.end()), F(lg.begin(), lg.end()), "tiled Decoder logits" + at, kModelRtol,
                   kModelAtol);
      c.backward(cpu, up);
      g.backward(gpu, std::span<const float>(d_up.p(), up.size()));
      expect_same_tensors(c, g, true, "tiled Decoder gradients" + at, kModelRtol, kModelAtol);
    };
    if (long_rows) check.template operator()<Long>();
    else check.template operator()<Small>();
  }
}

// bf16 products on both backends (CudaOptions::bf16, and CpuOptions::bf16
// where the CPU has them, else float32): a Decoder's logits and gradients
// within 2 x 4 x 2^-8 of their scale (test_bf16's model bound, once for each
// side), and cached decoding within it too.
BOOST_AUTO_TEST_CASE(decoder_in_bf16_products) {
  const int V = 40;
  const Shape bt{4, Small::MAX_T};
  Decoder<Small, Cpu> c(V, 98, {.tie_weights = true});
  Decoder<Small, Gpu> g(V, 98, {.tie_weights = true});
  Cpu cpu(CpuOptions{.bf16 = bf16::available()});
  Gpu gpu({.device = 0, .bf16 = true});
  const double tol = 2 * 4 * 0x1p-8;
  auto scale = [](const F& x) {
    double m = 0;
    for (float v : x) m = std::max(m, double(std::abs(v)));
    return m;
  };
  const auto ids = random_ids(bt.rows(), V, 64);
  const auto lc = c.forward(cpu, ids, bt);
  std::vector<float> staging;
  const auto lg = gpu.host_view(g.forward(gpu, ids, bt), staging);
  const F fc(lc.begin(), lc.end()), fg(lg.begin(), lg.end());
  expect_close(fc, fg, "bf16 Decoder logits", 0, tol * scale(fc));
  const F up = randn(fc.size(), 65);
  DevF d_up(up);
  c.backward(cpu, up);
  g.backward(gpu, std::span<const float>(d_up.p(), up.size()));
  std::map<std::string, F> grads;
  c.visit([&](std::string_view name, auto&, auto& grad) { grads[std::string(name)] = F(grad.begin(), grad.end()); });
  g.visit([&](std::string_view name, auto&, auto& grad) {
    F host(grad.size());
    grad.copy_to_host(host.data());
    const F& want = grads.at(std::string(name));
    expect_close(want, host, "bf16 Decoder gradient " + std::string(name), 0, tol * std::max(scale(want), 1e-3));
  });
  c.set_training(false);
  g.set_training(false);
  DecodingCache<Cpu> kc;
  DecodingCache<Gpu> kg;
  c.start_cache(kc, 1);
  g.start_cache(kg, 1);
  const WeightCopies copies(cpu, c);  // the CPU decodes from bf16 weights (the GPU rounds them in each product)
  for (std::int32_t t = 1; t < 6; ++t) {
    const auto dc = c.forward_cached(cpu, std::span<const std::int32_t>(&t, 1), 1, kc);
    const auto dg = gpu.host_view(g.forward_cached(gpu, std::span<const std::int32_t>(&t, 1), 1, kg), staging);
    const F hc(dc.begin(), dc.end());
    expect_close(hc, F(dg.begin(), dg.end()), "bf16 cached logits", 0, tol * scale(hc));
  }
}

// A Llama-style decoder (rotary positions, RmsNorm, SwiGLU, no biases): the
// logits of a batch, then cached decoding from a 3-token prompt, on both.
BOOST_AUTO_TEST_CASE(llama_style_decoder_and_cached_decoding) {
  const int V = 40;
  const Shape bt{3, SmallLlama::MAX_T};
  Decoder<SmallLlama, Cpu> c(V, 17);
  Decoder<SmallLlama, Gpu> g(V, 17);
  Cpu cpu;
  Gpu gpu;
  std::vector<float> staging;
  const auto ids = random_ids(bt.rows(), V, 80);
  const auto lc = c.forward(cpu, ids, bt);
  const auto lg = gpu.host_view(g.forward(gpu, ids, bt), staging);
  expect_close(F(lc.begin(), lc.end()), F(lg.begin(), lg.end()), "Llama-style logits", kModelRtol, kModelAtol);
  DecodingCache<Cpu> kc;
  DecodingCache<Gpu> kg;
  c.start_cache(kc, 1);
  g.start_cache(kg, 1);
  std::vector<std::int32_t> prompt(ids.begin(), ids.begin() + 3);
  for (int step = 0; step + 3 < SmallLlama::MAX_T; ++step) {
    const std::span<const std::int32_t> in = step == 0 ? std::span<const std::int32_t>(prompt)
                                                       : std::span<const std::int32_t>(&prompt.back(), 1);
    const auto dc = c.forward_cached(cpu, in, 1, kc);
    const auto dg = gpu.host_view(g.forward_cached(gpu, in, 1, kg), staging);
    expect_close(F(dc.begin(), dc.end()), F(dg.begin(), dg.end()), "Llama-style cached logits", kModelRtol,
                 kModelAtol);
    prompt.push_back(std::int32_t(std::max_element(dc.end() - V, dc.end()) - (dc.end() - V)));
  }
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

// The steady state on the GPU (test_steady_state on the CPU): training
// steps 3 to 10 under every recompute mode, and decoding steps after the
// second, make no device allocation (cuda::memory_use().allocations): no
// cudaMalloc or cudaFree inside a step, which graph replay needs.
BOOST_AUTO_TEST_CASE(steps_allocate_no_device_memory_after_the_first) {
  const int V = 40;
  const Shape bt{4, Small::MAX_T};
  for (Recompute mode : {Recompute::none, Recompute::cheap, Recompute::block}) {
    BOOST_TEST_CONTEXT("recompute " << recompute_name(mode)) {
      Decoder<Small, Gpu> g(V, 5, {.dropout = 0.1f, .attention_dropout = 0.1f, .recompute = mode});
      Gpu be;
      AdamW<Gpu> opt(g);
      CrossEntropyLoss<Gpu> ce;
      Gpu::Buffer<float> dl_storage;
      const std::span<float> dl(dl_storage.reserve(std::size_t(bt.rows()) * V), std::size_t(bt.rows()) * V);
      const auto ids = random_ids(bt.rows(), V, 80), targets = random_ids(bt.rows(), V, 81);
      std::size_t before = 0;
      for (int step = 1; step <= 10; ++step) {
        if (step == 3) before = cuda::memory_use().allocations;
        ce.forward(be, g.forward(be, ids, bt), targets, V);
        ce.backward(be, dl);
        g.backward(be, std::span<const float>(dl));
        clip_gradients(be, g, 1.0);
        opt.step(be, 1e-3);
      }
      be.synchronize();
      BOOST_TEST(cuda::memory_use().allocations - before == 0u, "device allocations in training steps 3 to 10");
      g.set_training(false);
      DecodingCache<Gpu> cache;
      g.start_cache(cache, 1);
      for (int step = 1; step < Small::MAX_T; ++step) {
        if (step == 3) before = cuda::memory_use().allocations;
        const std::int32_t id = step % V;
        g.forward_cached(be, std::span<const std::int32_t>(&id, 1), 1, cache);
      }
      be.synchronize();
      BOOST_TEST(cuda::memory_use().allocations - before == 0u, "device allocations in decoding steps after the second");
    }
  }
}

// Graph steps (CudaBackend::graph_step) against queueing every kernel, both
// on the GPU: the same losses, norms and weights bit for bit, with fresh
// batches, dropout keys and learning rates at every step; once warm, every
// segment of a step replays.
BOOST_AUTO_TEST_CASE(graph_steps_train_bit_for_bit_like_eager) {
  // Block recompute too: its one set of saved buffers changes hands between
  // the blocks at the same points every step, so its steps replay as well.
  for (Recompute mode : {Recompute::none, Recompute::block}) {
    BOOST_TEST_CONTEXT("recompute " << recompute_name(mode)) {
      const int V = 40;
      const Shape bt{4, Small::MAX_T};
      Decoder<Small, Gpu> e(V, 7, {.dropout = 0.1f, .attention_dropout = 0.1f, .tie_weights = true, .recompute = mode});
      Decoder<Small, Gpu> g(V, 7, {.dropout = 0.1f, .attention_dropout = 0.1f, .tie_weights = true, .recompute = mode});
      Gpu be_e, be_g;
      AdamW<Gpu> opt_e(e), opt_g(g);
      CrossEntropyLoss<Gpu> ce_e, ce_g;
      const std::size_t n = std::size_t(bt.rows()) * V;
      Gpu::Buffer<float> dl_e_storage, dl_g_storage;
      const std::span<float> dl_e(dl_e_storage.reserve(n), n), dl_g(dl_g_storage.reserve(n), n);
      struct Read {
        double loss = 0, norm = 0;
      };
      auto train = [&](Gpu& be, auto& model, AdamW<Gpu>& opt, CrossEntropyLoss<Gpu>& ce, std::span<float> dl,
                       const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& targets, int step) {
        zero_grad(model);
        Read r;
        r.loss = ce.forward(be, model.forward(be, ids, bt), targets, V);
        ce.backward(be, dl);
        model.backward(be, std::span<const float>(dl));
        r.norm = clip_gradients(be, model, 1e6);  // reads every tensor's norm (many segments), never clips
        opt.step(be, 1e-3 * (step + 1));
        return r;
      };
      std::size_t warm_captures = 0;
      for (int step = 0; step < 6; ++step) {
        const auto ids = random_ids(bt.rows(), V, 200 + step), targets = random_ids(bt.rows(), V, 300 + step);
        const Read eager = train(be_e, e, opt_e, ce_e, dl_e, ids, targets, step);
        Read graphed;
        be_g.graph_step("train", [&] { graphed = train(be_g, g, opt_g, ce_g, dl_g, ids, targets, step); });
        BOOST_TEST(eager.loss == graphed.loss, "step " << step << " loss " << eager.loss << " vs " << graphed.loss);
        BOOST_TEST(eager.norm == graphed.norm, "step " << step << " norm " << eager.norm << " vs " << graphed.norm);
        expect_same_tensors(e, g, false, "after graph step " + std::to_string(step), 0, 0);
        if (step == 2) warm_captures = be_g.graph_stats().captures;
      }
      const auto stats = be_g.graph_stats();
      BOOST_TEST(stats.captures == warm_captures, "steps 3-5 captured " << stats.captures - warm_captures << " segments");
      BOOST_TEST(stats.replays >= 3 * 2, "replays " << stats.replays);
      std::cout << "graph steps: " << stats.captures << " segments captured, " << stats.replays << " replayed\n";

      // A bad token id inside a graph step: a clear error, nothing recorded is
      // run, and the next step is again the eager one.
      auto bad = random_ids(bt.rows(), V, 400);
      bad[5] = V + 3;
      BOOST_CHECK_EXCEPTION(be_g.graph_step("train", [&] { train(be_g, g, opt_g, ce_g, dl_g, bad, bad, 6); }), Error,
                            [](const Error& err) { return std::string(err.what()).find("out of range") != std::string::npos; });
      BOOST_CHECK_THROW(be_g.graph_step("outer", [&] { be_g.graph_step("inner", [] {}); }), Error);
      const auto ids = random_ids(bt.rows(), V, 500), targets = random_ids(bt.rows(), V, 501);
      const Read eager = train(be_e, e, opt_e, ce_e, dl_e, ids, targets, 6);
      Read graphed;
      be_g.graph_step("train", [&] { graphed = train(be_g, g, opt_g, ce_g, dl_g, ids, targets, 6); });
      BOOST_TEST(eager.loss == graphed.loss);
      expect_same_tensors(e, g, false, "after the failed graph step", 0, 0);

      // Forward passes of changing batch size: each new shape recaptures.
      e.set_training(false);
      g.set_training(false);
      std::vector<float> staging;
      for (int b : {4, 2, 4}) {
        const Shape shape{b, Small::MAX_T};
        const auto x = random_ids(shape.rows(), V, 600 + b);
        const auto le = be_e.host_view(e.forward(be_e, x, shape), staging);
        const F want(le.begin(), le.end());
        std::span<const float> lg;
        be_g.graph_step("forward", [&] { lg = g.forward(be_g, x, shape); });
        const auto got = be_g.host_view(lg, staging);
        expect_close(want, F(got.begin(), got.end()), "graph step forward, batch " + std::to_string(b), 0, 0);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
