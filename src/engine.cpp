// engine.cpp: Engine (infer/engine.hpp), compiled once for every backend
// this xfmr has: what runs on the backend's type is EngineCoreFor<Be>;
// what turns tokens into completions (end ids, stop strings, finish
// reasons, whole UTF-8 text) is Engine's own, above it.
#include "xfmr/infer/engine.hpp"

#include "xfmr/infer/json_grammar.hpp"

#include <algorithm>
#include <cmath>
#include <future>
#include <mutex>
#include <optional>
#include <utility>

#include "xfmr/backend/factory.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/stop_strings.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/infer/window_loss.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/peft.hpp"

namespace xfmr {

namespace {

// The operations Engine needs of the model on its backend.
class Core : public detail::EngineCore {
 public:
  virtual const PresetInfo& preset() const = 0;
  virtual int vocab() const = 0;
  virtual std::size_t parameter_count() const = 0;
  virtual const DecoderOptions& options() const = 0;
  virtual std::string describe() const = 0;
  // adapter: the one every row takes (LinearAdapters' id; 0: none).
  virtual std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, const GenerateOptions& opts, int adapter,
                                             Rng& rng, const std::function<bool(std::int32_t)>& on_token) = 0;
  // A batcher for the engine's life (serving) or for one call
  // (generate_batch); draft: the draft model's core (the same backend's).
  virtual void start_batching(BatchOptions opts, Core* draft) = 0;
  virtual bool batching() const = 0;
  virtual void stop_batching() = 0;
  virtual int batch_context() const = 0;
  virtual std::uint64_t submit(BatchRequest r) = 0;
  virtual void post(std::function<void()> task) = 0;
  virtual std::vector<SlotState> slot_states() const = 0;
  virtual void cancel(std::uint64_t id) = 0;
  virtual void cancel_all() = 0;
  virtual void close() = 0;
  virtual bool idle() const = 0;
  virtual BatchStats stats() const = 0;
  virtual bool step() = 0;
  virtual void run(std::stop_token stop) = 0;
  virtual LossSum loss(std::span<const std::int32_t> tokens, int context, int batch, long windows) = 0;
  virtual std::vector<float> logits(std::span<const std::int32_t> ids, int B, int T) = 0;
  virtual std::vector<float> hidden(std::span<const std::int32_t> ids) = 0;
  virtual void export_hf(const std::filesystem::path& dir, bool overwrite, std::span<const AttachedFile> files) = 0;
  virtual void synchronize() = 0;
  virtual void weights_changed() = 0;
};

template <class Be>
class CoreFor final : public Core {
 public:
  using Lm = LanguageModel<Be>;
  CoreFor(std::unique_ptr<Lm> model, const std::string& backend, const std::string& precision)
      : model_(std::move(model)), be_(make_backend<Be>(backend, precision)) {
    model_->set_training(false);
    copies_.emplace(be_, *model_);
    generator_.emplace(*model_, be_);
  }
  ~CoreFor() override {
    batcher_.reset();  // before the copies it reads
  }

  const std::type_info& backend_type() const override { return typeid(Be); }
  void* model() override { return model_.get(); }
  void* backend() override { return &be_; }
  const PresetInfo& preset() const override { return model_->preset(); }
  int vocab() const override { return model_->vocab(); }
  std::size_t parameter_count() const override { return model_->parameter_count(); }
  const DecoderOptions& options() const override { return model_->options(); }
  std::string describe() const override { return xfmr::describe(be_); }

  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, const GenerateOptions& opts, int adapter,
                                     Rng& rng, const std::function<bool(std::int32_t)>& on_token) override {
    struct Select {  // for this call
      Lm& m;
      Select(Lm& model, int id) : m(model) { m.select_adapter(id); }
      ~Select() { m.select_adapter(0); }
    } select(*model_, adapter);
    return (*generator_)(std::move(prompt), opts, rng, [&](std::int32_t id) { return on_token(id); });
  }

