// Generation (infer/generate.hpp): the cache and the recomputed context give
// the same tokens, the stop and restart tokens and the callback act as
// documented, a Generator repeats itself, and bad calls are refused; and a
// language model's loss on a text in windows (infer/window_loss.hpp).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/window_loss.hpp"
#include "xfmr/models/decoder.hpp"

BOOST_AUTO_TEST_SUITE(test_generate)

using namespace xfmr;
using namespace xfmr::test;
using Be = CpuBackend<float>;

namespace {
struct TinyLm : TinyPre {
  static constexpr int MAX_T = 8, N_LAYERS = 2;
};
constexpr int kVocab = 7;
}  // namespace

// Within MAX_T the cache changes nothing; past it, the cached path restarts
// from the last MAX_T / 2 tokens (so the two may part there), and sampling
// at a temperature draws the same tokens both ways from one seed.
BOOST_AUTO_TEST_CASE(cached_and_recomputed_generation_agree) {
  Be be;
  Decoder<TinyLm, Be> model(kVocab, 3);
  for (double temperature : {0.0, 1.0}) {
    BOOST_TEST_CONTEXT("temperature " << temperature) {
      GenerateOptions opts{.sampling = {.temperature = temperature}, .max_tokens = 6};
      Rng r1(9), r2(9);
      const auto cached = generate(model, be, {1, 2}, opts, r1);
      opts.use_cache = false;
      const auto plain = generate(model, be, {1, 2}, opts, r2);
      BOOST_TEST(cached.size() == 6u);
      BOOST_TEST(cached == plain, boost::test_tools::per_element());
    }
  }
  // A prompt longer than MAX_T is read from its last MAX_T tokens.
  Rng r1(1), r2(1);
  const std::vector<std::int32_t> long_prompt = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3};
  const auto a = generate(model, be, long_prompt, {.sampling = {.temperature = 0}, .max_tokens = 1}, r1);
  const auto b = generate(model, be, {3, 4, 5, 6, 0, 1, 2, 3}, {.sampling = {.temperature = 0}, .max_tokens = 1}, r2);
  BOOST_TEST(a == b, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(stop_restart_and_the_callback) {
  Be be;
  Decoder<TinyLm, Be> model(kVocab, 3);
  Rng rng(2);
  const GenerateOptions greedy{.sampling = {.temperature = 0}, .max_tokens = 20};
  const auto all = generate(model, be, {1}, greedy, rng);
  BOOST_REQUIRE(all.size() == 20u);
  // stop: generation ends with the first such token.
  GenerateOptions stopping = greedy;
  stopping.stop = all[3];
  const auto stopped = generate(model, be, {1}, stopping, rng);
  const auto first = std::find(all.begin(), all.end(), all[3]);
  BOOST_TEST(stopped == std::vector<std::int32_t>(all.begin(), first + 1), boost::test_tools::per_element());
  // The callback sees every token in order; false ends generation.
  std::vector<std::int32_t> seen;
  const auto five = generate(model, be, {1}, greedy, rng, [&](std::int32_t id) {
    seen.push_back(id);
    return seen.size() < 5;
  });
  BOOST_TEST(five == seen, boost::test_tools::per_element());
  BOOST_TEST(five == std::vector<std::int32_t>(all.begin(), all.begin() + 5), boost::test_tools::per_element());
  // restart: after that token the context is that token alone, as a fresh
  // prompt of it would be.
  GenerateOptions restarting = greedy;
  restarting.restart = all[2];
  const auto restarted = generate(model, be, {1}, restarting, rng);
  const auto fresh = generate(model, be, {all[2]}, greedy, rng);
  const std::size_t at = std::size_t(std::find(all.begin(), all.end(), all[2]) - all.begin()) + 1;
  BOOST_TEST(std::vector<std::int32_t>(restarted.begin() + at, restarted.begin() + at + 3) ==
                 std::vector<std::int32_t>(fresh.begin(), fresh.begin() + 3),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_generator_repeats_and_bad_calls_are_refused) {
  Be be;
  Decoder<TinyLm, Be> model(kVocab, 3);
  Generator<Decoder<TinyLm, Be>, Be> generator(model, be);
  Rng a(5), b(5);
  const auto one = generator({2}, {.max_tokens = 12}, a);
  const auto two = generator({2}, {.max_tokens = 12}, b);
  BOOST_TEST(one == two, boost::test_tools::per_element());
  BOOST_CHECK_THROW(generator({}, {.max_tokens = 1}, a), Error);
  BOOST_CHECK_THROW(generator({2}, {.max_tokens = -1}, a), Error);
  BOOST_CHECK_THROW(generator({2}, {.sampling = {.top_p = 0.0}, .max_tokens = 1}, a), Error);
  BOOST_CHECK_THROW(generator({kVocab}, {.max_tokens = 1}, a), Error);  // an id out of range
  BOOST_CHECK_THROW(generator({2}, {.max_tokens = 1, .vocabulary = kVocab + 1}, a), Error);
  BOOST_CHECK_THROW(generator({2}, {.max_tokens = 1, .vocabulary = -1}, a), Error);
}

// vocabulary: the ids past it (a padded vocabulary's rows, which no
// tokenizer decodes) are never drawn, while the whole vocabulary draws them.
BOOST_AUTO_TEST_CASE(ids_past_the_vocabulary_are_never_drawn) {
  Be be;
  Decoder<TinyLm, Be> model(kVocab, 3);
  Rng a(11), b(11);
  const GenerateOptions all{.sampling = {.temperature = 2.0}, .max_tokens = 200};
  GenerateOptions first_four = all;
  first_four.vocabulary = 4;
  const auto any = generate(model, be, {1}, all, a), four = generate(model, be, {1}, first_four, b);
  BOOST_TEST(*std::max_element(any.begin(), any.end()) >= 4);
  BOOST_TEST(*std::max_element(four.begin(), four.end()) < 4);
  BOOST_TEST(four.size() == 200u);
}

// window_loss: the mean over every target of every window of the
// log-softmax's loss, whatever the batch; at most `windows` windows; stop()
// ends it between batches; too short a text is an error naming its length.
BOOST_AUTO_TEST_CASE(window_loss_sums_each_windows_targets) {
  Be be;
  Decoder<TinyLm, Be> model(kVocab, 3);
  std::vector<std::int32_t> tokens(30);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t(i * 3 % kVocab);
  const int T = 8;  // 29 targets: three windows of 8, the last 5 tokens unused
  model.set_training(false);
  double want = 0;
  for (int w = 0; w < 3; ++w) {
    const std::span<const std::int32_t> ids(tokens.data() + w * T, T);
    const auto logits = model.forward(be, ids, Shape{1, T});
    const std::vector<float> z(logits.begin(), logits.end());
    for (int t = 0; t < T; ++t) {
      const float* row = z.data() + std::size_t(t) * kVocab;
      double top = row[0], norm = 0;
      for (int v = 1; v < kVocab; ++v) top = std::max(top, double(row[v]));
      for (int v = 0; v < kVocab; ++v) norm += std::exp(double(row[v]) - top);
      want += top + std::log(norm) - double(row[tokens[std::size_t(w * T + t + 1)]]);
    }
  }
  model.set_training(true);
  for (int batch : {1, 2, 3, 8}) {
    BOOST_TEST_CONTEXT("batch " << batch) {
      const LossSum sum = window_loss(model, be, tokens, T, batch, 0);
      BOOST_TEST(sum.counted == 24);
      BOOST_TEST(sum.total == want, boost::test_tools::tolerance(1e-5));
    }
  }
  BOOST_TEST(window_loss(model, be, tokens, T, 2, 2).counted == 16);  // at most two windows
  BOOST_TEST(window_loss(model, be, tokens, T, 2, 9).counted == 24);  // no more than fit
  int asked = 0;
  BOOST_TEST(window_loss(model, be, tokens, T, 2, 0, [&] { return ++asked > 1; }).counted == 16);  // one batch
  BOOST_TEST(window_loss(model, be, tokens, T, 2, 0, [] { return true; }).counted == 0);
  BOOST_TEST(test::error_of([&] { (void)window_loss(model, be, std::span(tokens).first(8), T, 1, 0); }) ==
             "the text has 8 tokens, too few for one window of 8 + 1");
  BOOST_TEST(test::error_of([&] { (void)window_loss(model, be, std::span<const std::int32_t>(), T, 1, 0); }) ==
             "the text has 0 tokens, too few for one window of 8 + 1");
  BOOST_TEST(test::error_of([&] { (void)window_loss(model, be, tokens, T, 0, 0); }) ==
             "window_loss: a window of 8 tokens, 0 a batch (both must be positive)");
}

BOOST_AUTO_TEST_SUITE_END()
