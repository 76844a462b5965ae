// A random checkpoint of each published family in a shape no preset has
// (reference/families.py writes them, with a plain float64 PyTorch
// reference): load_pretrained builds the family's Dynamic model from the
// config alone, and its logits and greedy tokens through the KV cache are
// PyTorch's. A model fine-tuned from such a shape saves, reloads
// (load_model) and resumes bit for bit, and exports back to its format.
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/train/trainer.hpp"

BOOST_AUTO_TEST_SUITE(test_families)

using namespace xfmr;
using Cpu = CpuBackend<float>;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(XFMR_FIXTURE_DIR) / "families";

struct Family {
  const char* dir;
  const char* name;   // the architecture load_pretrained reports
  const char* shape;  // PresetInfo::shape(), which no preset has
};
const Family kFamilies[] = {{"gpt2-ctx2048", "gpt2", "D24 H3 L2 T2048 FF96"},
                            {"llama3-scaled", "llama", "D32 H4 KV1 L2 T128 FF40"},
                            {"qwen2", "qwen2", "D24 H3 KV1 L2 T64 FF56"},
                            {"smollm2", "llama", "D48 H6 KV2 L2 T64 FF64"}};

std::vector<std::int32_t> ints(const SafeTensors& st, const std::string& name) {
  const auto v = st.integers(name);
  return {v.begin(), v.end()};
}

fs::path fresh_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("xfmr_families_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<unsigned char> weight_bytes(LanguageModel<Cpu>& m) {
  std::vector<unsigned char> bytes;
  m.visit([&](std::string_view, auto& value, auto&) {
    const auto* p = reinterpret_cast<const unsigned char*>(value.data());
    bytes.insert(bytes.end(), p, p + value.size() * sizeof(float));
  });
  return bytes;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_family_in_a_shape_without_a_preset_matches_pytorch) {
  for (const Family& f : kFamilies) {
    BOOST_TEST_CONTEXT(f.dir) {
      // No preset has the shape: the model is the family's, at the config's sizes and knobs.
      for (std::string_view name : LanguageModelPresets::names())
        BOOST_TEST(LanguageModelPresets::info(name).shape() != f.shape);
      auto p = load_pretrained<Cpu>(kDir / f.dir);
      LanguageModel<Cpu>& m = *p.model;
      BOOST_TEST(m.preset().name == f.name);
      BOOST_TEST(m.preset().shape() == f.shape);
      m.set_training(false);
      const SafeTensors expected = SafeTensors::load(kDir / f.dir / "expected.safetensors");
      const auto ids = ints(expected, "ids"), want = ints(expected, "greedy");
      const auto ref = expected.values<float>("logits");
      Cpu be;
      const auto logits = m.forward(be, ids, Shape{1, int(ids.size())});
      BOOST_REQUIRE_EQUAL(logits.size(), ref.size());
      double scale = 0, worst = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        scale = std::max(scale, std::abs(double(ref[i])));
        worst = std::max(worst, std::abs(double(logits[i]) - ref[i]));
      }
      BOOST_TEST(worst <= 1e-4 * scale, "logits differ by " << worst << " at scale " << scale);
      // Greedy tokens through the KV cache.
      Generator<LanguageModel<Cpu>, Cpu> gen(m, be);
      Rng rng(1);
      const std::vector<std::int32_t> prompt(ids.begin(), ids.begin() + 4);
      const auto got = gen(prompt, {.sampling = {.temperature = 0.0}, .max_tokens = int(want.size())}, rng);
      BOOST_TEST(got == want, boost::test_tools::per_element());
    }
  }
}