  void start_batching(BatchOptions opts, Core* draft) override {
    batcher_.reset();
    require(!draft || draft->backend_type() == typeid(Be), "the draft model runs on another backend");
    batcher_.emplace(*model_, be_, opts, draft ? static_cast<Lm*>(draft->model()) : nullptr,
                     draft ? static_cast<Be*>(draft->backend()) : nullptr);
  }
  bool batching() const override { return batcher_.has_value(); }
  void stop_batching() override { batcher_.reset(); }
  int batch_context() const override { return batcher().context(); }
  std::uint64_t submit(BatchRequest r) override { return batcher().submit(std::move(r)); }
  void post(std::function<void()> task) override { batcher().post(std::move(task)); }
  std::vector<SlotState> slot_states() const override {
    return batcher_ ? batcher_->slot_states() : std::vector<SlotState>{};
  }
  void cancel(std::uint64_t id) override { batcher().cancel(id); }
  void cancel_all() override { batcher().cancel_all(); }
  void close() override { batcher().close(); }
  bool idle() const override { return batcher().idle(); }
  BatchStats stats() const override { return batcher_ ? batcher_->stats() : BatchStats{}; }
  bool step() override { return batcher().step(); }
  void run(std::stop_token stop) override { batcher().run(std::move(stop)); }

  LossSum loss(std::span<const std::int32_t> tokens, int context, int batch, long windows) override {
    return window_loss(*model_, be_, tokens, context, batch, windows);
  }
  std::vector<float> logits(std::span<const std::int32_t> ids, int B, int T) override {
    model_->set_training(false);
    const auto out = be_.host_view(model_->forward(be_, ids, Shape{B, T}), staging_);
    return std::vector<float>(out.begin(), out.end());
  }
  std::vector<float> hidden(std::span<const std::int32_t> ids) override {
    model_->set_training(false);
    const auto out = be_.host_view(model_->hidden(be_, ids, Shape{1, int(ids.size())}), staging_);
    return std::vector<float>(out.begin(), out.end());
  }
  void export_hf(const std::filesystem::path& dir, bool overwrite, std::span<const AttachedFile> files) override {
    save_pretrained(*model_, dir, overwrite, files);
  }
  void synchronize() override { be_.synchronize(); }
  void weights_changed() override {
    batcher_.reset();
    copies_.reset();
    model_->set_training(false);
    copies_.emplace(be_, *model_);
  }

 private:
  ContinuousBatcher<Lm, Be>& batcher() const {
    require(batcher_.has_value(), "the engine is not batching (start_batching first)");
    return const_cast<ContinuousBatcher<Lm, Be>&>(*batcher_);
  }

  std::unique_ptr<Lm> model_;
  Be be_;
  std::optional<WeightCopies<Be>> copies_;  // the precision's copies, for the engine's life
  std::optional<Generator<Lm, Be>> generator_;
  std::optional<ContinuousBatcher<Lm, Be>> batcher_;
  std::vector<typename Be::Scalar> staging_;
};

// check_backend, naming a precision the checkpoint chose as the checkpoint's.
void check_engine_backend(const EngineOptions& o, const std::string& precision) {
  check_backend(o.backend, precision, o.backend_option,
                !o.precision.empty() || !is_decoding_precision(precision)
                    ? o.precision_option
                    : "precision (the checkpoint's " + precision + " weights)");
}

}  // namespace

