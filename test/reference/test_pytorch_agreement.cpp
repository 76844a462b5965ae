// xfmr's float32 blocks and models against torch.nn.Transformer{Encoder,Decoder}Layer
// (models: torch embeddings + those layers + LayerNorm/pooling + Linear).
// The fixtures are written by make_fixtures.py (see there); PyTorch is not
// needed to run this test. Criterion: max |xfmr - torch| <= 1e-4 * max |torch|
// for the output, every input gradient and every parameter gradient.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <iostream>
#include <string>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/layers/feed_forward.hpp"
#include "xfmr/layers/rms_norm.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"

BOOST_AUTO_TEST_SUITE(test_pytorch_agreement)

using namespace xfmr;
using Cpu = CpuBackend<float>;

constexpr double kTolerance = 1e-4;
double worst_seen = 0.0;

template <class NormPolicy, class ActivationKind>
struct FixtureCfg {
  static constexpr int MAX_T = 8, D_MODEL = 16, N_HEADS = 4, N_LAYERS = 1, D_FF = 32;
  using Norm = NormPolicy;
  using Activation = ActivationKind;
};

SafeTensors fixture(const std::string& name) {
  return SafeTensors::load(std::string(XFMR_FIXTURE_DIR) + "/" + name + ".safetensors");
}

// Scaled max error of `got` against the fixture tensor `name`.
double compare(const SafeTensors& st, const std::string& name, const float* got, std::size_t n) {
  const auto want = st.values<double>(name);
  BOOST_REQUIRE_MESSAGE(want.size() == n, name << ": fixture has " << want.size() << " elements, xfmr " << n);
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  const double rel = err / std::max(scale, 1e-30);
  worst_seen = std::max(worst_seen, rel);
  BOOST_TEST(rel <= kTolerance, name << ": max error " << err << " is " << rel << " of the tensor's scale " << scale);
  return rel;
}

template <class Layer>
void load_params(Layer& layer, const SafeTensors& st) {
  std::size_t loaded = 0;
  layer.visit([&](std::string_view name, auto& value, auto&) {
    st.copy_to<float>("param." + std::string(name), value.shape(), std::span<float>(value.data(), value.size()));
    ++loaded;
  });
  std::size_t in_file = 0;
  for (const auto& n : st.names()) in_file += n.rfind("param.", 0) == 0;
  BOOST_TEST(loaded == in_file, "every fixture parameter maps onto an xfmr parameter");
}

template <class Layer>
double compare_param_grads(Layer& layer, const SafeTensors& st) {
  double worst = 0;
  layer.visit([&](std::string_view name, auto&, auto& grad) {
    worst = std::max(worst, compare(st, "grad.param." + std::string(name), grad.data(), grad.size()));
  });
  return worst;
}

std::vector<std::uint8_t> mask_of(const SafeTensors& st, const std::string& name) {
  const auto v = st.integers(name);
  return {v.begin(), v.end()};
}

// dropout > 0: the block is built with that rate on its branches and its
// attention probabilities and run in evaluation mode, against the same
// fixture (PyTorch's layer with dropout disabled).
template <class Block>
void check_self_block(const std::string& name, bool padded, float dropout = 0.0f) {
  const auto st = fixture(name);
  constexpr int D = Block::D;
  const Shape bt{2, 5};
  Rng rng(0);
  Cpu be;
  Block block(rng, dropout, dropout);
  if (dropout > 0) block.set_training(false);
  load_params(block, st);
  const auto x = st.values<float>("x"), dy = st.values<float>("dy");
  const auto pad = padded ? mask_of(st, "key_padding") : std::vector<std::uint8_t>{};
  std::vector<float> y(x.size()), dx(x.size());
  zero_grad(block);
  block.forward(be, ConstRows<float, D>(x.data(), bt.rows()), Rows<float, D>(y.data(), bt.rows()), bt,
                padded ? pad.data() : nullptr);
  block.backward(be, ConstRows<float, D>(dy.data(), bt.rows()), Rows<float, D>(dx.data(), bt.rows()));
  double worst = compare(st, "y", y.data(), y.size());
  worst = std::max(worst, compare(st, "grad.x", dx.data(), dx.size()));
  worst = std::max(worst, compare_param_grads(block, st));
  std::cout << name << ": worst scaled error " << worst << " (" << st.metadata().at("config") << ")\n";
}

