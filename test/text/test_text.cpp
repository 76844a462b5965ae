#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "support/temp_dir.hpp"
#include "support/errors.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/text/bpe.hpp"
#include "xfmr/text/chat_template.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/text/text.hpp"

BOOST_AUTO_TEST_SUITE(test_text)

using namespace xfmr;
using xfmr::test::error_of;
namespace fs = std::filesystem;

namespace {
struct TempDir : xfmr::test::TempDir {
  TempDir() : xfmr::test::TempDir("text") {}
  fs::path write_gz(const std::string& name, const std::string& content) const {
    gzFile f = gzopen((path / name).c_str(), "wb");
    gzwrite(f, content.data(), static_cast<unsigned>(content.size()));
    gzclose(f);
    return path / name;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(reads_plain_and_gzip_files) {
  TempDir d;
  const std::string text = "line one\nline two\r\nlast";
  BOOST_TEST(read_text_file(d.write("a.txt", text)) == text);
  BOOST_TEST(read_text_file(d.write_gz("a.txt.gz", text)) == text);
  BOOST_TEST((read_lines(d.write_gz("b.gz", text)) == std::vector<std::string>{"line one", "line two", "last"}));
  BOOST_TEST(error_of([&] { read_text_file(d.path / "missing.txt"); }) == (d.path / "missing.txt").string() + ": no such file");
  BOOST_TEST(error_of([&] { read_text_file(d.write("empty.txt", "")); }).ends_with(": file is empty"));
  // A gzip stream cut in half is reported, not silently shortened.
  const auto gz = d.write_gz("long.gz", std::string(100000, 'x') + "tail");
  fs::resize_file(gz, fs::file_size(gz) / 2);
  BOOST_TEST(error_of([&] { read_text_file(gz); }).find("corrupt or truncated") != std::string::npos);

  // Two gzip members read as one text (gzip's own rule); bytes after the
  // last member are an error (zlib's gzread skipped them silently).
  const auto one = d.write_gz("one.gz", "first\n"), two = d.write_gz("two.gz", "second\n");
  auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto both = d.write("both.gz", bytes_of(one) + bytes_of(two));
  BOOST_TEST(read_text_file(both) == "first\nsecond\n");
  const auto garbage = d.write("garbage.gz", bytes_of(one) + "not gzip");
  BOOST_TEST(error_of([&] { read_text_file(garbage); }) ==
             garbage.string() + ": 8 bytes after the gzip data at byte " + std::to_string(bytes_of(one).size()) +
                 " are not gzip (trailing garbage)");
  // A directory or a device is named as such, not as a missing file.
  BOOST_TEST(error_of([&] { read_text_file(d.path); }) == d.path.string() + ": is a directory, not a file");
  BOOST_TEST(error_of([&] { read_text_file("/dev/zero"); }) == "/dev/zero: is a device, not a file");
}

// A pipe reads like a file (a shell's `--data <(zcat corpus.gz)`).
BOOST_AUTO_TEST_CASE(reads_a_pipe) {
  TempDir d;
  const fs::path fifo = d.path / "pipe";
  BOOST_TEST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::thread writer([&] { std::ofstream(fifo) << "through a pipe\n"; });
  const std::string text = read_text_file(fifo);
  writer.join();
  BOOST_TEST(text == "through a pipe\n");
}

BOOST_AUTO_TEST_CASE(char_tokenizer_from_corpus) {
  const auto tok = CharTokenizer::from_corpus("hello wörld\n");
  BOOST_TEST(tok.size() == 10);  // \n space d e h l o r w ö
  BOOST_TEST(tok.token(0) == "\n");
  BOOST_TEST(tok.token(9) == "ö");
  const auto ids = tok.encode("world hö");
  BOOST_TEST(tok.decode(ids) == "world hö");
  BOOST_TEST(error_of([&] { tok.encode("hex"); }) == "character 'x' at byte 2 is not in the vocabulary of 10 characters");
  BOOST_TEST(error_of([&] { tok.encode("h\x01"); }) == "character '\\x01' at byte 1 is not in the vocabulary of 10 characters");
  BOOST_TEST(error_of([&] { tok.encode("h\xc3"); }) == "invalid UTF-8 at line 1, byte 2 of the line (byte 1 of the text)");
  // Overlong forms and surrogates are not UTF-8 (Unicode's table 3-7).
  BOOST_TEST(error_of([&] { check_utf8("ok\nx\xc0\xaf", "f.txt"); }) ==
             "f.txt: invalid UTF-8 at line 2, byte 2 of the line (byte 4 of the text)");
  BOOST_TEST(error_of([&] { check_utf8("\xed\xa0\x80", "f.txt"); }) ==
             "f.txt: invalid UTF-8 at line 1, byte 1 of the line (byte 0 of the text)");
  BOOST_TEST(error_of([&] { check_utf8("\xf4\x90\x80\x80", "f.txt"); }) ==
             "f.txt: invalid UTF-8 at line 1, byte 1 of the line (byte 0 of the text)");
  check_utf8("h\xc3\xb6 \xe2\x82\xac \xf0\x9f\x98\x80", "f.txt");  // ö € 😀
  const auto back = CharTokenizer::from_json(tok.to_json());
  BOOST_TEST(back.size() == tok.size());
  BOOST_TEST((back.encode("world hö") == ids));
}

BOOST_AUTO_TEST_CASE(char_tokenizer_unknown_token_and_bytes) {
  const auto tok = CharTokenizer::from_corpus("abc", /*with_unknown=*/true);
  BOOST_TEST(tok.size() == 4);
  BOOST_TEST((tok.encode("axc") == std::vector<std::int32_t>{0, 3, 2}));
  BOOST_TEST(CharTokenizer::from_json(tok.to_json()).unknown_id().value_or(-1) == 3);
  const auto bytes = CharTokenizer::byte_level();
  BOOST_TEST(bytes.size() == 256);
  const std::string any = "any \xff\x01 text";
  BOOST_TEST(bytes.decode(bytes.encode(any)) == any);
  BOOST_TEST(CharTokenizer::from_json(bytes.to_json()).is_byte_level());
  BOOST_CHECK_THROW(CharTokenizer::from_json("{\"type\": \"chars\", \"chars\": [\"a\", \"a\"]}"), Error);
  BOOST_CHECK_THROW(CharTokenizer::from_json("not json"), Error);
}

BOOST_AUTO_TEST_CASE(word_vocab) {
  const std::vector<std::string> texts = {"the cat sat", "the dog sat", "a cat"};
  const auto v = WordVocab::build(texts, 2);
  // specials, then by frequency (ties alphabetical): cat 2, sat 2, the 2
  BOOST_TEST(v.size() == 6);
  BOOST_TEST(v.word(3) == "cat");
  BOOST_TEST((v.encode("the dog") == std::vector<std::int32_t>{5, 1}));  // dog is rare: <unk>
  BOOST_TEST(*v.special("<cls>") == 2);
  const auto back = WordVocab::from_json(v.to_json());
  BOOST_TEST((back.encode("a cat sat") == v.encode("a cat sat")));
  BOOST_CHECK_THROW(WordVocab::build(texts, 1, {"<pad>"}), Error);  // no <unk>
  // A cap of 2 keeps the first two of cat, sat, the (twice each, ties alphabetical), a, dog (once).
  const auto capped = WordVocab::build(texts, 1, {"<unk>"}, 2);
  BOOST_TEST(capped.size() == 3);
  BOOST_TEST((capped.encode("cat sat the") == std::vector<std::int32_t>{1, 2, 0}));
}

BOOST_AUTO_TEST_CASE(lm_batches) {
  std::vector<std::int32_t> tokens(50);
  for (int i = 0; i < 50; ++i) tokens[i] = i;
  const LmBatcher batcher(tokens, 3, 8);
  Rng rng(1);
  std::vector<std::int32_t> ids(24), targets(24), ids2(24), targets2(24);
  batcher.sample(rng, ids.data(), targets.data());
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 8; ++t) {
      BOOST_TEST(targets[b * 8 + t] == ids[b * 8 + t] + 1);  // next token
      if (t) BOOST_TEST(ids[b * 8 + t] == ids[b * 8 + t - 1] + 1);
    }
  batcher.fixed(7, 2, ids.data(), targets.data());
  batcher.fixed(7, 2, ids2.data(), targets2.data());
  BOOST_TEST(ids == ids2);
  BOOST_CHECK_THROW(LmBatcher(std::span(tokens).first(8), 1, 8), Error);
}

BOOST_AUTO_TEST_CASE(names_mode) {
  const std::vector<std::string> lines = {"emma", "olivia", "", "ava", "isabella", "sophia", "mia", "amelia", "harper",
                                          "evelyn", "abigail"};
  const auto s = split_names(lines, 0.8, 42);
  BOOST_TEST(s.train.size() == 8u);
  BOOST_TEST(s.val.size() == 2u);
  std::vector<std::string> all = s.train;
  all.insert(all.end(), s.val.begin(), s.val.end());
  std::sort(all.begin(), all.end());
  BOOST_TEST(std::count(all.begin(), all.end(), "emma") == 1);
  BOOST_TEST(all.size() == 10u);  // the empty line is dropped

  // Rows are whole names: [sep, n...] -> [n..., sep], padding ignored.
  const SequenceBatcher batcher({{5, 6}, {7, 8, 9}, {4}}, 2, 5, /*sep=*/0, /*pad=*/0, /*ignore=*/-100);
  std::vector<std::int32_t> ids(10), targets(10);
  batcher.in_order(0, ids.data(), targets.data());
  BOOST_TEST((ids == std::vector<std::int32_t>{0, 5, 6, 0, 0, 0, 7, 8, 9, 0}));
  BOOST_TEST((targets == std::vector<std::int32_t>{5, 6, 0, -100, -100, 7, 8, 9, 0, -100}));
  BOOST_TEST(batcher.batches() == 2);
  batcher.in_order(1, ids.data(), targets.data());
  BOOST_TEST((std::vector<std::int32_t>(targets.begin() + 5, targets.end()) == std::vector<std::int32_t>(5, -100)));
  BOOST_CHECK_THROW(SequenceBatcher({{1, 2, 3, 4, 5}}, 1, 5, 0, 0, -100), Error);  // 5 + separator > 5
}

BOOST_AUTO_TEST_CASE(labeled_tsv) {
  TempDir d;
  const auto good = read_labeled_tsv(d.write("g.tsv", "label\tsentence\n1\ta fine film\n0\tdull\n"));
  BOOST_TEST(good.size() == 2u);
  BOOST_TEST(good[0].label == 1);
  BOOST_TEST(good[1].text == "dull");
  const auto p = d.write("bad.tsv", "label\tsentence\n1\tok\n0 no tab here\n");
  BOOST_TEST(error_of([&] { read_labeled_tsv(p); }) == p.string() + ":3: no tab between label and text");
  const auto q = d.write("bad2.tsv", "label\tsentence\npositive\tok\n");
  BOOST_TEST(error_of([&] { read_labeled_tsv(q); }) == q.string() + ":2: label 'positive' is not an integer");
  BOOST_TEST(error_of([&] { read_labeled_tsv(d.write("h.tsv", "1\n")); }).ends_with("expected a header line 'label<TAB>text'"));
  // A label past kMaxClasses - 1 (it set the class count: 1e8 exhausted
  // memory) or past an int is refused with the limit.
  const auto big = d.write("big.tsv", "label\tsentence\n100000000\tok\n");
  BOOST_TEST(error_of([&] { read_labeled_tsv(big); }) ==
             big.string() + ":2: label 100000000 outside 0..65535 (the class count follows the largest label)");
  const auto huge = d.write("huge.tsv", "label\tsentence\n99999999999999999999999\tok\n");
  BOOST_TEST(error_of([&] { read_labeled_tsv(huge); }) ==
             huge.string() + ":2: label '99999999999999999999999' is out of range");
  const auto neg = d.write("neg.tsv", "label\tsentence\n-1\tok\n");
  BOOST_TEST(error_of([&] { read_labeled_tsv(neg); }).ends_with(":2: label -1 outside 0..65535 (the class count follows the largest label)"));
  BOOST_TEST(read_labeled_tsv(d.write("max.tsv", "label\tsentence\n65535\tok\n"))[0].label == 65535);
}

BOOST_AUTO_TEST_CASE(class_batches_pad_truncate_and_cls) {
  const std::vector<std::vector<std::int32_t>> seqs = {{5, 6, 7}, {8}, {9, 9, 9, 9, 9, 9}};
  const std::vector<int> labels = {1, 0, 1};
  const auto b = make_class_batch(seqs, labels, 5, 0, 2);
  BOOST_TEST(b.B == 3);
  BOOST_TEST(b.T == 5);  // 6 + CLS truncated to max_t
  BOOST_TEST((std::vector<std::int32_t>(b.ids.begin(), b.ids.begin() + 5) == std::vector<std::int32_t>{2, 5, 6, 7, 0}));
  BOOST_TEST((std::vector<std::uint8_t>(b.padding.begin() + 5, b.padding.begin() + 10) ==
              std::vector<std::uint8_t>{0, 0, 1, 1, 1}));
  BOOST_TEST((b.labels == std::vector<std::int32_t>{1, 0, 1}));
  const auto plain = make_class_batch(seqs, labels, 64, 0);
  BOOST_TEST(plain.T == 6);  // longest in the batch
}

BOOST_AUTO_TEST_CASE(translation_pretokenization) {
  const auto w = pretokenize("Un homme, avec l'air (très) heureux!  Two-way.");
  BOOST_TEST((w == std::vector<std::string>{"Un", "homme", ",", "avec", "l'air", "(", "très", ")", "heureux", "!",
                                            "Two-way", "."}));
  BOOST_TEST((pretokenize("A Dog.", true) == std::vector<std::string>{"a", "dog", "."}));
  BOOST_TEST(detokenize(w) == "Un homme, avec l'air (très) heureux! Two-way.");
  BOOST_TEST(pretokenize("   ").empty());
}

BOOST_AUTO_TEST_CASE(bpe_trains_merges_and_round_trips) {
  const std::vector<std::string> texts = {"the cat sat on the mat.", "the cat ate the rat.", "a cat, the hat!"};
  const auto bpe = BpeTokenizer::train(texts, 4 + 257 + 12);
  // Training stops early once no pair occurs twice: this corpus has 7 such merges.
  BOOST_TEST(bpe.merges() == 7u);
  BOOST_TEST(bpe.size() == 4 + 257 + 7);
  // "the" (5 times) becomes one symbol with its end of word.
  const auto the = bpe.encode("the");
  BOOST_TEST(the.size() == 1u);
  BOOST_TEST(bpe.symbol(the[0]) == "the</w>");
  // Any text, unseen words and bytes included, round-trips.
  for (const std::string s : {"the cat sat.", "zebras écoutent la radio!", "x\x01y"})
    BOOST_TEST(bpe.decode(bpe.encode(s)) == detokenize(pretokenize(s)));
  // Deterministic, and the JSON description reproduces the tokenizer.
  const auto again = BpeTokenizer::train(texts, 4 + 257 + 12);
  BOOST_TEST(again.to_json() == bpe.to_json());
  const auto back = BpeTokenizer::from_json(bpe.to_json());
  BOOST_TEST((back.encode("the rat sat on a hat") == bpe.encode("the rat sat on a hat")));
  BOOST_TEST(*bpe.special("<eos>") == 3);
  BOOST_CHECK_THROW(BpeTokenizer::train(texts, 10), Error);  // below the base alphabet
  BOOST_CHECK_THROW(BpeTokenizer::from_json("{\"type\": \"bpe\", \"specials\": [], \"merges\": [[0, 9999]]}"), Error);
}

// Hostile descriptions (issue 29's reproducers): numbers out of range or not
// integers, a specials count of 0 (it left special("<bos>") empty), and BPE
// merges that keep doubling one symbol (2^k bytes) are clear errors.
BOOST_AUTO_TEST_CASE(hostile_vocabulary_descriptions_are_errors) {
  // Nesting is bounded before parsing (100,000 levels overflowed the stack).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  BOOST_TEST(error_of([&] { CharTokenizer::from_json(deep); }) == "tokenizer description nests deeper than 64 levels");
  BOOST_TEST(error_of([&] { WordVocab::from_json(deep); }) == "vocabulary description nests deeper than 64 levels");
  BOOST_TEST(error_of([&] { BpeTokenizer::from_json(deep); }) == "BPE description nests deeper than 64 levels");
  // Values of the wrong type are xfmr::Error too (nlohmann's type_error
  // escaped: found by fuzz_tokenizers).
  BOOST_TEST(error_of([] { CharTokenizer::from_json(R"({"type":"chars","chars":["a"],"unknown":44444})"); })
                 .starts_with("tokenizer description is malformed: "));
  BOOST_TEST(error_of([] { WordVocab::from_json(R"({"type":5,"words":[]})"); })
                 .starts_with("vocabulary description is malformed: "));
  BOOST_TEST(error_of([] { BpeTokenizer::from_json(R"({"type":"bpe","merges":[],"specials":[1],"lowercase":"x"})"); })
                 .starts_with("BPE description is malformed: "));
  const std::string words = R"("words": ["<pad>", "<unk>", "cat"])";
  auto word_vocab = [&](const std::string& extra) {
    return WordVocab::from_json("{\"type\": \"words\", " + words + extra + "}");
  };
  BOOST_TEST(word_vocab(R"(, "specials": 2)").size() == 3);
  for (const char* bad : {R"(, "specials": 0)", R"(, "specials": 1e100)", R"(, "specials": 4)", R"(, "specials": "2")",
                          R"(, "specials": 18446744073709551615)", R"(, "specials": 2, "min_freq": -3)"}) {
    BOOST_TEST_CONTEXT(bad) { BOOST_CHECK_THROW(word_vocab(bad), Error); }
  }
  try {
    word_vocab(R"(, "specials": 0)");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "vocabulary specials count 0 outside [1, 3]");
  }
  BOOST_CHECK_THROW(word_vocab(R"(, "specials": 1)"), Error);  // <unk> (word 1) not a special

