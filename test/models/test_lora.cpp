// LoRA on a language model (models/lora.hpp): the adapters' gradients
// through a whole model in double, GPT-2's shape (GELU apart from its
// products) and Llama's (q, k, v of a grouped fused qkv; gate and up); the
// frozen base's matrices take no gradient memory; an adapted model's
// logits are its merged model's within float rounding, at step 0 the
// base's exactly, and through the KV cache the same; bad targets refused.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/lora.hpp"

BOOST_AUTO_TEST_SUITE(test_lora)

using namespace xfmr;
using namespace xfmr::test;

namespace {
constexpr int kVocab = 13;
struct LlamaGqa : TinyLlama {
  static constexpr int N_HEADS = 4, N_KV_HEADS = 2, N_LAYERS = 2;
};
struct Gpt : TinyPre {
  static constexpr int N_LAYERS = 2;
};
const std::vector<std::int32_t> kIds = {1, 5, 2, 9, 12, 0, 3, 3, 7, 4};  // B 2 x T 5

template <class Be>
void draw_b(LanguageModel<Be>& model, std::uint64_t seed) {
  Rng rng(seed);
  model.visit_adapters([&](std::string_view, LinearAdapters<Be>& adapters, auto&) {
    for (auto& x : adapters.list()) x.b.generate([&] { return typename Be::Scalar(rng.uniform(-0.5, 0.5)); });
  });
}
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(adapter_gradients_through_a_model, Cfg, decltype(std::tuple<Gpt, LlamaGqa>())) {
  const bool llama = std::is_same_v<Cfg, LlamaGqa>;
  Be be;
  auto model = make_decoder_model<Cfg, Be>(kVocab, 3, {});
  add_lora(*model, {.rank = 2, .alpha = 3, .targets = llama ? std::vector<std::string>{"q", "k", "v", "o", "gate", "up", "down"}
                                                              : std::vector<std::string>{"qkv", "o", "fc1", "down"}},
           4);
  draw_b(*model, 5);
  LoraAdapters<Be> adapters(*model);
  std::size_t n = 0;
  adapters.visit([&](std::string_view, auto&, auto&) { ++n; });
  BOOST_TEST(n == (llama ? 28u : 16u));  // A and B, a target a block, two blocks
  Rng rng(6);
  GradCase c;
  c.name = llama ? "LoRA, Llama-shaped" : "LoRA, GPT-2-shaped";
  c.output(kIds.size() * kVocab, rng);
  c.forward = [&] {
    const auto logits = model->forward(be, kIds, {2, 5});
    c.y.assign(logits.begin(), logits.end());
  };
  c.backward = [&] { model->backward(be, c.dy); };
  c.visit = [&](const ParamFn& f) { adapters.visit(f); };
  check_case(c);
  model->visit([](std::string_view name, auto& value, auto& grad) {
    if (value.shape().size() == 2) BOOST_TEST(grad.allocated_bytes() == 0u, name);
  });
}

BOOST_AUTO_TEST_CASE(an_adapted_model_gives_its_merged_models_logits) {
  using F = CpuBackend<float>;
  F be;
  auto base = make_decoder_model<LlamaGqa, F>(kVocab, 3, {});
  auto model = make_decoder_model<LlamaGqa, F>(kVocab, 3, {});
  const auto logits_of = [&](LanguageModel<F>& m) {
    const auto l = m.forward(be, kIds, {2, 5});
    return std::vector<float>(l.begin(), l.end());
  };
  const std::vector<float> plain = logits_of(*base);
  add_lora(*model, {.rank = 2, .alpha = 4, .rslora = true}, 4);
  BOOST_TEST(logits_of(*model) == plain, boost::test_tools::per_element());  // B zero: the base, bit for bit
  draw_b(*model, 5);
  const std::vector<float> adapted = logits_of(*model);
  double moved = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) moved = std::max(moved, double(std::abs(adapted[i] - plain[i])));
  BOOST_TEST(moved > 1e-3);
  // The KV cache's path: the same logits, a token at a time.
  DecodingCache<F> cache;
  model->start_cache(cache, 1);
  for (int t = 0; t < 5; ++t) {
    const auto l = model->forward_cached(be, std::span(kIds).subspan(std::size_t(t), 1), 1, cache);
    for (int v = 0; v < kVocab; ++v)
      BOOST_TEST(std::abs(l[std::size_t(v)] - adapted[std::size_t(t * kVocab + v)]) <= 1e-5);
  }
  merge_lora(be, *model);
  const std::vector<float> merged = logits_of(*model);
  for (std::size_t i = 0; i < plain.size(); ++i) BOOST_TEST(std::abs(merged[i] - adapted[i]) <= 1e-5);
  std::size_t left = 0;
  LoraAdapters<F>(*model).visit([&](std::string_view, auto&, auto&) { ++left; });
  BOOST_TEST(left == 0u);
}

BOOST_AUTO_TEST_CASE(bad_targets_are_refused) {
  using F = CpuBackend<float>;
  auto gpt = make_decoder_model<Gpt, F>(kVocab, 3, {});
  BOOST_TEST(error_of([&] { add_lora(*gpt, {.targets = {"q", "gate"}}, 1); }).find("not gated") != std::string::npos);
  BOOST_TEST(error_of([&] { add_lora(*gpt, {.targets = {"query"}}, 1); }).find("'query' is not a projection") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { add_lora(*gpt, {.targets = {"qkv", "q"}}, 1); }).find("overlap") != std::string::npos);
  BOOST_TEST(error_of([&] { add_lora(*gpt, {.rank = 9, .targets = {"o"}}, 1); }).find("LoRA rank 9 outside [1, 8]") !=
             std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
