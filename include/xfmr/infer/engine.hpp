// engine.hpp: Engine, a language model ready to decode: the model, its
// tokenizer, the backend and precision it runs in, the weights' decoding
// copies, and what turns tokens into a completion (end ids, stop strings,
// finish reasons, text in whole UTF-8 characters). xfmr-lm's sample and
// eval, xfmr-serve, the Python module and xfmr-bench --pretrained all
// decode through it; none assembles a model, a backend and a Generator
// itself.
//
//   auto engine = xfmr::Engine::load("SmolLM-135M", {.precision = "int8"});
//   const xfmr::Completion c = engine.generate({.prompt = engine.prompt("Once upon a time"), .max_tokens = 64},
//                                              [](std::string_view text) { std::cout << text; return true; });
//   // c.text, c.ids, c.reason (stop: an end token or a stop string; length: max_tokens)
//
// add_adapter(name, dir): a LoRA adapter beside the model that a request
//   names (CompletionRequest::adapter); several, decoded in one batch.
// load(path, opts): any model load_model reads (io/pretrained.hpp). The
//   backend is a setting (opts.backend: backend/factory.hpp's names), not a
//   type; the precision is opts.precision, or when empty a quantised
//   checkpoint's (int8, q4: its weights as saved), else fp32. The tokenizer
//   is opts.tokenizer, else the model's own; with opts.tokenizer_required
//   false a model without one still decodes ids (Python's logits).
// create(arch, vocab, seed, opts): a new model of an architecture.
// generate(request, on_text): one sequence, through the KV cache (or, with
//   use_cache false, the context recomputed a token: the reference path);
//   on_text sees each token's text as it comes (streaming; returning false
//   ends it, reason cancelled). The cache serves call after call.
// generate_batch(requests, batch_size): many at once, batch_size decoded
//   together (infer/continuous_batching.hpp), each getting what generate
//   gives it alone; with speculative decoding (prompt lookup, or a draft
//   model given by set_draft), the same in fewer steps.
// start_batching(opts), then submit / cancel / step / run: the server's
//   engine, requests coming from any thread and decoded together on the
//   thread that runs it (continuous_batching.hpp's rules).
// loss, logits: the model's numbers on token windows and ids; embedding:
//   a text's vector (the mean final hidden state, of unit length), run on
//   the engine's thread between steps while it serves.
// visit(f): f(LanguageModel<Be>&, Be&) with the backend's type, for what
//   needs the model itself (a trainer, a benchmark's ceilings); after the
//   weights change, weights_changed() makes the copies again.
//
// Compiled once (src/engine.cpp), for every backend this xfmr has. One call
// that runs the model at a time; submit, cancel and stats from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "xfmr/backend/factory.hpp"
#include "xfmr/infer/continuous_batching.hpp"
#include "xfmr/infer/sampling.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/lora.hpp"