template <class Cfg>
void check_decoder_block(const std::string& name, float dropout = 0.0f) {
  const auto st = fixture(name);
  constexpr int D = Cfg::D_MODEL;
  const Shape tgt{2, 5}, src{2, 6};
  Rng rng(0);
  Cpu be;
  DecoderBlock<Cfg, Cpu> block(rng, dropout, dropout);
  if (dropout > 0) block.set_training(false);
  load_params(block, st);
  const auto x = st.values<float>("x"), mem = st.values<float>("memory"), dy = st.values<float>("dy");
  const auto tgt_pad = mask_of(st, "tgt_padding"), src_pad = mask_of(st, "src_padding");
  std::vector<float> y(x.size()), dx(x.size()), dmem(mem.size());
  zero_grad(block);
  block.forward(be, ConstRows<float, D>(x.data(), tgt.rows()), ConstRows<float, D>(mem.data(), src.rows()),
                Rows<float, D>(y.data(), tgt.rows()), tgt, src, tgt_pad.data(), src_pad.data());
  block.backward(be, ConstRows<float, D>(dy.data(), tgt.rows()), Rows<float, D>(dx.data(), tgt.rows()),
                 Rows<float, D>(dmem.data(), src.rows()));
  double worst = compare(st, "y", y.data(), y.size());
  worst = std::max(worst, compare(st, "grad.x", dx.data(), dx.size()));
  worst = std::max(worst, compare(st, "grad.memory", dmem.data(), dmem.size()));
  worst = std::max(worst, compare_param_grads(block, st));
  std::cout << name << ": worst scaled error " << worst << " (" << st.metadata().at("config") << ")\n";
}

BOOST_AUTO_TEST_CASE(pre_norm_decoder_only_block) {
  check_self_block<DecoderOnlyBlock<FixtureCfg<PreNorm, Gelu>, Cpu>>("decoder_only_block_prenorm", false);
}

BOOST_AUTO_TEST_CASE(post_norm_encoder_block_with_padding) {
  check_self_block<EncoderBlock<FixtureCfg<PostNorm, Relu>, Cpu>>("encoder_block_postnorm_padded", true);
}

BOOST_AUTO_TEST_CASE(post_norm_decoder_block_with_cross_attention) {
  check_decoder_block<FixtureCfg<PostNorm, Relu>>("decoder_block_postnorm");
}

BOOST_AUTO_TEST_CASE(pre_norm_decoder_block_with_cross_attention) {
  check_decoder_block<FixtureCfg<PreNorm, Gelu>>("decoder_block_prenorm");
}

// A layer over D_MODEL features, rows of x -> y, against a fixture of x,
// dy, y, grad.x and its parameters' gradients.
template <class Layer>
void check_row_layer(const std::string& name, Layer& layer) {
  const auto st = fixture(name);
  constexpr int D = FixtureCfg<PreNorm, Gelu>::D_MODEL;
  Cpu be;
  load_params(layer, st);
  const auto x = st.values<float>("x"), dy = st.values<float>("dy");
  const int rows = int(x.size() / D);
  std::vector<float> y(x.size()), dx(x.size());
  zero_grad(layer);
  layer.forward(be, ConstRows<float, D>(x.data(), rows), Rows<float, D>(y.data(), rows));
  layer.backward(be, ConstRows<float, D>(dy.data(), rows), Rows<float, D>(dx.data(), rows));
  double worst = compare(st, "y", y.data(), y.size());
  worst = std::max(worst, compare(st, "grad.x", dx.data(), dx.size()));
  worst = std::max(worst, compare_param_grads(layer, st));
  std::cout << name << ": worst scaled error " << worst << " (" << st.metadata().at("config") << ")\n";
}

// A Llama-style block (RmsNorm, rotary positions, grouped-query attention with
// 2 key/value heads for 4 query heads, SwiGLU, no biases) against the same
// block written out in plain torch.
struct LlamaFixtureCfg : FixtureCfg<PreNorm, SwiGlu> {
  static constexpr int N_KV_HEADS = 2;
  template <int D, class Be>
  using NormLayer = RmsNorm<D, Be>;
  using Positions = Rope;
  static constexpr bool BIAS = false;
};
BOOST_AUTO_TEST_CASE(llama_style_decoder_only_block) {
  check_self_block<DecoderOnlyBlock<LlamaFixtureCfg, Cpu>>("llama_block", false);
}

// RmsNorm against RMSNorm written out in plain torch (make_fixtures.py).
BOOST_AUTO_TEST_CASE(rms_norm_layer) {
  RmsNorm<FixtureCfg<PreNorm, Gelu>::D_MODEL, Cpu> norm;
  check_row_layer("rms_norm", norm);
}

// The SwiGLU feed-forward against the same written out in plain torch.
BOOST_AUTO_TEST_CASE(swiglu_feed_forward) {
  struct Cfg : FixtureCfg<PreNorm, SwiGlu> {};
  Rng rng(0);
  FeedForward<Cfg, Cpu> ff(rng);
  check_row_layer("swiglu_feed_forward", ff);
}

// The GeGLU feed-forward (T5 v1.1's gated GELU) against the same in plain torch.
BOOST_AUTO_TEST_CASE(geglu_feed_forward) {
  struct Cfg : FixtureCfg<PreNorm, GeGlu> {};
  Rng rng(0);
  FeedForward<Cfg, Cpu> ff(rng);
  check_row_layer("geglu_feed_forward", ff);
}

