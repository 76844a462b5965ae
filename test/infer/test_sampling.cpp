#include "xfmr/infer/sampling.hpp"

#include <boost/test/unit_test.hpp>
#include <cmath>

BOOST_AUTO_TEST_SUITE(test_sampling)

using namespace xfmr;

BOOST_AUTO_TEST_CASE(greedy_and_top_k_one_pick_the_arg_max) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  Rng rng(1);
  Sampler greedy({.temperature = 0.0});
  Sampler k1({.temperature = 1.5, .top_k = 1});
  for (int i = 0; i < 20; ++i) {
    BOOST_TEST(greedy(std::span<const float>(logits), rng) == 1);
    BOOST_TEST(k1(std::span<const float>(logits), rng) == 1);
  }
}

BOOST_AUTO_TEST_CASE(frequencies_follow_the_softmax) {
  const std::vector<double> logits = {std::log(0.5), std::log(0.3), std::log(0.2)};
  Rng rng(2);
  Sampler s({});
  std::vector<int> counts(3);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s(std::span<const double>(logits), rng)];
  BOOST_TEST(std::abs(counts[0] / double(n) - 0.5) < 0.01);
  BOOST_TEST(std::abs(counts[1] / double(n) - 0.3) < 0.01);
  BOOST_TEST(std::abs(counts[2] / double(n) - 0.2) < 0.01);
}

BOOST_AUTO_TEST_CASE(top_k_and_top_p_restrict_the_support) {
  const std::vector<double> logits = {std::log(0.5), std::log(0.3), std::log(0.15), std::log(0.05)};
  Rng rng(3);
  Sampler k2({.temperature = 1.0, .top_k = 2});
  Sampler p07({.temperature = 1.0, .top_k = 0, .top_p = 0.7});  // 0.5 + 0.3 reaches 0.7
  std::vector<int> ck(4), cp(4);
  for (int i = 0; i < 20000; ++i) {
    ++ck[k2(std::span<const double>(logits), rng)];
    ++cp[p07(std::span<const double>(logits), rng)];
  }
  BOOST_TEST(ck[2] + ck[3] == 0);
  BOOST_TEST(cp[2] + cp[3] == 0);
  BOOST_TEST(std::abs(ck[0] / 20000.0 - 0.625) < 0.015);  // renormalised 0.5 / 0.8
}

// A vocabulary of 5,000 whose nucleus lies mostly below the first
// candidates sorted (1e-3 of the likeliest's weight): one id of weight 1
// and 4,999 tied at e^-7.5, top_p 0.5. The nucleus is id 7 and the first
// ties by id up to half the mass (about 1,600 of them); the draws stay in
// it and reach across it. The first arg-max wins a tie, at any position;
// a temperature whose inverse overflows float32 is greedy.
BOOST_AUTO_TEST_CASE(top_p_over_a_large_vocabulary_and_ties) {
  const int n = 5000, top = 7, draws = 200;
  std::vector<float> logits(n, -7.5f);
  logits[top] = 0.0f;
  const double tie = std::exp(-7.5), sum = 1.0 + (n - 1) * tie;
  const int ties_in = int(std::ceil((0.5 * sum - 1.0) / tie));
  const int last = ties_in + 1;  // ids 0..6 and 8..last are the ties kept
  Rng rng(4);
  Sampler half({.temperature = 1.0, .top_p = 0.5});
  int largest = 0, tops = 0;
  for (int i = 0; i < draws; ++i) {
    const int id = half(std::span<const float>(logits), rng);
    BOOST_TEST_REQUIRE(id <= last);
    largest = std::max(largest, id);
    tops += id == top;
  }
  BOOST_TEST(largest > last / 2);
  BOOST_TEST(std::abs(tops / double(draws) - 1.0 / (0.5 * sum)) < 0.1);
  for (const int at : {0, 15, 16, 17, n - 1}) {
    std::vector<float> flat(n, 1.0f);
    flat[at] = 2.0f;
    if (at + 20 < n) flat[at + 20] = 2.0f;  // a later tie loses
    BOOST_TEST(Sampler({.temperature = 0.0})(std::span<const float>(flat), rng) == at);
    BOOST_TEST(Sampler({.temperature = 1e-300})(std::span<const float>(flat), rng) == at);
  }
}

BOOST_AUTO_TEST_CASE(bad_options_are_errors) {
  BOOST_CHECK_THROW(Sampler({.temperature = -1.0}), Error);
  BOOST_CHECK_THROW(Sampler({.temperature = 1.0, .top_k = -2}), Error);
  BOOST_CHECK_THROW(Sampler({.temperature = 1.0, .top_k = 0, .top_p = 0.0}), Error);
}

// Logits that are not finite numbers (a model whose weights overflow) are
// an error, greedy or not, never an arbitrary id.
BOOST_AUTO_TEST_CASE(logits_that_are_not_numbers_are_errors) {
  Rng rng(1);
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    const std::vector<float> logits = {0.1f, bad, 1.0f};
    for (const double temperature : {0.0, 1.0}) {
      BOOST_TEST_CONTEXT(bad << " at temperature " << temperature) {
        Sampler s({.temperature = temperature});
        try {
          (void)s(std::span<const float>(logits), rng);
          BOOST_ERROR("sampled");
        } catch (const Error& e) {
          BOOST_TEST(std::string(e.what()).find("logit 1 is") != std::string::npos, e.what());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
