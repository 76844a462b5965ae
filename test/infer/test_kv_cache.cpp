#define BOOST_TEST_MODULE kv_cache
#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"

#include <thread>

using namespace xfmr;
using namespace xfmr::test;

namespace {
struct TinyLm : TinyPre {
  static constexpr int N_LAYERS = 2;
};
struct TinyLmPostSinusoidal : TinyPost {
  static constexpr int N_LAYERS = 2;
  using Positions = Sinusoidal;
};
// Three heads and a wider feed-forward than the others.
struct TinyLmWide : TinyPre {
  static constexpr int MAX_T = 6, D_MODEL = 12, N_HEADS = 3, N_LAYERS = 2, D_FF = 40;
};
// One head (the fused step's second lane has none), query/key heads
// narrower than the value heads.
struct TinyLmOneHead : TinyPost {
  static constexpr int MAX_T = 6, D_MODEL = 8, N_HEADS = 1, N_LAYERS = 2, D_FF = 12;
  static constexpr int QK_HEAD_DIM = 3, V_HEAD_DIM = 5;
  using Activation = Gelu;
};
// Wide enough for the float kernels' full 16-wide blocks and their tails:
// 34 = 2 x 16 + 2, heads of 17, 72 feed-forward units split 48 + 24.
struct SmallLmF : TinyPre {
  static constexpr int MAX_T = 20, D_MODEL = 34, N_HEADS = 2, N_LAYERS = 3, D_FF = 72;
  using Activation = Relu;
};

// Feeds ids (B, T) through the cache in chunks (prefill `first`, then one at
// a time) and returns the logits of every position, laid out as forward().
template <class Model>
Vec cached_logits(Model& model, Be& be, const std::vector<std::int32_t>& ids, int B, int T, int first) {
  DecodingCache<Be> cache;
  model.start_cache(cache, B);
  const int V = model.vocab();
  Vec out(std::size_t(B) * T * V);
  for (int t0 = 0; t0 < T;) {
    const int n = t0 == 0 ? first : 1;
    std::vector<std::int32_t> chunk;
    for (int b = 0; b < B; ++b)
      for (int t = t0; t < t0 + n; ++t) chunk.push_back(ids[b * T + t]);
    const auto logits = model.forward_cached(be, chunk, B, cache);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < n; ++t)
        std::copy_n(logits.data() + (std::size_t(b) * n + t) * V, V, out.data() + (std::size_t(b) * T + t0 + t) * V);
    t0 += n;
    BOOST_TEST(cache.length() == t0);
  }
  return out;
}

