#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/bigram.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/encoder.hpp"
#include "xfmr/models/seq2seq.hpp"

BOOST_AUTO_TEST_SUITE(test_models)

using namespace xfmr;
using namespace xfmr::test;

namespace {

struct TinyPostSinusoidal : TinyPost {
  static constexpr int N_LAYERS = 2;
  using Positions = Sinusoidal;
};
struct TinyPre2 : TinyPre {
  static constexpr int N_LAYERS = 2;
};

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, Rng& rng) {
  std::vector<std::int32_t> ids(n);
  for (auto& i : ids) i = static_cast<std::int32_t>(rng.below(vocab));
  return ids;
}

// Larger weights than the GPT-2 initialisation, so gradients are O(0.1) and
// every nonlinearity is exercised away from its linear regime.
template <class Model>
void spread_parameters(Model& model, Rng& rng) {
  model.visit([&](std::string_view, auto& value, auto&) {
    const double scale = value.shape().size() >= 2 ? 0.5 : 0.1;
    for (auto& v : value) v += scale * rng.uniform(-1, 1);
  });
}

// Gradient check of a model mapping ids to a logit span.
template <class Model, class Forward>
void check_model(const std::string& name, Model& model, std::size_t out_size, Forward forward) {
  Rng rng(77);
  spread_parameters(model, rng);
  Be be;
  GradCase c;
  c.name = name;
  c.output(out_size, rng);
  c.forward = [&] {
    const auto y = forward(be);
    BOOST_REQUIRE_EQUAL(y.size(), c.y.size());
    std::copy(y.begin(), y.end(), c.y.begin());
  };
  c.backward = [&] { model.backward(be, std::span<const double>(c.dy)); };
  c.visit = [&](const ParamFn& f) { model.visit(f); };
  check_case(c);
}

template <class Model>
std::size_t visited(Model& m) {
  return parameter_count(m);
}

// A Decoder's gradient check over 2 sequences of 5 of its 7 tokens, and the
// parameters visit() lists against their count worked out by hand.
template <class Cfg>
void check_decoder(const std::string& name, Decoder<Cfg, Be>& model, std::uint64_t seed, std::size_t parameters) {
  Rng rng(seed);
  const Shape bt{2, 5};
  const auto ids = random_ids(bt.rows(), 7, rng);
  check_model(name, model, bt.rows() * 7, [&](Be& be) { return model.forward(be, ids, bt); });
  BOOST_TEST(visited(model) == parameters);
}

}  // namespace

BOOST_AUTO_TEST_CASE(decoder_pre_norm_learned_untied) {
  Rng rng(1);
  Decoder<TinyPre2, Be> model(7, 11);
  const Shape bt{2, 5};
  const auto ids = random_ids(bt.rows(), 7, rng);
  check_model("Decoder pre-norm, learned positions", model, bt.rows() * 7,
              [&](Be& be) { return model.forward(be, ids, bt); });
  // tok 7*8 + pos 6*8 + 2 blocks * (2 norms 16 + qkv 9*24 + proj 9*8 + fc1 9*12 + fc2 13*8) + ln_f 16 + head 8*7+7
  BOOST_TEST(visited(model) == 1247u);
}

BOOST_AUTO_TEST_CASE(decoder_post_norm_sinusoidal_tied) {
  Rng rng(2);
  Decoder<TinyPostSinusoidal, Be> model(9, 12, {.dropout = 0.0f, .tie_weights = true});
  const Shape bt{2, 4};
  const auto ids = random_ids(bt.rows(), 9, rng);
  check_model("Decoder post-norm, sinusoidal, tied head", model, bt.rows() * 9,
              [&](Be& be) { return model.forward(be, ids, bt); });
  BOOST_TEST(visited(model) == 1145u);  // no position table, no ln_f (post-norm), the head's bias alone
  std::vector<std::string> names;
  model.visit([&](std::string_view n, auto&, auto&) { names.emplace_back(n); });
  BOOST_TEST(names.front() == "tok_emb.weight");
  BOOST_TEST(names.back() == "lm_head.bias");  // the tied weight is listed once, as tok_emb
  BOOST_TEST(std::count(names.begin(), names.end(), "lm_head.weight") == 0);
}

