// Hugging Face Llama checkpoints (io/hf_llama.hpp) against make_fixtures.py's
// plain-torch Llama with Hugging Face's rotate-half positions: fixtures/
// hf_llama holds model.safetensors (q_proj and k_proj in that order),
// config.json and expected.safetensors (ids and their float64 logits, and
// the greedy continuation of the first four ids).
// Then mismatched configs, tensors and models are refused by name.
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/parameters.hpp"
#include "support/llama_fixture.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/io/hf_llama.hpp"
#include "xfmr/layers/kv_cache.hpp"

BOOST_AUTO_TEST_SUITE(test_hf_llama)

using namespace xfmr;
using Cpu = CpuBackend<float>;
namespace fs = std::filesystem;

namespace {

using Lm = Decoder<test::LlamaFixture, Cpu>;
constexpr int kVocab = test::LlamaFixture::VOCAB;
const fs::path kDir = fs::path(XFMR_FIXTURE_DIR) / "hf_llama";
using test::relative_gap;

// A copy of the fixture directory with config.json's text changed by
// edit_config and the tensors by edit_tensors(name, values) (false drops one).
template <class EditConfig, class EditTensors>
fs::path edited(EditConfig edit_config, EditTensors edit_tensors) {
  static int n = 0;
  const fs::path d = fs::temp_directory_path() / ("xfmr_hf_llama_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ifstream in(kDir / "config.json");
  std::string config{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  edit_config(config);
  std::ofstream(d / "config.json") << config;
  const auto st = SafeTensors::load(kDir / "model.safetensors");
  SafeTensorsWriter w;
  std::vector<std::vector<float>> keep;
  for (const auto& name : st.names()) {
    std::string to = name;
    auto values = st.values<float>(name);
    if (!edit_tensors(to, values)) continue;
    keep.push_back(std::move(values));
    w.add<float>(to, st.info(name).shape, std::span<const float>(keep.back()));
  }
  w.write(d / "model.safetensors");
  return d;
}
void replace(std::string& text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  BOOST_REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
}
const auto same_config = [](std::string&) {};
const auto same_tensors = [](std::string&, std::vector<float>&) { return true; };

}  // namespace

BOOST_AUTO_TEST_CASE(logits_match_the_rotate_half_reference) {
  const auto ck = open_hf_llama(kDir);
  BOOST_TEST(ck.config.num_key_value_heads == 2);
  BOOST_TEST(!ck.config.tie_word_embeddings);
  Lm m(kVocab, 1, {.head_bias = false});
  load_hf_llama(m, ck);
  const auto expected = SafeTensors::load(kDir / "expected.safetensors");
  const auto ids64 = expected.integers("ids");
  const std::vector<std::int32_t> ids(ids64.begin(), ids64.end());
  const auto want = expected.values<float>("logits");
  Cpu be;
  const auto logits = m.forward(be, ids, Shape{1, int(ids.size())});
  BOOST_TEST(relative_gap(logits, want) < 1e-4);
  m.set_training(false);
  DecodingCache<Cpu> cache;
  m.start_cache(cache, 1);
  std::vector<float> cached;
  for (std::int32_t id : ids) {
    const auto row = m.forward_cached(be, std::span<const std::int32_t>(&id, 1), 1, cache);
    cached.insert(cached.end(), row.begin(), row.end());
  }
  BOOST_TEST(relative_gap(std::span<const float>(cached), want) < 1e-4);
}

// Greedy decoding through the KV cache picks PyTorch's tokens (the
// reference recomputes the whole prefix for each; its top two logits are
// far apart at every step).
BOOST_AUTO_TEST_CASE(greedy_decoding_through_the_cache_matches_pytorch) {
  Lm m(kVocab, 1, {.head_bias = false});
  load_hf_llama(m, open_hf_llama(kDir));
  m.set_training(false);
  const auto expected = SafeTensors::load(kDir / "expected.safetensors");
  const auto ids = expected.integers("ids"), want = expected.integers("greedy");
  Cpu be;
  DecodingCache<Cpu> cache;
  m.start_cache(cache, 1);
  std::vector<std::int32_t> prompt(ids.begin(), ids.begin() + 4);
  auto logits = m.forward_cached(be, prompt, 1, cache);
  std::vector<std::int64_t> got;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto last = logits.subspan(logits.size() - kVocab);
    const std::int32_t next = std::int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    got.push_back(next);
    logits = m.forward_cached(be, std::span<const std::int32_t>(&next, 1), 1, cache);
  }
  BOOST_TEST(got == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(mismatches_are_refused_by_name) {
  auto has = [](const std::string& error, const std::string& part) {
    BOOST_TEST(error.find(part) != std::string::npos, "'" << error << "' does not say '" << part << "'");
  };
  auto open_error = [](const fs::path& d) { return test::error_of([&] { open_hf_llama(d); }); };
  // Knobs a file may set (a Dynamic model takes them, load_pretrained), but
  // a model built with others refuses them by name.
  auto load_error = [](const fs::path& d) {
    return test::error_of([&] {
      Lm m(kVocab, 1, {.head_bias = false});
      load_hf_llama(m, open_hf_llama(d));
    });
  };
  has(load_error(edited([](std::string& c) { replace(c, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-06"); },
                        same_tensors)),
      "rms_norm_eps is 1e-06 but the model's norm epsilon is 1e-05");
  has(load_error(edited([](std::string& c) { replace(c, "\"rope_theta\": 10000.0", "\"rope_theta\": 500000.0"); },
                        same_tensors)),
      "rope_theta is 500000 but the model's rotary theta is 10000");
  has(open_error(edited([](std::string& c) { replace(c, "\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 2}"); },
                        same_tensors)),
      "rope_scaling {\"factor\":2} is not built");
  has(open_error(edited([](std::string& c) { replace(c, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1"); },
                        same_tensors)),
      "rms_norm_eps -1 is not a number in (0, 1)");
  has(open_error(edited([](std::string& c) { replace(c, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""); },
                        same_tensors)),
      "hidden_act \"gelu\"");
  has(open_error(edited([](std::string& c) { replace(c, "\"intermediate_size\": 48", "\"intermediate_size\": 64"); },
                        same_tensors)),
      "has shape (48, 32) but its config gives (64, 32)");
  has(open_error(edited(same_config, [](std::string& n, std::vector<float>&) { return n != "model.layers.1.mlp.up_proj.weight"; })),
      "no tensor 'model.layers.1.mlp.up_proj.weight'");
  has(open_error(edited(same_config, [](std::string& n, std::vector<float>&) {
        if (n == "model.norm.weight") n = "model.final_norm.weight";
        return true;
      })),
      "no tensor 'model.norm.weight'");
  // Opening checks names and shapes; loading defers the matrices to the
  // file (core/tensor.hpp), whose values are read, and checked, when first
  // needed.
  const fs::path with_nan = edited(same_config, [](std::string& n, std::vector<float>& v) {
    if (n == "model.layers.0.self_attn.q_proj.weight") v[5] = std::nanf("");
    return true;
  });
  BOOST_TEST(open_error(with_nan).empty());
  has(test::error_of([&] {
        Lm m(kVocab, 1, {.head_bias = false});
        load_hf_llama(m, open_hf_llama(with_nan));
        (void)test::host_parameters(m);
      }),
      "tensor 'model.layers.0.self_attn.q_proj.weight' holds nan at element 5");
  has(test::error_of([] {
        Lm m(kVocab, 1, {.tie_weights = true, .head_bias = false});
        load_hf_llama(m, open_hf_llama(kDir));
      }),
      "build the model with tie_weights = false");
  has(test::error_of([] {
        Lm m(kVocab + 2, 1, {.head_bias = false});
        load_hf_llama(m, open_hf_llama(kDir));
      }),
      "vocab_size is 40 but the model's vocabulary is 42");
  has(open_error(kDir / "missing"), "no such file");
}

namespace {
fs::path fresh_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("xfmr_hf_llama_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}
}  // namespace

// The export of the loaded fixture is the fixture: every tensor bit for bit
// under its name (q_proj and k_proj back in rotate-half order, gate and up
// apart), and a config that loads it again.
BOOST_AUTO_TEST_CASE(export_gives_back_the_files_tensors) {
  Lm m(kVocab, 1, {.head_bias = false});
  load_hf_llama(m, open_hf_llama(kDir));
  const fs::path d = fresh_dir("export");
  save_hf_llama(m, d);
  const auto fixture = SafeTensors::load(kDir / "model.safetensors");
  const auto exported = SafeTensors::load(d / "model.safetensors");
  BOOST_TEST(exported.names().size() == fixture.names().size());
  for (const auto& n : fixture.names()) {
    BOOST_REQUIRE_MESSAGE(exported.contains(n), "export lacks " << n);
    BOOST_TEST((exported.info(n).shape == fixture.info(n).shape), n);
    BOOST_TEST((exported.values<float>(n) == fixture.values<float>(n)), n);
  }
  const auto again = open_hf_llama(d);
  BOOST_TEST(again.config.num_key_value_heads == 2);
  BOOST_TEST(again.config.max_position_embeddings == test::LlamaFixture::MAX_T);
  Lm back(kVocab, 2, {.head_bias = false});
  load_hf_llama(back, again);
  BOOST_TEST((test::host_parameters(back) == test::host_parameters(m)));
  BOOST_TEST(test::error_of([&] { save_hf_llama(m, d); }).find("exists already") != std::string::npos);
  save_hf_llama(m, d, /*overwrite=*/true);
  fs::remove_all(d);
}

// A tied model exports without lm_head and says so in its config; it comes
// back bit for bit, and only into a tied model.
BOOST_AUTO_TEST_CASE(a_tied_model_exports_and_reimports_bitwise) {
  Lm m(kVocab, 7, {.tie_weights = true, .head_bias = false});
  const fs::path d = fresh_dir("tied");
  save_hf_llama(m, d);
  const auto ck = open_hf_llama(d);
  BOOST_TEST(ck.config.tie_word_embeddings);
  BOOST_TEST(!ck.tensors.contains("lm_head.weight"));
  Lm back(kVocab, 8, {.tie_weights = true, .head_bias = false});
  load_hf_llama(back, ck);
  BOOST_TEST((test::host_parameters(back) == test::host_parameters(m)));
  Lm untied(kVocab, 8, {.head_bias = false});
  BOOST_TEST(test::error_of([&] { load_hf_llama(untied, ck); }).find("tie_weights = true") != std::string::npos);
  Lm with_bias(kVocab, 8, {.tie_weights = true});
  BOOST_TEST(test::error_of([&] { save_hf_llama(with_bias, d, true); }).find("no bias") != std::string::npos);
  fs::remove_all(d);
}

BOOST_AUTO_TEST_SUITE_END()