  const std::string bpe = R"({"type": "bpe", "specials": ["<pad>", "<unk>"], "merges": )";
  BOOST_CHECK_THROW(BpeTokenizer::from_json(bpe + "[[1e100, 0]]}"), Error);
  BOOST_CHECK_THROW(BpeTokenizer::from_json(bpe + "[[-1, 0]]}"), Error);
  BOOST_CHECK_THROW(BpeTokenizer::from_json(bpe + "[[99999, 0]]}"), Error);
  // Doubling "a" (symbol 2 + 97): 2^k bytes after k merges; refused at 2^17.
  std::string doubling = bpe + "[[99, 99]";
  const int base = 2 + 256 + 1;  // specials, bytes, </w>
  for (int k = 0; k < 40; ++k) doubling += ", [" + std::to_string(base + k) + ", " + std::to_string(base + k) + "]";
  doubling += "]}";
  try {
    BpeTokenizer::from_json(doubling);
    BOOST_FAIL("a doubling BPE description loaded");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("over the limit of 65536") != std::string::npos, e.what());
  }
}

// Streamed text: a character split between pieces is held back, and
// ill-formed bytes become U+FFFD a maximal subpart each (as Python's
// errors="replace" gives).
BOOST_AUTO_TEST_CASE(utf8_streamed_text) {
  const std::string euro = "\xE2\x82\xAC", fffd = "\xEF\xBF\xBD";
  BOOST_TEST(utf8_complete_prefix("ab" + euro) == 5u);
  BOOST_TEST(utf8_complete_prefix("ab\xE2\x82") == 2u);
  BOOST_TEST(utf8_complete_prefix("ab\xE2") == 2u);
  BOOST_TEST(utf8_complete_prefix("\xF0\x9F\x98") == 0u);
  BOOST_TEST(utf8_complete_prefix("ab\xE2\x41") == 4u);  // cannot complete: not held
  BOOST_TEST(utf8_complete_prefix("ab\x82") == 3u);
  BOOST_TEST(utf8_complete_prefix("a\xF5") == 2u);
  BOOST_TEST(utf8_repaired("a" + euro + "b") == "a" + euro + "b");
  BOOST_TEST(utf8_repaired("a\xE2\x82" "b") == "a" + fffd + "b");       // one subpart
  BOOST_TEST(utf8_repaired("a\x82\x82" "b") == "a" + fffd + fffd + "b");  // two lone continuations
  BOOST_TEST(utf8_repaired("\xC0\xAF") == fffd + fffd);                   // overlong: never a start
  BOOST_TEST(utf8_repaired("\xED\xA0\x80") == fffd + fffd + fffd);        // a surrogate
  BOOST_TEST(utf8_repaired("\xF0\x9F\x98") == fffd);                      // cut short at the end
}