// RmsNorm in the Norm slot: the blocks' norms and the final one ("ln_f.weight"
// alone), and the compile-time count follows.
struct TinyRmsPre2 : TinyRmsPre {
  static constexpr int N_LAYERS = 2;
};

BOOST_AUTO_TEST_CASE(decoder_with_rms_norm) {
  using Cfg = TinyRmsPre2;
  Decoder<Cfg, Be> model(7, 13);
  check_decoder("Decoder pre-norm, RmsNorm", model, 3, 1247 - 5 * Cfg::D_MODEL);  // LayerNorm's five biases less
  std::vector<std::string> names;
  model.visit([&](std::string_view n, auto&, auto&) { names.emplace_back(n); });
  BOOST_TEST(std::count(names.begin(), names.end(), "ln_f.weight") == 1);
  BOOST_TEST(std::count(names.begin(), names.end(), "ln_f.bias") == 0);
}

BOOST_AUTO_TEST_CASE(decoder_is_causal) {
  // Changing a later token never changes earlier logits.
  Rng rng(3);
  CpuBackend<float> be;
  Decoder<TinyPre2, CpuBackend<float>> model(11, 5);
  const Shape bt{1, 6};
  auto ids = random_ids(6, 11, rng);
  const auto a = model.forward(be, ids, bt);
  const std::vector<float> first(a.begin(), a.end());
  ids[4] = (ids[4] + 1) % 11;
  const auto b = model.forward(be, ids, bt);
  for (int i = 0; i < 4 * 11; ++i) BOOST_TEST(first[i] == b[i]);
  bool later_changed = false;
  for (int i = 4 * 11; i < 6 * 11; ++i) later_changed |= first[i] != b[i];
  BOOST_TEST(later_changed);
}

BOOST_AUTO_TEST_CASE(encoder_with_padding) {
  Rng rng(4);
  Be be;
  Encoder<TinyPre2, Be> model(6, rng);
  const Shape bt{2, 4};
  const auto ids = random_ids(bt.rows(), 6, rng);
  const std::vector<std::uint8_t> pad = {0, 0, 0, 0, 0, 0, 1, 1};
  GradCase c;
  c.name = "Encoder pre-norm, padded";
  spread_parameters(model, rng);
  c.output(bt.rows() * 8, rng);
  c.forward = [&] {
    const auto h = model.forward(be, ids, bt, pad.data());
    std::copy(h.data, h.data + h.size(), c.y.begin());
  };
  c.backward = [&] { model.backward(be, crows_of<8>(c.dy)); };
  c.visit = [&](const ParamFn& f) { model.visit(f); };
  check_case(c);
  BOOST_TEST(visited(model) == 1176u);
}

BOOST_AUTO_TEST_CASE(encoder_ignores_padded_tokens) {
  // What sits at a padded position does not change the unpadded outputs.
  Rng rng(5);
  CpuBackend<float> be;
  Encoder<TinyPost, CpuBackend<float>> model(10, rng);
  const Shape bt{1, 5};
  auto ids = random_ids(5, 10, rng);
  const std::vector<std::uint8_t> pad = {0, 0, 0, 1, 1};
  const auto h1 = model.forward(be, ids, bt, pad.data());
  const std::vector<float> a(h1.data, h1.data + 3 * 8);
  ids[3] = (ids[3] + 3) % 10;
  ids[4] = (ids[4] + 5) % 10;
  const auto h2 = model.forward(be, ids, bt, pad.data());
  for (int i = 0; i < 3 * 8; ++i) BOOST_TEST(a[i] == h2.data[i]);
}

BOOST_AUTO_TEST_CASE(classifier_mean_pooling_padded) {
  Rng rng(6);
  Classifier<TinyPost, Be> model(8, 3, 21, {.dropout = 0.0f, .pooling = Pooling::Mean});
  const Shape bt{3, 4};
  const auto ids = random_ids(bt.rows(), 8, rng);
  const std::vector<std::uint8_t> pad = {0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1};
  check_model("Classifier post-norm, mean pooling, padded", model, 3 * 3,
              [&](Be& be) { return model.forward(be, ids, bt, pad.data()); });
  BOOST_TEST(visited(model) == 671u);
}

