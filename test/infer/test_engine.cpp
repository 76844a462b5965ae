// Engine (infer/engine.hpp): what it decodes is what the parts it owns
// give (Generator, ContinuousBatcher, TokenText) when wired by hand; the
// completion logic (end ids, stop strings, cancellation, finish reasons)
// ends a generation as documented; a quantised checkpoint decodes in its
// precision unless another is asked; bad settings and ids are Errors
// naming them.
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/errors.hpp"
#include "support/temp_dir.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/stop_strings.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/io/safetensors.hpp"

BOOST_AUTO_TEST_SUITE(test_engine)

using namespace xfmr;
using namespace xfmr::test;
namespace fs = std::filesystem;
using Be = CpuBackend<float>;

namespace {

const fs::path kModel = fs::path(XFMR_FIXTURE_DIR) / "families" / "smollm2";
const fs::path kTokenizer = fs::path(XFMR_FIXTURE_DIR) / "lm" / "tokenizer.json";

Engine smollm(std::string precision = "") {
  return Engine::load(kModel, {.precision = std::move(precision), .tokenizer = kTokenizer});
}

// What a Generator over the same model gives, wired by hand: the reference.
std::vector<std::int32_t> by_hand(const std::vector<std::int32_t>& prompt, int tokens, std::uint64_t seed,
                                  SamplingOptions sampling) {
  Pretrained<Be> p = load_model<Be>(kModel);
  Be be;
  const WeightCopies copies(be, *p.model);
  Rng rng(seed);
  return generate(*p.model, be, prompt, {.sampling = sampling, .max_tokens = tokens}, rng);
}

}  // namespace

BOOST_AUTO_TEST_CASE(generates_what_a_generator_gives_and_its_text) {
  Engine e = smollm();
  BOOST_TEST(e.precision() == "fp32");
  BOOST_TEST(e.format() == "llama");
  const std::vector<std::int32_t> prompt = e.prompt("Once upon");
  for (const SamplingOptions s : {SamplingOptions{.temperature = 0}, SamplingOptions{.temperature = 0.9, .top_k = 20}}) {
    std::string streamed;
    const Completion c = e.generate({.prompt = prompt, .sampling = s, .max_tokens = 20, .seed = 7, .ignore_eos = true},
                                    [&](std::string_view t) {
                                      streamed += t;
                                      return true;
                                    });
    BOOST_TEST(c.ids == by_hand(prompt, 20, 7, s));
    BOOST_TEST(c.reason == FinishReason::length);
    BOOST_TEST(c.prompt_tokens == int(prompt.size()));
    // The text is TokenText's over the same ids, and what on_text saw.
    TokenText text(e.tokenizer(), prompt.back());
    std::string expected;
    for (std::int32_t id : c.ids) expected += text.feed(id);
    expected += text.flush();
    BOOST_TEST(c.text == expected);
    BOOST_TEST(streamed == c.text);
  }
  // With the ids (a caller with a tokenizer of its own): each id once, in order.
  std::vector<std::int32_t> seen;
  const Completion with_ids = e.generate(
      {.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 12, .ignore_eos = true},
      OnToken([&](std::int32_t id, std::string_view) {
        if (id >= 0) seen.push_back(id);
        return true;
      }));
  BOOST_TEST(seen == with_ids.ids, boost::test_tools::per_element());
  // A restart id begins a fresh context: what Generator gives with the same restart.
  const std::int32_t restart = with_ids.ids[2];
  const Completion restarted =
      e.generate({.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 12, .ignore_eos = true, .restart = restart});
  {
    Pretrained<Be> p = load_model<Be>(kModel);
    Be be;
    const WeightCopies copies(be, *p.model);
    Rng rng(0);
    BOOST_TEST(restarted.ids == generate(*p.model, be, prompt, {.sampling = {.temperature = 0}, .max_tokens = 12,
                                                                 .restart = restart}, rng),
               boost::test_tools::per_element());
  }
  BOOST_TEST(error_of([&] { (void)e.generate_batch(std::vector<CompletionRequest>{{.prompt = prompt, .restart = restart}}, 1); })
                 .find("one sequence at a time") != std::string::npos);
  // The reference path (no cache) agrees token for token.
  const Completion cached = e.generate({.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 12, .ignore_eos = true});
  const Completion plain = e.generate(
      {.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 12, .ignore_eos = true, .use_cache = false});
  BOOST_TEST(plain.ids == cached.ids);
}

