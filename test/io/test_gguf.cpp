// GgufFile (io/gguf.hpp) against a file written from the format's
// description by test/reference/make_gguf.py, not by xfmr: every metadata
// value type, arrays of numbers and strings, and a tensor of each type
// read, whose values equal the plain decoder's in that script; a damaged
// file is an Error naming what is wrong; and llama.cpp's stories260K
// model (../shared/data/gguf), where the data is, decodes through the
// engine to llama.cpp's greedy tokens and text, its tokenizer the file's.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "support/errors.hpp"
#include "support/temp_dir.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/core/q4.hpp"
#include "xfmr/io/gguf.hpp"
#include "xfmr/io/gguf_model.hpp"
#include "xfmr/io/model_tokenizer.hpp"
#include "xfmr/io/weight_sources.hpp"
#include "xfmr/text/chat_template.hpp"

BOOST_AUTO_TEST_SUITE(test_gguf)

using namespace xfmr;
using namespace xfmr::test;
namespace fs = std::filesystem;

namespace {

const fs::path kTypes = fs::path(XFMR_FIXTURE_DIR) / "gguf" / "types.gguf";

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(metadata_of_every_type) {
  const GgufFile f = GgufFile::open(kTypes);
  BOOST_TEST(f.version() == 3u);
  BOOST_TEST(f.alignment() == 32u);
  BOOST_TEST(f.string("general.architecture") == "test");
  BOOST_TEST(f.integer("test.u8") == 200);
  BOOST_TEST(f.integer("test.i8") == -100);
  BOOST_TEST(f.integer("test.u16") == 60000);
  BOOST_TEST(f.integer("test.i16") == -30000);
  BOOST_TEST(f.integer("test.i32") == -2000000000);
  BOOST_TEST(f.number("test.f32") == 0.5);
  BOOST_TEST(f.boolean("test.bool"));
  BOOST_TEST(f.integer("test.u64") == (std::int64_t(1) << 40));
  BOOST_TEST(f.integer("test.i64") == -(std::int64_t(1) << 40));
  BOOST_TEST(f.number("test.f64") == 0.25);
  const GgufValue& s = f.value("test.strings");
  BOOST_TEST(s.array);
  BOOST_TEST((s.strings == std::vector<std::string>{"a", "", "\xc3\xbc"}));
  BOOST_TEST((f.value("test.floats").numbers == std::vector<double>{1.5, -2.0}));
  BOOST_TEST((f.value("test.ints").integers == std::vector<std::int64_t>{-1, 2, 3}));
  BOOST_TEST(error_of([&] { (void)f.string("test.u8"); }).find("'test.u8' is not a string") != std::string::npos);
  BOOST_TEST(error_of([&] { (void)f.value("llama.block_count"); }).find("no metadata key 'llama.block_count'") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(every_type_decodes_as_the_reference_does) {
  const GgufFile f = GgufFile::open(kTypes);
  const GgufTensor& t = f.tensor("t.f32");
  BOOST_TEST((t.shape == std::vector<std::uint64_t>{48, 2}));
  BOOST_TEST(t.rows() == 2u);
  const std::vector<float> all = f.values(t);
  std::vector<float> row(48);
  f.read_rows(t, 1, 1, row.data());
  BOOST_TEST(std::equal(row.begin(), row.end(), all.begin() + 48));
  for (const char* name : {"t.f16", "t.bf16", "t.q8_0", "t.q4_0", "t.q4_k", "t.q6_k"}) {
    BOOST_TEST_CONTEXT(name) {
      const GgufTensor& q = f.tensor(name);
      const std::vector<float> got = f.values(q), want = f.values(f.tensor(std::string(name) + ".expected"));
      BOOST_REQUIRE(got.size() == want.size());
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1e-3, std::abs(double(want[i]))));
      BOOST_TEST(worst < 1e-6);
      // Rows read alone are the same values.
      std::vector<float> last(q.shape[0]);
      f.read_rows(q, q.rows() - 1, 1, last.data());
      BOOST_TEST(std::equal(last.begin(), last.end(), got.end() - std::ptrdiff_t(q.shape[0])));
    }
  }
  BOOST_TEST(ggml_type_name(GgmlType::q4_k) == "Q4_K");
  BOOST_TEST(ggml_type_name(GgmlType(23)) == "type 23");
}

BOOST_AUTO_TEST_CASE(a_damaged_file_is_an_error_naming_what) {
  const TempDir dir("gguf");
  const std::string good = bytes_of(kTypes);
  auto with = [&](std::string bytes) {
    const fs::path p = dir.path / "f.gguf";
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    return error_of([&] { (void)GgufFile::open(p); });
  };
  BOOST_TEST(with("GGML" + good.substr(4)).find("not a GGUF file") != std::string::npos);
  std::string v = good;
  v[4] = 7;
  BOOST_TEST(with(v).find("GGUF version 7 (xfmr reads 2 and 3)") != std::string::npos);
  BOOST_TEST(with(good.substr(0, 300)).find("the file ends inside") != std::string::npos);
  BOOST_TEST(with(good.substr(0, 100)).find("the key count 15 is more than") != std::string::npos);
  BOOST_TEST(with(good.substr(0, good.size() - 40)).find("lies past the end of the data") != std::string::npos);
  std::string counts = good;
  counts[16] = char(0xff), counts[17] = char(0xff), counts[18] = char(0xff);  // the key count
  BOOST_TEST(with(counts).find("the key count") != std::string::npos);
  // A type xfmr does not read (IQ4_XS, 23), where the first tensor's type lies.
  std::string iq = good;
  const std::string name = std::string("\x05\0\0\0\0\0\0\0", 8) + "t.f32";
  const std::size_t at = iq.find(name);
  BOOST_REQUIRE(at != std::string::npos);
  const std::size_t type_at = at + name.size() + 4 + 2 * 8;
  iq[type_at] = 23;
  BOOST_TEST(with(iq).find("tensor 't.f32' is type 23, a type xfmr does not read") != std::string::npos);
  BOOST_TEST(error_of([] { (void)GgufFile::open("/no/such.gguf"); }).find("no such file") != std::string::npos);
}

// llama.cpp's stories260K (../shared/DATA.md): its tensors, and its greedy
// tokens from BOS, which DATA.md gives as llama.cpp decodes them.
BOOST_AUTO_TEST_CASE(stories260k_decodes_as_llama_cpp_does) {
  const fs::path p = fs::path(XFMR_FIXTURE_DIR) / ".." / ".." / ".." / ".." / "shared" / "data" / "gguf" /
                     "stories260K.gguf";
  if (!fs::exists(p)) {
    BOOST_TEST_MESSAGE("skipped: no " << p.string());
    return;
  }
  Engine engine = Engine::load(p);
  BOOST_TEST(engine.format() == "gguf");
  BOOST_TEST(engine.vocab() == 512);
  const Completion c = engine.generate(
      {.prompt = {1}, .sampling = {.temperature = 0}, .max_tokens = 64, .ignore_eos = true});
  const std::vector<std::int32_t> first(c.ids.begin(), c.ids.begin() + 10);
  BOOST_TEST(first == (std::vector<std::int32_t>{403, 407, 261, 378, 432, 383, 286, 261, 376, 298}),
             boost::test_tools::per_element());
  BOOST_TEST(c.text.starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside in "
                                "the park. One day, she saw a big, red ball. She wanted to play with it, but it was "
                                "too high."),
             c.text);
  const GgufFile f = GgufFile::open(p);
  BOOST_TEST(f.string("general.architecture") == "llama");
  BOOST_TEST(f.has("tokenizer.ggml.tokens"));
  for (const GgufTensor& t : f.tensors()) {
    const std::vector<float> v = f.values(t);
    BOOST_TEST(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }), t.name);
  }
}