// Chat templates: each format's text, the one a model's Jinja template
// names by its markers, and conversations that cannot be rendered.
BOOST_AUTO_TEST_CASE(chat_templates) {
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Why?"}};
  BOOST_TEST(ChatTemplate::named("chatml").render(chat) ==
             "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
             "Hello.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n");
  BOOST_TEST(ChatTemplate::named("llama3").render(std::span(chat).first(2)) ==
             "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  BOOST_TEST(ChatTemplate().render(std::span(chat).first(2)) == "System: Be brief.\nUser: Hi\nAssistant:");
  BOOST_TEST(ChatTemplate::named("chatml").stops().front() == "<|im_end|>");
  BOOST_TEST(ChatTemplate::named("llama3").stops().front() == "<|eot_id|>");
  TempDir dir;
  dir.write("tokenizer_config.json",
            R"({"chat_template": "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n'}}{% endfor %}"})");
  BOOST_TEST(ChatTemplate::for_model(dir.path).name() == std::string("chatml"));
  dir.write("tokenizer_config.json",
            R"({"chat_template": [{"name": "default", "template": "<|start_header_id|>{{ role }}"}]})");
  BOOST_TEST(ChatTemplate::for_model(dir.path).name() == std::string("llama3"));
  dir.write("tokenizer_config.json", R"({"model_max_length": 512})");
  BOOST_TEST(ChatTemplate::for_model(dir.path).name() == std::string("plain"));
  dir.write("tokenizer_config.json", "{\"chat_template\": ");
  BOOST_TEST(error_of([&] { ChatTemplate::for_model(dir.path); }).find("not a JSON object") != std::string::npos);
  BOOST_TEST(error_of([] { ChatTemplate::named("jinja"); }).find("'jinja' is not one of chatml, llama3, plain") !=
             std::string::npos);
  BOOST_TEST(error_of([] { ChatTemplate().render({}); }).find("the conversation is empty") != std::string::npos);
  const std::vector<ChatMessage> robot = {{"user", "x"}, {"robot", "y"}};
  BOOST_TEST(error_of([&] { ChatTemplate().render(robot); }).find("messages[1].role 'robot'") != std::string::npos);
  const std::vector<ChatMessage> late = {{"user", "x"}, {"system", "y"}};
  BOOST_TEST(error_of([&] { ChatTemplate().render(late); }).find("a system message must come first") !=
             std::string::npos);
}

// Tools offered as each format's models saw them in training, calls and
// results rendered back, and an answer's calls read back.
BOOST_AUTO_TEST_CASE(chat_templates_with_tools) {
  const std::vector<ChatTool> tools = {
      {"weather", "The weather in a city", R"({"type":"object","properties":{"city":{"type":"string"}}})"}};
  const std::vector<ChatMessage> chat = {{"user", "Weather in Paris?"},
                                         {"assistant", "", {{"weather", R"({"city":"Paris"})"}}},
                                         {"tool", R"({"sky":"clear"})"}};
  const ChatTemplate chatml = ChatTemplate::named("chatml"), llama3 = ChatTemplate::named("llama3");
  const std::string m = chatml.render(chat, tools);
  BOOST_TEST(m.starts_with("<|im_start|>system\n# Tools\n"));
  BOOST_TEST(m.find("<tools>\n{\"function\":{\"description\":\"The weather in a city\",\"name\":\"weather\"") != std::string::npos, m);
  BOOST_TEST(m.find("<|im_start|>assistant\n<tool_call>\n{\"arguments\":{\"city\":\"Paris\"},\"name\":\"weather\"}\n</tool_call><|im_end|>") !=
             std::string::npos, m);
  BOOST_TEST(m.find("<|im_start|>user\n<tool_response>\n{\"sky\":\"clear\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n") !=
             std::string::npos, m);
  const std::string l = llama3.render(chat, tools);
  BOOST_TEST(l.find("Environment: ipython") != std::string::npos);
  BOOST_TEST(l.find("{\"name\":\"weather\",\"parameters\":{\"city\":\"Paris\"}}<|eot_id|>") != std::string::npos, l);
  BOOST_TEST(l.find("<|start_header_id|>ipython<|end_header_id|>\n\n{\"sky\":\"clear\"}<|eot_id|>") != std::string::npos);
  // Read back: the calls, and the text beside them.
  const auto a = chatml.parse_tool_calls("Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  BOOST_REQUIRE(a.calls.size() == 1u);
  BOOST_TEST(a.calls[0].name == "weather");
  BOOST_TEST(a.calls[0].arguments == R"({"city":"Oslo"})");
  BOOST_TEST(a.content == "Let me look.");
  BOOST_TEST(chatml.parse_tool_calls("<tool_call>not json</tool_call>").calls.empty());
  BOOST_TEST(llama3.parse_tool_calls(R"( {"name": "weather", "parameters": {"city": "Rome"}} )").calls.at(0).arguments ==
             R"({"city":"Rome"})");
  BOOST_TEST(llama3.parse_tool_calls("It is sunny.").content == "It is sunny.");
  BOOST_TEST(chatml.tool_call_schema(tools) ==
             R"({"properties":{"arguments":{"properties":{"city":{"type":"string"}},"type":"object"},"name":{"enum":["weather"]}},"required":["name","arguments"],"type":"object"})");
  BOOST_TEST(error_of([&] { (void)chatml.tool_call_schema(tools, "time"); }).find("no tool named 'time'") != std::string::npos);
  const std::vector<ChatMessage> bad = {{"user", "x", {{"weather", "{}"}}}};
  BOOST_TEST(error_of([&] { chatml.render(bad); }).find("only an assistant's message has tool calls") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
