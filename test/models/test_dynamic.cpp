// Static and Dynamic instantiations of one shape compute the same bits
// (core/config.hpp): ten AdamW steps (every weight byte for byte) and 64
// greedy tokens through the cache, for each of the four models; a model of
// Dynamic parts (AnyParts: the norms' place and kind, the activation and
// the positions given at run time) computes the bits of the static
// configuration with those parts, for five combinations that cover every
// value of each part; and a
// Dynamic model's sizes that disagree are an xfmr::Error naming them.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <string>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/io/architecture.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/classifier_model.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/encoder.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/models/translation_model.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/train/optimizers.hpp"

BOOST_AUTO_TEST_SUITE(test_dynamic)

using namespace xfmr;
using Be = CpuBackend<float>;

namespace {

// A GPT-style model with a context long enough for 64 greedy tokens, and a
// Llama-style one (RMSNorm, SwiGLU, rotary positions, grouped-query
// attention, no biases; theta and epsilon of its own).
struct Gpt {
  static constexpr int MAX_T = 72, D_MODEL = 24, N_HEADS = 3, N_LAYERS = 2, D_FF = 40;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};
struct Llama {
  static constexpr int MAX_T = 72, D_MODEL = 32, N_HEADS = 4, N_KV_HEADS = 2, N_LAYERS = 2, D_FF = 48;
  static constexpr bool BIAS = false;
  static constexpr double NORM_EPS = 1e-6, ROPE_THETA = 5e5;
  using Norm = PreNorm;
  template <int W, class B>
  using NormLayer = RmsNorm<W, B>;
  using Activation = SwiGlu;
  using Positions = Rope;
};
struct Post {
  static constexpr int MAX_T = 72, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 2, D_FF = 32;
  using Norm = PostNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};
// Architectures no published family has: post-norm GeGLU with sinusoidal
// positions, and post-norm RMSNorm with ReLU and rotary positions.
struct PostGeGlu {
  static constexpr int MAX_T = 72, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 2, D_FF = 24;
  using Norm = PostNorm;
  using Activation = GeGlu;
  using Positions = Sinusoidal;
};
struct PostRmsRope {
  static constexpr int MAX_T = 72, D_MODEL = 16, N_HEADS = 4, N_KV_HEADS = 2, N_LAYERS = 2, D_FF = 24;
  static constexpr bool BIAS = false;
  using Norm = PostNorm;
  template <int W, class B>
  using NormLayer = RmsNorm<W, B>;
  using Activation = Relu;
  using Positions = Rope;
};

// f throws an xfmr::Error whose message holds `part`.
void says(const std::function<void()>& f, const std::string& part) {
  const std::string e = test::error_of(f);
  BOOST_TEST(e.find(part) != std::string::npos, "'" << e << "' does not say '" << part << "'");
}

std::vector<std::int32_t> ids_of(int n, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& i : ids) i = static_cast<std::int32_t>(rng.below(vocab));
  return ids;
}

// Every parameter's bytes, in visit order.
template <class Model>
std::vector<unsigned char> weight_bytes(Model& m) {
  std::vector<unsigned char> bytes;
  m.visit([&](std::string_view, auto& value, auto&) {
    const auto* p = reinterpret_cast<const unsigned char*>(value.data());
    bytes.insert(bytes.end(), p, p + value.size() * sizeof(*value.data()));
  });
  return bytes;
}