BOOST_AUTO_TEST_CASE(end_ids_stop_strings_and_cancellation_end_it) {
  Engine e = smollm();
  const std::vector<std::int32_t> prompt = e.prompt("The cat");
  const Completion whole = e.generate({.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 16, .ignore_eos = true});
  BOOST_REQUIRE(whole.ids.size() == 16u);
  // A stop id: the generation ends at it, which is drawn but not shown.
  const std::int32_t at = whole.ids[5];
  const Completion by_id = e.generate(
      {.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 16, .stop_ids = {at}, .ignore_eos = true});
  const auto first = std::find(whole.ids.begin(), whole.ids.end(), at);
  BOOST_TEST(by_id.ids == std::vector<std::int32_t>(whole.ids.begin(), first + 1), boost::test_tools::per_element());
  BOOST_TEST(by_id.reason == FinishReason::stop);
  // A stop string: the text ends before it.
  const auto ascii = std::find_if(whole.text.begin() + 1, whole.text.end(), [](char c) { return c > 32 && c < 0x7f; });
  if (ascii != whole.text.end()) {
    const std::string stop(1, *ascii);
    const Completion cut = e.generate(
        {.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 16, .stop = {stop}, .ignore_eos = true});
    BOOST_TEST(cut.text == whole.text.substr(0, whole.text.find(stop)));
    BOOST_TEST(cut.reason == FinishReason::stop);
  }
  // on_text returning false cancels after that token.
  int seen = 0;
  const Completion cancelled = e.generate(
      {.prompt = prompt, .sampling = {.temperature = 0}, .max_tokens = 16, .ignore_eos = true},
      [&](std::string_view) { return ++seen < 3; });
  BOOST_TEST(cancelled.ids.size() == 3u);
  BOOST_TEST(cancelled.reason == FinishReason::cancelled);
  // The end-of-text id ends it unless ignore_eos.
  const std::int32_t eos = e.tokenizer().start();
  BOOST_REQUIRE(eos >= 0);
  const Completion ended = e.generate({.prompt = prompt, .sampling = {.temperature = 1.5}, .max_tokens = 400, .seed = 3});
  const bool drew_eos = std::find(ended.ids.begin(), ended.ids.end(), eos) != ended.ids.end();
  if (drew_eos) {
    BOOST_TEST(ended.ids.back() == eos);
    BOOST_TEST(ended.reason == FinishReason::stop);
  } else {
    BOOST_TEST(ended.reason == FinishReason::length);
  }
}

BOOST_AUTO_TEST_CASE(batched_and_served_requests_get_what_one_alone_gets) {
  Engine e = smollm();
  std::vector<CompletionRequest> requests;
  for (const char* p : {"Once upon", "a", "The cat sat", "Why"})
    requests.push_back({.prompt = e.prompt(p),
                        .sampling = {.temperature = 0.8, .top_p = 0.9},
                        .max_tokens = 10,
                        .seed = 11 + requests.size(),
                        .ignore_eos = true});
  requests[2].stop = {"e"};
  const std::vector<Completion> batched = e.generate_batch(requests, 3);
  BOOST_REQUIRE(batched.size() == requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Completion alone = e.generate(requests[i]);
    BOOST_TEST(batched[i].ids == alone.ids);
    BOOST_TEST(batched[i].text == alone.text);
    BOOST_TEST(batched[i].reason == alone.reason);
  }
  // Served: submitted, then stepped on this thread.
  e.start_batching({.slots = 2, .context = 32});
  std::vector<Completion> served(requests.size());
  std::vector<std::string> streamed(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i)
    e.submit(
        requests[i],
        [&, i](std::string_view t) {
          streamed[i] += t;
          return true;
        },
        [&, i](const Completion& c) { served[i] = c; });
  while (e.step()) {
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    BOOST_TEST(served[i].ids == batched[i].ids);
    BOOST_TEST(served[i].text == batched[i].text);
    BOOST_TEST(streamed[i] == served[i].text);
  }
  BOOST_TEST(e.stats().finished == requests.size());
  BOOST_TEST(error_of([&] { (void)e.generate_batch(requests, 2); }).find("serving") != std::string::npos);
}