struct Engine::Impl {
  std::unique_ptr<Core> core;
  std::optional<FoundTokenizer> tok;
  std::string no_tokenizer;  // why there is none
  CheckpointFormat format = CheckpointFormat::xfmr;
  Metadata metadata;
  std::vector<std::int32_t> end_ids;  // the end-of-text id, when the tokenizer has one
  // Each id's text, for structured output; made at its first request.
  std::mutex pieces_made;
  std::shared_ptr<const TokenPieces> pieces;
  std::unique_ptr<Engine> draft;  // speculative decoding's (set_draft)
  std::vector<std::string> adapters;  // add_adapter's names: adapter k + 1 (LinearAdapters' id)
  // A request's adapter's id (0: none), or an Error naming the adapters there are.
  int adapter_id(const CompletionRequest& r) const {
    if (r.adapter.empty()) return 0;
    const auto at = std::find(adapters.begin(), adapters.end(), r.adapter);
    if (at != adapters.end()) return int(at - adapters.begin()) + 1;
    std::string names;
    for (const std::string& n : adapters) names += (names.empty() ? "" : ", ") + n;
    detail::fail("no LoRA adapter named '", r.adapter, "' (", adapters.empty() ? "none is loaded" : "loaded: " + names,
                 ")");
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  core_ = impl_->core.get();
  tokenizer_ = impl_->tok ? &impl_->tok->tokenizer : nullptr;
  if (tokenizer_ && tokenizer_->end() >= 0) impl_->end_ids.push_back(tokenizer_->end());
}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

std::string Engine::check(const std::filesystem::path& path, const EngineOptions& opts) {
  check_backend_name(opts.backend, opts.backend_option);
  if (!opts.precision.empty()) check_precision_name(opts.precision, opts.precision_option);
  Metadata metadata = is_checkpoint(path) ? read_checkpoint_metadata(path, opts.format) : Metadata{};
  if (!is_checkpoint(path) && std::filesystem::is_regular_file(path) && checkpoint_format(path) == CheckpointFormat::gguf)
    metadata[kWeightsKey] = gguf_precision(open_gguf_model(path));  // its matrices' type's
  if (const auto lora = metadata.find("lora"); lora != metadata.end()) {
    const auto named = metadata.find("lora_base");  // xfmr-lm's --init, the path Python's Trainer's model came from
    const std::string base = named != metadata.end() ? named->second : "the model they were trained on";
    detail::fail(path.string(), " holds LoRA adapters (", lora->second, "), not a model: load ", base,
                 " with them as its adapter (xfmr-lm sample --model ", base, " --lora ", path.string(),
                 "; Python's load_adapter)");
  }
  const std::string precision = decoding_precision(opts.precision, metadata);
  check_engine_backend(opts, precision);
  return precision;
}

Engine Engine::load(const std::filesystem::path& path, EngineOptions opts) {
  const std::string precision = check(path, opts);
  return with_backend(opts.backend, [&]<class Be>() {
    auto impl = std::make_unique<Impl>();
    Pretrained<Be> p = load_model<Be>(path);
    try {
      impl->tok.emplace(load_model_tokenizer(p, opts.tokenizer));
    } catch (const Error& e) {
      if (opts.tokenizer_required || !opts.tokenizer.empty())
        detail::fail(e.what(), opts.tokenizer.empty() ? " (name one with " + opts.tokenizer_option + ")" : "");
      impl->no_tokenizer = e.what();
    }
    impl->format = p.format;
    impl->metadata = std::move(p.metadata);
    impl->core = std::make_unique<CoreFor<Be>>(std::move(p.model), opts.backend, precision);
    Engine e(std::move(impl));
    e.backend_ = opts.backend;
    e.precision_ = precision;
    return e;
  });
}

Engine Engine::create(const PresetInfo& arch, int vocab, std::uint64_t seed, DecoderOptions model,
                      EngineOptions opts) {
  const std::string precision = opts.precision.empty() ? "fp32" : opts.precision;
  check_training_precision(precision, opts.precision_option);
  check_backend(opts.backend, precision, opts.backend_option, opts.precision_option);
  auto impl = std::make_unique<Impl>();
  if (!opts.tokenizer.empty()) {
    impl->tok.emplace(FoundTokenizer{ModelTokenizer::load(opts.tokenizer), std::filesystem::absolute(opts.tokenizer)});
    if (vocab == 0) vocab = impl->tok->tokenizer.size();
    impl->tok->padding = impl->tok->tokenizer.check_fits(vocab, arch.name);
  } else {
    require(!opts.tokenizer_required, "a new model needs a tokenizer (or tokenizer_required false)");
    impl->no_tokenizer = "the model was created without a tokenizer";
  }
  require(vocab > 0, "a new model needs a vocabulary: give its size, or a tokenizer whose size it is");
  return with_backend(opts.backend, [&]<class Be>() {
    impl->core = std::make_unique<CoreFor<Be>>(make_language_model<Be>(arch, vocab, seed, model), opts.backend,
                                               precision);
    Engine e(std::move(impl));
    e.backend_ = opts.backend;
    e.precision_ = precision;
    return e;
  });
}

const PresetInfo& Engine::architecture() const { return static_cast<Core*>(core_)->preset(); }
int Engine::vocab() const { return static_cast<Core*>(core_)->vocab(); }
int Engine::max_t() const { return architecture().max_t; }
std::size_t Engine::parameter_count() const { return static_cast<Core*>(core_)->parameter_count(); }
const DecoderOptions& Engine::model_options() const { return static_cast<Core*>(core_)->options(); }
std::string_view Engine::format() const { return format_name(impl_->format); }
std::string Engine::describe() const { return static_cast<Core*>(core_)->describe(); }
const Metadata& Engine::metadata() const { return impl_->metadata; }

const ModelTokenizer& Engine::tokenizer() const {
  require(tokenizer_ != nullptr, impl_->no_tokenizer, " (load the model with a tokenizer)");
  return *tokenizer_;
}
const std::filesystem::path& Engine::tokenizer_source() const {
  (void)tokenizer();
  return impl_->tok->source;
}
int Engine::drawn_vocabulary() const {
  return impl_->tok && impl_->tok->padding > 0 ? impl_->tok->tokenizer.size() : vocab();
}

std::vector<std::int32_t> Engine::prompt(std::string_view text) const {
  std::vector<std::int32_t> ids = tokenizer().encode(text);
  if (ids.empty()) {
    require(tokenizer().start() >= 0, "the prompt is empty, and the tokenizer has no token a text starts after");
    ids.push_back(tokenizer().start());
  }
  check_ids(ids, "prompt");
  return ids;
}

void Engine::check_ids(std::span<const std::int32_t> ids, std::string_view what) const {
  const int V = vocab();
  for (std::size_t i = 0; i < ids.size(); ++i)
    require(ids[i] >= 0 && ids[i] < V, what, " id ", ids[i], " at ", i, " outside [0, ", V,
            "), the model's vocabulary");
}

namespace {

// A completion's text and end as its tokens come: the end ids (not
// shown), the stop strings, whole UTF-8 characters.
class CompletionText {
 public:
  CompletionText(const ModelTokenizer* tok, const CompletionRequest& r, std::span<const std::int32_t> end_ids)
      : ends_(r.stop_ids) {
    if (!r.ignore_eos) ends_.insert(ends_.end(), end_ids.begin(), end_ids.end());
    if (tok) text_.emplace(*tok, r.prompt.back(), r.stop);
  }
  // The text `id` completes; ended() once it ends the completion.
  std::string feed(std::int32_t id) {
    const bool end = std::find(ends_.begin(), ends_.end(), id) != ends_.end();
    std::string piece = text_ ? text_->feed(id, !end) : std::string();
    ended_ = end || (text_ && text_->stopped());
    return piece;
  }
  bool ended() const { return ended_; }
  std::string flush() { return text_ ? text_->flush() : std::string(); }
  const std::vector<std::int32_t>& end_ids() const { return ends_; }

