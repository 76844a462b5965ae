// Activation recompute (block_stack.hpp, Recompute::cheap and ::block):
// every model's logits and parameter gradients bit for bit those of
// Recompute::none, with
// dropout on the branches and the attention probabilities, over two steps
// (the second step's masks differ from the first's), past the row kernels
// (tiled attention) and within them; the dropout counters end where they
// would; and the memory a training forward leaves allocated shrinks by at
// least every block's forward activations.
#include <boost/test/unit_test.hpp>

#include <malloc.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/random.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"

BOOST_AUTO_TEST_SUITE(test_recompute)

using namespace xfmr;

namespace {

using Be = CpuBackend<float>;

struct PreGelu {
  static constexpr int MAX_T = 80, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 3, D_FF = 48;
  using Norm = PreNorm;
  using Activation = Gelu;
};
struct PostRelu {
  static constexpr int MAX_T = 80, D_MODEL = 16, N_HEADS = 4, N_LAYERS = 2, D_FF = 32;
  using Norm = PostNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};
struct RmsSwiglu {
  static constexpr int MAX_T = 80, D_MODEL = 16, N_HEADS = 4, N_KV_HEADS = 2, N_LAYERS = 2, D_FF = 24;
  using Norm = PreNorm;
  using Activation = SwiGlu;
  using Positions = Rope;
  static constexpr bool BIAS = false;
  template <int D, class B>
  using NormLayer = RmsNorm<D, B>;
};

std::vector<std::int32_t> ids(std::size_t n, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> v(n);
  for (auto& i : v) i = static_cast<std::int32_t>(rng.below(vocab));
  return v;
}
using xfmr::test::randn;  // support/random.hpp

// Every parameter gradient, in visiting order.
template <class Model>
std::vector<float> gradients(Model& m) {
  std::vector<float> g;
  m.visit([&](auto&&, auto&, auto& grad) { g.insert(g.end(), grad.begin(), grad.end()); });
  return g;
}
template <class Model>
void clear_grads(Model& m) {
  m.visit([](auto&&, auto&, auto& grad) { grad.zero(); });
}
template <class Model>
std::vector<std::uint64_t> counters(Model& m) {
  std::vector<std::uint64_t> c;
  m.for_each_dropout([&](DropoutKeys& k) { c.push_back(k.calls()); });
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two models from one seed, one with Recompute::cheap or ::block; step(model)
// runs a forward and a backward and returns the logits.
template <class Model, class Make, class Step>
void check_bitwise(const std::string& model_name, Make make, Step step) {
  for (const Recompute mode : {Recompute::cheap, Recompute::block}) {
  const std::string name = model_name + ", recompute " + recompute_name(mode);
  Be be;
  std::unique_ptr<Model> plain = make(), recomputed = make();
  recomputed->set_recompute(mode);
  for (int s = 0; s < 2; ++s) {
    clear_grads(*plain);
    clear_grads(*recomputed);
    const auto y1 = step(be, *plain, s), y2 = step(be, *recomputed, s);
    BOOST_TEST(same_bits(y1, y2), name << " step " << s << ": logits");
    const auto g1 = gradients(*plain), g2 = gradients(*recomputed);
    BOOST_TEST(same_bits(g1, g2), name << " step " << s << ": gradients");
    BOOST_TEST((counters(*plain) == counters(*recomputed)), name << " step " << s << ": dropout counters");
    float norm = 0;
    for (float g : g1) norm += g * g;
    BOOST_TEST(norm > 0.0f, name << ": the gradients are not all zero");
  }
  }
}

template <class Model>
std::vector<float> decoder_step(Be& be, Model& m, int s, Shape bt, int vocab) {
  const auto x = ids(std::size_t(bt.rows()), vocab, 100 + s);
  const auto logits = m.forward(be, x, bt);
  std::vector<float> out(logits.begin(), logits.end());
  m.backward(be, randn(out.size(), 200 + s));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(decoder_gradients_are_bitwise_equal) {
  for (const Shape bt : {Shape{3, 80}, Shape{2, 20}}) {
    const std::string at = " B" + std::to_string(bt.B) + " T" + std::to_string(bt.T);
    check_bitwise<Decoder<PreGelu, Be>>(
        "Decoder pre-norm, dropout" + at,
        [] {
          const DecoderOptions opts{.dropout = 0.2f, .attention_dropout = 0.1f};
          return std::make_unique<Decoder<PreGelu, Be>>(11, 7, opts);
        },
        [&](Be& be, auto& m, int s) { return decoder_step(be, m, s, bt, 11); });
    check_bitwise<Decoder<RmsSwiglu, Be>>(
        "Decoder RMSNorm, SwiGLU, rotary, grouped heads, tied" + at,
        [] {
          return std::make_unique<Decoder<RmsSwiglu, Be>>(
              11, 8, DecoderOptions{.dropout = 0.1f, .attention_dropout = 0.1f, .tie_weights = true});
        },
        [&](Be& be, auto& m, int s) { return decoder_step(be, m, s, bt, 11); });
  }
}

BOOST_AUTO_TEST_CASE(classifier_gradients_are_bitwise_equal) {
  const Shape bt{3, 70};
  std::vector<std::uint8_t> pad(std::size_t(bt.rows()), 0);
  for (int t = 50; t < 70; ++t) pad[std::size_t(bt.T) + t] = 1;
  check_bitwise<Classifier<PostRelu, Be>>(
      "Classifier post-norm, padded, dropout",
      [] {
        const ClassifierOptions opts{.dropout = 0.1f, .attention_dropout = 0.2f};
        return std::make_unique<Classifier<PostRelu, Be>>(9, 3, 21, opts);
      },
      [&](Be& be, auto& m, int s) {
        const auto x = ids(std::size_t(bt.rows()), 9, 300 + s);  // read again by the backward
        const auto logits = m.forward(be, x, bt, pad.data());
        std::vector<float> out(logits.begin(), logits.end());
        m.backward(be, randn(out.size(), 400 + s));
        return out;
      });
}

BOOST_AUTO_TEST_CASE(seq2seq_gradients_are_bitwise_equal) {
  const Shape src{2, 75}, tgt{2, 66};
  std::vector<std::uint8_t> src_pad(std::size_t(src.rows()), 0), tgt_pad(std::size_t(tgt.rows()), 0);
  for (int t = 60; t < 75; ++t) src_pad[std::size_t(src.T) + t] = 1;
  for (int t = 40; t < 66; ++t) tgt_pad[std::size_t(tgt.T) + t] = 1;
  check_bitwise<Seq2Seq<PostRelu, PreGelu, Be>>(
      "Seq2Seq, both padded, dropout",
      [] {
        const Seq2SeqOptions opts{.dropout = 0.1f, .attention_dropout = 0.1f};
        return std::make_unique<Seq2Seq<PostRelu, PreGelu, Be>>(9, 10, 31, opts);
      },
      [&](Be& be, auto& m, int s) {
        const auto x = ids(std::size_t(src.rows()), 9, 500 + s), y = ids(std::size_t(tgt.rows()), 10, 600 + s);
        const auto logits = m.forward(be, x, src, src_pad.data(), y, tgt, tgt_pad.data());
        std::vector<float> out(logits.begin(), logits.end());
        m.backward(be, randn(out.size(), 700 + s));
        return out;
      });
}

// Bytes in use from the heap (glibc: the arena's and mmap'd blocks); 0
// where malloc is not glibc's (a sanitizer's), which skips the check.
std::size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

BOOST_AUTO_TEST_CASE(block_recompute_frees_the_blocks_activations) {
  {
    const std::size_t before = heap_in_use();
    std::vector<char> probe(std::size_t(64) << 20, 1);
    if (heap_in_use() < before + probe.size()) {
      BOOST_TEST_MESSAGE("skipped: this malloc does not report its use through mallinfo2");
      return;
    }
  }
  const Shape bt{8, 80};
  auto held_after_forward = [&](Recompute r) {
    Be be;
    const std::size_t before = heap_in_use();
    Decoder<PreGelu, Be> m(11, 7, DecoderOptions{.dropout = 0.2f});
    m.set_recompute(r);
    decoder_step(be, m, 0, bt, 11);  // the first step allocates what every step uses
    m.forward(be, ids(std::size_t(bt.rows()), 11, 1), bt);
    return heap_in_use() - before;
  };
  const std::size_t none = held_after_forward(Recompute::none), cheap = held_after_forward(Recompute::cheap),
                    block = held_after_forward(Recompute::block);
  // At least what every block's forward saves, but for the one set block
  // recompute keeps: the feed-forward's hidden and activated rows (D_FF
  // each), and seven rows of D (q, k and v, the context, both branches'
  // norm outputs, the block's middle).
  constexpr int D = PreGelu::D_MODEL, FF = PreGelu::D_FF;
  static_assert(PreGelu::N_LAYERS > 1);
  const std::size_t least = std::size_t(PreGelu::N_LAYERS - 1) * bt.rows() * (2 * FF + 7 * D) * sizeof(float);
  BOOST_TEST_MESSAGE("held after a forward: none " << none << " bytes, cheap " << cheap << ", block " << block);
  BOOST_TEST(none >= block + least, "none " << none << ", block " << block << ", at least " << least << " apart");
  // Cheap: one shared copy of a norm output (D) and of the activation (D_FF)
  // for all the blocks' two norm outputs and one activation each.
  const std::size_t shared = std::size_t(bt.rows()) * (FF + D) * sizeof(float);
  const std::size_t fewer = std::size_t(PreGelu::N_LAYERS) * bt.rows() * (FF + 2 * D) * sizeof(float) - shared;
  BOOST_TEST(none >= cheap + fewer, "none " << none << ", cheap " << cheap << ", at least " << fewer << " apart");
}

BOOST_AUTO_TEST_CASE(recompute_modes_are_named) {
  BOOST_TEST((parse_recompute("none") == Recompute::none));
  BOOST_TEST((parse_recompute("block") == Recompute::block));
  BOOST_TEST((parse_recompute("cheap") == Recompute::cheap));
  BOOST_TEST(std::string(recompute_name(Recompute::block)) == "block");
  try {
    parse_recompute("everything");
    BOOST_FAIL("an unknown mode was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("'everything'") != std::string::npos);
  }
}

BOOST_AUTO_TEST_SUITE_END()
