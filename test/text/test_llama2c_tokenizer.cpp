// llama2.c's tokenizer.bin (text/llama2c_tokenizer.hpp) against
// make_fixtures.py's run.c-style encoder: fixtures/llama2c/tokenizer.bin
// (Llama's specials, the byte pieces, some letters and merges) and
// tokenizer.json (texts and their ids: merges by score, the dummy prefix,
// byte fallback, BOS and EOS). Then the text comes back from the ids, and
// malformed files are refused with a message naming the entry.
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "xfmr/text/llama2c_tokenizer.hpp"

BOOST_AUTO_TEST_SUITE(test_llama2c_tokenizer)

using namespace xfmr;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(XFMR_FIXTURE_DIR) / "llama2c";

// A tokenizer.bin of the given header and entries (score, length, bytes).
struct Entry {
  float score;
  std::int32_t length;
  std::string bytes;
};
fs::path written(std::int32_t max_length, const std::vector<Entry>& entries, std::size_t cut = 0) {
  static struct Written {  // removed at exit
    std::vector<fs::path> paths;
    ~Written() {
      std::error_code ec;
      for (const fs::path& p : paths) fs::remove(p, ec);
    }
  } files;
  const fs::path p = fs::temp_directory_path() /
                     ("xfmr_tok_" + std::to_string(::getpid()) + "_" + std::to_string(files.paths.size()) + ".bin");
  files.paths.push_back(p);
  std::string b(reinterpret_cast<const char*>(&max_length), 4);
  for (const Entry& e : entries) {
    b.append(reinterpret_cast<const char*>(&e.score), 4);
    b.append(reinterpret_cast<const char*>(&e.length), 4);
    b += e.bytes;
  }
  b.resize(b.size() - cut);
  std::ofstream(p, std::ios::binary).write(b.data(), std::streamsize(b.size()));
  return p;
}
}  // namespace

BOOST_AUTO_TEST_CASE(encodes_as_run_c_and_decodes_back) {
  std::ifstream in(kDir / "tokenizer.json");
  const auto ref = nlohmann::json::parse(in);
  const auto t = Llama2cTokenizer::load(kDir / "tokenizer.bin");
  BOOST_TEST(t.vocab_size() == ref["vocab_size"].get<int>());
  BOOST_TEST(t.piece(3) == "<0x00>");
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    BOOST_TEST_CONTEXT("'" << text << "'") {
      const auto ids = t.encode(text, c["bos"].get<bool>(), c["eos"].get<bool>());
      BOOST_TEST((ids == c["ids"].get<std::vector<std::int32_t>>()));
      // The text again: BOS's following space dropped, byte pieces as bytes, EOS as its piece.
      std::string back = t.decode(ids);
      if (c["eos"].get<bool>()) back.resize(back.size() - t.piece(Llama2cTokenizer::kEos).size());
      if (c["bos"].get<bool>()) back = back.substr(t.piece(Llama2cTokenizer::kBos).size());
      else if (!back.empty() && back[0] == ' ') back = back.substr(1);  // the dummy prefix, not after BOS
      BOOST_TEST(back == text);
    }
  }
  // After BOS a piece's leading space goes; elsewhere it stays.
  const std::int32_t once = t.encode("Once", false).at(0);
  BOOST_TEST(t.piece(once) == " Once");
  BOOST_TEST(t.decode(Llama2cTokenizer::kBos, once) == "Once");
  BOOST_TEST(t.decode(once, once) == " Once");
  BOOST_TEST(t.decode(0, 3 + 0x0A) == "\n");
}

BOOST_AUTO_TEST_CASE(malformed_files_and_ids_are_refused) {
  auto has = [](const std::string& error, const std::string& part) {
    BOOST_TEST(error.find(part) != std::string::npos, "'" << error << "' does not say '" << part << "'");
  };
  const std::vector<Entry> three = {{0, 5, "<unk>"}, {0, 3, "<s>"}, {0, 4, "</s>"}};
  has(test::error_of([] { Llama2cTokenizer::load(kDir / "missing.bin"); }), "no llama2.c tokenizer there");
  has(test::error_of([&] { Llama2cTokenizer::load(written(0, three)); }), "max_token_length 0");
  has(test::error_of([&] { Llama2cTokenizer::load(written(5, three, 2)); }), "ends inside the bytes of piece 2");
  has(test::error_of([&] { Llama2cTokenizer::load(written(5, three, 6)); }), "ends inside the length of piece 2");
  has(test::error_of([&] { Llama2cTokenizer::load(written(4, three)); }), "piece 0 is 5 bytes long");
  has(test::error_of([&] {
        Llama2cTokenizer::load(written(5, {{0, 5, "<unk>"}, {std::nanf(""), 3, "<s>"}, {0, 4, "</s>"}}));
      }),
      "piece 1 has a score that is not finite");
  has(test::error_of([&] { Llama2cTokenizer::load(written(5, {{0, 5, "<unk>"}, {0, 3, "<s>"}})); }),
      "2 pieces; BOS and EOS need ids 1 and 2");
  // No dummy prefix, no byte pieces.
  const auto bare = Llama2cTokenizer::load(written(5, three));
  has(test::error_of([&] { bare.encode("a"); }), "no piece \" \" for the dummy prefix");
  auto spaced = three;
  spaced.push_back({0, 1, " "});
  const auto no_bytes = Llama2cTokenizer::load(written(5, spaced));
  has(test::error_of([&] { no_bytes.encode("a"); }), "no byte piece for 0x61 at id 100");
  has(test::error_of([&] { no_bytes.decode(0, 4); }), "token id 4 outside the vocabulary (0..3)");
}

BOOST_AUTO_TEST_SUITE_END()