// The softmax cross-entropy's gradient of logits (rows, V) against targets.
std::vector<float> loss_gradient(std::span<const float> logits, const std::vector<std::int32_t>& targets, int V) {
  std::vector<float> d(logits.begin(), logits.end());
  for (std::size_t r = 0; r < targets.size(); ++r) {
    float* row = d.data() + r * V;
    const float m = *std::max_element(row, row + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += row[v] = std::exp(row[v] - m);
    for (int v = 0; v < V; ++v) row[v] = float(row[v] / sum) / float(targets.size());
    row[targets[r]] -= 1.0f / float(targets.size());
  }
  return d;
}

// Ten AdamW steps of next-token training; f(be) runs a forward and returns the logits.
template <class Model, class Forward>
void train(Model& m, int V, const std::vector<std::int32_t>& targets, Forward f) {
  Be be;
  AdamW<Be> opt(m);
  for (int step = 0; step < 10; ++step) {
    m.visit([](std::string_view, auto&, auto& grad) { grad.zero(); });
    const auto logits = f(be);
    const auto d = loss_gradient(logits, targets, V);
    m.backward(be, std::span<const float>(d));
    opt.step(be, 1e-2);
  }
}

template <class Model>
std::vector<std::int32_t> greedy(Model& m, int V, int n) {
  Be be;
  DecodingCache<Be> cache;
  m.start_cache(cache, 1);
  std::vector<std::int32_t> out{1};
  for (int i = 0; i < n; ++i) {
    const auto logits = m.forward_cached(be, std::span(out).last(1), 1, cache);
    out.push_back(std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  (void)V;
  return out;
}

template <class Cfg>
void decoder_same_bits(const DecoderOptions& opts) {
  const int V = 29;
  const Shape bt{2, 16};
  const auto ids = ids_of(bt.rows() + 1, V, 5);
  const std::vector<std::int32_t> x(ids.begin(), ids.end() - 1), y(ids.begin() + 1, ids.end());
  Decoder<Cfg, Be> fixed(V, 42, opts);
  Decoder<dynamic_of_t<Cfg>, Be> dynamic(model_dims<Cfg>(), V, 42, opts);
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(dynamic));
  train(fixed, V, y, [&](Be& be) { return fixed.forward(be, x, bt); });
  train(dynamic, V, y, [&](Be& be) { return dynamic.forward(be, x, bt); });
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(dynamic));
  const auto a = greedy(fixed, V, 64), b = greedy(dynamic, V, 64);
  BOOST_TEST(a == b, boost::test_tools::per_element());
}

// A Decoder of Dynamic parts (AnyParts), given Cfg's parts and sizes at
// run time: Cfg's bits, trained and decoding.
template <class Cfg>
void any_parts_same_bits(const DecoderOptions& opts) {
  const int V = 29;
  const Shape bt{2, 16};
  const auto ids = ids_of(bt.rows() + 1, V, 5);
  const std::vector<std::int32_t> x(ids.begin(), ids.end() - 1), y(ids.begin() + 1, ids.end());
  Decoder<Cfg, Be> fixed(V, 42, opts);
  const ModelDims dims = preset_info<Cfg>().dims();
  Decoder<AnyParts, Be> any(dims, V, 42, opts);
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(any));
  std::vector<std::string> fixed_names, any_names;
  fixed.visit([&](std::string_view n, auto&, auto&) { fixed_names.emplace_back(n); });
  any.visit([&](std::string_view n, auto&, auto&) { any_names.emplace_back(n); });
  BOOST_TEST(fixed_names == any_names, boost::test_tools::per_element());
  train(fixed, V, y, [&](Be& be) { return fixed.forward(be, x, bt); });
  train(any, V, y, [&](Be& be) { return any.forward(be, x, bt); });
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(any));
  BOOST_TEST(greedy(fixed, V, 64) == greedy(any, V, 64), boost::test_tools::per_element());
}

}  // namespace

BOOST_AUTO_TEST_CASE(any_parts_are_the_static_parts_bit_for_bit) {
  any_parts_same_bits<Gpt>({.dropout = 0.1f});
  any_parts_same_bits<Llama>({.tie_weights = true, .head_bias = false});
  any_parts_same_bits<Post>({.dropout = 0.1f, .attention_dropout = 0.1f});
  any_parts_same_bits<PostGeGlu>({.dropout = 0.1f});
  any_parts_same_bits<PostRmsRope>({.tie_weights = true, .head_bias = false});
}