// The knobs are the file's: a config's epsilon, theta and scaling each
// change the logits (a negative control for the agreement above).
BOOST_AUTO_TEST_CASE(the_knobs_reach_the_model) {
  auto p = load_pretrained<Cpu>(kDir / "llama3-scaled");
  const PresetInfo arch = p.model->preset();
  BOOST_TEST(arch.rope_theta == 500000.0);
  BOOST_TEST((arch.rope_scaling.kind == RopeScaling::llama3));
  BOOST_TEST(arch.rope_scaling.factor == 8.0);
  BOOST_TEST(arch.rope_scaling.original_max_t == 16);
  const auto q = load_pretrained<Cpu>(kDir / "qwen2");
  BOOST_TEST(q.model->preset().qkv_bias);
  BOOST_TEST(q.model->preset().norm_eps == 1e-6);
  // The same weights without the scaling: other logits past the first positions.
  PresetInfo plain = arch;
  plain.rope_scaling = {};
  auto other = make_language_model<Cpu>(plain, p.model->vocab(), 0, p.model->options());
  std::vector<std::vector<float>> values;
  p.model->visit([&](std::string_view, auto& v, auto&) { values.emplace_back(v.begin(), v.end()); });
  std::size_t i = 0;
  other->visit([&](std::string_view, auto& v, auto&) { v.copy_from_host(values[i++].data()); });
  Cpu be;
  std::vector<std::int32_t> ids(12);
  for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = std::int32_t(t * 5 % 47);
  const auto a = p.model->forward(be, ids, {1, 12});
  const std::vector<float> scaled(a.begin(), a.end());
  const auto b = other->forward(be, ids, {1, 12});
  BOOST_TEST(!std::equal(scaled.begin(), scaled.end(), b.begin()));
}

// Fine-tuned from a shape no preset has: saved with its architecture, the
// checkpoint reloads without a preset (load_model), resumes bit for bit,
// and exports back to the family's layout.
BOOST_AUTO_TEST_CASE(a_fine_tuned_new_shape_reloads_resumes_and_exports) {
  auto base = load_pretrained<Cpu>(kDir / "qwen2");
  const PresetInfo arch = base.model->preset();
  const int V = base.model->vocab(), B = 2, T = 8;
  std::vector<std::int32_t> text(200);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = std::int32_t((i * i + 3 * i) % V);
  Cpu be;
  auto run = [&](LanguageModel<Cpu>& model, long from, long to, const fs::path& resume, const fs::path& save) {
    AdamW<Cpu> opt(model);
    Trainer<LanguageModel<Cpu>, Cpu> trainer(model, be, opt, {.schedule = LrSchedule::parse("constant", 1e-3, to),
                                                              .data_seed = 3});
    if (!resume.empty()) trainer.resume(resume);
    BOOST_TEST(trainer.steps() == from);
    std::vector<std::int32_t> x(B * T), y(B * T);
    const LmBatcher batches(text, B, T);
    while (trainer.steps() < to)
      trainer.step(
          [&](int) {
            batches.sample(trainer.data_rng(), x.data(), y.data());
            return BatchTargets{B, y};
          },
          [&](const Shard& s, LanguageModel<Cpu>& m, Cpu& b) {
            return m.forward(b, std::span(x).subspan(s.begin * T, s.size() * T), {s.size(), T});
          });
    if (!save.empty()) trainer.save(save, language_model_metadata(model));
  };
  const fs::path half = fresh_dir("half"), whole = fresh_dir("whole"), hf = fresh_dir("hf");
  run(*base.model, 0, 6, {}, whole);  // straight through
  auto second = load_pretrained<Cpu>(kDir / "qwen2");
  run(*second.model, 0, 3, {}, half);
  // Reloaded from the checkpoint alone: the same architecture and weights.
  auto reloaded = load_model<Cpu>(half);
  BOOST_TEST((reloaded.format == CheckpointFormat::xfmr));
  BOOST_TEST(architecture_json(reloaded.model->preset()) == architecture_json(arch));
  BOOST_TEST(weight_bytes(*reloaded.model) == weight_bytes(*second.model));
  // Resumed to the end: the straight run's bits.
  run(*reloaded.model, 3, 6, half, {});
  BOOST_TEST(weight_bytes(*reloaded.model) == weight_bytes(*base.model));
  // Exported back to Qwen2's layout, and loaded again.
  save_pretrained(*reloaded.model, hf);
  auto back = load_pretrained<Cpu>(hf);
  BOOST_TEST(back.model->preset().shape() == arch.shape());
  BOOST_TEST(back.model->preset().qkv_bias);
  BOOST_TEST(weight_bytes(*back.model) == weight_bytes(*reloaded.model));
  for (const auto& d : {half, whole, hf}) fs::remove_all(d);
}