// save_gguf of a Llama-shaped model with the llama2.c fixture's tokenizer in each type
// reads back through load_model: F32 with the model's own logits, bit for
// bit, and its tokenizer's pieces; F16 and BF16 within their rounding;
// Q8_0 and Q4_0 within their blocks' error.
BOOST_AUTO_TEST_CASE(a_written_gguf_reads_back) {
  const fs::path dir = fs::path(XFMR_FIXTURE_DIR) / "llama2c";
  const TempDir tmp("gguf_write");
  const PresetInfo arch = LanguageModelPresets::info("shakespeare-llama");
  Engine original = Engine::create(arch, 0, 11, {.tie_weights = true, .head_bias = false},
                                   {.tokenizer = dir / "tokenizer.bin"});
  const std::vector<std::int32_t> ids = {1, 7, 3, 9, 12, 4};
  const std::vector<float> want = original.logits(ids, 1, int(ids.size()));
  float scale = 0;
  for (float x : want) scale = std::max(scale, std::abs(x));
  for (const auto& [type, tolerance] : {std::pair{GgmlType::f32, 0.0}, std::pair{GgmlType::f16, 2e-3},
                                        std::pair{GgmlType::bf16, 2e-2}, std::pair{GgmlType::q8_0, 3e-2},
                                        std::pair{GgmlType::q4_0, 0.3}}) {
    BOOST_TEST_CONTEXT(ggml_type_name(type)) {
      const fs::path file = tmp.path / (ggml_type_name(type) + ".gguf");
      original.export_gguf(file, type);
      const GgufFile g = GgufFile::open(file);
      BOOST_TEST(g.string("general.architecture") == "llama");
      BOOST_TEST(g.string("tokenizer.ggml.model") == "llama");
      Engine back = Engine::load(file);
      BOOST_TEST(back.tokenizer().decode(ids) == original.tokenizer().decode(ids));
      const std::vector<float> got = back.logits(ids, 1, int(ids.size()));
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
      BOOST_TEST(worst <= tolerance * scale);
    }
  }
  // Q8_0 as written is within half a step of a block's values; Q4_0 within
  // one (its 16 levels are -8..7 steps: the side opposite the block's
  // largest magnitude reaches 7 of its 8 steps).
  std::vector<float> x(64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.37f) * (i < 32 ? 1.0f : 0.01f);
  for (const auto& [type, steps, within] :
       {std::tuple{GgmlType::q8_0, 127.0f, 0.51f}, std::tuple{GgmlType::q4_0, 8.0f, 1.01f}}) {
    const std::vector<std::byte> q = ggml_quantize(type, x);
    std::vector<float> y(x.size());
    ggml_dequantize(type, q.data(), x.size(), y.data());
    for (int b = 0; b < 2; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[32 * b + j]));
      for (int j = 0; j < 32; ++j)
        BOOST_TEST(std::abs(y[32 * b + j] - x[32 * b + j]) <= amax / steps * within + 1e-7f);
    }
  }
}

