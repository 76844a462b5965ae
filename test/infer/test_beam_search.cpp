#include "xfmr/infer/beam_search.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/seq2seq.hpp"

BOOST_AUTO_TEST_SUITE(test_beam_search)

using namespace xfmr;
using namespace xfmr::test;

namespace {
// A hand-built next-token distribution over {pad 0, bos 1, eos 2, a 3, b 4},
// depending only on the previous token. Greedy takes "a" (0.55) and then
// ends (0.4): P = 0.22. "b" (0.45) then ends with 0.95: P = 0.4275.
std::vector<double> next_probs(std::int32_t prev) {
  if (prev == 1) return {1e-9, 1e-9, 1e-9, 0.55, 0.45};
  if (prev == 3) return {1e-9, 1e-9, 0.40, 0.30, 0.30};
  if (prev == 4) return {1e-9, 1e-9, 0.95, 0.025, 0.025};
  return {1e-9, 1e-9, 1.0, 1e-9, 1e-9};
}
struct ToyModel {
  std::vector<double> logits;
  std::span<const double> step(std::span<const std::int32_t> ids) {
    logits.clear();
    for (auto id : ids)
      for (double p : next_probs(id)) logits.push_back(std::log(p));
    return logits;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(beam_finds_what_greedy_misses) {
  ToyModel toy;
  auto step = [&](std::span<const std::int32_t> ids) { return toy.step(ids); };
  auto reorder = [](std::span<const int>) {};  // the toy has no state
  const auto greedy = beam_search(1, 5, {.beam = 1, .length_penalty = 0.0, .max_len = 8, .bos = 1, .eos = 2}, step, reorder);
  BOOST_TEST((greedy[0].tokens == std::vector<std::int32_t>{3}));
  // The rows sum to 1 + 3e-9 (the 1e-9 entries), so renormalising moves log P by ~3e-9.
  BOOST_TEST(greedy[0].log_prob == std::log(0.55 * 0.40), boost::test_tools::tolerance(1e-7));
  const auto beam = beam_search(1, 5, {.beam = 2, .length_penalty = 0.0, .max_len = 8, .bos = 1, .eos = 2}, step, reorder);
  BOOST_TEST((beam[0].tokens == std::vector<std::int32_t>{4}));
  BOOST_TEST(beam[0].log_prob == std::log(0.45 * 0.95), boost::test_tools::tolerance(1e-7));
  BOOST_TEST(beam[0].finished);
}

BOOST_AUTO_TEST_CASE(length_penalty_and_max_length) {
  BOOST_TEST(gnmt_length_penalty(1, 0.6) == 1.0);
  BOOST_TEST(gnmt_length_penalty(7, 0.6) == std::pow(2.0, 0.6), boost::test_tools::tolerance(1e-12));
  ToyModel toy;
  auto step = [&](std::span<const std::int32_t> ids) { return toy.step(ids); };
  // max_len 1: nothing can finish after "a"/"b"; the live beams are scored.
  const auto cut = beam_search(1, 5, {.beam = 2, .length_penalty = 0.6, .max_len = 1, .bos = 1, .eos = 2}, step,
                               [](std::span<const int>) {});
  BOOST_TEST(!cut[0].finished);
  BOOST_TEST((cut[0].tokens == std::vector<std::int32_t>{3}));
  BOOST_CHECK_THROW(beam_search(1, 5, {.beam = 0}, step, [](std::span<const int>) {}), Error);
  // An alpha whose divisor overflows or vanishes would make every score
  // infinite and the choice arbitrary: refused, naming it and the range.
  for (const double alpha : {-1e300, 1e300, 10.5, -11.0})
    BOOST_CHECK_EXCEPTION(beam_search(1, 5, {.beam = 2, .length_penalty = alpha}, step, [](std::span<const int>) {}),
                          Error, [&](const Error& e) {
                            return std::string(e.what()).find(" outside [-10, 10]") != std::string::npos;
                          });
  for (const double alpha : {-10.0, 10.0}) {
    BOOST_TEST(std::isnormal(gnmt_length_penalty(std::numeric_limits<int>::max(), alpha)));
    BOOST_TEST(beam_search(1, 5, {.beam = 2, .length_penalty = alpha, .max_len = 3}, step,
                           [](std::span<const int>) {}).size() == 1u);
  }
}

struct Src : TinyPre {};
struct Tgt : TinyPre {
  static constexpr int N_LAYERS = 2, MAX_T = 6;
};

struct SrcLlama : TinyLlama {};
struct TgtLlama : TinyLlama {
  static constexpr int N_LAYERS = 2, MAX_T = 6;
};

// The same beam search twice: stepping the model with its KV cache (and
// reordering it), and recomputing every hypothesis from scratch with the
// teacher-forced forward. Identical hypotheses prove the cache, the
// cross-attention memory and the reordering (with rotary positions: keys
// cached turned by their own positions).
template <class Src, class Tgt>
void check_cached_beam_search() {
  Rng rng(5);
  Be be;
  Seq2Seq<Src, Tgt, Be> model(9, 7, 3);
  model.visit([&](std::string_view, auto& v, auto&) {  // a peaked, non-trivial model
    for (auto& e : v) e += (v.shape().size() >= 2 ? 0.6 : 0.1) * rng.uniform(-1, 1);
  });
  const Shape src{2, 5};
  const std::vector<std::int32_t> src_ids = {3, 4, 5, 6, 7, 8, 4, 2, 0, 0};
  const std::vector<std::uint8_t> src_pad = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  const BeamOptions opt{.beam = 3, .length_penalty = 0.6, .max_len = 6, .bos = 1, .eos = 2};
  const int K = opt.beam, V = 7;

  model.encode(be, src_ids, src, src_pad.data());
  typename Seq2Seq<Src, Tgt, Be>::DecodeState st;
  model.start_decoding(be, st, K);
  const auto cached = beam_search(
      2, V, opt, [&](std::span<const std::int32_t> ids) { return model.decode(be, ids, st); },
      [&](std::span<const int> order) { st.self.reorder(be, order); });

  // Recompute: keep each sequence's full prefix, run the whole forward each step.
  std::vector<std::vector<std::int32_t>> prefix(2 * K, std::vector<std::int32_t>{});
  Vec last;
  const auto recomputed = beam_search(
      2, V, opt,
      [&](std::span<const std::int32_t> ids) {
        for (int i = 0; i < 2 * K; ++i) prefix[i].push_back(ids[i]);
        const int T = static_cast<int>(prefix[0].size());
        last.assign(std::size_t(2) * K * V, 0.0);
        for (int b = 0; b < 2; ++b) {
          std::vector<std::int32_t> s(src_ids.begin() + b * 5, src_ids.begin() + (b + 1) * 5), tgt;
          std::vector<std::uint8_t> pad(src_pad.begin() + b * 5, src_pad.begin() + (b + 1) * 5);
          std::vector<std::int32_t> reps, tgts;
          std::vector<std::uint8_t> pads;
          for (int k = 0; k < K; ++k) {
            reps.insert(reps.end(), s.begin(), s.end());
            pads.insert(pads.end(), pad.begin(), pad.end());
            tgts.insert(tgts.end(), prefix[b * K + k].begin(), prefix[b * K + k].end());
          }
          const auto logits = model.forward(be, reps, Shape{K, 5}, pads.data(), tgts, Shape{K, T});
          for (int k = 0; k < K; ++k)
            std::copy_n(logits.data() + (std::size_t(k) * T + T - 1) * V, V, last.data() + std::size_t(b * K + k) * V);
        }
        return std::span<const double>(last);
      },
      [&](std::span<const int> order) {
        const auto old = prefix;
        for (int i = 0; i < 2 * K; ++i) prefix[i] = old[order[i]];
      });
  for (int b = 0; b < 2; ++b) {
    BOOST_TEST(cached[b].tokens == recomputed[b].tokens, boost::test_tools::per_element());
    BOOST_TEST(cached[b].score == recomputed[b].score, boost::test_tools::tolerance(1e-9));
  }
  BOOST_TEST((cached[0].tokens != cached[1].tokens || cached[0].score != cached[1].score));
}

BOOST_AUTO_TEST_CASE(cached_beam_search_matches_recomputation) { check_cached_beam_search<Src, Tgt>(); }
BOOST_AUTO_TEST_CASE(cached_beam_search_matches_recomputation_with_rotary_positions) {
  check_cached_beam_search<SrcLlama, TgtLlama>();
}

BOOST_AUTO_TEST_SUITE_END()