 private:
  std::vector<std::int32_t> ends_;
  std::optional<TokenText> text_;
  bool ended_ = false;
};

}  // namespace

Completion Engine::generate(const CompletionRequest& r, const OnText& on_text) {
  if (!on_text) return generate(r, OnToken{});
  return generate(r, OnToken([&](std::int32_t, std::string_view text) { return on_text(text); }));
}

Completion Engine::generate(const CompletionRequest& r, const OnToken& on_token) {
  require(!r.prompt.empty(), "the prompt is empty (give at least one token)");
  check_ids(r.prompt, "prompt");
  r.sampling.validate();
  require(r.max_tokens >= 0, "max_tokens ", r.max_tokens, " is negative");
  require(r.logprobs < 0, "logprobs: the batcher's (Engine::submit, generate_batch), not generate's");
  require(!r.json_schema, "a json_schema: the batcher's (Engine::submit, generate_batch), not generate's");
  const int adapter = impl_->adapter_id(r);
  Completion c;
  c.prompt_tokens = int(r.prompt.size());
  CompletionText text(tokenizer_, r, impl_->end_ids);
  Rng rng(r.seed);
  const GenerateOptions opts{.sampling = r.sampling,
                             .max_tokens = r.max_tokens,
                             .restart = r.restart,
                             .use_cache = r.use_cache,
                             .vocabulary = drawn_vocabulary() < vocab() ? drawn_vocabulary() : 0};
  c.ids = static_cast<Core*>(core_)->generate(r.prompt, opts, adapter, rng, [&](std::int32_t id) {
    const std::string piece = text.feed(id);
    c.text += piece;
    if (text.ended()) c.reason = FinishReason::stop;
    if (on_token && !on_token(id, piece) && !text.ended()) {
      c.reason = FinishReason::cancelled;
      return false;
    }
    return !text.ended();
  });
  const std::string rest = text.flush();
  c.text += rest;
  if (!rest.empty() && on_token) on_token(-1, rest);
  return c;
}

namespace {

// A request for the batcher, its text and end kept by `state` (which the
// callbacks share), as a Completion when it finishes.
struct Pending {
  Completion completion;
  std::optional<CompletionText> text;
  bool cancelled = false;  // on_text said stop
};

BatchRequest batch_request(const CompletionRequest& r, int vocabulary, int adapter, const std::shared_ptr<Pending>& p,
                           OnStep on_step, OnCompletion on_finish,
                           const std::shared_ptr<const TokenPieces>& pieces = nullptr) {
  require(!r.restart, "a restart id: one sequence at a time (Engine::generate)");
  require(r.use_cache, "use_cache false: one sequence at a time (Engine::generate)");
  std::shared_ptr<TokenConstraint> constraint;
  if (r.json_schema) constraint = std::make_shared<JsonConstraint>(r.json_schema, pieces, p->text->end_ids());
  p->completion.prompt_tokens = int(r.prompt.size());
  return BatchRequest{.prompt = r.prompt,
                      .sampling = r.sampling,
                      .max_tokens = r.max_tokens,
                      .stop_ids = p->text->end_ids(),
                      .vocabulary = vocabulary,
                      .seed = r.seed,
                      .adapter = adapter,
                      .top_logprobs = r.logprobs,
                      .on_logprobs = [p](const TokenLogprobs& lp) { p->completion.logprobs.push_back(lp); },
                      .constraint = std::move(constraint),
                      .on_token =
                          [p, on_step](std::int32_t id) {
                            Completion& c = p->completion;
                            c.ids.push_back(id);
                            const std::string piece = p->text->feed(id);
                            c.text += piece;
                            const TokenLogprobs* lp = c.logprobs.size() == c.ids.size() ? &c.logprobs.back() : nullptr;
                            if (on_step && !on_step({id, piece, lp}) && !p->text->ended()) {
                              p->cancelled = true;
                              return false;
                            }
                            return !p->text->ended();
                          },
                      .on_finish =
                          [p, on_step, on_finish = std::move(on_finish)](const BatchResult& b) {
                            Completion& c = p->completion;
                            const std::string rest = p->text->flush();
                            c.text += rest;
                            if (!rest.empty() && on_step) on_step({-1, rest, nullptr});
                            c.reason = p->cancelled ? FinishReason::cancelled : b.reason;
                            c.error = b.error;
                            c.cached_tokens = b.cached_tokens;
                            c.prompt_seconds = b.prompt_seconds;
                            c.generation_seconds = b.generation_seconds;
                            if (on_finish) on_finish(c);
                          }};
}

}  // namespace

std::vector<Completion> Engine::generate_batch(std::span<const CompletionRequest> requests, int batch_size,
                                               const std::function<bool()>& interrupted, Speculation speculation) {
  require(batch_size >= 1, "generate_batch: batch_size ", batch_size, " must be at least 1");
  Core& core = *static_cast<Core*>(core_);
  require(!core.batching(), "generate_batch: the engine is serving (its batcher runs the requests: submit)");
  std::vector<Completion> out(requests.size());
  if (requests.empty()) return out;
  // The cache holds what the longest asks for (not max_t: a slot of Llama
  // 3's 131072 positions for a few tokens).
  long context = 2;
  for (const CompletionRequest& r : requests) context = std::max(context, long(r.prompt.size()) + r.max_tokens);
  start_batching({.slots = int(std::min<std::size_t>(requests.size(), std::size_t(batch_size))),
                  .context = int(std::min<long>(context, max_t())),
                  .queue = int(requests.size()),
                  .speculation = speculation});
  struct StopBatching {
    Core& core;
    ~StopBatching() { core.stop_batching(); }
  } stop_batching{core};
  const int vocabulary = drawn_vocabulary() < vocab() ? drawn_vocabulary() : 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const CompletionRequest& r = requests[i];
    check_ids(r.prompt, "prompt");
    auto p = std::make_shared<Pending>();
    p->text.emplace(tokenizer_, r, impl_->end_ids);
    out[i].prompt_tokens = int(r.prompt.size());
    if (r.max_tokens == 0) continue;
    core.submit(batch_request(r, vocabulary, impl_->adapter_id(r), p, {},
                              [&c = out[i]](const Completion& done) { c = done; },
                              r.json_schema ? pieces() : nullptr));
  }
  while (core.step())
    if (interrupted && interrupted()) {
      core.cancel_all();
      while (core.step()) {
      }
      break;
    }
  return out;
}