BOOST_AUTO_TEST_CASE(decoder_gpt_static_and_dynamic_same_bits) { decoder_same_bits<Gpt>({.dropout = 0.1f}); }

BOOST_AUTO_TEST_CASE(decoder_llama_static_and_dynamic_same_bits) {
  decoder_same_bits<Llama>({.tie_weights = true, .head_bias = false});
}

// make_language_model builds a family's Dynamic Decoder: the same bits as
// the preset's static type (its training and its decoding).
BOOST_AUTO_TEST_CASE(language_model_is_the_static_decoder) {
  const int V = 31;
  const Shape bt{2, 32};
  const auto ids = ids_of(bt.rows() + 1, V, 9);
  const std::vector<std::int32_t> x(ids.begin(), ids.end() - 1), y(ids.begin() + 1, ids.end());
  auto lm = make_language_model<Be>("shakespeare-small", V, 7);
  BOOST_TEST((preset_info<test::ShakespeareSmallStatic>().dims() == LanguageModelPresets::info("shakespeare-small").dims()));
  Decoder<test::ShakespeareSmallStatic, Be> fixed(V, 7);
  train(*lm, V, y, [&](Be& be) { return lm->forward(be, x, bt); });
  train(fixed, V, y, [&](Be& be) { return fixed.forward(be, x, bt); });
  BOOST_TEST(weight_bytes(*lm) == weight_bytes(fixed));
  BOOST_TEST(greedy(*lm, V, 24) == greedy(fixed, V, 24), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(encoder_static_and_dynamic_same_bits) {
  const int V = 23;
  const Shape bt{3, 12};
  const auto x = ids_of(bt.rows(), V, 3);
  std::vector<std::uint8_t> pad(bt.rows(), 0);
  pad[bt.rows() - 1] = pad[bt.rows() - 2] = 1;
  Rng r1(4), r2(4);
  Encoder<Post, Be> fixed(V, r1, 0.1f);
  Encoder<dynamic_of_t<Post>, Be> dynamic(model_dims<Post>(), V, r2, 0.1f);
  const std::vector<std::int32_t> targets = ids_of(bt.rows(), Post::D_MODEL, 8);
  // The hidden states as logits over D_MODEL "classes": a loss that reaches every weight.
  auto step = [&](auto& m) {
    Be be;
    AdamW<Be> opt(m);
    for (int i = 0; i < 10; ++i) {
      m.visit([](std::string_view, auto&, auto& grad) { grad.zero(); });
      const auto h = m.forward(be, x, bt, pad.data());
      const auto d = loss_gradient({h.data, h.size()}, targets, Post::D_MODEL);
      m.backward(be, ConstRows<float, Dynamic>(d.data(), h.rows, Post::D_MODEL));
      opt.step(be, 1e-2);
    }
  };
  step(fixed);
  step(dynamic);
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(dynamic));
}

BOOST_AUTO_TEST_CASE(classifier_static_and_dynamic_same_bits) {
  const int V = 23, C = 3;
  const Shape bt{4, 10};
  const auto x = ids_of(bt.rows(), V, 3);
  const auto labels = ids_of(bt.B, C, 6);
  Classifier<Gpt, Be> fixed(V, C, 5, {.dropout = 0.1f});
  Classifier<dynamic_of_t<Gpt>, Be> dynamic(model_dims<Gpt>(), V, C, 5, {.dropout = 0.1f});
  train(fixed, C, labels, [&](Be& be) { return fixed.forward(be, x, bt); });
  train(dynamic, C, labels, [&](Be& be) { return dynamic.forward(be, x, bt); });
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(dynamic));
}

