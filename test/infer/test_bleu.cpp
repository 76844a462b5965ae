#include "xfmr/infer/bleu.hpp"

#include <boost/test/unit_test.hpp>
#include <cmath>

#include "xfmr/core/error.hpp"

BOOST_AUTO_TEST_SUITE(test_bleu)

using namespace xfmr;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(tokenize_13a_rules) {
  BOOST_TEST(tokenize_13a("Hello, world.") == "Hello , world .");
  BOOST_TEST(tokenize_13a("It costs $3.50, or 1,000 yen.") == "It costs $ 3.50 , or 1,000 yen .");
  BOOST_TEST(tokenize_13a("The 1990-2000 range (approx.)") == "The 1990 - 2000 range ( approx . )");
  BOOST_TEST(tokenize_13a("don't stop-gap") == "don't stop-gap");  // apostrophes and word dashes stay
  BOOST_TEST(tokenize_13a("a &amp; b &lt;c&gt; &quot;d&quot;") == "a & b < c > \" d \"");
  BOOST_TEST(tokenize_13a("  many   spaces\n and lines ") == "many spaces and lines");
  BOOST_TEST(tokenize_13a("end...") == "end . . .");
  BOOST_TEST(tokenize_13a("Une phrase, très belle.") == "Une phrase , très belle .");
}

BOOST_AUTO_TEST_CASE(identical_and_empty_output) {
  const std::vector<std::string> hyp = {"The cat sat on the mat.", "A dog barked loudly at night."};
  const std::vector<std::vector<std::string>> refs = {hyp};
  BOOST_TEST(corpus_bleu(hyp, refs).score == 100.0, tt::tolerance(1e-9));
  const std::vector<std::string> empty = {"", ""};
  BOOST_TEST(corpus_bleu(empty, refs).score == 0.0);
  BOOST_CHECK_THROW(corpus_bleu(empty, std::vector<std::vector<std::string>>{{"one"}}), Error);
}

BOOST_AUTO_TEST_CASE(sacrebleu_readme_example) {
  // The multi-reference example from sacreBLEU's README:
  // BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)
  const std::vector<std::string> sys = {"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."};
  const std::vector<std::vector<std::string>> refs = {
      {"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
      {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."}};
  const auto s = corpus_bleu(sys, refs);
  BOOST_TEST(s.to_string() == "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)");
}

BOOST_AUTO_TEST_CASE(hand_checked_single_reference) {
  // hyp "the cat sat on a mat" vs ref "the cat sat on the mat":
  // 1-grams 5/6, 2-grams 3/5, 3-grams 2/4, 4-grams 1/3, equal lengths (BP 1):
  // BLEU = 100 * (5/6 * 3/5 * 2/4 * 1/3)^(1/4) = 53.728...
  const std::vector<std::string> hyp = {"the cat sat on a mat"};
  const std::vector<std::vector<std::string>> refs = {{"the cat sat on the mat"}};
  const auto s = corpus_bleu(hyp, refs);
  BOOST_TEST(s.score == 100.0 * std::pow(5.0 / 6 * 3.0 / 5 * 2.0 / 4 * 1.0 / 3, 0.25), tt::tolerance(1e-12));
  // No 4-gram match: "exp" smoothing counts it as 1 / (2 * total).
  const std::vector<std::string> short_hyp = {"the cat on the mat"};
  const auto t = corpus_bleu(short_hyp, refs);
  // 1-grams 5/5; 2-grams 3/4 (the cat, on the, the mat); 3-grams 1/3 (on the mat);
  // 4-grams 0/2 -> 1/(2*2); BP = exp(1 - 6/5). BLEU = 40.94.
  const double want = std::exp(1.0 - 6.0 / 5.0) * 100.0 * std::pow(1.0 * 0.75 * (1.0 / 3) * (1.0 / 4), 0.25);
  BOOST_TEST(t.score == want, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_SUITE_END()