void Engine::start_batching(BatchOptions opts) {
  require(opts.speculation.draft == 0 || impl_->draft, "draft ", opts.speculation.draft,
          " tokens a step need a draft model (set_draft)");
  static_cast<Core*>(core_)->start_batching(
      opts, opts.speculation.draft > 0 ? static_cast<Core*>(impl_->draft->core_) : nullptr);
}

void Engine::set_draft(Engine draft) {
  require(!static_cast<Core*>(core_)->batching(), "set_draft: the engine is batching (set it before start_batching)");
  require(draft.backend_ == backend_, "the draft model's backend ", draft.backend_, " is not the model's, ", backend_);
  require(draft.core_->backend_type() == core_->backend_type(), "the draft model's backend type is not the model's");
  // The same tokenizer: each id the same text, the same start and end.
  require(has_tokenizer() && draft.has_tokenizer(),
          "a draft model and the model need their tokenizers, to check that they are one");
  const ModelTokenizer &a = tokenizer(), &b = draft.tokenizer();
  require(a.size() == b.size(), "the draft model's tokenizer has ", b.size(), " tokens, the model's ", a.size());
  require(a.start() == b.start() && a.end() == b.end(), "the draft model's tokenizer starts and ends with ids ",
          b.start(), " and ", b.end(), ", the model's with ", a.start(), " and ", a.end());
  const auto pa = pieces(), pb = draft.pieces();
  for (std::size_t id = 0; id < pa->size(); ++id)
    require((*pa)[id] == (*pb)[id], "the draft model's tokenizer gives id ", id, " another text than the model's");
  impl_->draft = std::make_unique<Engine>(std::move(draft));
}
bool Engine::has_draft() const { return impl_->draft != nullptr; }

