// Continuous batching (infer/continuous_batching.hpp): a ragged step gives
// each sequence the logits its own cached forward gives; the batcher gives
// every request the tokens Generator gives it alone, however the requests
// share the slots and the prompts are cut; stops, lengths, cancellations and
// bad requests end as documented, and no slot is left busy.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <ostream>
#include <span>
#include <thread>
#include <vector>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/continuous_batching.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/stop_strings.hpp"
#include "xfmr/models/decoder.hpp"

namespace xfmr {
inline std::ostream& operator<<(std::ostream& os, FinishReason r) { return os << finish_reason_name(r); }
}  // namespace xfmr

BOOST_AUTO_TEST_SUITE(test_continuous_batching)

using namespace xfmr;
using namespace xfmr::test;
using Be = CpuBackend<float>;

namespace {
// GPT-2's choices (learned positions, biases) and Llama's (rotary
// positions, grouped-query attention), two layers each.
struct GptLike : TinyPre {
  static constexpr int MAX_T = 16, N_LAYERS = 2;
};
struct LlamaLike : TinyLlama {
  static constexpr int MAX_T = 16, N_LAYERS = 2, N_HEADS = 4, N_KV_HEADS = 2;
};
// The same with room for long answers (prompt lookup's).
struct GptLongLike : GptLike {
  static constexpr int MAX_T = 64;
};
struct LlamaLongLike : LlamaLike {
  static constexpr int MAX_T = 64;
};
constexpr int kVocab = 11;

const std::vector<std::vector<std::int32_t>> kPrompts = {
    {1, 2, 3}, {4}, {5, 6, 7, 8, 9, 10, 0}, {2, 2}, {9, 8, 7, 6, 5}, {3}, {10, 1, 4, 1}};

// Each request's tokens, as the batcher gave them, and how it ended.
struct Collected {
  std::map<std::uint64_t, std::vector<std::int32_t>> tokens;
  std::map<std::uint64_t, BatchResult> results;

  BatchRequest with_callbacks(BatchRequest r, std::uint64_t& id_slot) {
    r.on_token = [this, &id_slot](std::int32_t t) {
      tokens[id_slot].push_back(t);
      return true;
    };
    r.on_finish = [this, &id_slot](const BatchResult& res) { results[id_slot] = res; };
    return r;
  }
};

template <class Batcher>
void drain(Batcher& b) {
  for (int i = 0; i < 10000 && b.step(); ++i) {
  }
  BOOST_TEST(b.idle());
}
}  // namespace

// The ragged step against each sequence's own cached forward: the same
// logits (up to the rounding of a product over more rows).
BOOST_AUTO_TEST_CASE_TEMPLATE(a_ragged_step_is_each_sequences_own_forward, Cfg, decltype(std::tuple<GptLike, LlamaLike>())) {
  Be be;
  Decoder<Cfg, Be> model(kVocab, 5);
  model.set_training(false);
  const int slots = 3, context = 12;
  DecodingCache<Be> pool;
  model.start_cache(pool, slots, context);
  // Alone: each sequence's cache, fed the same pieces.
  std::vector<DecodingCache<Be>> alone(slots);
  for (auto& c : alone) model.start_cache(c, 1, context);
  // Sequence s's ids, read in pieces of these sizes, one piece a step.
  const std::vector<std::vector<std::int32_t>> seqs = {{1, 2, 3, 4, 5, 6}, {7, 8}, {9, 10, 0, 1, 2}};
  const std::vector<std::vector<int>> pieces = {{2, 1, 3}, {1, 1}, {4, 1}};
  std::vector<int> done(slots, 0), step_of(slots, 0);
  for (int step = 0; step < 3; ++step) {
    std::vector<StepSegment> segs;
    std::vector<std::int32_t> ids;
    for (int s = 0; s < slots; ++s) {
      if (step >= int(pieces[s].size())) continue;
      const int n = pieces[s][step];
      segs.push_back({s, done[s], n});
      ids.insert(ids.end(), seqs[s].begin() + done[s], seqs[s].begin() + done[s] + n);
    }
    const auto got = model.forward_cached(be, ids, std::span<const StepSegment>(segs), pool);
    const std::vector<float> batched(got.begin(), got.end());
    BOOST_TEST(batched.size() == segs.size() * kVocab);
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const int s = segs[i].slot, n = segs[i].rows;
      const std::span<const std::int32_t> mine(seqs[s].data() + done[s], n);
      const auto own = model.forward_cached(be, mine, 1, alone[s]);
      for (int v = 0; v < kVocab; ++v)
        BOOST_TEST(batched[i * kVocab + v] == own[std::size_t(n - 1) * kVocab + v],
                   boost::test_tools::tolerance(2e-5f));
      done[s] += n;
    }
  }
  // A segment outside the pool is refused, naming it.
  const std::vector<StepSegment> past = {{0, context - 1, 2}};
  const std::vector<std::int32_t> two = {1, 2};
  BOOST_TEST(error_of([&] { model.forward_cached(be, two, std::span<const StepSegment>(past), pool); })
                 .find("outside the cache's 3 slots of 12 positions") != std::string::npos);
}