// A draft model (set_draft): with its drafts, batched and served requests
// get the tokens plain decoding gives, greedy and sampled, whether the
// draft is the model's weights in int8 or a model of another family
// (Qwen2's shape) with the same tokenizer. A draft whose tokenizer gives an
// id another text, or a draft step asked of an engine without a draft, is
// refused naming it.
BOOST_AUTO_TEST_CASE(a_draft_model_changes_no_token) {
  Engine plain = smollm();
  std::vector<CompletionRequest> requests;
  for (const char* p : {"Once upon", "The cat sat on the mat. The cat", "Why"})
    for (double t : {0.0, 0.8})
      requests.push_back({.prompt = plain.prompt(p), .sampling = {.temperature = t}, .max_tokens = 12,
                          .seed = 5 + requests.size(), .ignore_eos = true});
  const std::vector<Completion> expected = plain.generate_batch(requests, 3);
  BOOST_TEST(error_of([&] { (void)plain.generate_batch(requests, 3, {}, {.draft = 2}); }).find("set_draft") !=
             std::string::npos);
  const fs::path qwen2 = fs::path(XFMR_FIXTURE_DIR) / "families" / "qwen2";
  for (const bool same_weights : {true, false}) {
    BOOST_TEST_CONTEXT((same_weights ? "int8 draft" : "qwen2 draft")) {
      Engine e = smollm();
      e.set_draft(same_weights ? smollm("int8") : Engine::load(qwen2, {.tokenizer = kTokenizer}));
      BOOST_TEST(e.has_draft());
      const std::vector<Completion> got = e.generate_batch(requests, 3, {}, {.draft = 3});
      for (std::size_t i = 0; i < requests.size(); ++i) BOOST_TEST(got[i].ids == expected[i].ids);
      e.start_batching({.slots = 2, .context = 48, .speculation = {.draft = 3}});
      std::vector<Completion> served(requests.size());
      for (std::size_t i = 0; i < requests.size(); ++i)
        e.submit(requests[i], OnText{}, [&, i](const Completion& c) { served[i] = c; });
      while (e.step()) {
      }
      for (std::size_t i = 0; i < requests.size(); ++i) BOOST_TEST(served[i].ids == expected[i].ids);
      const BatchStats st = e.stats();
      BOOST_TEST_MESSAGE(st.accepted_tokens << " of " << st.drafted_tokens << " drafts drawn, " << st.steps
                                            << " steps");
      BOOST_TEST(st.drafted_tokens > 0u);
      if (same_weights) BOOST_TEST(st.accepted_tokens > 0u);  // misplaced drafts would hardly ever be drawn
    }
  }
  // A tokenizer with two ids swapped.
  const TempDir dir("draft");
  nlohmann::json tok = nlohmann::json::parse(std::ifstream(kTokenizer));
  auto& vocab = tok["model"]["vocab"];
  std::swap(vocab["a"], vocab["b"]);
  std::ofstream(dir.path / "tokenizer.json") << tok.dump();
  Engine e = smollm();
  BOOST_TEST(error_of([&] { e.set_draft(Engine::load(kModel, {.tokenizer = dir.path / "tokenizer.json"})); })
                 .find("gives id 97 another text") != std::string::npos);
  BOOST_TEST(!e.has_draft());
}