LoraOptions Engine::load_adapter(const std::filesystem::path& dir, double scale) {
  require(!static_cast<Core*>(core_)->batching(), "load_adapter: the engine is batching (load it before start_batching)");
  require(std::isfinite(scale) && scale > 0, "load_adapter: scale ", scale, " must be positive");
  LoraOptions o;
  visit([&]<class Be>(LanguageModel<Be>& model, Be&) {
    if constexpr (std::is_same_v<Be, CpuBackend<float>>) {
      o = load_peft_adapter(model, dir);
      model.visit_adapters([&](std::string_view, LinearAdapters<Be>& adapters, auto&) {
        for (auto& x : adapters.list())
          if (x.id == 0) x.scale *= scale;
      });
    } else {
      detail::fail("load_adapter: LoRA runs on the CPU backend (it has not run on a GPU yet), not ", backend_);
    }
  });
  return o;
}
LoraOptions Engine::add_adapter(const std::string& name, const std::filesystem::path& dir, double scale) {
  require(!static_cast<Core*>(core_)->batching(), "add_adapter: the engine is batching (add it before start_batching)");
  require(!name.empty(), "add_adapter: an adapter needs a name");
  require(std::find(impl_->adapters.begin(), impl_->adapters.end(), name) == impl_->adapters.end(),
          "add_adapter: an adapter named '", name, "' is loaded already");
  require(std::isfinite(scale) && scale > 0, "add_adapter: scale ", scale, " must be positive");
  const int id = int(impl_->adapters.size()) + 1;
  LoraOptions o;
  visit([&]<class Be>(LanguageModel<Be>& model, Be&) {
    if constexpr (std::is_same_v<Be, CpuBackend<float>>) {
      o = load_peft_adapter(model, dir, id);
      model.visit_adapters([&](std::string_view, LinearAdapters<Be>& adapters, auto&) {
        for (auto& x : adapters.list())
          if (x.id == id) x.scale *= scale;
      });
    } else {
      detail::fail("add_adapter: LoRA runs on the CPU backend (it has not run on a GPU yet), not ", backend_);
    }
  });
  impl_->adapters.push_back(name);
  return o;
}
const std::vector<std::string>& Engine::adapter_names() const { return impl_->adapters; }
const Engine* Engine::draft() const { return impl_->draft.get(); }
int Engine::batch_context() const { return static_cast<Core*>(core_)->batch_context(); }
std::uint64_t Engine::submit(CompletionRequest r, OnText on_text, OnCompletion on_finish) {
  OnStep on_step;
  if (on_text) on_step = [on_text = std::move(on_text)](const TokenStep& t) { return on_text(t.text); };
  return submit(std::move(r), std::move(on_step), std::move(on_finish));
}
std::uint64_t Engine::submit(CompletionRequest r, OnStep on_step, OnCompletion on_finish) {
  require(!r.prompt.empty(), "the prompt is empty (give at least one token)");
  auto p = std::make_shared<Pending>();
  p->text.emplace(tokenizer_, r, impl_->end_ids);
  const int vocabulary = drawn_vocabulary() < vocab() ? drawn_vocabulary() : 0;
  return static_cast<Core*>(core_)->submit(batch_request(r, vocabulary, impl_->adapter_id(r), p, std::move(on_step),
                                                         std::move(on_finish), r.json_schema ? pieces() : nullptr));
}
std::shared_ptr<const TokenPieces> Engine::pieces() const {
  std::lock_guard lock(impl_->pieces_made);
  if (!impl_->pieces) {
    // After an ordinary id (a SentencePiece's text drops its space after the start token).
    const ModelTokenizer& tok = tokenizer();
    const std::int32_t ordinary = tok.start() == 0 ? 1 : 0;
    auto p = std::make_shared<TokenPieces>(std::size_t(tok.size()));
    for (int id = 0; id < tok.size(); ++id) (*p)[std::size_t(id)] = tok.piece(ordinary, id);
    impl_->pieces = std::move(p);
  }
  return impl_->pieces;
}
std::vector<SlotState> Engine::slot_states() const { return static_cast<Core*>(core_)->slot_states(); }
void Engine::cancel(std::uint64_t id) { static_cast<Core*>(core_)->cancel(id); }
void Engine::cancel_all() { static_cast<Core*>(core_)->cancel_all(); }
void Engine::close() { static_cast<Core*>(core_)->close(); }
bool Engine::idle() const { return static_cast<Core*>(core_)->idle(); }
BatchStats Engine::stats() const { return static_cast<Core*>(core_)->stats(); }
bool Engine::step() { return static_cast<Core*>(core_)->step(); }
void Engine::run(std::stop_token stop) { static_cast<Core*>(core_)->run(std::move(stop)); }