// Seven requests through three slots, prompts read two ids a step among
// all of them: each gets Generator's tokens alone, greedy and sampled.
BOOST_AUTO_TEST_CASE_TEMPLATE(each_request_gets_the_tokens_it_gets_alone, Cfg,
                              decltype(std::tuple<GptLike, LlamaLike>())) {
  Be be;
  Decoder<Cfg, Be> model(kVocab, 7);
  for (double temperature : {0.0, 0.9}) {
    BOOST_TEST_CONTEXT("temperature " << temperature) {
      ContinuousBatcher batcher(model, be, {.slots = 3, .context = 14, .prefill_chunk = 2, .queue = 16});
      Collected got;
      std::vector<std::uint64_t> ids(kPrompts.size());
      for (std::size_t i = 0; i < kPrompts.size(); ++i) {
        const int max_tokens = 3 + int(i) % 5;
        ids[i] = batcher.submit(got.with_callbacks(
            {.prompt = kPrompts[i], .sampling = {.temperature = temperature}, .max_tokens = max_tokens, .seed = 40 + i},
            ids[i]));
      }
      drain(batcher);
      for (std::size_t i = 0; i < kPrompts.size(); ++i) {
        Rng rng(40 + i);
        const int max_tokens = 3 + int(i) % 5;
        const auto alone =
            generate(model, be, kPrompts[i], {.sampling = {.temperature = temperature}, .max_tokens = max_tokens}, rng);
        BOOST_TEST_CONTEXT("request " << i) {
          BOOST_TEST(got.tokens[ids[i]] == alone, boost::test_tools::per_element());
          BOOST_TEST(got.results[ids[i]].reason == FinishReason::length);
          BOOST_TEST(got.results[ids[i]].completion_tokens == max_tokens);
          BOOST_TEST(got.results[ids[i]].prompt_tokens == int(kPrompts[i].size()));
        }
      }
      const BatchStats s = batcher.stats();
      BOOST_TEST(s.requests == kPrompts.size());
      BOOST_TEST(s.finished == kPrompts.size());
      BOOST_TEST(s.busy_slots == 0);
      BOOST_TEST(s.queued == 0);
    }
  }
}