// A LoRA adapter (load_adapter, peft's format): the engine's logits are
// PyTorch's of the merged base (fixtures/lora, lora_reference.py); one
// generation and a batch of them decode the same tokens through it; half
// the scale moves the logits; a second adapter is refused; merged, the
// model and its export give those logits.
BOOST_AUTO_TEST_CASE(a_lora_adapter_gives_pytorchs_merged_logits) {
  const fs::path adapter = fs::path(XFMR_FIXTURE_DIR) / "lora" / "smollm2";
  const SafeTensors expected = SafeTensors::load(adapter / "expected.safetensors");
  const auto wide = expected.integers("ids");
  const std::vector<std::int32_t> ids(wide.begin(), wide.end());
  const auto want = expected.values<double>("logits");
  Engine e = smollm();
  const LoraOptions o = e.load_adapter(adapter);
  BOOST_TEST(o.rank == 4);
  const std::vector<float> got = e.logits(ids, 1, int(ids.size()));
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  }
  BOOST_TEST(worst <= 1e-4 * scale, "logits differ by " << worst << " at scale " << scale);
  const CompletionRequest r{.prompt = ids, .sampling = {.temperature = 0}, .max_tokens = 8, .ignore_eos = true};
  const std::vector<CompletionRequest> both = {r, r};
  BOOST_TEST(e.generate_batch(both, 2)[1].ids == e.generate(r).ids);
  BOOST_TEST(error_of([&] { (void)e.load_adapter(adapter); }).find("LoRA adapters already") != std::string::npos);
  // Exported, the adapter is merged first (an export would leave it out):
  // the merged model's logits are the adapted ones, and its export's.
  const TempDir dir("engine_lora");
  BOOST_TEST(error_of([&] { e.export_hf(dir.path / "hf", false); }).find("merge_adapter") != std::string::npos);
  e.merge_adapter();
  const std::vector<float> merged = e.logits(ids, 1, int(ids.size()));
  worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(merged[i]) - want[i]));
  BOOST_TEST(worst <= 1e-4 * scale, "merged logits differ by " << worst << " at scale " << scale);
  e.export_hf(dir.path / "hf", false);
  BOOST_TEST((Engine::load(dir.path / "hf").logits(ids, 1, int(ids.size())) == merged));
  BOOST_TEST(error_of([&] { e.merge_adapter(); }).find("no LoRA adapter") != std::string::npos);
  Engine half = smollm();
  (void)half.load_adapter(adapter, 0.5);
  const std::vector<float> h = half.logits(ids, 1, int(ids.size()));
  BOOST_TEST(std::abs(h[0] - got[0]) > 1e-4);
}

