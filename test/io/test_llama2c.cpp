// llama2.c checkpoints (io/llama2c.hpp) against the plain-PyTorch Llama of
// make_fixtures.py: fixtures/llama2c holds model_v0.bin (the legacy layout,
// classifier shared with the embedding), model_v1.bin (version 1, a
// classifier of its own) and expected.json (float64 logits of one sequence
// under each). Then every malformed or mismatched file is refused with a
// message naming what is wrong.
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/llama_fixture.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/io/llama2c.hpp"
#include "xfmr/layers/kv_cache.hpp"

BOOST_AUTO_TEST_SUITE(test_llama2c)

using namespace xfmr;
using Cpu = CpuBackend<float>;
namespace fs = std::filesystem;

namespace {

struct WiderFeedForward : test::LlamaFixture {
  static constexpr int D_FF = 64;
};
using Lm = Decoder<test::LlamaFixture, Cpu>;
constexpr int kVocab = test::LlamaFixture::VOCAB;
using test::relative_gap;

const fs::path kDir = fs::path(XFMR_FIXTURE_DIR) / "llama2c";

nlohmann::json expected() {
  std::ifstream in(kDir / "expected.json");
  return nlohmann::json::parse(in);
}

std::unique_ptr<Lm> load(const fs::path& file, bool tie) {
  const auto ckpt = read_llama2c(file);
  auto m = std::make_unique<Lm>(kVocab, 1, DecoderOptions{.tie_weights = tie, .head_bias = false});
  load_llama2c(*m, ckpt);
  return m;
}

std::vector<char> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The fixture `name`, changed by edit(bytes), as a file of its own.
template <class Edit>
fs::path edited(const std::string& name, Edit edit) {
  static int n = 0;
  const fs::path p = fs::temp_directory_path() / ("xfmr_llama2c_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".bin");
  std::vector<char> b = bytes_of(kDir / name);
  edit(b);
  std::ofstream(p, std::ios::binary).write(b.data(), std::streamsize(b.size()));
  return p;
}
void put_int(std::vector<char>& b, std::size_t at, std::int32_t v) { std::memcpy(b.data() + at, &v, sizeof v); }

std::string load_error(const fs::path& file, bool tie) {
  return test::error_of([&] { load(file, tie); });
}

}  // namespace

BOOST_AUTO_TEST_CASE(both_layouts_give_the_references_logits) {
  const auto e = expected();
  const std::vector<std::int32_t> ids = e["ids"].get<std::vector<std::int32_t>>();
  for (const char* name : {"model_v0.bin", "model_v1.bin"}) {
    BOOST_TEST_CONTEXT(name) {
      const auto& want = e["models"][name];
      const bool shared = want["shared_classifier"].get<bool>();
      const auto ckpt = read_llama2c(kDir / name);
      BOOST_TEST(ckpt.config.version == (std::string(name) == "model_v0.bin" ? 0 : 1));
      BOOST_TEST(ckpt.config.dim == 32);
      BOOST_TEST(ckpt.config.hidden_dim == 48);
      BOOST_TEST(ckpt.config.n_kv_heads == 2);
      BOOST_TEST(ckpt.config.vocab_size == kVocab);
      BOOST_TEST(ckpt.config.seq_len == 16);
      BOOST_TEST(ckpt.config.shared_classifier == shared);
      Cpu be;
      auto m = load(kDir / name, shared);
      const auto logits = m->forward(be, ids, Shape{1, int(ids.size())});
      const auto ref = want["logits"].get<std::vector<double>>();
      const double gap = relative_gap(logits, ref);
      BOOST_TEST(gap < 1e-4, "logits " << gap << " of their scale from the reference");
      // Decoding through the KV cache gives the same logits, row by row.
      m->set_training(false);
      DecodingCache<Cpu> cache;
      m->start_cache(cache, 1);
      std::vector<float> cached;
      for (std::int32_t id : ids) {
        const auto row = m->forward_cached(be, std::span<const std::int32_t>(&id, 1), 1, cache);
        cached.insert(cached.end(), row.begin(), row.end());
      }
      BOOST_TEST(relative_gap(std::span<const float>(cached), ref) < 1e-4);
    }
  }
}

BOOST_AUTO_TEST_CASE(an_untied_model_takes_the_shared_classifier_as_its_head) {
  const auto e = expected();
  const std::vector<std::int32_t> ids = e["ids"].get<std::vector<std::int32_t>>();
  Cpu be;
  auto tied = load(kDir / "model_v0.bin", true), untied = load(kDir / "model_v0.bin", false);
  const auto a = tied->forward(be, ids, Shape{1, int(ids.size())});
  const std::vector<float> first(a.begin(), a.end());
  const auto b = untied->forward(be, ids, Shape{1, int(ids.size())});
  BOOST_TEST((first == std::vector<float>(b.begin(), b.end())));
}

BOOST_AUTO_TEST_CASE(malformed_and_mismatched_files_are_refused) {
  auto has = [](const std::string& error, const std::string& part) {
    BOOST_TEST(error.find(part) != std::string::npos, "'" << error << "' does not say '" << part << "'");
  };
  has(test::error_of([] { read_llama2c(kDir / "missing.bin"); }), "no llama2.c checkpoint there");
  // One float short, and one float more.
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { b.resize(b.size() - 4); })); }),
      "holds 67740");
  has(test::error_of([&] { read_llama2c(edited("model_v1.bin", [](auto& b) { b.resize(b.size() + 4); })); }),
      "72580 bytes");
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { b.resize(20); })); }),
      "shorter than a llama2.c header");
  // The header's fields.
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { put_int(b, 12, 3); })); }),
      "dim 32 is not n_heads 3 heads");
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { put_int(b, 16, 3); })); }),
      "not a multiple of n_kv_heads 3");
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { put_int(b, 8, 0); })); }),
      "n_layers is 0");
  // Fields a legacy header (no magic) gets wrong are named too: the file is
  // read as llama2.c's, not turned away as some other format.
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { put_int(b, 0, -32); })); }),
      "llama2.c legacy header (no version-1 magic \"ak42\"; is this a llama2.c .bin file?) field dim is -32");
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { put_int(b, 12, 0); })); }),
      "field n_heads is 0");
  has(test::error_of([&] { read_llama2c(edited("model_v0.bin", [](auto& b) { put_int(b, 24, 1 << 30); })); }),
      "field seq_len is 1073741824 (1..");
  has(test::error_of([&] { read_llama2c(edited("model_v1.bin", [](auto& b) { put_int(b, 8 + 12, 3); })); }),
      "llama2.c version 1 header: dim 32 is not n_heads 3 heads");
  has(test::error_of([&] { read_llama2c(edited("model_v1.bin", [](auto& b) { put_int(b, 4, 2); })); }),
      "version 2 (int8 Q8_0 groups) is not supported");
  has(test::error_of([&] { read_llama2c(edited("model_v1.bin", [](auto& b) { put_int(b, 4, 7); })); }),
      "llama2.c version 7");
  has(test::error_of([&] { read_llama2c(edited("model_v1.bin", [](auto& b) { b[36] = 5; })); }),
      "shared-classifier flag is 5");
  // A weight that is not finite (the first of the embedding, in the legacy layout).
  has(test::error_of([&] {
        read_llama2c(edited("model_v0.bin", [](auto& b) {
          const float nan = std::nanf("");
          std::memcpy(b.data() + 28, &nan, sizeof nan);
        }));
      }),
      "'tok_emb.weight' holds a value that is not finite");
  // The model against the file.
  has(load_error(kDir / "model_v1.bin", true), "build the model with tie_weights = false");
  has(test::error_of([] {
        Decoder<WiderFeedForward, Cpu> m(kVocab, 1, {.head_bias = false});
        load_llama2c(m, read_llama2c(kDir / "model_v1.bin"));
      }),
      "hidden_dim is 48, the model's D_FF 64");
  has(test::error_of([] {
        Lm m(kVocab + 1, 1, {.tie_weights = true, .head_bias = false});
        load_llama2c(m, read_llama2c(kDir / "model_v0.bin"));
      }),
      "vocab_size is 40, the model's vocabulary 41");
}

BOOST_AUTO_TEST_SUITE_END()