namespace xfmr {

class JsonSchema;  // infer/json_grammar.hpp

struct EngineOptions {
  std::string backend = "cpu";  // cpu, cuda, cuda-tf32, cuda-bf16
  std::string precision{};      // fp32, bf16, int8, q4; empty: the checkpoint's (int8, q4), else fp32
  std::filesystem::path tokenizer{};  // a tokenizer file or directory; empty: the model's own
  bool tokenizer_required = true;     // false: a model without a tokenizer decodes ids only
  std::string format = "xfmr-lm";     // the program whose checkpoints it reads (another's is refused)
  // The names errors give the settings (a program's options: "--backend").
  std::string backend_option = "backend", precision_option = "precision", tokenizer_option = "tokenizer";
};

// One generation. The end-of-text id (the tokenizer's end()) ends it
// unless ignore_eos; stop_ids end it too; neither is shown in the text. A
// stop string ends it before the string, which is never shown.
struct CompletionRequest {
  std::vector<std::int32_t> prompt{};  // ids (Engine::prompt makes them from text)
  SamplingOptions sampling{};
  int max_tokens = 100;
  std::uint64_t seed = 0;
  std::vector<std::string> stop{};
  std::vector<std::int32_t> stop_ids{};
  bool ignore_eos = false;
  // >= 0 (at most 20): each drawn token's log-probability, and this many of
  // the likeliest ids' (sampling.hpp's token_logprobs); through the
  // batcher (submit, generate_batch), not generate.
  int logprobs = -1;
  // Structured output: only text that is a value of this schema
  // (json_grammar.hpp), then the end; through the batcher, as logprobs.
  std::shared_ptr<const JsonSchema> json_schema{};
  // A LoRA adapter added beside the model (Engine::add_adapter), by its
  // name; empty: the model as loaded. Requests with different adapters
  // decode in one batch.
  std::string adapter{};
  bool use_cache = true;  // generate only: false recomputes the context for every token
  // generate only: this id starts a fresh context (a names model's separator, GenerateOptions').
  std::optional<std::int32_t> restart = std::nullopt;
};

struct Completion {
  std::vector<std::int32_t> ids{};  // the tokens drawn after the prompt
  std::string text{};               // their text, cut at a stop string (empty without a tokenizer)
  FinishReason reason = FinishReason::length;
  int prompt_tokens = 0;
  std::string error{};  // reason error: what the step threw
  std::vector<TokenLogprobs> logprobs{};  // a token's each, when the request asked
  // Through the batcher: prompt ids taken from its cache (not read again);
  // seconds reading the prompt (to the first token) and generating.
  int cached_tokens = 0;
  double prompt_seconds = 0, generation_seconds = 0;
  int completion_tokens() const { return int(ids.size()); }
};

// A token's text as it comes (it may be empty: an end token, a character
// whose last bytes have not come); false ends the generation (cancelled).
using OnText = std::function<bool(std::string_view)>;
// The same with the token's id: for a caller with a tokenizer of its own (a
// character model's). Text held back to the end (a character not yet
// whole) comes last, with id -1.
using OnToken = std::function<bool(std::int32_t, std::string_view)>;
using OnCompletion = std::function<void(const Completion&)>;
// The same with the token's log-probabilities (null unless the request
// asked): what a server streams with each piece of text.
struct TokenStep {
  std::int32_t id = -1;
  std::string_view text{};
  const TokenLogprobs* logprobs = nullptr;
};
using OnStep = std::function<bool(const TokenStep&)>;

namespace detail {
// What runs on the backend's type (src/engine.cpp's EngineCoreFor<Be>).
class EngineCore {
 public:
  virtual ~EngineCore() = default;
  virtual const std::type_info& backend_type() const = 0;
  virtual void* model() = 0;
  virtual void* backend() = 0;
};
}  // namespace detail

class Engine {
 public:
  static Engine load(const std::filesystem::path& path, EngineOptions opts = {});
  // What load checks before it reads the model (the names, the precision
  // decided and the backend that runs it): the precision, or the Error.
  static std::string check(const std::filesystem::path& path, const EngineOptions& opts);
  // A new model of `arch` (vocab: the tokenizer's size when 0), initialised
  // from seed; opts' precision must be fp32 or bf16 (its weights are float).
  static Engine create(const PresetInfo& arch, int vocab, std::uint64_t seed, DecoderOptions model,
                       EngineOptions opts = {});
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  // What it runs.
  const PresetInfo& architecture() const;
  int vocab() const;
  int max_t() const;
  std::size_t parameter_count() const;
  const DecoderOptions& model_options() const;
  std::string_view format() const;  // "gpt2", "llama", "llama2.c", "xfmr" (a checkpoint of xfmr's, or created)
  const std::string& backend_name() const { return backend_; }
  const std::string& precision() const { return precision_; }
  std::string describe() const;  // "cpu (int8 weights)": the backend as a program's line says it
  const Metadata& metadata() const;  // an xfmr checkpoint's

  // Its tokenizer (an Error saying why there is none).
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const ModelTokenizer& tokenizer() const;
  const std::filesystem::path& tokenizer_source() const;
  // The ids of `text`, or the start token for an empty one (an Error
  // without one); checked against the model and its context.
  std::vector<std::int32_t> prompt(std::string_view text) const;
  // Each id in [0, vocab), or an Error naming `what`, the id and its place.
  void check_ids(std::span<const std::int32_t> ids, std::string_view what) const;
  // The ids drawn are below it: the tokenizer's size when the model's
  // vocabulary is padded past it, else the model's.
  int drawn_vocabulary() const;