// Adapters beside the model (add_adapter), each request's choice: two
// adapters (the fixture at scale 1 and 3) and the bare model, greedy and
// sampled, in one batch and in one ragged step, each give what it gives
// alone; alone, a named adapter gives what load_adapter's (the one whose
// logits are PyTorch's above) gives; prompts share cached rows only with
// their own adapter's.
BOOST_AUTO_TEST_CASE(requests_with_other_adapters_decode_in_one_batch) {
  const fs::path adapter = fs::path(XFMR_FIXTURE_DIR) / "lora" / "smollm2";
  Engine e = smollm();
  (void)e.add_adapter("one", adapter);
  (void)e.add_adapter("three", adapter, 3.0);
  BOOST_TEST((e.adapter_names() == std::vector<std::string>{"one", "three"}));
  const std::vector<std::int32_t> prompt = {1, 7, 42, 9, 3, 11};
  std::vector<CompletionRequest> requests;
  for (const char* name : {"one", "", "three"})
    for (const double t : {0.0, 0.9})
      requests.push_back({.prompt = prompt,
                          .sampling = {.temperature = t},
                          .max_tokens = 12,
                          .seed = 5,
                          .ignore_eos = true,
                          .adapter = name});
  std::vector<std::vector<std::int32_t>> alone;
  for (const CompletionRequest& r : requests) alone.push_back(e.generate(r).ids);
  // Greedy: the adapters and the model differ (else this would prove nothing).
  BOOST_TEST(alone[0] != alone[2]);
  BOOST_TEST(alone[4] != alone[2]);
  BOOST_TEST(alone[0] != alone[4]);
  Engine own = smollm(), own3 = smollm();
  (void)own.load_adapter(adapter);
  (void)own3.load_adapter(adapter, 3.0);
  for (int i : {0, 1}) {
    CompletionRequest r = requests[std::size_t(i)];
    r.adapter.clear();
    BOOST_TEST(own.generate(r).ids == alone[std::size_t(i)]);
    BOOST_TEST(own3.generate(r).ids == alone[std::size_t(4 + i)]);
  }
  // All six in one batch (one ragged step reads every prompt: chunk 128),
  // twice: the second round's prompts find their rows in the cache, each
  // its own adapter's.
  for (int round = 0; round < 2; ++round) {
    const std::vector<Completion> batch = e.generate_batch(requests, int(requests.size()));
    for (std::size_t i = 0; i < requests.size(); ++i)
      BOOST_TEST(batch[i].ids == alone[i], "request " << i << " (adapter '" << requests[i].adapter << "')");
  }
  e.start_batching({.slots = 2, .context = 64});
  std::vector<Completion> served(3);
  for (std::size_t i = 0; i < 3; ++i)
    (void)e.submit(requests[2 * i], OnText{}, [&served, i](const Completion& c) { served[i] = c; });
  while (e.step()) {
  }
  for (std::size_t i = 0; i < 3; ++i) BOOST_TEST(served[i].ids == alone[2 * i]);
  // A name none was added under, and one added twice, are refused by name.
  CompletionRequest unknown = requests[0];
  unknown.adapter = "two";
  BOOST_TEST(error_of([&] { (void)e.submit(unknown, OnText{}, {}); }).find("no LoRA adapter named 'two'") !=
             std::string::npos);
  Engine f = smollm();
  BOOST_TEST(error_of([&] { (void)f.generate(unknown); }).find("none is loaded") != std::string::npos);
  (void)f.add_adapter("two", adapter);
  BOOST_TEST(error_of([&] { (void)f.add_adapter("two", adapter); }).find("loaded already") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_quantised_checkpoint_decodes_in_its_precision) {
  const TempDir dir("engine");
  const fs::path int8 = dir.path / "int8";
  (void)quantise_language_model<Be>(kModel, int8, "int8", kTokenizer);
  BOOST_TEST(Engine::check(int8, {}) == "int8");
  Engine e = Engine::load(int8);
  BOOST_TEST(e.precision() == "int8");
  BOOST_TEST(e.describe().find("int8") != std::string::npos);
  // Asked for another, the checkpoint's weights are read in that one.
  BOOST_TEST(Engine::load(int8, {.precision = "q4"}).precision() == "q4");
  // The checkpoint's precision on another backend names the checkpoint.
  BOOST_TEST(error_of([&] { (void)Engine::check(int8, {.backend = "cuda"}); }).find("checkpoint's int8") !=
             std::string::npos);
  // int8 greedy text is float32's, near enough to share its first tokens on this model.
  const Completion c = e.generate({.prompt = e.prompt("a"), .sampling = {.temperature = 0}, .max_tokens = 4});
  BOOST_TEST(!c.ids.empty());
}

BOOST_AUTO_TEST_CASE(bad_settings_and_ids_are_errors_naming_them) {
  BOOST_TEST(error_of([] { (void)Engine::load(kModel, {.backend = "tpu", .backend_option = "--backend"}); })
                 .find("unknown --backend 'tpu'") != std::string::npos);
  BOOST_TEST(error_of([] { (void)Engine::load(kModel, {.precision = "fp8"}); }).find("unknown precision 'fp8'") !=
             std::string::npos);
  BOOST_TEST(error_of([] { (void)Engine::load(kModel, {.tokenizer_option = "--tokenizer"}); }).find("--tokenizer") !=
             std::string::npos);
  Engine none = Engine::load(kModel, {.tokenizer_required = false});
  BOOST_TEST(!none.has_tokenizer());
  BOOST_TEST(error_of([&] { (void)none.tokenizer(); }).find("tokenizer") != std::string::npos);
  const Completion ids = none.generate({.prompt = {1, 2}, .sampling = {.temperature = 0}, .max_tokens = 3});
  BOOST_TEST(ids.ids.size() == 3u);
  BOOST_TEST(ids.text.empty());
  Engine e = smollm();
  BOOST_TEST(error_of([&] { (void)e.generate({.prompt = {1, 9999}}); }).find("prompt id 9999 at 1 outside") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { (void)e.generate({}); }).find("the prompt is empty") != std::string::npos);
  BOOST_TEST(error_of([&] { (void)e.logits(std::vector<std::int32_t>(65, 1), 1, 65); }).find("context is 64") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { e.submit({.prompt = {1}}, OnText{}, {}); }).find("start_batching") != std::string::npos);
  BOOST_TEST(error_of([] {
               (void)Engine::create(LanguageModelPresets::info("shakespeare-small"), 0, 1, {}, {.tokenizer_required = false});
             }).find("vocabulary") != std::string::npos);
}

