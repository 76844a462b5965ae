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

BOOST_AUTO_TEST_SUITE(test_gpt2_bpe)

using namespace xfmr;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = XFMR_GPT2_DIR;
const Gpt2Tokenizer& tokenizer() {
  static const Gpt2Tokenizer t = Gpt2Tokenizer::load(kDir / "encoder.json", kDir / "vocab.bpe");
  return t;
}
}  // namespace

// Every reference text encodes to its ids, and they decode back to it.
void check_reference_encodings(const Gpt2Tokenizer& t) {
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

BOOST_AUTO_TEST_CASE(matches_the_reference_encodings) {
  if (!fs::exists(kDir / "reference.jsonl")) {
    BOOST_TEST_MESSAGE("no " << kDir << "; skipped");
    return;
  }
  check_reference_encodings(tokenizer());
  BOOST_TEST(tokenizer().missing_bytes() == 0);
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

namespace {
// A file of `text` in a fresh directory under the test's working directory.
fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path dir = fs::current_path() / "gpt2_bpe_files";
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << text;
  return dir / name;
}

// GPT-2's own files as a Hugging Face tokenizer.json; `merges_as_pairs`
// writes each merge as ["a", "b"] (newer files) rather than "a b".
fs::path gpt2_tokenizer_json(bool merges_as_pairs) {
  std::ifstream enc(kDir / "encoder.json");
  nlohmann::json vocab = nlohmann::json::parse(enc), merges = nlohmann::json::array();
  std::ifstream bpe(kDir / "vocab.bpe");
  for (std::string line; std::getline(bpe, line);) {
    if (line.empty() || line.starts_with("#version")) continue;
    const auto space = line.find(' ');
    if (merges_as_pairs) merges.push_back(nlohmann::json::array({line.substr(0, space), line.substr(space + 1)}));
    else merges.push_back(line);
  }
  const nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"vocab", vocab}, {"merges", merges}}}};
  return write_file(merges_as_pairs ? "gpt2_pairs.json" : "gpt2.json", j.dump());
}
}  // namespace

// tokenizer.json built from GPT-2's encoder.json and vocab.bpe encodes the
// reference texts as GPT-2's files do, with either way of writing merges.
BOOST_AUTO_TEST_CASE(tokenizer_json_matches_the_reference_encodings) {
  if (!fs::exists(kDir / "reference.jsonl")) {
    BOOST_TEST_MESSAGE("no " << kDir << "; skipped");
    return;
  }
  for (const bool pairs : {false, true})
    BOOST_TEST_CONTEXT("merges as pairs " << pairs) check_reference_encodings(Gpt2Tokenizer::load_json(gpt2_tokenizer_json(pairs)));
}

namespace {
// A small SmolLM-style tokenizer.json: digits split apart before GPT-2's
// pre-tokenizer, several special tokens, and no token for the byte 0x01.
nlohmann::json small_tokenizer() {
  nlohmann::json vocab = {{"<|endoftext|>", 0}, {"<|im_start|>", 1}, {"<|im_end|>", 2}};
  // Every printable ASCII byte, and 'Ġ' (the space's stand-in); no 0x01 ('ā').
  int id = 3;
  for (char c = '!'; c <= '~'; ++c) vocab[std::string(1, c)] = id++;
  vocab["\xc4\xa0"] = id++;  // Ġ
  for (const char* merged : {"\xc4\xa0" "a", "\xc4\xa0" "ab", "12"}) vocab[merged] = id++;
  return {{"added_tokens", {{{"id", 0}, {"content", "<|endoftext|>"}}, {{"id", 1}, {"content", "<|im_start|>"}},
                            {{"id", 2}, {"content", "<|im_end|>"}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"},
                             {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}},
                                                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array({nlohmann::json::array({"\xc4\xa0", "a"}),
                                                                       nlohmann::json::array({"\xc4\xa0" "a", "b"}),
                                                                       nlohmann::json::array({"1", "2"})})}}}};
}
}  // namespace

BOOST_AUTO_TEST_CASE(tokenizer_json_splits_digits_and_special_tokens) {
  const Gpt2Tokenizer t = Gpt2Tokenizer::load_json(write_file("small.json", small_tokenizer().dump()));
  BOOST_TEST(t.end_of_text() == 0);
  const auto id = [&](const std::string& s) {
    const auto ids = t.encode(s);
    BOOST_REQUIRE(ids.size() == 1u);
    return ids[0];
  };
  const std::int32_t ab = id(" ab"), one = id("1"), two = id("2"), x = id("x");
  BOOST_TEST(ab == 3 + 94 + 1 + 1);  // the merge of " a" and "b"
  // "12" is a token, but digits are pieces of their own first, so it never forms.
  BOOST_TEST(t.encode("x12") == (std::vector<std::int32_t>{x, one, two}), boost::test_tools::per_element());
  // Special tokens split the text wherever they are; the longest wins.
  BOOST_TEST(t.encode("<|im_start|>x ab<|im_end|><|endoftext|>") == (std::vector<std::int32_t>{1, x, ab, 2, 0}),
             boost::test_tools::per_element());
  // A byte without a token is dropped, as Hugging Face's tokenizers do.
  BOOST_TEST(t.encode("x\x01x") == (std::vector<std::int32_t>{x, x}), boost::test_tools::per_element());
  // ... and counted, for the caller to report.
  std::size_t dropped = 0;
  BOOST_TEST(t.encode("x\x01x\x02\x01", &dropped).size() == 2u);
  BOOST_TEST(dropped == 3u);
  BOOST_TEST(t.missing_bytes() > 0);
  BOOST_TEST(t.missing_bytes() < 256);
  BOOST_TEST(t.decode(t.encode("<|im_start|> ab12")) == "<|im_start|> ab12");
}