// One sequence (one row a step, a decoding step's single-row products) and
// two.
template <class Cfg>
void check_equivalence(const char* name) {
  Rng rng(3);
  Be be;
  Decoder<Cfg, Be> model(9, 5);
  const int T = Cfg::MAX_T;
  for (int B : {1, 2}) {
    std::vector<std::int32_t> ids(B * T);
    for (auto& i : ids) i = static_cast<std::int32_t>(rng.below(9));
    const auto full = model.forward(be, ids, Shape{B, T});
    const Vec want(full.begin(), full.end());
    for (int first : {1, 3, T}) {
      const Vec got = cached_logits(model, be, ids, B, T, first);
      double worst = 0;
      for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
      BOOST_TEST(worst < 1e-12, name << ", B " << B << ", prefill " << first << ": cached logits differ by " << worst);
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(cached_decoding_matches_full_recomputation) {
  check_equivalence<TinyLm>("pre-norm, learned positions");
  check_equivalence<TinyLmPostSinusoidal>("post-norm, sinusoidal positions");
  check_equivalence<TinyLmWide>("pre-norm, three heads");
}

// The translator's decoder, one sentence stepped one token at a time (its
// self- and cross-attention caches), against the teacher-forced forward
// over each prefix.
BOOST_AUTO_TEST_CASE(cached_seq2seq_decoding_matches_full_recomputation) {
  Be be;
  Seq2Seq<TinyLmWide, TinyLmWide, Be> model(9, 7, 3);
  const std::vector<std::int32_t> src = {3, 4, 5, 6, 7}, tgt = {1, 4, 6, 2, 5, 3};
  const std::vector<std::uint8_t> pad(src.size(), 0);
  const int V = 7, T = int(tgt.size());
  const auto full = model.forward(be, src, Shape{1, int(src.size())}, pad.data(), tgt, Shape{1, T});
  const Vec want(full.begin(), full.end());
  model.encode(be, src, Shape{1, int(src.size())}, pad.data());
  Seq2Seq<TinyLmWide, TinyLmWide, Be>::DecodeState st;
  model.start_decoding(be, st, 1);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    const auto logits = model.decode(be, std::span(&tgt[t], 1), st);
    for (int v = 0; v < V; ++v) worst = std::max(worst, std::abs(logits[v] - want[std::size_t(t) * V + v]));
  }
  BOOST_TEST(worst < 1e-12, "cached logits differ by " << worst);
}

namespace {
using detail::Partner;
using detail::PartnerPolicy;

// Decodes `steps` tokens one at a time (greedy, from token 1) on two
// backends, one fusing each step (CpuBackend::decode_layers), one leaving
// it to the blocks, and returns the largest difference between their
// logits.
template <class Model, class Backend>
double fused_against_blocks(Model& model, int steps) {
  Backend fused, blocks;
  blocks.set_fused_decoding(false);
  DecodingCache<Backend> a, b;
  model.start_cache(a, 1);
  model.start_cache(b, 1);
  std::int32_t id = 1;
  double worst = 0;
  for (int t = 0; t < steps; ++t) {
    const auto x = model.forward_cached(fused, std::span(&id, 1), 1, a);
    const std::vector<typename Backend::Scalar> got(x.begin(), x.end());
    const auto y = model.forward_cached(blocks, std::span(&id, 1), 1, b);
    for (std::size_t v = 0; v < got.size(); ++v) worst = std::max(worst, double(std::abs(got[v] - y[v])));
    id = std::int32_t(std::max_element(got.begin(), got.end()) - got.begin());
  }
  BOOST_TEST(a.length() == steps);
  return worst;
}

// Every parameter uniform in [-0.5, 0.5], the layer norms' and the biases
// (which init_gpt2 leaves at 1 and 0) included.
template <class Model>
void randomize(Model& model, std::uint64_t seed) {
  Rng rng(seed);
  model.visit([&](std::string_view, auto& value, auto&) {
    using S = typename std::remove_cvref_t<decltype(value)>::value_type;
    value.generate([&] { return S(rng.uniform(-0.5, 0.5)); });
  });
}

template <class Cfg>
void check_fused(const char* name) {
  Decoder<Cfg, Be> model(9, 11);
  randomize(model, 21);
  model.set_training(false);
  const double worst = fused_against_blocks<Decoder<Cfg, Be>, Be>(model, Cfg::MAX_T);
  BOOST_TEST(worst < 1e-13, name << ": fused step differs by " << worst);
}

struct PolicyGuard {
  explicit PolicyGuard(PartnerPolicy p) { Partner::instance().set_policy(p); }
  ~PolicyGuard() { Partner::instance().set_policy(PartnerPolicy::measured); }
};
}  // namespace

// The fused decoding step against the blocks' own forward_cached, with the
// step's two lanes on two threads (always: the partner takes lane 1 of
// every step, on a machine with two threads), on one (never) and as
// measured.
// The lanes split heads and feed-forward units unevenly where the sizes are
// odd; the results must not depend on the split or on the way.
BOOST_AUTO_TEST_CASE(fused_decoding_step_matches_the_blocks_own) {
  for (PartnerPolicy p : {PartnerPolicy::always, PartnerPolicy::never, PartnerPolicy::measured}) {
    PolicyGuard guard(p);
    check_fused<TinyLm>("pre-norm, GELU");
    check_fused<TinyLmPostSinusoidal>("post-norm, ReLU");
    check_fused<TinyLmWide>("three heads");
    check_fused<TinyLmOneHead>("one head, 3-wide queries, 5-wide values");
    Decoder<SmallLmF, CpuBackend<float>> model(11, 12);
    randomize(model, 22);
    model.set_training(false);
    const double worst = fused_against_blocks<decltype(model), CpuBackend<float>>(model, SmallLmF::MAX_T);
    BOOST_TEST(worst < 2e-5, "float: fused step differs by " << worst);
  }
}

// Under PartnerPolicy::always the partner does take the second lane (on a
// machine with two threads to spare), and then gives the same logits.
BOOST_AUTO_TEST_CASE(fused_decoding_runs_paired_on_two_threads) {
  if (!detail::may_fork()) {
    BOOST_TEST_MESSAGE("one thread only: no partner to pair with");
    return;
  }
  PolicyGuard guard(PartnerPolicy::always);
  Decoder<SmallLmF, CpuBackend<float>> model(11, 13);
  model.set_training(false);
  const std::uint64_t before = Partner::instance().lockstep_pairs();
  double worst = 0;
  for (int round = 0; round < 200 && Partner::instance().lockstep_pairs() == before; ++round)
    worst = std::max(worst, fused_against_blocks<decltype(model), CpuBackend<float>>(model, SmallLmF::MAX_T));
  BOOST_TEST(Partner::instance().lockstep_pairs() > before);
  BOOST_TEST(worst < 2e-5);
}

// Two threads decoding at once share one partner: one pairs, the other
// runs alone, and both get their own model's logits.
BOOST_AUTO_TEST_CASE(concurrent_fused_decoding_keeps_each_caller_apart) {
  PolicyGuard guard(PartnerPolicy::always);
  Decoder<SmallLmF, CpuBackend<float>> m1(11, 14), m2(11, 15);
  m1.set_training(false);
  m2.set_training(false);
  double w1 = 1, w2 = 1;
  std::thread other([&] { w2 = fused_against_blocks<decltype(m2), CpuBackend<float>>(m2, SmallLmF::MAX_T); });
  w1 = fused_against_blocks<decltype(m1), CpuBackend<float>>(m1, SmallLmF::MAX_T);
  other.join();
  BOOST_TEST(w1 < 2e-5);
  BOOST_TEST(w2 < 2e-5);
}

// While dropout is active (training, nonzero rate) a step is not fused: it
// drops exactly as the blocks' own path does.
BOOST_AUTO_TEST_CASE(fused_decoding_leaves_dropout_to_the_blocks) {
  Decoder<TinyLm, Be> a(9, 16, {.dropout = 0.3f}), b(9, 16, {.dropout = 0.3f});
  Be fused, blocks;
  blocks.set_fused_decoding(false);
  DecodingCache<Be> ca, cb;
  a.start_cache(ca, 1);
  b.start_cache(cb, 1);
  for (std::int32_t id : {1, 2, 3}) {
    const auto x = a.forward_cached(fused, std::span(&id, 1), 1, ca);
    const Vec got(x.begin(), x.end());
    const auto y = b.forward_cached(blocks, std::span(&id, 1), 1, cb);
    for (std::size_t v = 0; v < got.size(); ++v) BOOST_TEST(got[v] == y[v]);
  }
}

BOOST_AUTO_TEST_CASE(reorder_moves_a_sequence_cache) {
  Be be;
  Decoder<TinyLm, Be> model(9, 6);
  const std::vector<std::int32_t> a = {1, 2, 3}, b = {4, 5, 6};
  DecodingCache<Be> cache;
  model.start_cache(cache, 2);
  model.forward_cached(be, std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}, 2, cache);
  const std::vector<int> swap = {1, 0};
  cache.reorder(be, swap);
  const auto next = model.forward_cached(be, std::vector<std::int32_t>{7, 7}, 2, cache);
  const Vec got(next.begin(), next.end());
  // Reference: sequence 0 is now b + 7, sequence 1 is a + 7.
  const auto full = model.forward(be, std::vector<std::int32_t>{4, 5, 6, 7, 1, 2, 3, 7}, Shape{2, 4});
  for (int v = 0; v < 9; ++v) {
    BOOST_TEST(got[v] == full[3 * 9 + v], boost::test_tools::tolerance(1e-12));
    BOOST_TEST(got[9 + v] == full[7 * 9 + v], boost::test_tools::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(decoding_past_max_t_is_an_error) {
  Be be;
  Decoder<TinyLm, Be> model(9, 7);
  DecodingCache<Be> cache;
  model.start_cache(cache, 1);
  model.forward_cached(be, std::vector<std::int32_t>(6, 1), 1, cache);  // MAX_T = 6
  try {
    model.forward_cached(be, std::vector<std::int32_t>{1}, 1, cache);
    BOOST_FAIL("a 7th position was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "decoding past MAX_T 6: 6 cached + 1 new positions");
  }
  BOOST_CHECK_THROW(model.forward_cached(be, std::vector<std::int32_t>{1, 2, 3}, 2, cache), Error);  // 3 ids, 2 seqs
}

BOOST_AUTO_TEST_CASE(truncate_rolls_decoding_back) {
  Be be;
  Decoder<TinyLm, Be> model(9, 8);
  DecodingCache<Be> cache;
  model.start_cache(cache, 1);
  model.forward_cached(be, std::vector<std::int32_t>{1, 2, 3, 4}, 1, cache);
  cache.truncate(2);  // forget 3, 4
  BOOST_TEST(cache.length() == 2);
  const auto next = model.forward_cached(be, std::vector<std::int32_t>{5}, 1, cache);
  const Vec got(next.begin(), next.end());
  const auto full = model.forward(be, std::vector<std::int32_t>{1, 2, 5}, Shape{1, 3});
  for (int v = 0; v < 9; ++v) BOOST_TEST(got[v] == full[2 * 9 + v], boost::test_tools::tolerance(1e-12));
  BOOST_CHECK_THROW(cache.truncate(4), Error);  // longer than what it holds
  BOOST_CHECK_THROW(cache.truncate(-1), Error);
}