// An embedding: the mean of the final hidden states over the positions, of
// unit length; the same while the engine serves (run between its steps).
BOOST_AUTO_TEST_CASE(an_embedding_is_the_mean_final_hidden_state_normalised) {
  Engine e = smollm();
  const std::vector<std::int32_t> ids = {5, 17, 40, 2};
  const std::vector<float> got = e.embedding(ids);
  const int D = e.architecture().d_model;
  BOOST_REQUIRE(got.size() == std::size_t(D));
  std::vector<double> mean(std::size_t(D), 0.0);
  e.visit([&]<class B>(LanguageModel<B>& model, B& be) {
    if constexpr (std::is_same_v<B, Be>) {  // the CPU's float32, which this engine runs
      const auto h = model.hidden(be, ids, Shape{1, int(ids.size())});
      for (std::size_t t = 0; t < ids.size(); ++t)
        for (int d = 0; d < D; ++d)
          mean[std::size_t(d)] += double(h[t * std::size_t(D) + std::size_t(d)]) / double(ids.size());
    }
  });
  double norm = 0.0;
  for (double m : mean) norm += m * m;
  norm = std::sqrt(norm);
  double length = 0.0;
  for (int d = 0; d < D; ++d) {
    BOOST_TEST(got[std::size_t(d)] == mean[std::size_t(d)] / norm, boost::test_tools::tolerance(1e-5));
    length += double(got[std::size_t(d)]) * got[std::size_t(d)];
  }
  BOOST_TEST(length == 1.0, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(e.embedding(std::vector<std::int32_t>{5, 17}) != got);
  // Serving: the embedding runs on the engine's thread, between steps.
  e.start_batching({.slots = 2, .context = 32});
  std::jthread engine([&](std::stop_token stop) { e.run(stop); });
  BOOST_TEST(e.embedding(ids) == got, boost::test_tools::per_element());
  BOOST_TEST(error_of([&] { (void)e.embedding(std::vector<std::int32_t>{}); }).find("no ids") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(logits_and_loss_are_the_models) {
  Engine e = smollm();
  Pretrained<Be> p = load_model<Be>(kModel);
  Be be;
  const std::vector<std::int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  const auto want = p.model->forward(be, ids, Shape{2, 4});
  const std::vector<float> got = e.logits(ids, 2, 4);
  BOOST_REQUIRE(got.size() == want.size());
  float worst = 0;  // (the engine's products may read its decoding copies: float32 panels, summed in another order)
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  BOOST_TEST(worst < 1e-5f);
  const LossSum sum = e.loss(ids, 3, 2, 0);
  BOOST_TEST(sum.counted == 6);
  BOOST_TEST(std::isfinite(sum.mean()));
}

BOOST_AUTO_TEST_SUITE_END()