// A checkpoint written before architectures were recorded (its preset's
// name alone) still loads: one xfmr-charlm wrote at 8f238f5, and one
// written here with the preset's name only.
BOOST_AUTO_TEST_CASE(a_committed_old_checkpoint_loads) {
  const fs::path old = fs::path(XFMR_FIXTURE_DIR) / "charlm_8f238f5";
  const Metadata md = read_checkpoint_metadata(old);
  BOOST_TEST(md.count("architecture") == 0u);
  auto m = load_model<Cpu>(old);
  BOOST_TEST(m.model->preset().name == "tiny");
  BOOST_TEST(m.model->preset().shape() == LanguageModelPresets::info("tiny").shape());
  const SafeTensors saved = SafeTensors::load(old / "model.safetensors");
  BOOST_TEST(m.model->vocab() == int(saved.info("tok_emb.weight").shape[0]));
  BOOST_TEST(m.model->parameter_count() == std::size_t(make_language_model<Cpu>("tiny", m.model->vocab(), 0)
                                                             ->parameter_count()));
}

BOOST_AUTO_TEST_CASE(a_checkpoint_with_only_a_preset_name_loads) {
  auto m = make_language_model<Cpu>("shakespeare-llama", 30, 1, {.head_bias = false});
  Cpu be;
  AdamW<Cpu> opt(*m);
  Trainer<LanguageModel<Cpu>, Cpu> trainer(*m, be, opt, {});
  const fs::path d = fresh_dir("old");
  trainer.save(d, {{"preset", "shakespeare-llama"}});
  auto back = load_model<Cpu>(d);
  BOOST_TEST(back.model->preset().name == "shakespeare-llama");
  BOOST_TEST(weight_bytes(*back.model) == weight_bytes(*m));
  fs::remove_all(d);
}

// A model of a long context (Llama 3's 131072 positions) decoding a few
// tokens: the Generator's cache holds those positions, not the context's,
// and decodes the same tokens as a cache of the whole context.
BOOST_AUTO_TEST_CASE(a_long_context_decodes_in_a_cache_of_what_it_decodes) {
  PresetInfo arch = LanguageModelPresets::info("shakespeare-llama");
  arch.name = "long", arch.max_t = 131072, arch.n_layers = 1, arch.rope_theta = 5e5;
  auto m = make_language_model<Cpu>(arch, 40, 7, {.head_bias = false});
  m->set_training(false);
  Cpu be;
  DecodingCache<Cpu> small, whole;
  m->start_cache(small, 1, 20);
  BOOST_TEST(small[0].capacity() == 20);
  BOOST_TEST(test::error_of([&] { m->start_cache(small, 1, 131073); }).find("outside 1..MAX_T 131072") !=
             std::string::npos);
  m->start_cache(whole, 1);
  BOOST_TEST(whole[0].capacity() == 131072);
  const std::vector<std::int32_t> prompt{3, 1, 4, 1, 5};
  std::vector<std::int32_t> want;
  auto logits = m->forward_cached(be, prompt, 1, whole);
  for (int i = 0; i < 12; ++i) {
    const auto last = logits.subspan(logits.size() - 40);
    want.push_back(std::int32_t(std::max_element(last.begin(), last.end()) - last.begin()));
    logits = m->forward_cached(be, std::span<const std::int32_t>(&want.back(), 1), 1, whole);
  }
  Generator<LanguageModel<Cpu>, Cpu> gen(*m, be);
  Rng rng(1);
  const auto got = gen(prompt, {.sampling = {.temperature = 0.0}, .max_tokens = 12}, rng);
  BOOST_TEST(got == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