// Dropout (branches and attention probabilities) switched off by evaluation
// mode leaves the forward and backward of PyTorch's dropout-free layers.
BOOST_AUTO_TEST_CASE(blocks_with_dropout_in_evaluation_mode) {
  check_self_block<EncoderBlock<FixtureCfg<PostNorm, Relu>, Cpu>>("encoder_block_postnorm_padded", true, 0.3f);
  check_decoder_block<FixtureCfg<PreNorm, Gelu>>("decoder_block_prenorm", 0.3f);
}

template <class NormPolicy, class ActivationKind>
struct ModelCfg : FixtureCfg<NormPolicy, ActivationKind> {
  static constexpr int N_LAYERS = 2;
};

std::vector<std::int32_t> ids_of(const SafeTensors& st) {
  const auto v = st.integers("ids");
  return {v.begin(), v.end()};
}

BOOST_AUTO_TEST_CASE(decoder_language_model) {
  const auto st = fixture("decoder_model");
  Cpu be;
  Decoder<ModelCfg<PreNorm, Gelu>, Cpu> model(11, 0);
  load_params(model, st);
  const auto ids = ids_of(st);
  const auto dlogits = st.values<float>("dlogits");
  zero_grad(model);
  const auto logits = model.forward(be, ids, Shape{2, 5});
  double worst = compare(st, "logits", logits.data(), logits.size());
  model.backward(be, dlogits);
  worst = std::max(worst, compare_param_grads(model, st));
  std::cout << "decoder_model: worst scaled error " << worst << " (" << st.metadata().at("config") << ")\n";
}

BOOST_AUTO_TEST_CASE(classifier_with_padding_and_mean_pooling) {
  const auto st = fixture("classifier_model");
  Cpu be;
  Classifier<ModelCfg<PostNorm, Relu>, Cpu> model(13, 3, 0, {.dropout = 0.0f, .pooling = Pooling::Mean});
  load_params(model, st);
  const auto ids = ids_of(st);
  const auto pad = mask_of(st, "key_padding");
  const auto dlogits = st.values<float>("dlogits");
  zero_grad(model);
  const auto logits = model.forward(be, ids, Shape{2, 5}, pad.data());
  double worst = compare(st, "logits", logits.data(), logits.size());
  model.backward(be, dlogits);
  worst = std::max(worst, compare_param_grads(model, st));
  std::cout << "classifier_model: worst scaled error " << worst << " (" << st.metadata().at("config") << ")\n";
}

BOOST_AUTO_TEST_CASE(seq2seq_against_nn_transformer) {
  const auto st = fixture("seq2seq_model");
  Cpu be;
  using Cfg = ModelCfg<PreNorm, Gelu>;
  Seq2Seq<Cfg, Cfg, Cpu> model(12, 10, 0);
  load_params(model, st);
  const auto src = st.integers("src"), tgt = st.integers("tgt");
  const std::vector<std::int32_t> src_ids(src.begin(), src.end()), tgt_ids(tgt.begin(), tgt.end());
  const auto src_pad = mask_of(st, "src_padding"), tgt_pad = mask_of(st, "tgt_padding");
  const auto dlogits = st.values<float>("dlogits");
  zero_grad(model);
  const auto logits = model.forward(be, src_ids, Shape{2, 6}, src_pad.data(), tgt_ids, Shape{2, 5}, tgt_pad.data());
  double worst = compare(st, "logits", logits.data(), logits.size());
  model.backward(be, dlogits);
  worst = std::max(worst, compare_param_grads(model, st));
  std::cout << "seq2seq_model: worst scaled error " << worst << " (" << st.metadata().at("config") << ")\n";
}

BOOST_AUTO_TEST_CASE(negative_control_a_perturbed_weight_is_detected) {
  // The comparison is sharp enough to see one of 768 projection weights off by 10%.
  const auto st = fixture("encoder_block_postnorm_padded");
  using Block = EncoderBlock<FixtureCfg<PostNorm, Relu>, Cpu>;
  const Shape bt{2, 5};
  Rng rng(0);
  Cpu be;
  Block block(rng);
  load_params(block, st);
  block.visit([](std::string_view n, auto& v, auto&) {
    if (n == "attn.qkv.weight") v[7] *= 1.1f;
  });
  const auto x = st.values<float>("x");
  const auto pad = mask_of(st, "key_padding");
  std::vector<float> y(x.size());
  block.forward(be, ConstRows<float, 16>(x.data(), 10), Rows<float, 16>(y.data(), 10), bt, pad.data());
  const auto want = st.values<double>("y");
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    err = std::max(err, std::abs(double(y[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  BOOST_TEST(err / scale > kTolerance, "perturbed output still within tolerance: " << err / scale);
}

BOOST_AUTO_TEST_CASE(report_worst) {
  std::cout << "pytorch agreement: worst scaled error over all fixtures " << worst_seen << "\n";
  BOOST_TEST(worst_seen > 0.0);  // the comparisons above ran
}

BOOST_AUTO_TEST_SUITE_END()
