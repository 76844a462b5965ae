// LoRA on a language model (models/lora.hpp): the adapters' gradients
// through a whole model in double, GPT-2's shape (GELU apart from its
// products) and Llama's (q, k, v of a grouped fused qkv; gate and up); the
// frozen base's matrices take no gradient memory; an adapted model's
// logits are its merged model's within float rounding, at step 0 the
// base's exactly, and through the KV cache the same; LoRA dropout's
// gradients through its masks, none in evaluation, replayed by a block
// recompute; a Trainer steps the adapters alone and resumes them bit for
// bit; bad targets refused.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "support/gradcheck.hpp"
#include "support/temp_dir.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/lora.hpp"
#include "xfmr/train/trainer.hpp"

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
  LoraModel<Be> adapters(*model);
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
  LoraModel<F>(*model).visit([&](std::string_view, auto&, auto&) { ++left; });
  BOOST_TEST(left == 0u);
}

// LoRA dropout (peft's lora_dropout): in training each adapter reads its
// input through a mask of its own; the gradients in double through the
// masks (the counters wound back before each forward, so every forward
// draws the same ones); evaluation draws none (the logits of the same
// adapters without dropout, bit for bit); a block recompute replays the
// masks (the same gradients as keeping everything, bit for bit).
BOOST_AUTO_TEST_CASE(dropout_masks_each_adapters_input_while_training) {
  Be be;
  auto model = make_decoder_model<LlamaGqa, Be>(kVocab, 3, {});
  add_lora(*model, {.rank = 2, .alpha = 3, .dropout = 0.4}, 4);
  draw_b(*model, 5);
  std::size_t keys = 0;
  model->for_each_dropout([&](DropoutKeys& k) { keys += k.p() == 0.4f; });  // (beside the residuals', p 0)
  BOOST_TEST(keys == 8u);  // qkv, o, fc1, down: four Linears a block, two blocks
  LoraModel<Be> adapters(*model);
  const auto rewind = [&] { model->for_each_dropout([](DropoutKeys& k) { k.set_calls(0); }); };
  Rng rng(6);
  GradCase c;
  c.name = "LoRA with dropout";
  c.output(kIds.size() * kVocab, rng);
  c.forward = [&] {
    rewind();
    const auto logits = model->forward(be, kIds, {2, 5});
    c.y.assign(logits.begin(), logits.end());
  };
  c.backward = [&] { model->backward(be, c.dy); };
  c.visit = [&](const ParamFn& f) { adapters.visit(f); };
  check_case(c);

  const auto logits_of = [&](LanguageModel<Be>& m) {
    const auto l = m.forward(be, kIds, {2, 5});
    return std::vector<double>(l.begin(), l.end());
  };
  rewind();
  const std::vector<double> training = logits_of(*model);
  auto plain = make_decoder_model<LlamaGqa, Be>(kVocab, 3, {});  // the same adapters, no dropout
  add_lora(*plain, {.rank = 2, .alpha = 3}, 4);
  draw_b(*plain, 5);
  const std::vector<double> undropped = logits_of(*plain);
  double moved = 0;
  for (std::size_t i = 0; i < training.size(); ++i) moved = std::max(moved, std::abs(training[i] - undropped[i]));
  BOOST_TEST(moved > 1e-3);  // the masks dropped something
  model->set_training(false);
  BOOST_TEST(logits_of(*model) == undropped, boost::test_tools::per_element());
  model->set_training(true);

  // Block recompute replays each block's masks: the adapters' gradients are those of keeping every activation.
  const auto gradients = [&](Recompute r) {
    model->set_recompute(r);
    rewind();
    adapters.visit([](std::string_view, auto&, auto& g) { g.zero(); });
    (void)model->forward(be, kIds, {2, 5});
    model->backward(be, c.dy);
    std::vector<double> g;
    adapters.visit([&](std::string_view, auto&, auto& grad) {
      std::vector<double> h(grad.size());
      grad.copy_to_host(h.data());
      g.insert(g.end(), h.begin(), h.end());
    });
    return g;
  };
  const std::vector<double> kept = gradients(Recompute::none);
  BOOST_TEST(gradients(Recompute::block) == kept, boost::test_tools::per_element());
}