// Prompt caching: a chat's next turn (the last prompt, its answer, more)
// reads only what the slot does not hold; n requests of one prompt sent at
// once read it once (the others wait, then copy its rows); each gets the
// tokens it gets alone, greedy and sampled.
BOOST_AUTO_TEST_CASE_TEMPLATE(prompts_share_what_the_cache_holds, Cfg, decltype(std::tuple<GptLike, LlamaLike>())) {
  Be be;
  Decoder<Cfg, Be> model(kVocab, 7);
  for (double temperature : {0.0, 0.9}) {
    BOOST_TEST_CONTEXT("temperature " << temperature) {
      const SamplingOptions sampling{.temperature = temperature};
      auto alone = [&](const std::vector<std::int32_t>& prompt, int max_tokens, std::uint64_t seed) {
        Rng rng(seed);
        return generate(model, be, prompt, {.sampling = sampling, .max_tokens = max_tokens}, rng);
      };
      ContinuousBatcher batcher(model, be, {.slots = 3, .context = 16, .prefill_chunk = 2, .queue = 16});
      Collected got;
      std::uint64_t first = 0, second = 0;
      const std::vector<std::int32_t> turn1 = {1, 2, 3, 4};
      first = batcher.submit(got.with_callbacks({.prompt = turn1, .sampling = sampling, .max_tokens = 3, .seed = 5}, first));
      drain(batcher);
      BOOST_TEST(got.results[first].cached_tokens == 0);
      std::vector<std::int32_t> turn2 = turn1;
      turn2.insert(turn2.end(), got.tokens[first].begin(), got.tokens[first].end());
      turn2.insert(turn2.end(), {5, 6});
      second = batcher.submit(got.with_callbacks({.prompt = turn2, .sampling = sampling, .max_tokens = 3, .seed = 6}, second));
      drain(batcher);
      // The slot holds turn 1's prompt and the answer's tokens but its last (drawn, never fed).
      BOOST_TEST(got.results[second].cached_tokens == 4 + 3 - 1);
      BOOST_TEST(got.tokens[second] == alone(turn2, 3, 6), boost::test_tools::per_element());
      // Three choices of one prompt, sent together.
      const std::vector<std::int32_t> shared = {9, 8, 7, 6, 5, 4, 3};
      std::vector<std::uint64_t> ids(3);
      for (std::size_t i = 0; i < 3; ++i)
        ids[i] = batcher.submit(
            got.with_callbacks({.prompt = shared, .sampling = sampling, .max_tokens = 4, .seed = 10 + i}, ids[i]));
      drain(batcher);
      int copied = 0;
      for (std::size_t i = 0; i < 3; ++i) BOOST_TEST_CONTEXT("choice " << i) {
          BOOST_TEST(got.tokens[ids[i]] == alone(shared, 4, 10 + i), boost::test_tools::per_element());
          copied += got.results[ids[i]].cached_tokens == int(shared.size()) - 1;
        }
      BOOST_TEST(copied == 2);  // the first read it; the others copied all but its last id
      BOOST_TEST(batcher.stats().cached_tokens == std::uint64_t(6 + 2 * 6));
      const auto states = batcher.slot_states();
      BOOST_TEST(states.size() == 3u);
      for (const SlotState& x : states) BOOST_TEST(!x.busy);
    }
  }
}

// Prompt lookup: with drafts from the text so far, each request gets the
// tokens it gets alone, greedy and sampled, in fewer steps where the
// drafts hold (a random model's greedy text falls into loops).
BOOST_AUTO_TEST_CASE_TEMPLATE(prompt_lookup_changes_no_token, Cfg, decltype(std::tuple<GptLongLike, LlamaLongLike>())) {
  Be be;
  Decoder<Cfg, Be> model(kVocab, 7);
  const std::vector<std::vector<std::int32_t>> prompts = {
      {1, 2, 3, 1, 2, 3, 1, 2}, {4, 5, 4, 5, 4}, {9, 8, 7, 6, 9, 8, 7}, {3}, {10, 0, 10, 0, 10, 0, 10}};
  for (double temperature : {0.0, 0.9}) {
    BOOST_TEST_CONTEXT("temperature " << temperature) {
      std::vector<std::uint64_t> plain_steps;
      for (int lookup : {0, 4}) {
        ContinuousBatcher batcher(model, be, {.slots = 3, .context = 56, .prefill_chunk = 4, .queue = 16,
                                                 .speculation = {.lookup = lookup}});
        Collected got;
        std::vector<std::uint64_t> ids(prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i)
          ids[i] = batcher.submit(got.with_callbacks(
              {.prompt = prompts[i], .sampling = {.temperature = temperature}, .max_tokens = 40, .seed = 60 + i}, ids[i]));
        drain(batcher);
        for (std::size_t i = 0; i < prompts.size(); ++i) BOOST_TEST_CONTEXT("lookup " << lookup << ", request " << i) {
            Rng rng(60 + i);
            const auto alone =
                generate(model, be, prompts[i], {.sampling = {.temperature = temperature}, .max_tokens = 40}, rng);
            BOOST_TEST(got.tokens[ids[i]] == alone, boost::test_tools::per_element());
          }
        const BatchStats st = batcher.stats();
        if (lookup == 0) {
          BOOST_TEST(st.drafted_tokens == 0u);
          plain_steps.push_back(st.steps);
        } else if (temperature == 0.0) {
          BOOST_TEST_MESSAGE(st.accepted_tokens << " of " << st.drafted_tokens << " drafts drawn; " << st.steps
                                                << " steps against " << plain_steps.back());
          BOOST_TEST(st.accepted_tokens > 0u);
          BOOST_TEST(st.steps < plain_steps.back());
        }
      }
    }
  }
}