// A Q4_0 matrix becomes 4-bit panels by its bytes alone (WeightSource::
// q4_panels): the same panels as quantising its values afresh gives, since
// ggml's Q4_0 and xfmr's 4-bit blocks hold the same numbers; rows past the
// last whole panel are padding. Its default precision is q4; F16's fp32.
BOOST_AUTO_TEST_CASE(q4_0_matrices_become_4_bit_panels_exactly) {
  const TempDir tmp("gguf_q4");
  const PresetInfo arch = LanguageModelPresets::info("shakespeare-llama");
  Engine original = Engine::create(arch, 70, 5, {.tie_weights = true, .head_bias = false}, {.tokenizer_required = false});
  for (const auto& [type, precision] : {std::pair{GgmlType::q4_0, "q4"}, std::pair{GgmlType::q8_0, "int8"},
                                        std::pair{GgmlType::bf16, "bf16"}, std::pair{GgmlType::f16, "fp32"}}) {
    const fs::path file = tmp.path / (ggml_type_name(type) + ".gguf");
    original.export_gguf(file, type);
    const GgufModel g = open_gguf_model(file);
    BOOST_TEST(gguf_precision(g) == precision);
    BOOST_TEST(Engine::check(file, {}) == precision);
  }
  const GgufModel g = open_gguf_model(tmp.path / "Q4_0.gguf");
  // One tensor; q, k and v stacked (in Meta's order, and in Hugging Face's
  // halves, as a qwen2 file's); the embedding, whose rows are not panels'.
  const auto pairs = WeightPiece::rotary_pairs;
  const std::vector<std::vector<WeightPiece>> cases = {
      {{"blk.0.attn_q.weight"}},
      {{"blk.1.attn_q.weight"}, {"blk.1.attn_k.weight"}, {"blk.1.attn_v.weight"}},
      {{"blk.1.attn_q.weight", pairs, 16}, {"blk.1.attn_k.weight", pairs, 16}, {"blk.1.attn_v.weight"}},
      {{"token_embd.weight"}}};
  for (const std::vector<WeightPiece>& pieces : cases) {
    BOOST_TEST_CONTEXT(pieces.size() << " pieces from " << pieces[0].tensor << ", order " << int(pieces[0].order)) {
      long N = 0;
      for (const WeightPiece& p : pieces) N += long(g.file->tensor(p.tensor).rows());
      const long K = long(g.file->tensor(pieces[0].tensor).shape[0]);
      const auto source = gguf_weights(g.file, pieces, N, K);
      std::vector<std::byte> in_place(detail::q4_bytes(N, K)), afresh(in_place.size());
      BOOST_TEST(source->q4_panels(in_place.data()));
      const std::vector<float> values = read_all(*source);
      for (long p = 0; p < detail::q4_panels(N); ++p)
        detail::q4_pack_panel(p, int(N), int(K), values.data(), K, afresh.data() + detail::q4_offset(K, p, 0));
      BOOST_TEST((in_place == afresh));
    }
  }
  const auto f32 = gguf_weights(open_gguf_model(tmp.path / "F16.gguf").file, {{"blk.0.attn_q.weight"}}, 64, 64);
  std::vector<std::byte> none(detail::q4_bytes(64, 64));
  BOOST_TEST(!f32->q4_panels(none.data()));  // another type: quantised from its values
}