BOOST_AUTO_TEST_CASE(classifier_cls_pooling) {
  Rng rng(7);
  Classifier<TinyPre2, Be> model(8, 2, 22, {.dropout = 0.0f, .pooling = Pooling::Cls});
  const Shape bt{2, 5};
  const auto ids = random_ids(bt.rows(), 8, rng);
  const std::vector<std::uint8_t> pad = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  check_model("Classifier pre-norm, CLS pooling", model, 2 * 2,
              [&](Be& be) { return model.forward(be, ids, bt, pad.data()); });
}

BOOST_AUTO_TEST_CASE(bigram) {
  Rng rng(8);
  Bigram<Be> model(5, 3);
  const Shape bt{2, 3};
  const auto ids = std::vector<std::int32_t>{0, 4, 4, 1, 2, 4};
  check_model("Bigram", model, bt.rows() * 5, [&](Be& be) { return model.forward(be, ids, bt); });
  BOOST_TEST(visited(model) == 25u);
}

BOOST_AUTO_TEST_CASE(models_reject_bad_input) {
  CpuBackend<float> be;
  Decoder<TinyPre2, CpuBackend<float>> model(7, 1);
  const std::vector<std::int32_t> ids = {1, 2, 7, 3};
  try {
    model.forward(be, ids, Shape{1, 4});
    BOOST_FAIL("id 7 with vocab 7 accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "token id 7 at position 2 out of range [0, 7)");
  }
  const std::vector<std::int32_t> long_ids(8, 1);
  try {
    model.forward(be, long_ids, Shape{1, 8});
    BOOST_FAIL("T = 8 > MAX_T = 6 accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "sequence length 8 exceeds MAX_T 6");
  }
  BOOST_CHECK_THROW(model.forward(be, ids, Shape{2, 4}), Error);  // 4 ids for B*T = 8
  BOOST_CHECK_THROW((Classifier<TinyPre, CpuBackend<float>>(5, 1, 1)), Error);  // one class
}

struct Shakespeare {
  static constexpr int MAX_T = 32, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 4, D_FF = 256;
  using Norm = PreNorm;
  using Activation = Relu;
};

BOOST_AUTO_TEST_CASE(parameter_count_of_the_seeds_model) {
  // tok 65*64 + pos 32*64 + 4 blocks * 49,984 + ln_f 128 + head 65*64 + 65
  Decoder<Shakespeare, CpuBackend<float>> model(65, 1);
  BOOST_TEST(parameter_count(model) == 65u * 64 + 32 * 64 + 4 * 49984 + 128 + 65 * 64 + 65);
  BOOST_TEST(parameter_count(model) == 210'497u);
}

struct TinySrc : TinyPost {
  static constexpr int N_LAYERS = 2, D_FF = 10;
  using Positions = Sinusoidal;
};
struct TinyTgt : TinyPost {
  static constexpr int N_LAYERS = 2;
  using Positions = Sinusoidal;
};
struct TinySrcPre : TinyPre {};
struct TinyTgtPre : TinyPre {
  static constexpr int N_LAYERS = 2;
};

template <class Model>
void check_seq2seq(const std::string& name, Model& model, int sv, int tv) {
  Rng rng(31);
  const Shape src{2, 5}, tgt{2, 4};
  const auto src_ids = random_ids(src.rows(), sv, rng), tgt_ids = random_ids(tgt.rows(), tv, rng);
  const std::vector<std::uint8_t> src_pad = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, tgt_pad = {0, 0, 0, 0, 0, 0, 0, 1};
  check_model(name, model, tgt.rows() * tv,
              [&](Be& be) { return model.forward(be, src_ids, src, src_pad.data(), tgt_ids, tgt, tgt_pad.data()); });
}

BOOST_AUTO_TEST_CASE(seq2seq_post_norm_sinusoidal) {
  Seq2Seq<TinySrc, TinyTgt, Be> model(7, 6, 41);
  check_seq2seq("Seq2Seq post-norm, sinusoidal, padded", model, 7, 6);
  BOOST_TEST(visited(model) == 2826u);
}

struct TinyLlama2 : TinyLlama {
  static constexpr int N_LAYERS = 2;
};

BOOST_AUTO_TEST_CASE(decoder_with_rms_norm_and_swiglu) {
  Decoder<TinyLlama2, Be> model(7, 14);
  // tok 56 + 2 blocks * (norms 16 + qkv 8*24 + proj 8*8 + fc1 8*24 + fc2 12*8) + ln_f 8 + head 8*7+7
  check_decoder("Decoder RmsNorm + SwiGLU, rotary, no biases", model, 4, 1247);
  std::size_t biases = 0;
  model.visit([&](std::string_view n, auto&, auto&) { biases += n.ends_with(".bias") && n != "lm_head.bias"; });
  BOOST_TEST(biases == 0u);
}

// Grouped-query attention in a decoder and in both halves of a Seq2Seq
// (cross-attention's key/value projection shrinks too).
struct TinyGqa2 : TinyGqa {
  static constexpr int N_LAYERS = 2;
};
BOOST_AUTO_TEST_CASE(models_with_grouped_query_attention) {
  Decoder<TinyGqa2, Be> model(7, 15);
  check_decoder("Decoder 4 query / 2 key-value heads", model, 6, 1103);
  // Against TinyPre2's 24-row fused projection (two heads of 4), 4 x 2 query
  // rows and 2 x 2 key and value rows are 16: 8 rows of 8 weights and a bias
  // fewer in each of the two blocks.
  BOOST_TEST(visited(model) + 2 * (8 * 9) == 1247u);
  Seq2Seq<TinyGqa, TinyGqa2, Be> s2s(7, 6, 46);
  check_seq2seq("Seq2Seq 4 / 2 heads", s2s, 7, 6);
  BOOST_TEST(visited(s2s) == 2130u);
}

struct TinyTgtRms : TinyRmsPre {
  static constexpr int N_LAYERS = 2;
};

BOOST_AUTO_TEST_CASE(seq2seq_with_rms_norm) {
  Seq2Seq<TinyRmsPre, TinyTgtRms, Be> model(7, 6, 44);
  check_seq2seq("Seq2Seq pre-norm, RmsNorm", model, 7, 6);
  BOOST_TEST(visited(model) == 2410u);
}

// Llama-style encoder and decoder (no biases in any projection, cross-attention included).
BOOST_AUTO_TEST_CASE(seq2seq_llama_style) {
  Seq2Seq<TinyLlama, TinyLlama2, Be> model(7, 6, 45);
  check_seq2seq("Seq2Seq RmsNorm + SwiGLU, no biases", model, 7, 6);
  BOOST_TEST(visited(model) == 2382u);
}

BOOST_AUTO_TEST_CASE(seq2seq_pre_norm_tied_output) {
  Seq2Seq<TinySrcPre, TinyTgtPre, Be> model(7, 6, 42, {.dropout = 0.0f, .tie_output = true});
  check_seq2seq("Seq2Seq pre-norm, tied output", model, 7, 6);
  BOOST_TEST(visited(model) == 2442u);
}

BOOST_AUTO_TEST_CASE(seq2seq_shared_embeddings_and_tied_output) {
  // One table embeds source and target and projects the output: its gradient
  // sums the encoder's, the decoder's and the head's contributions.
  using Model = Seq2Seq<TinySrcPre, TinyTgtPre, Be>;
  Model model(7, 7, 43, {.dropout = 0.0f, .tie_output = true, .share_embeddings = true});
  check_seq2seq("Seq2Seq pre-norm, shared embeddings, tied output", model, 7, 7);
  BOOST_TEST(visited(model) == 2395u);
  int tables = 0;
  model.visit([&](std::string_view name, auto&, auto&) { tables += name.ends_with("tok_emb.weight"); });
  BOOST_TEST(tables == 1);
  BOOST_CHECK_THROW(Model(7, 6, 43, {.share_embeddings = true}), Error);  // two vocabularies cannot share
}

BOOST_AUTO_TEST_SUITE_END()