BOOST_AUTO_TEST_CASE(seq2seq_static_and_dynamic_same_bits) {
  const int SV = 19, TV = 21;
  const Shape src{2, 9}, tgt{2, 11};
  const auto s = ids_of(src.rows(), SV, 1);
  const auto t = ids_of(tgt.rows() + 1, TV, 2);
  const std::vector<std::int32_t> x(t.begin(), t.end() - 1), y(t.begin() + 1, t.end());
  Seq2Seq<Post, Post, Be> fixed(SV, TV, 3, {.dropout = 0.1f});
  Seq2Seq<dynamic_of_t<Post>, dynamic_of_t<Post>, Be> dynamic(model_dims<Post>(), model_dims<Post>(), SV, TV, 3,
                                                              {.dropout = 0.1f});
  auto forward = [&](auto& m) { return [&](Be& be) { return m.forward(be, s, src, nullptr, x, tgt); }; };
  train(fixed, TV, y, forward(fixed));
  train(dynamic, TV, y, forward(dynamic));
  BOOST_TEST(weight_bytes(fixed) == weight_bytes(dynamic));
  // 64 greedy target tokens against the first source sentence.
  auto decode = [&](auto& m) {
    Be be;
    m.set_training(false);
    m.encode(be, std::span(s).first(src.T), {1, src.T});
    typename std::remove_reference_t<decltype(m)>::DecodeState st;
    m.start_decoding(be, st);
    std::vector<std::int32_t> out{0};
    for (int i = 0; i < 64; ++i) {
      const auto logits = m.decode(be, std::span(out).last(1), st);
      out.push_back(std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    return out;
  };
  BOOST_TEST(decode(fixed) == decode(dynamic), boost::test_tools::per_element());
}

// make_classifier and make_translation_model build the one compiled model
// of every part Dynamic: the same bits as a static type of the preset's
// architecture, in training and in decoding.
BOOST_AUTO_TEST_CASE(classifier_model_is_the_static_classifier) {
  const int V = 23, C = 3;
  const Shape bt{4, 10};
  const auto x = ids_of(bt.rows(), V, 3);
  const auto labels = ids_of(bt.B, C, 6);
  for (const char* name : {"sst2", "imdb"}) {
    auto erased = make_classifier<Be>(ClassifierPresets::info(name), V, C, 5, {.dropout = 0.1f});
    auto same_as = [&]<class Cfg>() {
      BOOST_TEST((preset_info<Cfg>().dims() == ClassifierPresets::info(name).dims()));
      Classifier<Cfg, Be> fixed(V, C, 5, {.dropout = 0.1f});
      train(*erased, C, labels, [&](Be& be) { return erased->forward(be, x, bt); });
      train(fixed, C, labels, [&](Be& be) { return fixed.forward(be, x, bt); });
      BOOST_TEST(weight_bytes(*erased) == weight_bytes(fixed), name);
    };
    if (std::string(name) == "sst2") same_as.template operator()<test::Sst2Static>();
    else same_as.template operator()<test::ImdbStatic>();
    BOOST_TEST(erased->parameter_count() == parameter_count(*erased->clone()));
  }
}

BOOST_AUTO_TEST_CASE(translation_model_is_the_static_seq2seq) {
  const int SV = 19, TV = 21;
  const Shape src{2, 9}, tgt{2, 11};
  const auto s = ids_of(src.rows(), SV, 1);
  const auto t = ids_of(tgt.rows() + 1, TV, 2);
  const std::vector<std::int32_t> x(t.begin(), t.end() - 1), y(t.begin() + 1, t.end());
  auto erased = make_translation_model<Be>(TranslatorPresets::info("tiny"), SV, TV, 3, {.dropout = 0.1f});
  BOOST_TEST((preset_info<test::TranslatorTinyStatic>().dims() == TranslatorPresets::info("tiny").dims()));
  Seq2Seq<test::TranslatorTinyStatic, test::TranslatorTinyStatic, Be> fixed(SV, TV, 3, {.dropout = 0.1f});
  train(*erased, TV, y, [&](Be& be) { return erased->forward(be, s, src, nullptr, x, tgt); });
  train(fixed, TV, y, [&](Be& be) { return fixed.forward(be, s, src, nullptr, x, tgt); });
  BOOST_TEST(weight_bytes(*erased) == weight_bytes(fixed));
  auto decode = [&](auto& m) {
    Be be;
    m.set_training(false);
    m.encode(be, std::span(s).first(src.T), {1, src.T});
    Seq2SeqDecodeState<Be> st;
    m.start_decoding(be, st);
    std::vector<std::int32_t> out{0};
    for (int i = 0; i < 12; ++i) {
      const auto logits = m.decode(be, std::span(out).last(1), st);
      out.push_back(std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    return out;
  };
  BOOST_TEST(decode(*erased) == decode(fixed), boost::test_tools::per_element());
  // One compiled model serves every architecture: a classifier's parts
  // (pre-norm GELU, learned positions) build a translator too.
  BOOST_TEST(make_translation_model<Be>(ClassifierPresets::info("sst2"), SV, TV, 1)->preset().name == "sst2");
  BOOST_TEST(make_classifier<Be>(TranslatorPresets::info("tiny"), SV, 2, 1)->preset().name == "tiny");
}

// A clone (DataParallel's replica) draws the dropout masks its original
// draws: a run of one process and two shards is the run of two ranks.
BOOST_AUTO_TEST_CASE(clones_keep_the_dropout_streams) {
  auto seeds = [](auto& m) {
    std::vector<std::uint64_t> s;
    m.for_each_dropout([&](DropoutKeys& d) { s.push_back(d.seed()); });
    return s;
  };
  auto same = [&](auto& model) {
    const auto a = seeds(*model);
    const auto b = seeds(*model->clone());
    BOOST_TEST(!a.empty());
    BOOST_TEST(a == b, boost::test_tools::per_element());
  };
  auto lm = make_language_model<Be>("tiny", 11, 7, {.dropout = 0.1f});
  same(lm);
  auto clf = make_classifier<Be>(ClassifierPresets::info("tiny"), 11, 2, 7, {.dropout = 0.1f});
  same(clf);
  auto mt = make_translation_model<Be>(TranslatorPresets::info("tiny"), 11, 13, 7, {.dropout = 0.1f});
  same(mt);
}

// Sizes a Dynamic model is built with are checked where parts meet.
BOOST_AUTO_TEST_CASE(dynamic_sizes_are_checked) {
  ModelDims d = model_dims<Gpt>();
  d.n_heads = 5;  // 24 is not divisible by 5
  says([&] { Decoder<dynamic_of_t<Gpt>, Be>(d, 11, 1); },
       "not divisible by the heads 5");
  d = model_dims<Llama>();
  d.n_kv_heads = 3;
  says([&] { Decoder<dynamic_of_t<Llama>, Be>(d, 11, 1); },
       "must divide the heads 4");
  d = model_dims<Gpt>();
  d.d_model = 30;  // a static configuration's own sizes must agree
  says([&] { Decoder<Gpt, Be>(d, 11, 1); },
       "model width 30 does not match the configuration's 24");
  // A Dynamic view of another width is refused by the layer it reaches.
  Rng rng(1);
  Linear<Dynamic, Dynamic, Be> lin(8, 4, rng);
  Buffer<float> x, y;
  Be be;
  says([&] { lin.forward(be, x.rows(2, Dim<Dynamic>(6)), y.rows(2, Dim<Dynamic>(4))); },
       "Linear input is 6 wide, expected 8");
  // Parts the layers do not have are refused by name.
  says([] { (void)ModelParts::activation_named("swish"); }, "activation 'swish' is not one of relu, gelu");
  std::string json = architecture_json(LanguageModelPresets::info("tiny"));
  json.replace(json.find("\"gelu\""), 6, "\"swish\"");
  says([&] { (void)architecture_from_json(json, "arch.json"); }, "arch.json: parts.activation 'swish' is not one of");
}

BOOST_AUTO_TEST_SUITE_END()
