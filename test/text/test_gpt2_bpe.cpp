#define BOOST_TEST_MODULE gpt2_bpe
// GPT-2's tokenizer against ../shared/data/gpt2/reference.jsonl: 65 texts
// with the ids two independent GPT-2 encoders agree on. Without the shared
// data the cases pass with a message saying they were not run.
#include "xfmr/text/gpt2_bpe.hpp"

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "xfmr/core/error.hpp"

using namespace xfmr;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = XFMR_GPT2_DIR;
const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer t = Gpt2Tokenizer::load(kDir / "encoder.json", kDir / "vocab.bpe");
  return t;
}
}  // namespace

BOOST_AUTO_TEST_CASE(matches_the_reference_encodings) {
  if (!fs::exists(kDir / "reference.jsonl")) {
    BOOST_TEST_MESSAGE("no " << kDir << "; skipped");
    return;
  }
  const Gpt2Tokenizer& t = tokenizer();
  BOOST_TEST(t.size() == 50257);
  BOOST_TEST(t.end_of_text() == 50256);
  std::ifstream in(kDir / "reference.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const std::string text = j.at("text");
    const auto want = j.at("ids").get<std::vector<std::int32_t>>();
    BOOST_TEST_CONTEXT("text " << n << ": " << text) {
      BOOST_TEST(t.encode(text) == want, boost::test_tools::per_element());
      BOOST_TEST(t.decode(want) == text);
    }
    ++n;
  }
  BOOST_TEST(n == 65);
}

BOOST_AUTO_TEST_CASE(round_trips_any_bytes) {
  if (!fs::exists(kDir / "encoder.json")) return;
  const Gpt2Tokenizer& t = tokenizer();
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = char(rng() % 256);
    BOOST_TEST(t.decode(t.encode(s)) == s);
  }
  const std::string special = "a<|endoftext|>b";
  const auto ids = t.encode(special);
  BOOST_TEST(ids.size() == 3u);
  BOOST_TEST(ids[1] == 50256);
  BOOST_TEST(t.decode(ids) == special);
  const std::vector<std::int32_t> bad = {50257};
  BOOST_CHECK_THROW((void)t.decode(bad), Error);
}