// Every tokenizer.json this class cannot honour is refused, naming what.
BOOST_AUTO_TEST_CASE(tokenizer_json_refuses_what_it_does_not_compute) {
  const auto refused = [](const nlohmann::json& j, const std::string& words) {
    BOOST_TEST_CONTEXT(words) {
      try {
        (void)Gpt2Tokenizer::load_json(write_file("bad.json", j.dump()));
        BOOST_ERROR("loaded");
      } catch (const Error& e) {
        BOOST_TEST(std::string(e.what()).find(words) != std::string::npos, e.what());
      }
    }
  };
  nlohmann::json j = small_tokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  refused(j, "normalizer");
  j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  refused(j, "pre_tokenizer");
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  refused(j, "add_prefix_space");
  j = small_tokenizer();
  j["model"]["type"] = "Unigram";
  refused(j, "is not BPE");
  j = small_tokenizer();
  j["model"]["byte_fallback"] = true;
  refused(j, "byte_fallback");
  j = small_tokenizer();
  j["model"]["merges"].push_back(nlohmann::json::array({"a"}));
  refused(j, "model.merges[3]");
  j = small_tokenizer();
  j["added_tokens"][1]["id"] = 2;
  refused(j, "<|im_start|>' has id 2");
  j = small_tokenizer();
  j["added_tokens"].push_back({{"id", 99}, {"content", "<pad>"}});
  refused(j, "'<pad>' is not in the vocabulary");
  j = small_tokenizer();
  j["model"]["vocab"]["\xc4\xa0" "a"] = 1000;
  refused(j, "id of");
  refused(nlohmann::json::array(), "tokenizer.json");
}

// The pre-tokenizer matches in windows of the text (PCRE2 reads a subject
// to its end on every call): pieces longer than a window, and pieces at
// every place a window may end, come out whole. Merges of x^n + x^n and
// of spaces make a piece of 2^k of them one token only when it is whole.
BOOST_AUTO_TEST_CASE(pieces_longer_than_the_matching_window_stay_whole) {
  nlohmann::json vocab = {{"<|endoftext|>", 0}, {"a", 1}, {"b", 2}}, merges = nlohmann::json::array();
  const std::string space = "\xc4\xa0";  // Ġ
  for (const std::string& unit : {std::string("x"), space}) {
    std::string s = unit;
    for (int k = 0; k <= 13; ++k, s += s) {
      vocab[s] = int(vocab.size());
      if (k < 13) merges.push_back(nlohmann::json::array({s, s}));
    }
  }
  const nlohmann::json j = {{"pre_tokenizer", {{"type", "ByteLevel"}}},
                            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  const Gpt2Tokenizer t = Gpt2Tokenizer::load_json(write_file("runs.json", j.dump()));
  const auto id = [&](const std::string& symbol) { return vocab.at(symbol).get<std::int32_t>(); };
  std::string x8192(8192, 'x'), s8192;
  for (int i = 0; i < 8192; ++i) s8192 += space;
  BOOST_TEST(t.encode(x8192) == std::vector<std::int32_t>{id(x8192)}, boost::test_tools::per_element());
  // "a", 8192 spaces (the last of 8193 starts " b"), " b".
  BOOST_TEST(t.encode("a" + std::string(8193, ' ') + "b") ==
                 (std::vector<std::int32_t>{id("a"), id(s8192), id(space), id("b")}),
             boost::test_tools::per_element());
  // "x x x ...": a piece ends at every other byte, wherever a window ends.
  std::string text = "x";
  std::vector<std::int32_t> want = {id("x")};
  for (int i = 0; i < 5000; ++i) text += " x", want.insert(want.end(), {id(space), id("x")});
  BOOST_TEST(t.encode(text) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(tokenizer_json_fields_of_another_type_are_named_errors) {
  nlohmann::json j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", 7}};
  BOOST_CHECK_THROW((void)Gpt2Tokenizer::load_json(write_file("typed.json", j.dump())), Error);
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = "yes";
  BOOST_CHECK_THROW((void)Gpt2Tokenizer::load_json(write_file("typed.json", j.dump())), Error);
}

BOOST_AUTO_TEST_SUITE_END()