LossSum Engine::loss(std::span<const std::int32_t> tokens, int context, int batch, long windows) {
  require(context >= 1 && context <= max_t(), "context ", context, " outside [1, ", max_t(), "], the model's");
  check_ids(tokens, "token");
  return static_cast<Core*>(core_)->loss(tokens, context, batch, windows);
}
std::vector<float> Engine::logits(std::span<const std::int32_t> ids, int B, int T) {
  require(B > 0 && T > 0 && ids.size() == std::size_t(B) * T, "logits: ", ids.size(), " ids for a batch of ", B,
          " x ", T);
  require(T <= max_t(), "logits: ", T, " positions; the model's context is ", max_t());
  check_ids(ids, "logits:");
  return static_cast<Core*>(core_)->logits(ids, B, T);
}
std::vector<float> Engine::embedding(std::span<const std::int32_t> ids) {
  require(!ids.empty(), "embedding: no ids");
  require(int(ids.size()) <= max_t(), "embedding: ", ids.size(), " positions; the model's context is ", max_t());
  check_ids(ids, "embedding:");
  Core& core = *static_cast<Core*>(core_);
  std::vector<float> h;
  if (core.batching()) {  // on the engine's thread, between its steps
    std::promise<std::vector<float>> done;
    auto result = done.get_future();
    core.post([&] {
      try {
        done.set_value(core.hidden(ids));
      } catch (...) {
        done.set_exception(std::current_exception());
      }
    });
    h = result.get();
  } else {
    h = core.hidden(ids);
  }
  const std::size_t T = ids.size(), D = h.size() / T;
  std::vector<double> mean(D, 0.0);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t d = 0; d < D; ++d) mean[d] += h[t * D + d];
  double norm = 0.0;
  for (double& m : mean) {
    m /= double(T);
    norm += m * m;
  }
  norm = std::sqrt(norm);
  std::vector<float> out(D);
  for (std::size_t d = 0; d < D; ++d) out[d] = float(norm > 0 ? mean[d] / norm : 0.0);
  return out;
}
namespace {
// An export writes the base's weights alone: one of a model with adapters would drop them.
void check_no_adapters(Engine& e, const char* what) {
  e.visit([&]<class Be>(LanguageModel<Be>& model, Be&) {
    model.visit_adapters([&](std::string_view name, LinearAdapters<Be>& adapters, auto&) {
      require(adapters.empty(), what, ": ", name, " holds LoRA adapters, which the export would leave out ",
              "(merge_adapter folds the model's own into its weights first)");
    });
  });
}
}  // namespace