// The Trainer over a LoraModel: a fixed batch's loss falls, the base's
// weights stay as they were, bit for bit; the checkpoint holds the
// adapters and their optimizer state alone, and resumes bit for bit.
BOOST_AUTO_TEST_CASE(a_trainer_steps_the_adapters_alone) {
  using F = CpuBackend<float>;
  using Lm = LanguageModel<F>;
  const std::vector<std::int32_t> targets = {5, 2, 9, 12, 0, 3, 3, 7, 4, 1};
  const auto base_weights = [](Lm& m) {
    std::vector<float> w;
    m.visit([&](std::string_view, auto& value, auto&) { w.insert(w.end(), value.begin(), value.end()); });
    return w;
  };
  struct Run {
    std::unique_ptr<Lm> model;
    std::unique_ptr<LoraModel<F>> lora;
    std::unique_ptr<AdamW<F>> opt;
    std::unique_ptr<Trainer<Lm, F>> trainer;
  };
  F be;
  const auto start = [&] {
    Run r;
    r.model = make_decoder_model<LlamaGqa, F>(kVocab, 3, {});
    add_lora(*r.model, {.rank = 2, .alpha = 4}, 4);
    r.lora = std::make_unique<LoraModel<F>>(*r.model);
    r.opt = std::make_unique<AdamW<F>>(*r.lora, AdamWOptions{.weight_decay = 0.0});
    r.trainer = std::make_unique<Trainer<Lm, F>>(*r.lora, be, *r.opt,
                                                 TrainerOptions{.schedule = LrSchedule{.lr = 1e-2}, .split = {.shards = 1}});
    return r;
  };
  const auto step = [&](Run& r) {
    return r.trainer->step([&](int) { return BatchTargets{2, targets}; },
                           [&](const Shard& s, Lm& m, F& b) {
                             return m.forward(b, std::span(kIds).subspan(std::size_t(s.begin) * 5, std::size_t(s.size()) * 5),
                                              Shape{s.size(), 5});
                           });
  };
  Run run = start();
  const std::vector<float> before = base_weights(*run.model);
  std::vector<double> losses;
  for (int i = 0; i < 20; ++i) losses.push_back(step(run).loss);
  // (A random tiny base's frozen head keeps its logits near uniform: the loss moves little, but it moves.)
  BOOST_TEST(losses.back() < losses.front() - 0.05, "loss " << losses.front() << " -> " << losses.back());
  BOOST_TEST(base_weights(*run.model) == before, boost::test_tools::per_element());
  const TempDir dir("lora_run");
  run.trainer->save(dir.path / "ck", {});
  const SafeTensors saved = SafeTensors::load(dir.path / "ck" / "model.safetensors");
  BOOST_TEST(saved.names().size() == 28u);  // 7 targets x 2 blocks x (A, B)
  for (const std::string& n : saved.names()) BOOST_TEST(n.find(".lora_") != std::string::npos, n);
  const double next = step(run).loss;
  Run again = start();
  (void)again.trainer->resume(dir.path / "ck");
  BOOST_TEST(step(again).loss == next);
}

BOOST_AUTO_TEST_CASE(lora_settings_read_as_written) {
  const LoraOptions o = LoraOptions::parse("r=8,alpha=16.5,targets=q,v,down,rslora");
  BOOST_TEST(o.rank == 8);
  BOOST_TEST(o.alpha == 16.5);
  BOOST_TEST(o.rslora);
  BOOST_TEST(o.targets == (std::vector<std::string>{"q", "v", "down"}), boost::test_tools::per_element());
  BOOST_TEST(o.str() == "r=8,alpha=16.5,targets=q,v,down,rslora");
  BOOST_TEST(LoraOptions::parse(o.str()).str() == o.str());
  BOOST_TEST(LoraOptions::parse("alpha=4").str() == "r=16,alpha=4,targets=q,k,v,o,gate,up,down");
  BOOST_TEST(error_of([] { (void)LoraOptions::parse("r=0"); }).find("'r=0': r must be a number >= 1") !=
             std::string::npos);
  BOOST_TEST(error_of([] { (void)LoraOptions::parse("r=2.5"); }).find("whole number") != std::string::npos);
  BOOST_TEST(error_of([] { (void)LoraOptions::parse("q,k"); }).find("'q' is none of r=, alpha=") != std::string::npos);
  const LoraOptions d = LoraOptions::parse("r=4,dropout=0.05,targets=q,v");
  BOOST_TEST(d.dropout == 0.05);
  BOOST_TEST(d.str() == "r=4,alpha=32,targets=q,v,dropout=0.05");
  BOOST_TEST(LoraOptions::parse(d.str()).str() == d.str());
  BOOST_TEST(error_of([] { (void)LoraOptions::parse("dropout=1"); }).find("dropout must be below 1") !=
             std::string::npos);
  BOOST_TEST(error_of([] { (void)LoraOptions::parse("drop=0.1"); }).find("'drop=0.1' is none of") !=
             std::string::npos);
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
