#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

BOOST_AUTO_TEST_SUITE(test_kv_cache)

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
// One head, query/key heads narrower than the value heads.
struct TinyLlama2 : TinyLlama {
  static constexpr int N_LAYERS = 2;
};
struct TinyLlamaGqa : TinyLlama2 {  // four query heads over two key/value heads: a cache half as wide
  static constexpr int N_HEADS = 4, N_KV_HEADS = 2;
};
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
  check_equivalence<TinyLmOneHead>("post-norm, one head, 3-wide queries, 5-wide values");
  check_equivalence<TinyLlama2>("rotary positions, RmsNorm, SwiGLU, no biases");
  check_equivalence<TinyLlamaGqa>("grouped-query attention, rotary positions");
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
// Wide enough that a decoding step's single-row products split their rows
// over the threads (fc1 and fc2: 2^18 weights each).
struct SplitLmF : TinyPre {
  static constexpr int MAX_T = 10, D_MODEL = 256, N_HEADS = 4, N_LAYERS = 2, D_FF = 1024;
  using Activation = Relu;
};

// Greedy float decoding of `steps` tokens through the cache, one row a
// step; returns every step's logits.
template <class Model>
std::vector<float> greedy_cached(Model& model, int steps) {
  CpuBackend<float> be;
  DecodingCache<CpuBackend<float>> cache;
  model.start_cache(cache, 1);
  std::vector<float> all;
  std::int32_t id = 1;
  for (int t = 0; t < steps; ++t) {
    const auto x = model.forward_cached(be, std::span(&id, 1), 1, cache);
    all.insert(all.end(), x.begin(), x.end());
    id = std::int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  }
  BOOST_TEST(cache.length() == steps);
  return all;
}
}  // namespace

// A float decoding step runs through the blocks' own forward_cached: its
// logits match a full float forward pass over the same tokens, and do not
// depend on the thread count, for a model whose single-row products stay
// on one thread (SmallLmF: 16-wide kernel blocks and their tails) and one
// whose products split over the threads (SplitLmF).
template <class Cfg>
void check_float_decoding(const char* name) {
  Decoder<Cfg, CpuBackend<float>> model(11, 12);
  model.set_training(false);
  const int T = Cfg::MAX_T, V = 11;
  const auto cached = greedy_cached(model, T);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one_thread = greedy_cached(model, T);
  omp_set_num_threads(threads);
  BOOST_TEST(std::memcmp(cached.data(), one_thread.data(), cached.size() * sizeof(float)) == 0, name);
  // The tokens fed were 1 and then each step's arg max.
  std::vector<std::int32_t> ids{1};
  for (int t = 0; t + 1 < T; ++t) {
    const auto row = cached.begin() + std::ptrdiff_t(t) * V;
    ids.push_back(std::int32_t(std::max_element(row, row + V) - row));
  }
  CpuBackend<float> be;
  const auto full = model.forward(be, ids, Shape{1, T});
  double worst = 0;
  for (std::size_t i = 0; i < cached.size(); ++i) worst = std::max(worst, double(std::abs(cached[i] - full[i])));
  BOOST_TEST(worst < 2e-5, name << ": cached float logits differ from the full pass by " << worst);
}

BOOST_AUTO_TEST_CASE(float_decoding_matches_the_full_pass_on_any_thread_count) {
  check_float_decoding<SmallLmF>("SmallLmF");
  check_float_decoding<SplitLmF>("SplitLmF");
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

BOOST_AUTO_TEST_SUITE_END()