void Engine::merge_adapter() {
  require(!static_cast<Core*>(core_)->batching(), "merge_adapter: the engine is batching");
  require(impl_->adapters.empty(), "merge_adapter: adapters are loaded beside the model (add_adapter), whose base a "
          "merge would change");
  bool any = false;
  visit([&]<class Be>(LanguageModel<Be>& model, Be& be) {
    model.visit_adapters([&](std::string_view, LinearAdapters<Be>& adapters, auto&) { any = any || !adapters.empty(); });
    require(any, "merge_adapter: the model has no LoRA adapter (load_adapter)");
    if constexpr (std::is_same_v<Be, CpuBackend<float>>) merge_lora(be, model);
    else detail::fail("merge_adapter: LoRA runs on the CPU backend (it has not run on a GPU yet), not ", backend_);
  });
  weights_changed();
}

void Engine::export_hf(const std::filesystem::path& dir, bool overwrite) {
  require(!dir.empty(), "export_hf: no directory named (an empty path)");
  check_no_adapters(*this, "export_hf");
  const std::vector<AttachedFile> files = tokenizer_ ? tokenizer_->attached_files() : std::vector<AttachedFile>{};
  static_cast<Core*>(core_)->export_hf(dir, overwrite, files);
}
void Engine::export_gguf(const std::filesystem::path& file, GgmlType type, bool overwrite) {
  require(!file.empty(), "export_gguf: no file named (an empty path)");
  require(overwrite || !std::filesystem::exists(file), file.string(), " exists already (overwrite replaces it)");
  check_no_adapters(*this, "export_gguf");
  visit([&]<class Be>(LanguageModel<Be>& model, Be&) { save_gguf(model, file, type, tokenizer_); });
}
void Engine::synchronize() { static_cast<Core*>(core_)->synchronize(); }
void Engine::weights_changed() { static_cast<Core*>(core_)->weights_changed(); }

}  // namespace xfmr