// open_gguf_model checks the file before anything is allocated: another
// architecture, a tensor missing, one of another shape, one it does not
// know, partial rotary positions and rope scaling it does not build are
// errors naming them.
BOOST_AUTO_TEST_CASE(a_model_file_is_checked_before_anything_is_read) {
  const TempDir tmp("gguf_model");
  auto file = [&](const std::string& arch, std::uint32_t rotary, const std::string& scaling,
                  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> tensors) {
    GgufWriter w;
    w.add("general.architecture", arch);
    for (const char* k : {"context_length", "embedding_length", "feed_forward_length"}) w.add(arch + "." + k, 32u);
    w.add(arch + ".block_count", 1u);
    w.add(arch + ".attention.head_count", 2u);
    w.add(arch + ".rope.dimension_count", rotary);
    if (!scaling.empty()) w.add(arch + ".rope.scaling.type", scaling);
    for (const auto& [name, shape] : tensors) {
      std::uint64_t n = 1;
      for (auto d : shape) n *= d;
      w.add_tensor(name, shape, GgmlType::f32, std::vector<float>(n, 0.5f));
    }
    const fs::path p = tmp.path / "m.gguf";
    w.write(p);
    return error_of([&] { (void)open_gguf_model(p); });
  };
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> llama = {
      {"token_embd.weight", {32, 10}}, {"output_norm.weight", {32}}, {"blk.0.attn_norm.weight", {32}},
      {"blk.0.ffn_norm.weight", {32}}, {"blk.0.attn_q.weight", {32, 32}}, {"blk.0.attn_k.weight", {32, 32}},
      {"blk.0.attn_v.weight", {32, 32}}, {"blk.0.attn_output.weight", {32, 32}}, {"blk.0.ffn_gate.weight", {32, 32}},
      {"blk.0.ffn_up.weight", {32, 32}}, {"blk.0.ffn_down.weight", {32, 32}}};
  BOOST_TEST(file("llama", 16, "", llama) == "");
  BOOST_TEST(file("mamba", 16, "", llama).find("general.architecture 'mamba' is not one xfmr reads (llama, qwen2, "
                                               "gpt2)") != std::string::npos);
  BOOST_TEST(file("llama", 8, "", llama).find("llama.rope.dimension_count is 8") != std::string::npos);
  BOOST_TEST(file("llama", 16, "yarn", llama).find("llama.rope.scaling.type 'yarn' is not built") != std::string::npos);
  auto missing = llama;
  missing.pop_back();
  BOOST_TEST(file("llama", 16, "", missing).find("no tensor 'blk.0.ffn_down.weight', which a llama of 1 layers needs") !=
             std::string::npos);
  auto wrong = llama;
  wrong[4].second = {32, 16};
  BOOST_TEST(file("llama", 16, "", wrong).find("tensor 'blk.0.attn_q.weight' has shape [32, 16]; the metadata's sizes "
                                               "give [32, 32]") != std::string::npos);
  auto extra = llama;
  extra.push_back({"blk.0.attn_q_norm.weight", {16}});
  BOOST_TEST(file("llama", 16, "", extra).find("tensor 'blk.0.attn_q_norm.weight' is not part of a llama xfmr builds") !=
             std::string::npos);
  // qwen2 needs its q/k/v biases.
  BOOST_TEST(file("qwen2", 16, "", llama).find("no tensor 'blk.0.attn_k.bias'") != std::string::npos);
}