  Completion generate(const CompletionRequest& r, const OnText& on_text = {});
  Completion generate(const CompletionRequest& r, const OnToken& on_token);
  // interrupted(), asked after each step, ends them all (cancelled).
  // speculation: drafts a step by prompt lookup or the draft model
  // (set_draft): the same tokens in fewer steps.
  std::vector<Completion> generate_batch(std::span<const CompletionRequest> requests, int batch_size,
                                         const std::function<bool()>& interrupted = {}, Speculation speculation = {});

  // Speculative decoding by a draft model (Speculation::draft): a smaller
  // model of the same tokenizer (each id's text checked) on the same
  // backend, which the engine keeps; before start_batching.
  void set_draft(Engine draft);
  bool has_draft() const;
  const Engine* draft() const;  // null without one

  // LoRA: a peft adapter directory (io/peft.hpp) on the model's
  // projections, at `scale` times its own scale (1: as trained); the base's
  // weights and their decoding copies stay as they are. One adapter, before
  // start_batching; the adapter's settings.
  LoraOptions load_adapter(const std::filesystem::path& dir, double scale = 1.0);
  // LoRA adapters beside the model, each request's choice
  // (CompletionRequest::adapter), as a server offers them under model
  // names: a peft directory under `name`, at `scale` times its own scale.
  // The model's weights and its own adapter stay as they are; requests
  // with other adapters or none decode in the same batch (each row takes
  // its sequence's: layers/lora.hpp). Before start_batching; the
  // adapter's settings. The names, in the order added.
  LoraOptions add_adapter(const std::string& name, const std::filesystem::path& dir, double scale = 1.0);
  const std::vector<std::string>& adapter_names() const;
  // Folds the model's own adapter (load_adapter's) into its weights
  // (merge_lora): a plain model again, to export; none beside it.
  void merge_adapter();

  // Serving: the batcher, for the engine's life.
  void start_batching(BatchOptions opts);
  int batch_context() const;  // positions a slot holds
  // Queues r (QueueFull past the bound, an Error naming a bad field);
  // on_text and on_finish run on the thread that steps.
  std::uint64_t submit(CompletionRequest r, OnText on_text, OnCompletion on_finish);
  std::uint64_t submit(CompletionRequest r, OnStep on_step, OnCompletion on_finish);
  void cancel(std::uint64_t id);
  void cancel_all();
  void close();
  bool idle() const;
  BatchStats stats() const;
  std::vector<SlotState> slot_states() const;
  // Each id's text as it adds it to a completion (structured output's
  // vocabulary), made once.
  std::shared_ptr<const std::vector<std::string>> pieces() const;
  bool step();
  void run(std::stop_token stop);

  // The loss on `tokens` in windows of `context` (infer/window_loss.hpp).
  LossSum loss(std::span<const std::int32_t> tokens, int context, int batch, long windows);
  // The logits (B*T, vocab) of ids (B*T), on the host.
  std::vector<float> logits(std::span<const std::int32_t> ids, int B, int T);
  // An embedding of ids (one sequence): the mean of the final hidden
  // states (after the last norm) over the positions, of unit length.
  std::vector<float> embedding(std::span<const std::int32_t> ids);
  // save_pretrained with the tokenizer's files. A model with LoRA adapters
  // is refused (its export would leave them out): merge_adapter first.
  void export_hf(const std::filesystem::path& dir, bool overwrite);
  // save_gguf (io/pretrained.hpp) with the tokenizer: a GGUF llama.cpp
  // reads; an existing file is replaced only with overwrite.
  void export_gguf(const std::filesystem::path& file, GgmlType type, bool overwrite = false);
  // The backend waits for its work (a benchmark's clock).
  void synchronize();
  // The weights changed (a training step, a resume): the copies again.
  void weights_changed();

  // f(LanguageModel<Be>& model, Be& be), Be the backend's type.
  template <class F>
  decltype(auto) visit(F&& f) {
    return with_backend(backend_, [&]<class Be>() -> decltype(auto) {
      require(core_->backend_type() == typeid(Be), "Engine::visit: the backend's type");
      return f(*static_cast<LanguageModel<Be>*>(core_->model()), *static_cast<Be*>(core_->backend()));
    });
  }

  struct Impl;  // src/engine.cpp

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  detail::EngineCore* core_ = nullptr;
  const ModelTokenizer* tokenizer_ = nullptr;
  std::string backend_, precision_;
};

}  // namespace xfmr