// A draft model: each request gets the tokens it gets alone, greedy and
// sampled, whatever the draft; one with the model's weights has its drafts
// drawn as drafted under greedy decoding (fewer steps), another model's
// changes no token either. The second round's prompts begin with the first
// round's (prompt caching: the draft's rows shared or caught up too).
BOOST_AUTO_TEST_CASE_TEMPLATE(draft_model_changes_no_token, Cfg, decltype(std::tuple<GptLongLike, LlamaLongLike>())) {
  Be be, draft_be;
  Decoder<Cfg, Be> model(kVocab, 7), same(kVocab, 7), other(kVocab, 8);
  std::vector<std::vector<std::int32_t>> first = {{1, 2, 3}, {4, 5, 4, 5, 4}, {1, 2, 3}, {9, 8, 7, 6}, {10, 0}};
  for (double temperature : {0.0, 0.9}) {
    std::uint64_t plain_steps = 0;
    for (Decoder<Cfg, Be>* draft : {static_cast<Decoder<Cfg, Be>*>(nullptr), &same, &other}) {
      BOOST_TEST_CONTEXT("temperature " << temperature << ", draft " << (!draft ? "none" : draft == &same ? "same" : "other")) {
        ContinuousBatcher batcher(model, be, {.slots = 3, .context = 56, .prefill_chunk = 4, .queue = 16,
                                              .speculation = {.draft = draft ? 4 : 0}},
                                  draft, &draft_be);
        std::vector<std::vector<std::int32_t>> prompts = first;
        std::uint64_t seed = 80;
        for (int round = 0; round < 2; ++round) {
          Collected got;
          std::vector<std::uint64_t> ids(prompts.size());
          for (std::size_t i = 0; i < prompts.size(); ++i)
            ids[i] = batcher.submit(got.with_callbacks({.prompt = prompts[i], .sampling = {.temperature = temperature},
                                                        .max_tokens = 20, .seed = seed + i},
                                                       ids[i]));
          drain(batcher);
          for (std::size_t i = 0; i < prompts.size(); ++i) BOOST_TEST_CONTEXT("round " << round << ", request " << i) {
              Rng rng(seed + i);
              const auto alone =
                  generate(model, be, prompts[i], {.sampling = {.temperature = temperature}, .max_tokens = 20}, rng);
              BOOST_TEST(got.tokens[ids[i]] == alone, boost::test_tools::per_element());
              // The next round: this text, then a new id.
              prompts[i].insert(prompts[i].end(), alone.begin(), alone.end());
              prompts[i].push_back(std::int32_t(i));
            }
          seed += 10;
        }
        const BatchStats st = batcher.stats();
        BOOST_TEST(st.cached_tokens > 0u);
        if (!draft) {
          BOOST_TEST(st.drafted_tokens == 0u);
          plain_steps = st.steps;
          continue;
        }
        BOOST_TEST_MESSAGE(st.accepted_tokens << " of " << st.drafted_tokens << " drafts drawn; " << st.steps
                                              << " steps against " << plain_steps);
        BOOST_TEST(st.drafted_tokens > 0u);
        if (draft == &same && temperature == 0.0) {
          BOOST_TEST(st.accepted_tokens * 10 >= st.drafted_tokens * 9);
          BOOST_TEST(st.steps * 2 < plain_steps);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(speculation_is_checked) {
  Be be;
  Decoder<GptLongLike, Be> model(kVocab, 7);
  BOOST_TEST(error_of([&] { ContinuousBatcher b(model, be, {.speculation = {.draft = 2}}); })
                 .find("draft 2 tokens a step need a draft model") != std::string::npos);
  BOOST_TEST(error_of([&] { ContinuousBatcher b(model, be, {.speculation = {.lookup = 2, .draft = 2}}, &model, &be); })
                 .find("from one source") != std::string::npos);
  BOOST_TEST(error_of([&] { ContinuousBatcher b(model, be, {.speculation = {.draft = 17}}, &model, &be); })
                 .find("draft 17 tokens outside [0, 16]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(prompt_lookup_drafts_what_followed_the_last_ids) {
  const std::vector<std::int32_t> held = {1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 2};
  // The text ends 7 2 3: no earlier 7 2 3, but an earlier 2 3, followed by 9 7 2 3.
  BOOST_TEST(prompt_lookup_drafts(held, 3, 4) == (std::vector<std::int32_t>{9, 7, 2, 3}), boost::test_tools::per_element());
  BOOST_TEST(prompt_lookup_drafts(held, 3, 2) == (std::vector<std::int32_t>{9, 7}), boost::test_tools::per_element());
  BOOST_TEST(prompt_lookup_drafts(held, 8, 4).empty());  // "2 8" never came before
  BOOST_TEST(prompt_lookup_drafts(held, 3, 0).empty());
  BOOST_TEST(prompt_lookup_drafts({}, 3, 4).empty());
}

// logprobs: each drawn token's log-probability under softmax(logits / T),
// and the likeliest ids' (ties by id), as a full forward of the sequence
// so far gives them.
BOOST_AUTO_TEST_CASE(logprobs_are_the_distribution_the_sampler_drew_from) {
  Be be;
  Decoder<GptLike, Be> model(kVocab, 7);
  ContinuousBatcher batcher(model, be, {.slots = 2, .context = 16, .queue = 8});
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  const double temperature = 0.7;
  std::vector<TokenLogprobs> got;
  std::vector<std::int32_t> tokens;
  batcher.submit({.prompt = prompt,
                  .sampling = {.temperature = temperature},
                  .max_tokens = 4,
                  .seed = 3,
                  .top_logprobs = 3,
                  .on_logprobs = [&](const TokenLogprobs& lp) { got.push_back(lp); },
                  .on_token = [&](std::int32_t t) {
                    tokens.push_back(t);
                    return true;
                  }});
  drain(batcher);
  BOOST_REQUIRE(got.size() == 4u);
  std::vector<std::int32_t> seq = prompt;
  for (std::size_t k = 0; k < got.size(); ++k) BOOST_TEST_CONTEXT("token " << k) {
      const int T = int(seq.size());
      const auto all = model.forward(be, seq, Shape{1, T});
      const std::vector<double> logits(all.end() - kVocab, all.end());
      const double top = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (double l : logits) z += std::exp((l - top) / temperature);
      auto lp = [&](int id) { return (logits[std::size_t(id)] - top) / temperature - std::log(z); };
      BOOST_TEST(got[k].token.id == tokens[k]);
      BOOST_TEST(got[k].token.logprob == lp(tokens[k]), boost::test_tools::tolerance(1e-4));
      std::vector<int> order(kVocab);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[std::size_t(a)] > logits[std::size_t(b)]; });
      BOOST_REQUIRE(got[k].top.size() == 3u);
      for (int j = 0; j < 3; ++j) {
        BOOST_TEST(got[k].top[std::size_t(j)].id == order[std::size_t(j)]);
        BOOST_TEST(got[k].top[std::size_t(j)].logprob == lp(order[std::size_t(j)]), boost::test_tools::tolerance(1e-4));
      }
      seq.push_back(tokens[k]);
    }
  BOOST_TEST(error_of([&] { batcher.submit({.prompt = {1}, .max_tokens = 2, .top_logprobs = 21}); }).find("top_logprobs 21") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(stops_lengths_and_cancellations) {
  Be be;
  Decoder<GptLike, Be> model(kVocab, 7);
  ContinuousBatcher batcher(model, be, {.slots = 2, .context = 16, .queue = 8});
  // The greedy continuation of {1, 2, 3}, to stop on its third token.
  Rng rng(0);
  const auto greedy = generate(model, be, {1, 2, 3}, {.sampling = {.temperature = 0}, .max_tokens = 6}, rng);
  Collected got;
  std::uint64_t by_id = 0, by_callback = 0, running = 0, queued = 0;
  by_id = batcher.submit(got.with_callbacks(
      {.prompt = {1, 2, 3}, .sampling = {.temperature = 0}, .max_tokens = 6, .stop_ids = {greedy[2]}}, by_id));
  BatchRequest r = got.with_callbacks({.prompt = {1, 2, 3}, .sampling = {.temperature = 0}, .max_tokens = 6}, by_callback);
  r.on_token = [&](std::int32_t t) {
    got.tokens[by_callback].push_back(t);
    return got.tokens[by_callback].size() < 2;  // a stop string seen in the second token
  };
  by_callback = batcher.submit(std::move(r));
  running = batcher.submit(got.with_callbacks({.prompt = {4, 5}, .max_tokens = 10}, running));
  queued = batcher.submit(got.with_callbacks({.prompt = {6}, .max_tokens = 10}, queued));
  BOOST_TEST(batcher.step());
  BOOST_TEST(batcher.stats().busy_slots == 2);
  batcher.cancel(queued);  // still waiting: answered at the next step, never run
  for (int i = 0; i < 3; ++i) batcher.step();
  batcher.cancel(running);
  drain(batcher);
  // The stop token is the last one given.
  const auto first_stop = std::find(greedy.begin(), greedy.end(), greedy[2]) + 1;
  BOOST_TEST(got.tokens[by_id] == std::vector<std::int32_t>(greedy.begin(), first_stop),
             boost::test_tools::per_element());
  BOOST_TEST(got.results[by_id].reason == FinishReason::stop);
  BOOST_TEST(got.tokens[by_callback].size() == 2u);
  BOOST_TEST(got.results[by_callback].reason == FinishReason::stop);
  BOOST_TEST(got.results[running].reason == FinishReason::cancelled);
  BOOST_TEST(got.tokens[running].size() < 10u);
  BOOST_TEST(got.results[queued].reason == FinishReason::cancelled);
  BOOST_TEST(got.tokens[queued].empty());
  const BatchStats s = batcher.stats();
  BOOST_TEST(s.finished == 4u);
  BOOST_TEST(s.cancelled == 2u);
  BOOST_TEST(s.busy_slots == 0);
}

BOOST_AUTO_TEST_CASE(bad_requests_are_refused_naming_the_field) {
  Be be;
  Decoder<GptLike, Be> model(kVocab, 7);
  ContinuousBatcher batcher(model, be, {.slots = 1, .context = 8, .queue = 0});
  auto refused = [&](BatchRequest r) { return error_of([&] { batcher.submit(std::move(r)); }); };
  BOOST_TEST(refused({.prompt = {}}).find("the prompt is empty") != std::string::npos);
  BOOST_TEST(refused({.prompt = {1, 11}}).find("prompt token id 11 outside [0, 11)") != std::string::npos);
  BOOST_TEST(refused({.prompt = {1, 2, 3}, .max_tokens = 6}).find("exceed the context of 8 tokens") !=
             std::string::npos);
  BOOST_TEST(refused({.prompt = {1}, .max_tokens = 0}).find("max_tokens 0 must be >= 1") != std::string::npos);
  BOOST_TEST(refused({.prompt = {1}, .sampling = {.top_p = 2}, .max_tokens = 2}).find("top-p 2") != std::string::npos);
  BOOST_TEST(refused({.prompt = {1}, .max_tokens = 2, .vocabulary = 12}).find("vocabulary 12 outside [0, 11]") != std::string::npos);
  batcher.submit({.prompt = {1}, .max_tokens = 2});
  BOOST_CHECK_THROW(batcher.submit({.prompt = {1}, .max_tokens = 2}), QueueFull);  // the slot's, and no queue
  batcher.close();
  BOOST_TEST(refused({.prompt = {1}, .max_tokens = 2}).find("shutting down") != std::string::npos);
  drain(batcher);
  BOOST_TEST(error_of([&] { ContinuousBatcher(model, be, {.context = 17}); }).find("context 17 outside [2, 16]") !=
             std::string::npos);
}

// The engine on its own thread, requests from several: every request
// finishes once, with its tokens; a stop request returns once they have.
BOOST_AUTO_TEST_CASE(the_engine_thread_serves_other_threads) {
  Be be;
  Decoder<LlamaLike, Be> model(kVocab, 9);
  ContinuousBatcher batcher(model, be, {.slots = 3, .context = 16, .queue = 64});
  std::mutex m;
  std::map<int, std::vector<std::int32_t>> tokens;
  std::atomic<int> finished = 0;
  {
    std::jthread engine([&](std::stop_token st) { batcher.run(st); });
    std::vector<std::jthread> clients;
    for (int c = 0; c < 4; ++c)
      clients.emplace_back([&, c] {
        for (int i = 0; i < 5; ++i) {
          const int key = c * 5 + i;
          batcher.submit({.prompt = kPrompts[key % kPrompts.size()],
                          .sampling = {.temperature = 0},
                          .max_tokens = 4,
                          .on_token =
                              [&, key](std::int32_t t) {
                                std::lock_guard lock(m);
                                tokens[key].push_back(t);
                                return true;
                              },
                          .on_finish = [&](const BatchResult&) { ++finished; }});
        }
      });
    clients.clear();  // joined: all submitted
    engine.request_stop();
  }  // the engine returns once every request has finished
  BOOST_TEST(finished.load() == 20);
  for (int key = 0; key < 20; ++key) {
    Rng rng(0);
    const auto alone =
        generate(model, be, kPrompts[key % kPrompts.size()], {.sampling = {.temperature = 0}, .max_tokens = 4}, rng);
    BOOST_TEST(tokens[key] == alone, boost::test_tools::per_element());
  }
  BOOST_TEST(batcher.stats().busy_slots == 0);
}

// Stop strings split across pieces are held back, never sent, and end the text.
BOOST_AUTO_TEST_CASE(stop_strings_are_never_sent) {
  StopStrings stops({"\nUser:", "###"});
  std::string sent;
  for (const char* piece : {"Hel", "lo\n", "Us", "ed #", "# x", "\nUs", "er: more"}) sent += stops.feed(piece);
  BOOST_TEST(stops.stopped());
  BOOST_TEST(sent == "Hello\nUsed ## x");
  BOOST_TEST(stops.feed("late").empty());
  StopStrings open({"###"});
  sent = open.feed("a#");
  sent += open.feed("#");
  BOOST_TEST(sent == "a");  // "##" may still begin "###"
  sent += open.flush();
  BOOST_TEST(sent == "a##");
  BOOST_TEST(!open.stopped());
  StopStrings none;
  BOOST_TEST(none.feed("text") == "text");
}

// A stream's text: whole characters a part (a byte-level tokenizer splits
// them), an end token shown as nothing, and the text cut at a stop string.
BOOST_AUTO_TEST_CASE(token_text_hands_out_whole_characters_up_to_a_stop_string) {
  const ModelTokenizer tok = ModelTokenizer::load(std::string(XFMR_FIXTURE_DIR) + "/lm/tokenizer.json");
  const std::string text = "Größe – naïve ✓ end. more";
  const std::vector<std::int32_t> ids = tok.encode(text);
  BOOST_REQUIRE(tok.decode(ids) == text);
  TokenText stream(tok, tok.start() >= 0 ? tok.start() : ids.front(), {" end."});
  std::string sent;
  int parts = 0;
  for (std::int32_t id : ids) {
    const std::string part = stream.feed(id);
    BOOST_TEST(utf8_repaired(part) == part);  // valid UTF-8, never half a character
    sent += part, parts += !part.empty();
    if (stream.stopped()) break;
  }
  BOOST_TEST(stream.stopped());
  BOOST_TEST(sent == "Größe – naïve ✓");
  BOOST_TEST(parts > 1);
  TokenText open(tok, ids.front());
  std::string all;
  for (std::int32_t id : std::span(ids).subspan(1)) all += open.feed(id);
  all += open.feed(ids.front(), false);  // an end token: no text
  all += open.flush();
  BOOST_TEST(all == tok.decode(std::span(ids).subspan(1)));
}

BOOST_AUTO_TEST_SUITE_END()