// The chat format a GGUF's tokenizer.chat_template is written for, by its
// markers (io/pretrained.hpp's model_chat_template); plain without one.
BOOST_AUTO_TEST_CASE(a_gguf_chat_template_picks_the_chat_format) {
  const TempDir tmp("gguf_chat");
  for (const auto& [jinja, format] : {std::pair{"{% for m in messages %}<|im_start|>{{ m.role }}", "chatml"},
                                      std::pair{"<|start_header_id|>{{ role }}<|end_header_id|>", "llama3"},
                                      std::pair{"", "plain"}}) {
    GgufWriter w;
    w.add("general.architecture", std::string("llama"));
    if (*jinja) w.add("tokenizer.chat_template", std::string(jinja));
    const fs::path p = tmp.path / (std::string(format) + ".gguf");
    w.write(p);
    BOOST_TEST(model_chat_template(p).name() == std::string(format));
  }
}

// A GGUF's byte-level BPE tokenizer: its pieces, special ids and
// add_bos_token (a Llama 3 file's BOS first; 0xFFFFFFFF unset).
BOOST_AUTO_TEST_CASE(a_gguf_bpe_tokenizer_keeps_its_special_ids) {
  const TempDir tmp("gguf_bpe");
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {  // GPT-2's printable stand-ins: the bytes 'a' and 'b' stand for themselves
    if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) {
      std::string u;
      if (b < 0x80) u += char(b);
      else u += char(0xc0 | (b >> 6)), u += char(0x80 | (b & 0x3f));
      tokens.push_back(u);
    } else {
      tokens.push_back("<" + std::to_string(b) + ">");  // a symbol of its own (never met below)
    }
  }
  tokens.push_back("ab");
  tokens.push_back("<|begin_of_text|>");
  tokens.push_back("<|end_of_text|>");
  std::vector<std::int32_t> types(tokens.size(), 1);
  types[257] = types[258] = 3;
  for (const auto& [add_bos, eos] : {std::pair{true, 258u}, std::pair{false, 0xFFFFFFFFu}}) {
    GgufWriter w;
    w.add("general.architecture", std::string("llama"));
    w.add("tokenizer.ggml.model", std::string("gpt2"));
    w.add("tokenizer.ggml.pre", std::string("llama-bpe"));
    w.add("tokenizer.ggml.tokens", tokens);
    w.add("tokenizer.ggml.token_type", types);
    w.add("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
    w.add("tokenizer.ggml.bos_token_id", 257u);
    w.add("tokenizer.ggml.eos_token_id", eos);
    w.add("tokenizer.ggml.add_bos_token", add_bos);
    const fs::path p = tmp.path / "t.gguf";
    w.write(p);
    const ModelTokenizer t = ModelTokenizer::load(p);
    const std::vector<std::int32_t> ab = t.encode("ab<|end_of_text|>");
    BOOST_TEST(ab == (add_bos ? std::vector<std::int32_t>{257, 256, 258} : std::vector<std::int32_t>{256, 258}),
               add_bos);
    BOOST_TEST(t.start() == 257);
    BOOST_TEST(t.end() == (add_bos ? 258 : 257));  // unset: start()
    BOOST_TEST(t.decode(std::vector<std::int32_t>{256}) == "ab");
  }
}

BOOST_AUTO_TEST_SUITE_END()
