// GPT-2 checkpoints in the Hugging Face layout (io/gpt2.hpp), against the
// plain-PyTorch GPT-2 of make_fixtures.py: the fixture gpt2_tiny holds its
// model.safetensors (as the Hub's gpt2 stores it: no prefix, with the mask
// buffers), config.json, and expected.safetensors (float64 logits of two
// sequences, and 12 greedy tokens after a prompt, decoded with a cache).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/parameters.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/io/gpt2.hpp"
#include "xfmr/layers/kv_cache.hpp"

BOOST_AUTO_TEST_SUITE(test_gpt2_checkpoint)

using namespace xfmr;
using Cpu = CpuBackend<float>;
namespace fs = std::filesystem;

namespace {

// The fixture's shape: vocab 61, n_positions 24, n_embd 32, n_layer 2, n_head 4.
struct TinyGpt2 {
  static constexpr int MAX_T = 24, D_MODEL = 32, N_HEADS = 4, N_LAYERS = 2, D_FF = 128;
  using Norm = PreNorm;
  using Activation = Gelu;
  using Positions = Learned;
};
using Lm = Decoder<TinyGpt2, Cpu>;
constexpr int kVocab = 61;

const fs::path kDir = fs::path(XFMR_FIXTURE_DIR) / "gpt2_tiny";

std::unique_ptr<Lm> load(const fs::path& file) {
  const auto ckpt = open_gpt2(file);
  auto m = std::make_unique<Lm>(kVocab, 1, kGpt2Options);
  load_gpt2(*m, ckpt.tensors, ckpt.config);
  return m;
}

fs::path temp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("xfmr_gpt2_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// The fixture's tensors, renamed and changed by `edit` (which may drop one by
// returning false), written to dir/model.safetensors with config.json `config`.
template <class Edit>
fs::path rewrite(const std::string& name, const std::string& config, Edit edit) {
  const auto st = SafeTensors::load(kDir / "model.safetensors");
  SafeTensorsWriter w;
  for (const auto& n : st.names()) {
    std::string key = n;
    auto info = st.info(n);
    auto v = st.values<float>(n);
    if (edit(key, info.shape, v)) w.add<float>(key, info.shape, std::span<const float>(v));
  }
  const auto dir = temp_dir(name);
  fs::create_directories(dir);
  w.write(dir / "model.safetensors");
  std::ofstream(dir / "config.json") << config;
  return dir / "model.safetensors";
}

std::string tiny_config(const std::string& changes = "") {
  return "{\"model_type\": \"gpt2\", \"vocab_size\": 61, \"n_positions\": 24, \"n_embd\": 32, \"n_layer\": 2, "
         "\"n_head\": 4, \"n_inner\": null" + changes + "}";
}

void check_error(const std::function<void()>& f, const std::string& expected) {
  try {
    f();
    BOOST_ERROR("no error; expected one containing: " << expected);
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find(expected) != std::string::npos, e.what() << "\n  expected: " << expected);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(logits_match_pytorch) {
  auto model = load(kDir / "model.safetensors");
  model->set_training(false);
  const auto expected = SafeTensors::load(kDir / "expected.safetensors");
  const auto ids64 = expected.integers("ids");
  const std::vector<std::int32_t> ids(ids64.begin(), ids64.end());
  Cpu be;
  const auto logits = model->forward(be, ids, Shape{2, 7});
  const auto want = expected.values<double>("logits");
  BOOST_REQUIRE(want.size() == logits.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(logits[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  BOOST_TEST(err <= 1e-4 * scale, "max error " << err << " against logits of scale " << scale);
  BOOST_TEST(scale > 1.0);  // logits of some size, so the bound says something
}

BOOST_AUTO_TEST_CASE(greedy_generation_with_the_cache_matches_pytorch) {
  auto model = load(kDir / "model.safetensors");
  model->set_training(false);
  const auto expected = SafeTensors::load(kDir / "expected.safetensors");
  const auto prompt64 = expected.integers("prompt"), greedy = expected.integers("greedy");
  std::vector<std::int32_t> context(prompt64.begin(), prompt64.end());
  Cpu be;
  DecodingCache<Cpu> cache;
  model->start_cache(cache, 1);
  auto logits = model->forward_cached(be, context, 1, cache);
  std::vector<std::int64_t> got;
  for (std::size_t i = 0; i < greedy.size(); ++i) {
    const auto last = logits.subspan(logits.size() - kVocab);
    const auto next = std::int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    got.push_back(next);
    logits = model->forward_cached(be, std::span<const std::int32_t>(&next, 1), 1, cache);
  }
  BOOST_TEST(got == greedy, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(export_and_reimport_are_bitwise) {
  auto model = load(kDir / "model.safetensors");
  const auto dir = temp_dir("export");
  save_gpt2(*model, dir);
  // The exported tensors are the fixture's, bit for bit, under the same names.
  const auto fixture = SafeTensors::load(kDir / "model.safetensors");
  const auto exported = SafeTensors::load(dir / "model.safetensors");
  BOOST_TEST(exported.metadata().at("format") == "pt");
  std::size_t compared = 0;
  for (const auto& n : fixture.names()) {
    if (n.ends_with(".attn.bias")) continue;  // the mask buffers are not parameters
    BOOST_REQUIRE_MESSAGE(exported.contains(n), "export lacks " << n);
    BOOST_TEST((exported.info(n).shape == fixture.info(n).shape), n);
    BOOST_TEST((exported.values<float>(n) == fixture.values<float>(n)), n);
    ++compared;
  }
  BOOST_TEST(compared == exported.names().size());
  // Reimported (config from config.json, then from the metadata alone): the same parameters.
  const auto again = load(dir / "model.safetensors");
  BOOST_TEST((test::host_parameters(*again) == test::host_parameters(*model)));
  fs::remove(dir / "config.json");
  BOOST_TEST((test::host_parameters(*load(dir / "model.safetensors")) == test::host_parameters(*model)));
  // An existing export is replaced only when asked.
  check_error([&] { save_gpt2(*model, dir); }, "exists already and holds model.safetensors");
  save_gpt2(*model, dir, /*overwrite=*/true);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(transformer_prefix_and_a_tied_lm_head_load) {
  const auto file = rewrite("prefix", tiny_config(), [](std::string& key, auto&, auto&) {
    key = "transformer." + key;
    return true;
  });
  {
    // GPT2LMHeadModel's lm_head.weight, equal to wte, beside the prefixed tensors.
    const auto st = SafeTensors::load(file);
    SafeTensorsWriter w;
    for (const auto& n : st.names()) {
      const auto v = st.values<float>(n);
      w.add<float>(n, st.info(n).shape, std::span<const float>(v));
    }
    const auto wte = st.values<float>("transformer.wte.weight");
    w.add<float>("lm_head.weight", st.info("transformer.wte.weight").shape, std::span<const float>(wte));
    w.write(file);
  }
  BOOST_TEST((test::host_parameters(*load(file)) == test::host_parameters(*load(kDir / "model.safetensors"))));
  fs::remove_all(file.parent_path());
}

BOOST_AUTO_TEST_CASE(mismatches_are_named) {
  auto keep = [](std::string&, auto&, auto&) { return true; };
  auto expect = [&](const std::string& name, const std::string& config, auto edit, const std::string& message) {
    const auto file = rewrite(name, config, edit);
    check_error([&] { load(file); }, message);
    fs::remove_all(file.parent_path());
  };
  // A config's sizes are checked against the file's tensors before a model
  // is built from them (a 4-byte file with vocab_size 16M allocated 9.6 GB).
  expect("embd", tiny_config(",\"n_embd\": 64"), keep,
         "tensor 'wte.weight' has shape (61, 32) but its config (vocab_size, n_embd) gives (61, 64)");
  expect("layers", tiny_config(",\"n_layer\": 3"), keep,
         "no tensor 'h.2.mlp.c_fc.weight', which its config (n_layer, n_embd, n_inner) calls for");
  expect("fewer", tiny_config(",\"n_layer\": 1"), keep, "holds more blocks than its config's n_layer 1");
  expect("vocab", tiny_config(",\"vocab_size\": 16000000"), keep,
         "tensor 'wte.weight' has shape (61, 32) but its config (vocab_size, n_embd) gives (16000000, 32)");
  expect("act", tiny_config(",\"activation_function\": \"relu\""), keep, "activation_function 'relu' is not GELU's tanh");
  // A static model's epsilon is its configuration's; a Dynamic one takes the file's (load_pretrained).
  expect("eps", tiny_config(",\"layer_norm_epsilon\": 1e-6"), keep,
         "layer_norm_epsilon 1e-06 but the model's norms' epsilon is 1e-05");
  expect("eps0", tiny_config(",\"layer_norm_epsilon\": 0"), keep, "layer_norm_epsilon 0 is not in (0, 1)");
  expect("type", tiny_config(",\"model_type\": \"llama\""), keep, "model_type 'llama' is not gpt2");
  expect("heads", tiny_config(",\"n_head\": 5"), keep, "n_embd 32 is not a multiple of n_head 5");
  expect(
      "shape", tiny_config(),
      [](std::string& key, std::vector<std::int64_t>& shape, std::vector<float>& v) {
        if (key == "h.1.mlp.c_fc.weight") shape = {128, 32};  // stored untransposed
        (void)v;
        return true;
      },
      "tensor 'h.1.mlp.c_fc.weight' has shape (128, 32) but its config (n_layer, n_embd, n_inner) gives (32, 128)");
  expect("missing", tiny_config(), [](std::string& key, auto&, auto&) { return key != "h.0.ln_2.bias"; },
         "no tensor 'h.0.ln_2.bias'");
  expect(
      "extra", tiny_config(),
      [](std::string& key, auto&, auto&) {
        if (key == "h.1.attn.bias") key = "h.1.attn.rotary";
        return true;
      },
      "tensor 'h.1.attn.rotary' is not part of a GPT-2 of this shape");
  // A matrix's values are read, and checked, when first needed (the model
  // defers them to the file: core/tensor.hpp).
  const auto nan_file = rewrite("nan", tiny_config(), [](std::string& key, auto&, std::vector<float>& v) {
    if (key == "wpe.weight") v[3] = NAN;
    return true;
  });
  check_error([&] { (void)test::host_parameters(*load(nan_file)); }, "tensor 'wpe.weight' holds nan at element 3");
  fs::remove_all(nan_file.parent_path());
  // No config: neither in the metadata nor beside the file.
  const auto file = rewrite("noconfig", tiny_config(), keep);
  fs::remove(file.parent_path() / "config.json");
  check_error([&] { load(file); }, "no 'config' in its metadata and no");
  fs::remove_all(file.parent_path());
  // A Decoder that is not GPT-2's: untied, or with a head bias.
  const auto st = SafeTensors::load(kDir / "model.safetensors");
  const auto config = read_gpt2_config(kDir / "model.safetensors", st);
  Lm untied(kVocab, 1);
  check_error([&] { load_gpt2(untied, st, config); }, "needs a Decoder built with tie_weights and without head_bias");
  check_error([&] { save_gpt2(untied, temp_dir("untied")); }, "needs a Decoder built with tie_weights");
}

BOOST_AUTO_TEST_SUITE_END()
