// xfmr.cpp: the Python module `xfmr` (pybind11), a thin layer over the
// library: a model is infer/engine.hpp's Engine, which xfmr-lm and
// xfmr-serve decode through too. docs/python.md shows it in use.
//
//   model = xfmr.load("models/smollm", precision="int8")
//   out = model.generate("Once upon a time", max_tokens=64, temperature=0)
//   for text in model.stream("Hello", max_tokens=32): print(text, end="")
//   logits = model.logits(model.tokenizer.encode("Hello"))   # numpy (T, vocab)
//
// Errors are xfmr.Error (a ValueError) with the library's message. Calls
// that run the model release the GIL; Ctrl-C stops a generation at the
// next token (KeyboardInterrupt). One call runs on a model at a time; a call
// ends a stream still open on the same model.
#include <nlohmann/json.hpp>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/infer/json_grammar.hpp"
#include "xfmr/io/architecture.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/peft.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/lora.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/train/schedules.hpp"
#include "xfmr/train/training_run.hpp"

namespace py = pybind11;
using namespace xfmr;

namespace {

using Be = CpuBackend<float>;
using Lm = LanguageModel<Be>;

// Arguments from Python, checked as the library's own: an xfmr.Error
// naming the argument by its Python name, never a wrapped or truncated
// value (a float is not an id; 2**40 is not an int32) nor pybind11's
// TypeError for a value out of a C++ type's range.
std::string shown(const py::handle& v) {
  std::string r = py::repr(v).cast<std::string>();
  return r.size() > 60 ? r.substr(0, 57) + "..." : r;
}
std::int64_t int_arg(const py::handle& v, const char* name, std::int64_t lo, std::int64_t hi) {
  require(!py::isinstance<py::bool_>(v) && PyIndex_Check(v.ptr()), name, " must be an integer, not ", shown(v));
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  require(overflow == 0 && x >= lo && x <= hi, name, " ", shown(v), " outside [", lo, ", ", hi, "]");
  return x;
}
// A seed: an integer in [0, 2**64), or None (a fresh one).
std::optional<std::uint64_t> seed_arg(const py::handle& v, const char* name) {
  if (v.is_none()) return std::nullopt;
  require(!py::isinstance<py::bool_>(v) && PyIndex_Check(v.ptr()), name, " must be an integer, not ", shown(v));
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    fail(name, " ", shown(v), " outside [0, 2**64)");
  }
  return x;
}
// An array of integer ids (a list, a tuple or a NumPy array of any
// integer type), each within [lo, hi); its values and shape.
struct IdArray {
  std::vector<std::int32_t> values;
  std::vector<py::ssize_t> shape;
};
IdArray ids_arg(const py::handle& v, const char* name, std::int64_t lo, std::int64_t hi) {
  require(!py::isinstance<py::str>(v) && !py::isinstance<py::bytes>(v), name, " must be integer ids, not a string");
  py::array a;
  try {
    a = py::module_::import("numpy").attr("asarray")(v);
  } catch (const py::error_already_set&) {
    fail(name, " must be integer ids (a list or an array), not ", shown(v));
  }
  IdArray out;
  out.shape.assign(a.shape(), a.shape() + a.ndim());
  if (a.size() == 0) return out;
  const char kind = a.dtype().kind();
  require(kind == 'i' || kind == 'u', name, " must be integer ids, not ",
          kind == 'O' ? std::string("values beyond 64-bit integers or of mixed types")
                      : py::str(a.dtype()).cast<std::string>() + " values");
  out.values.reserve(std::size_t(a.size()));
  auto take = [&](auto typed) {
    const auto* d = typed.data();
    for (py::ssize_t i = 0; i < typed.size(); ++i) {
      const auto x = d[i];
      require(std::cmp_greater_equal(x, lo) && std::cmp_less(x, hi), name, " holds ", +x, ", outside [", lo, ", ", hi,
              ")");
      out.values.push_back(std::int32_t(x));
    }
  };
  if (kind == 'u') take(py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(a));
  else take(py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a));
  return out;
}

// The result of generate(): the engine's Completion, its text None
// without a tokenizer.
struct PyCompletion {
  std::vector<std::int32_t> ids;    // the tokens drawn after the prompt
  std::optional<std::string> text;  // their text, cut at a stop string (None: the model has no tokenizer)
  std::string finish_reason;        // "stop" (an end token or a stop string), "length" or "cancelled"
};

// What a stream's thread and its iterator share.
struct State {
  std::mutex m;
  std::condition_variable changed;
  std::deque<std::string> pieces;  // text not yet taken
  std::vector<std::int32_t> ids;
  std::string finish_reason;
  std::exception_ptr error;
  bool done = false;
  std::atomic<bool> cancelled = false;
  void cancel() {
    std::lock_guard lock(m);
    cancelled = true;
    changed.notify_all();
  }
};

// A loaded model: the library's Engine (infer/engine.hpp), with the
// module's rules for calls from Python (one at a time; a stream ends when
// another call starts).
class Model {
 public:
  // source: the path it was loaded from (a LoRA checkpoint names it as its base); empty: made here.
  explicit Model(Engine engine, std::filesystem::path source = {})
      : engine_(std::move(engine)), source_(std::move(source)) {}

  Engine& engine() { return engine_; }
  const std::filesystem::path& source() const { return source_; }
  // The model the CPU backend runs (xfmr.Trainer's).
  Lm& lm() {
    Lm* lm = engine_.visit([]<class B>(LanguageModel<B>& m, B&) -> Lm* {
      if constexpr (std::is_same_v<B, Be>) return &m;
      else return nullptr;
    });
    require(lm != nullptr, "the model runs on backend '", engine_.backend_name(),
            "'; xfmr.Trainer trains on the CPU backend (load with backend='cpu')");
    return *lm;
  }
  const std::string& precision() const { return engine_.precision(); }
  std::mutex& busy() { return busy_; }
  bool has_tokenizer() const { return engine_.has_tokenizer(); }
  const ModelTokenizer& tokenizer_() const { return engine_.tokenizer(); }
  std::vector<AttachedFile> tokenizer_files() const {
    return engine_.has_tokenizer() ? engine_.tokenizer().attached_files() : std::vector<AttachedFile>{};
  }

  py::dict config() const {
    py::dict d = py::module_::import("json").attr("loads")(architecture_json(engine_.architecture()));
    d["vocab"] = engine_.vocab();
    d["parameters"] = engine_.parameter_count();
    d["format"] = std::string(engine_.format());
    d["precision"] = engine_.precision();
    d["backend"] = engine_.backend_name();
    d["tokenizer"] = engine_.has_tokenizer() ? py::cast(engine_.tokenizer_source().string()) : py::none();
    return d;
  }

  // The ids of `prompt` (text or ids), checked against the model.
  std::vector<std::int32_t> prompt_ids(const py::object& prompt) const {
    if (py::isinstance<py::str>(prompt)) return engine_.prompt(prompt.cast<std::string>());
    IdArray ids = ids_arg(prompt, "prompt", 0, engine_.vocab());
    require(ids.shape.size() == 1, "prompt must be text or a list of ids (one dimension), not ", ids.shape.size(),
            " dimensions");
    if (ids.values.empty()) return engine_.prompt("");
    return ids.values;
  }
  void check_ids(std::span<const std::int32_t> ids, const char* what) const { engine_.check_ids(ids, what); }

  // generate's arguments, checked by their Python names.
  CompletionRequest request(const py::object& prompt, const py::object& max_tokens, double temperature,
                            const py::object& top_k, double top_p, std::optional<std::uint64_t> seed,
                            std::optional<std::vector<std::string>> stop, bool ignore_eos,
                            const std::optional<std::string>& adapter) const {
    CompletionRequest r;
    r.prompt = prompt_ids(prompt);
    require(std::isfinite(temperature) && temperature >= 0, "temperature ", temperature,
            " must be a finite number >= 0 (0: greedy)");
    require(top_p > 0 && top_p <= 1, "top_p ", top_p, " outside (0, 1]");
    r.sampling = {.temperature = temperature,
                  .top_k = int(int_arg(top_k, "top_k", 0, std::numeric_limits<int>::max())),
                  .top_p = top_p};
    r.max_tokens = int(int_arg(max_tokens, "max_tokens", 0, std::numeric_limits<int>::max()));
    r.seed = seed ? *seed : std::random_device{}();
    if (stop) r.stop = *stop;
    r.ignore_eos = ignore_eos;
    r.adapter = adapter.value_or("");
    return r;
  }

  PyCompletion completion(const Completion& c) const {
    PyCompletion out{c.ids, std::nullopt, finish_reason_name(c.reason)};
    if (engine_.has_tokenizer()) out.text = c.text;
    if (c.reason == FinishReason::error) out.finish_reason = "stop";
    return out;
  }

  // Runs r on the calling thread, the GIL released; on_text(text) for each
  // token's text (returning false ends it, cancelled).
  Completion run(const CompletionRequest& r, const OnText& on_text) {
    std::lock_guard lock(busy_);
    return engine_.generate(r, on_text);
  }

  PyCompletion generate(const CompletionRequest& r) {
    bool interrupted = false;
    Completion c;
    {
      py::gil_scoped_release release;
      end_open_stream();
      // Once a signal has come it stays come: the text held back is flushed
      // through here after the generation has stopped.
      c = run(r, [&](std::string_view) {
        py::gil_scoped_acquire acquire;
        interrupted = interrupted || PyErr_CheckSignals() != 0;
        return !interrupted;
      });
    }
    if (interrupted) throw py::error_already_set();
    return completion(c);
  }

  // Engine::set_draft: speculative decoding's draft model, loaded on this
  // model's backend.
  void load_draft(const std::filesystem::path& path, const std::optional<std::string>& precision,
                  const std::optional<std::filesystem::path>& tokenizer) {
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    engine_.set_draft(Engine::load(path, {.backend = engine_.backend_name(),
                                          .precision = precision.value_or(""),
                                          .tokenizer = tokenizer.value_or("")}));
  }

  // Engine::load_adapter: a peft LoRA adapter directory on the model.
  void load_adapter(const std::filesystem::path& dir, double scale) {
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    (void)engine_.load_adapter(dir, scale);
  }
  // Engine::merge_adapter: load_adapter's folded into the weights.
  void merge_adapter() {
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    engine_.merge_adapter();
  }
  // Engine::add_adapter: one beside the model, a generation's choice by name.
  void add_adapter(const std::string& name, const std::filesystem::path& dir, double scale) {
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    (void)engine_.add_adapter(name, dir, scale);
  }

  // Many generations decoded together (Engine::generate_batch), each with
  // its own seed, so that each gets the tokens it would get alone.
  std::vector<PyCompletion> generate_batch(const std::vector<CompletionRequest>& requests, int batch_size,
                                          Speculation speculation) {
    bool interrupted = false;
    std::vector<Completion> done;
    {
      py::gil_scoped_release release;
      end_open_stream();
      std::lock_guard lock(busy_);
      done = engine_.generate_batch(requests, batch_size, [&] {
        py::gil_scoped_acquire acquire;
        interrupted = PyErr_CheckSignals() != 0;
        return interrupted;
      }, speculation);
    }
    if (interrupted) throw py::error_already_set();
    std::vector<PyCompletion> out;
    for (const Completion& c : done) out.push_back(completion(c));
    return out;
  }

  // Logits of ids (T) or a batch (B, T): numpy float32 (T, vocab) or (B, T, vocab).
  py::array_t<float> logits(const py::object& ids_) {
    const IdArray ids = ids_arg(ids_, "ids", 0, engine_.vocab());
    const std::size_t dims = ids.shape.size();
    require(dims == 1 || dims == 2, "logits: ids of ", dims, " dimensions (1: T, or 2: B, T)");
    const int B = dims == 2 ? int(ids.shape[0]) : 1, T = int(ids.shape[dims - 1]);
    require(B > 0 && T > 0, "logits: no ids");
    const std::span<const std::int32_t> in(ids.values);
    std::vector<py::ssize_t> shape = {T, engine_.vocab()};
    if (dims == 2) shape.insert(shape.begin(), B);
    std::vector<float> values;
    {
      py::gil_scoped_release release;
      end_open_stream();
      std::lock_guard lock(busy_);
      values = engine_.logits(in, B, T);
    }
    py::array_t<float> out(shape);
    std::copy(values.begin(), values.end(), out.mutable_data());
    return out;
  }

  // Engine::embedding of a text or ids: numpy float32 (d_model,), unit length.
  py::array_t<float> embedding(const py::object& input) {
    const std::vector<std::int32_t> ids = prompt_ids(input);
    std::vector<float> e;
    {
      py::gil_scoped_release release;
      end_open_stream();
      std::lock_guard lock(busy_);
      e = engine_.embedding(ids);
    }
    py::array_t<float> out(py::ssize_t(e.size()));
    std::copy(e.begin(), e.end(), out.mutable_data());
    return out;
  }

  // A Hugging Face directory (GPT-2 or Llama), with the tokenizer's files.
  void export_hf(const std::filesystem::path& dir, bool overwrite) {
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    engine_.export_hf(dir, overwrite);
  }

  // A GGUF file (llama, qwen2 or gpt2) with the tokenizer, its matrices in `type`.
  void export_gguf(const std::filesystem::path& file, const std::string& type, bool overwrite) {
    const GgmlType ggml = ggml_type_named(type, "type");
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    engine_.export_gguf(file, ggml, overwrite);
  }

  // A stream still open on the model ends before another call runs.
  void end_open_stream() {
    std::lock_guard lock(streams_);
    if (auto open = open_stream_.lock()) open->cancel();
  }
  void set_open_stream(const std::shared_ptr<State>& s) {
    std::lock_guard lock(streams_);
    open_stream_ = s;
  }

 private:
  Engine engine_;
  std::filesystem::path source_;
  std::mutex busy_;  // held by the call running the model
  std::mutex streams_;
  std::weak_ptr<State> open_stream_;
};

// model.stream(...): the generation runs on a thread of its own, at most
// kReadAhead pieces of text ahead of the iterator, which yields them as
// they come (the GIL released while it waits). Dropping the iterator,
// Ctrl-C while it waits, or another call on the model ends the generation.
class TokenStream {
 public:
  static constexpr std::size_t kReadAhead = 4;

  TokenStream(std::shared_ptr<Model> model, CompletionRequest r) : model_(std::move(model)), state_(std::make_shared<State>()) {
    model_->end_open_stream();
    model_->set_open_stream(state_);
    worker_ = std::thread([model = model_, state = state_, r = std::move(r)] {
      try {
        const Completion c = model->run(r, [&state](std::string_view text) {
          std::unique_lock lock(state->m);
          if (!text.empty()) {
            state->pieces.emplace_back(text);
            state->changed.notify_all();
            state->changed.wait(lock, [&] { return state->pieces.size() < kReadAhead || state->cancelled; });
          }
          return !state->cancelled.load();
        });
        std::lock_guard lock(state->m);
        state->ids = c.ids;
        state->finish_reason = finish_reason_name(c.reason);
      } catch (...) {
        std::lock_guard lock(state->m);
        state->error = std::current_exception();
      }
      std::lock_guard lock(state->m);
      state->done = true;
      state->changed.notify_all();
    });
  }
  ~TokenStream() { close(); }

  // One reader at a time: a second thread's next() while one waits is an
  // Error (the state's lock is only taken with the GIL released, so that
  // the two never wait for each other).
  std::string next() {
    require(!reading_.exchange(true), "this stream is being read by another thread; a stream has one reader");
    const struct Done {
      std::atomic<bool>& reading;
      ~Done() { reading = false; }
    } done{reading_};
    State& s = *state_;
    for (;;) {
      std::optional<std::string> text;
      bool ended = false;
      std::exception_ptr error;
      {
        py::gil_scoped_release release;
        std::unique_lock lock(s.m);
        s.changed.wait_for(lock, std::chrono::milliseconds(50), [&] { return !s.pieces.empty() || s.done; });
        if (!s.pieces.empty()) {
          text = std::move(s.pieces.front());
          s.pieces.pop_front();
          s.changed.notify_all();
        } else if (s.done) {
          ended = true;
          error = std::exchange(s.error, nullptr);
        }
      }
      if (text) return *text;
      if (error) std::rethrow_exception(error);
      if (ended) throw py::stop_iteration();
      if (PyErr_CheckSignals() != 0) {
        close();
        throw py::error_already_set();
      }
    }
  }
  // Ends the generation at its next token and waits for it.
  void close() {
    state_->cancel();
    if (worker_.joinable()) {
      py::gil_scoped_release release;
      worker_.join();
    }
  }
  std::vector<std::int32_t> ids() {
    py::gil_scoped_release release;
    std::lock_guard lock(state_->m);
    return state_->ids;
  }
  std::optional<std::string> finish_reason() {
    py::gil_scoped_release release;
    std::lock_guard lock(state_->m);
    return state_->done && !state_->error ? std::optional(state_->finish_reason) : std::nullopt;
  }

 private:
  std::shared_ptr<Model> model_;
  std::shared_ptr<State> state_;
  std::thread worker_;
  std::atomic<bool> reading_ = false;
};

// xfmr.Trainer: the library's TrainingRun (train/training_run.hpp: AdamW,
// the language models' recipe by default, and a learning-rate schedule)
// over a model of this module, stepped by the caller. A batch is an integer array
// (B, T + 1), each row's first T ids the input and its last T the targets;
// or inputs (B, T) and targets (B, T), where -100 is not counted (PyTorch's
// ignore_index).
class PyTrainer {
 public:
  using Ids = py::object;  // integer ids: ids_arg
  static inline const AdamWOptions kRecipe = adamw_recipe(AdamWRecipe::language_model, 0.1);
  struct Options {
    double lr = 3e-4;
    std::string schedule = "cosine";
    long steps = 1000;
    // AdamW: the language models' recipe, as xfmr-lm trains.
    double weight_decay = 0.1, beta1 = kRecipe.beta1, beta2 = kRecipe.beta2, eps = kRecipe.eps, clip = 1.0,
           label_smoothing = 0.0;
    int grad_accum = 1, shards = 0;
    std::string precision = "fp32", recompute = "none";
    std::uint64_t data_seed = 0;
    std::string lora;  // LoraOptions::parse's spec: adapters alone train, on the frozen model ("": every weight)

    // Each setting within its range, by its Python name: a NaN learning
    // rate would turn the weights to NaN at the first step.
    void check() const {
      auto finite = [](double v, const char* name, double lo, bool lo_open, double hi, bool hi_open) {
        const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        require(ok, "Trainer: ", name, " ", v, " outside ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
      };
      const double inf = std::numeric_limits<double>::max();
      finite(lr, "lr", 0, true, inf, false);
      finite(weight_decay, "weight_decay", 0, false, inf, false);
      finite(beta1, "beta1", 0, false, 1, true);
      finite(beta2, "beta2", 0, false, 1, true);
      finite(eps, "eps", 0, true, inf, false);
      finite(clip, "clip", 0, false, inf, false);
      finite(label_smoothing, "label_smoothing", 0, false, 1, true);
      require(steps >= 1, "Trainer: steps ", steps, " must be >= 1");
      require(grad_accum >= 1, "Trainer: grad_accum ", grad_accum, " must be >= 1");
      require(shards >= 0, "Trainer: shards ", shards, " must be >= 0 (0: the CPU's default)");
    }
    // What a checkpoint records and a resumed Trainer must have.
    nlohmann::json json() const {
      return {{"lr", lr},          {"schedule", schedule},       {"steps", steps},
              {"weight_decay", weight_decay}, {"beta1", beta1},   {"beta2", beta2},
              {"eps", eps},        {"clip", clip},               {"label_smoothing", label_smoothing},
              {"grad_accum", grad_accum},     {"data_seed", data_seed},     {"lora", lora}};
    }
  };

  PyTrainer(std::shared_ptr<Model> model, const Options& o) : model_(std::move(model)), options_(o) {
    o.check();
    require(model_->precision() == "fp32", "Trainer: the model was loaded for decoding in ", model_->precision(),
            "; train one loaded in fp32 (Trainer(precision='bf16') trains with bf16 products",
            o.lora.empty() ? "" : "; with lora, Trainer(precision='" + model_->precision() + "') holds it so", ")");
    if (o.lora.empty()) check_training_precision(o.precision, "Trainer: precision");
    else check_precision_name(o.precision, "Trainer: precision");  // the frozen base's: any
    Lm& lm = model_->lm();
    lm.set_recompute(parse_recompute(o.recompute));
    // LoRA: adapters on the model's projections train (one shard), the model frozen, in `precision` (bf16: held as
    // its bf16 copies; int8, q4: its forward through the int8 or 4-bit copies); a checkpoint is the adapters, their
    // state and a peft directory. The backend first: a precision it refuses leaves the model without adapters.
    be_ = std::make_unique<Be>(!o.lora.empty() ? make_frozen_base_backend<Be>("cpu", o.precision)
                                               : make_backend<Be>("cpu", o.precision));
    if (!o.lora.empty()) {
      require(o.shards <= 1, "Trainer: lora trains as one shard (shards ", o.shards, "; a replica would copy the model)");
      lora_ = LoraOptions::parse(o.lora);
      options_.lora = lora_->str();  // as a checkpoint records it, whatever order the settings came in
      add_lora(lm, *lora_, o.data_seed ^ 0x10a);
      adapters_ = std::make_unique<LoraModel<Be>>(lm);
    }
    run_ = std::make_unique<TrainingRun<Lm, Be>>(
        adapters_ ? static_cast<Lm&>(*adapters_) : lm, *be_,
        TrainingRunOptions{
            .optimizer = {.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay},
            .trainer = {.grad_accum = o.grad_accum,
                        .clip = o.clip,
                        .label_smoothing = o.label_smoothing,
                        .schedule = LrSchedule::parse(o.schedule, o.lr, o.steps),
                        .data_seed = o.data_seed,
                        .split = {.shards = lora_ ? 1 : o.shards}}});
    if (lora_) run_->hold_frozen_base(lm);
    trainer_ = &run_->trainer();
  }

  double step(const Ids& batch, const std::optional<Ids>& targets) {
    const int B = take(batch, targets, "step"), micro = B / trainer_->options().grad_accum;
    require(micro * trainer_->options().grad_accum == B, "step: ", B, " sequences do not split into grad_accum ",
            trainer_->options().grad_accum, " micro-batches");
    StepResult r;
    {
      py::gil_scoped_release release;
      model_->end_open_stream();
      std::lock_guard lock(model_->busy());
      int first = 0;  // the micro-batch's first sequence
      r = trainer_->step(
          [&](int m) {
            first = m * micro;
            return BatchTargets{micro, std::span<const std::int32_t>(targets_).subspan(std::size_t(first) * T_,
                                                                                       std::size_t(micro) * T_)};
          },
          [&](const Shard& sh, Lm& lm, Be& be) { return forward(lm, be, first + sh.begin, sh.size()); });
      model_->lm().set_training(false);
      if (!lora_) model_->engine().weights_changed();  // the decoding copies are of the old weights (not the adapters')
    }
    grad_norm_ = r.grad_norm;
    return r.loss;
  }

  // The mean loss over batch's counted targets, without a step.
  double evaluate(const Ids& batch, const std::optional<Ids>& targets) {
    const int B = take(batch, targets, "evaluate");
    py::gil_scoped_release release;
    model_->end_open_stream();
    std::lock_guard lock(model_->busy());
    const LossSum sum = trainer_->evaluate(BatchTargets{B, targets_}, [&](const Shard& sh, Lm& lm, Be& be) {
      return forward(lm, be, sh.begin, sh.size());
    });
    model_->lm().set_training(false);
    return sum.checked_mean("evaluate");
  }

  // A checkpoint xfmr.load (and xfmr-lm) reads, with the tokenizer's files.
  void save(const std::filesystem::path& dir, bool overwrite) {
    py::gil_scoped_release release;
    require(!std::filesystem::exists(dir) || (overwrite && is_checkpoint(dir)) ||
                (std::filesystem::is_directory(dir) && std::filesystem::is_empty(dir)),
            "save: ", dir.string(),
            is_checkpoint(dir) ? " holds a checkpoint (save(dir, overwrite=True) replaces it)"
                               : " exists and is not a checkpoint");
    std::lock_guard lock(model_->busy());
    // xfmr-lm's metadata, so that its sample, eval and export, and
    // xfmr-serve, read the checkpoint as one of its own.
    const Lm& lm = model_->lm();
    Metadata metadata = language_model_metadata(lm);
    metadata["format"] = "xfmr-lm";
    metadata["vocab"] = std::to_string(lm.vocab());
    metadata["tie_weights"] = lm.options().tie_weights ? "1" : "0";
    metadata["head_bias"] = lm.options().head_bias ? "1" : "0";
    metadata["trainer_settings"] = options_.json().dump();
    if (model_->has_tokenizer()) metadata["tokenizer_hash"] = hex(model_->tokenizer_().content_hash());
    std::vector<AttachedFile> files = model_->tokenizer_files();
    if (lora_) {  // the adapters alone: a peft directory too (load_adapter reads it), which xfmr.load refuses alone
      metadata["lora"] = lora_->str();
      if (!model_->source().empty()) metadata["lora_base"] = model_->source().string();
      for (AttachedFile& f : peft_adapter_files(model_->lm(), *lora_)) files.push_back(std::move(f));
    }
    run_->save(dir, metadata, files);
  }
  // Continues from save's checkpoint, bit for bit: the Trainer's settings
  // and the model's tokenizer (by content) must be the checkpoint's.
  long resume(const std::filesystem::path& dir) {
    py::gil_scoped_release release;
    std::lock_guard lock(model_->busy());
    const Metadata saved = read_checkpoint_metadata(dir);
    if (const auto it = saved.find("trainer_settings"); it != saved.end()) {
      const nlohmann::json was = nlohmann::json::parse(it->second, nullptr, false), is = options_.json();
      require(was.is_object(), "resume: ", dir.string(), ": trainer_settings is not a JSON object");
      for (const auto& [key, value] : is.items())
        require(!was.contains(key) || was[key] == value || (key == "steps" && options_.schedule == "constant"),
                "resume: ", dir.string(), " was trained with ", key, "=", was.contains(key) ? was[key].dump() : "?",
                "; this Trainer has ", key, "=", value.dump(), " (build the Trainer with the checkpoint's settings)");
    }
    if (const auto it = saved.find("tokenizer_hash"); it != saved.end() && model_->has_tokenizer())
      require(it->second == hex(model_->tokenizer_().content_hash()), "resume: the model's tokenizer (",
              model_->tokenizer_().files().empty() ? std::string("?") : model_->tokenizer_().files().front().string(),
              ") is not the one ", dir.string(), " was trained with (its content differs)");
    run_->resume(dir);
    model_->lm().set_training(false);
    if (!lora_) model_->engine().weights_changed();
    return trainer_->steps();
  }

  long steps() const { return trainer_->steps(); }
  double lr() const { return trainer_->lr(); }
  double grad_norm() const { return grad_norm_; }

 private:
  // batch's inputs and targets into ids_ and targets_; its row count.
  // Without targets, batch is (B, T + 1); with them, both are (B, T).
  int take(const Ids& batch_, const std::optional<Ids>& targets_in, const char* what) {
    const int extra = targets_in ? 0 : 1;
    const IdArray batch = ids_arg(batch_, "batch", 0, model_->lm().vocab());
    const std::optional<IdArray> targets =
        targets_in ? std::optional(ids_arg(*targets_in, "targets", kIgnoreIndex, model_->lm().vocab())) : std::nullopt;
    const std::size_t dims = batch.shape.size();
    require(dims == 2 && batch.shape[0] > 0 && batch.shape[1] > extra, what, ": a batch is ",
            targets ? "(B, T) ids with targets (B, T)" : "(B, T + 1) ids, T >= 1", "; this one has ", dims,
            " dimensions",
            dims == 2 ? " (" + std::to_string(batch.shape[0]) + ", " + std::to_string(batch.shape[1]) + ")"
                      : std::string());
    const int B = int(batch.shape[0]), T = int(batch.shape[1]) - extra;
    if (targets)
      require(targets->shape.size() == 2 && targets->shape[0] == B && targets->shape[1] == T, what,
              ": targets must have the batch's shape (", B, ", ", T, ")");
    require(T <= model_->lm().max_t(), what, ": sequences of ", T, " inputs; the model's context is ",
            model_->lm().max_t());
    T_ = T;
    ids_.resize(std::size_t(B) * T);
    targets_.resize(std::size_t(B) * T);
    const std::int32_t* in = batch.values.data();
    const std::size_t row = std::size_t(T + extra);
    for (int b = 0; b < B; ++b) {
      std::copy(in + b * row, in + b * row + T, ids_.begin() + std::size_t(b) * T);
      if (!targets) std::copy(in + b * row + 1, in + b * row + 1 + T, targets_.begin() + std::size_t(b) * T);
    }
    if (targets) std::copy(targets->values.begin(), targets->values.end(), targets_.begin());
    model_->check_ids(ids_, what);
    for (std::size_t i = 0; i < targets_.size(); ++i)
      require(targets_[i] == kIgnoreIndex || (targets_[i] >= 0 && targets_[i] < model_->lm().vocab()), what,
              ": target ", targets_[i], " outside [0, ", model_->lm().vocab(), ") (or -100, not counted)");
    return B;
  }
  // The Trainer's forward: the head and the loss left to head_loss (no logits of the whole batch).
  HeadRows forward(Lm& lm, Be& be, int first, int sequences) {
    return lm.forward_to_head(
        be, std::span<const std::int32_t>(ids_).subspan(std::size_t(first) * T_, std::size_t(sequences) * T_),
        Shape{sequences, T_});
  }

  std::shared_ptr<Model> model_;
  Options options_;
  std::optional<LoraOptions> lora_;
  std::unique_ptr<LoraModel<Be>> adapters_;  // what trains with lora: the adapters alone
  std::unique_ptr<Be> be_;
  std::unique_ptr<TrainingRun<Lm, Be>> run_;
  decltype(&run_->trainer()) trainer_ = nullptr;
  std::vector<std::int32_t> ids_, targets_;
  int T_ = 0;
  double grad_norm_ = 0.0;
};

// model.tokenizer: the model's, kept alive by it.
struct Tokenizer {
  std::shared_ptr<Model> model;
  const ModelTokenizer& tok() const { return model->tokenizer_(); }
};

}  // namespace

PYBIND11_MODULE(_xfmr, m) {
  m.doc() = "xfmr: transformer models with hand-derived backward passes (docs/python.md)";
  py::register_exception<Error>(m, "Error", PyExc_ValueError).attr("__doc__") =
      "Every error of the library, with its message (a ValueError)";

  py::class_<PyCompletion>(m, "Completion", "What generate() returns")
      .def_readonly("ids", &PyCompletion::ids, "the tokens drawn after the prompt")
      .def_readonly("text", &PyCompletion::text, "their text, cut at a stop string (None without a tokenizer)")
      .def_readonly("finish_reason", &PyCompletion::finish_reason,
                    "'stop' (an end token or a stop string) or 'length' (max_tokens)")
      .def(
          "__repr__",
          [](const PyCompletion& c) {
            return "Completion(" + std::to_string(c.ids.size()) + " tokens, finish_reason='" + c.finish_reason + "')";
          },
          "its token count and finish_reason");

  py::class_<Tokenizer>(m, "Tokenizer", "The model's tokenizer")
      .def(
          "encode", [](const Tokenizer& t, const std::string& text) { return t.tok().encode(text); }, py::arg("text"),
          "the ids of text")
      .def(
          "decode",
          [](const Tokenizer& t, const py::object& ids) {
            const IdArray a = ids_arg(ids, "ids", 0, t.tok().size());
            require(a.shape.size() <= 1, "decode: ids of ", a.shape.size(), " dimensions (1 expected)");
            return utf8_repaired(t.tok().decode(a.values));
          },
          py::arg("ids"), "the text of ids (bytes that are not UTF-8 as U+FFFD)")
      .def(
          "__len__", [](const Tokenizer& t) { return t.tok().size(); }, "the vocabulary's size")
      .def_property_readonly(
          "start",
          [](const Tokenizer& t) -> std::optional<int> {
            return t.tok().start() >= 0 ? std::optional(t.tok().start()) : std::nullopt;
          },
          "the token a text starts after (GPT-2's <|endoftext|>), or None");

  py::class_<TokenStream>(m, "TokenStream", "Iterates over a generation's text, token by token")
      .def(
          "__iter__", [](TokenStream& s) -> TokenStream& { return s; }, "itself")
      .def("__next__", &TokenStream::next, "the next token's text, as it is drawn")
      .def("close", &TokenStream::close, "ends the generation")
      .def_property_readonly("ids", &TokenStream::ids, "the tokens drawn, once it has ended")
      .def_property_readonly("finish_reason", &TokenStream::finish_reason,
                             "'stop', 'length' or 'cancelled' (closed) once it has ended");

  const SamplingOptions sampling;
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "A language model loaded by xfmr.load")
      .def_property_readonly("config", &Model::config, "its architecture, vocabulary, format and precision")
      .def("__repr__",
           [](Model& self) {
             const PresetInfo& p = self.engine().architecture();
             return "<xfmr.Model " + p.name + " " + p.shape() + " V" + std::to_string(self.engine().vocab()) + ", " +
                    self.precision() + ">";
           },
           "its architecture, shape, vocabulary and precision")
      .def_property_readonly(
          "tokenizer",
          [](std::shared_ptr<Model> self) -> std::optional<Tokenizer> {
            if (!self->has_tokenizer()) return std::nullopt;
            return Tokenizer{std::move(self)};
          },
          "its tokenizer, or None")
      .def(
          "generate",
          [](Model& self, const py::object& prompt, const py::object& max_tokens, double temperature,
             const py::object& top_k, double top_p, const py::object& seed,
             std::optional<std::vector<std::string>> stop, bool ignore_eos, const std::optional<std::string>& adapter) {
            return self.generate(self.request(prompt, max_tokens, temperature, top_k, top_p, seed_arg(seed, "seed"), stop,
                                              ignore_eos, adapter));
          },
          py::arg("prompt"), py::kw_only(), py::arg("max_tokens") = 100, py::arg("temperature") = sampling.temperature,
          py::arg("top_k") = sampling.top_k, py::arg("top_p") = sampling.top_p, py::arg("seed") = py::none(),
          py::arg("stop") = py::none(), py::arg("ignore_eos") = false, py::arg("adapter") = py::none(),
          "Tokens after prompt (text or ids): greedy at temperature 0; ends at the end-of-text token (unless "
          "ignore_eos), at a stop string, or after max_tokens; adapter: a LoRA adapter's name (add_adapter)")
      .def(
          "stream",
          [](std::shared_ptr<Model> self, const py::object& prompt, const py::object& max_tokens, double temperature,
             const py::object& top_k, double top_p, const py::object& seed,
             std::optional<std::vector<std::string>> stop, bool ignore_eos, const std::optional<std::string>& adapter) {
            (void)self->tokenizer_();  // a stream is text
            CompletionRequest r = self->request(prompt, max_tokens, temperature, top_k, top_p, seed_arg(seed, "seed"),
                                                stop, ignore_eos, adapter);
            return std::make_unique<TokenStream>(std::move(self), std::move(r));
          },
          py::arg("prompt"), py::kw_only(), py::arg("max_tokens") = 100, py::arg("temperature") = sampling.temperature,
          py::arg("top_k") = sampling.top_k, py::arg("top_p") = sampling.top_p, py::arg("seed") = py::none(),
          py::arg("stop") = py::none(), py::arg("ignore_eos") = false, py::arg("adapter") = py::none(),
          "generate's tokens as an iterator of their text, as they are drawn")
      .def("export_hf", &Model::export_hf, py::arg("dir"), py::kw_only(), py::arg("overwrite") = false,
           "writes a Hugging Face directory (GPT2LMHeadModel or LlamaForCausalLM, with the tokenizer's files); an "
           "existing one only with overwrite=True")
      .def("export_gguf", &Model::export_gguf, py::arg("file"), py::arg("type") = "f32", py::kw_only(),
           py::arg("overwrite") = false,
           "writes a GGUF file llama.cpp reads (llama, qwen2 or gpt2, with the tokenizer), its matrices in type f32, "
           "f16, bf16, q8_0 or q4_0; an existing file only with overwrite=True")
      .def(
          "generate_batch",
          [](Model& self, const std::vector<py::object>& prompts, const py::object& max_tokens, double temperature,
             const py::object& top_k, double top_p, const py::object& seed,
             std::optional<std::vector<std::string>> stop, bool ignore_eos, const py::object& batch_size_,
             const py::object& json_schema, const py::object& lookup, const py::object& draft,
             const py::object& adapters) {
            const int batch_size = int(int_arg(batch_size_, "batch_size", 1, 4096));
            const Speculation speculation{.lookup = int(int_arg(lookup, "lookup", 0, 16)),
                                          .draft = int(int_arg(draft, "draft", 0, 16))};
            const std::uint64_t base = seed_arg(seed, "seed").value_or(std::random_device{}());
            // json_schema: a schema (a dict, as JSON has it) or "json_object": every text a value of it.
            std::shared_ptr<const JsonSchema> schema;
            if (py::isinstance<py::str>(json_schema) && json_schema.cast<std::string>() == "json_object")
              schema = JsonSchema::any_object();
            else if (!json_schema.is_none())
              schema = JsonSchema::compile(nlohmann::json::parse(
                  py::module_::import("json").attr("dumps")(json_schema).cast<std::string>()));
            // adapters: one name (or None) for every prompt, or a list of them, a prompt's each.
            std::vector<std::optional<std::string>> chosen(prompts.size());
            if (py::isinstance<py::str>(adapters)) {
              std::fill(chosen.begin(), chosen.end(), adapters.cast<std::string>());
            } else if (!adapters.is_none()) {
              chosen = adapters.cast<std::vector<std::optional<std::string>>>();
              require(chosen.size() == prompts.size(), "adapters: ", chosen.size(), " names for ", prompts.size(),
                      " prompts");
            }
            std::vector<CompletionRequest> requests;
            for (std::size_t i = 0; i < prompts.size(); ++i) {
              requests.push_back(self.request(prompts[i], max_tokens, temperature, top_k, top_p, base + i, stop,
                                              ignore_eos, chosen[i]));
              requests.back().json_schema = schema;
            }
            return self.generate_batch(requests, batch_size, speculation);
          },
          py::arg("prompts"), py::kw_only(), py::arg("max_tokens") = 100, py::arg("temperature") = sampling.temperature,
          py::arg("top_k") = sampling.top_k, py::arg("top_p") = sampling.top_p, py::arg("seed") = py::none(),
          py::arg("stop") = py::none(), py::arg("ignore_eos") = false, py::arg("batch_size") = 8,
          py::arg("json_schema") = py::none(), py::arg("lookup") = 0, py::arg("draft") = 0,
          py::arg("adapters") = py::none(),
          "generate for each of prompts, batch_size of them decoded together (one weight read serves them all); "
          "prompt i draws with seed + i, so it gets what generate(prompt, seed=seed + i) gets while the prompt and "
          "max_tokens fit the context. json_schema (a JSON schema as a dict, or 'json_object'): each text is a "
          "value of it (structured output), then the end token. lookup: speculative decoding by prompt lookup, up to "
          "that many drafts a step (the same tokens, in fewer steps where the text repeats the prompt); draft: up "
          "to that many drafts a step from the draft model (load_draft), the same tokens. adapters: a LoRA "
          "adapter's name (add_adapter) for every prompt, or a list of names (None: the model alone), decoded in one "
          "batch")
      .def("load_adapter", &Model::load_adapter, py::arg("dir"), py::kw_only(), py::arg("scale") = 1.0,
           "puts a LoRA adapter in Hugging Face peft's format (a directory of adapter_config.json and "
           "adapter_model.safetensors) on the model's projections, at scale times its own; one adapter")
      .def("merge_adapter", &Model::merge_adapter,
           "folds load_adapter's adapter into the model's weights (a plain model again, to export)")
      .def("add_adapter", &Model::add_adapter, py::arg("name"), py::arg("dir"), py::kw_only(), py::arg("scale") = 1.0,
           "loads a LoRA adapter (peft's format) beside the model under name: a generation that names it "
           "(adapter=, adapters=) decodes with it, others without, in the same batch")
      .def("load_draft", &Model::load_draft, py::arg("path"), py::kw_only(), py::arg("precision") = py::none(),
           py::arg("tokenizer") = py::none(),
           "loads speculative decoding's draft model (generate_batch(draft=K)): a smaller model with the same "
           "tokenizer (each id's text checked), on this model's backend; precision and tokenizer as load's")
      .def("embedding", &Model::embedding, py::arg("input"),
           "the mean of the final hidden states (after the last norm) over input's positions (text or ids), of unit "
           "length: a float32 array (d_model,), as xfmr-serve's /v1/embeddings gives it")
      .def("logits", &Model::logits, py::arg("ids"),
           "the logits of ids (T) or of a batch (B, T): a float32 array (T, vocab) or (B, T, vocab)");

  const PyTrainer::Options t;
  py::class_<PyTrainer>(m, "Trainer", "Trains a model: AdamW, a learning-rate schedule, batches of ids")
      .def(py::init([](std::shared_ptr<Model> model, double lr, std::string schedule, const py::object& steps,
                       double weight_decay, double beta1, double beta2, double eps, double clip,
                       const py::object& grad_accum, double label_smoothing, const py::object& shards,
                       std::string precision, std::string recompute, const py::object& data_seed,
                       std::optional<std::string> lora) {
             const int most = std::numeric_limits<int>::max();
             return std::make_unique<PyTrainer>(
                 std::move(model),
                 PyTrainer::Options{lr, std::move(schedule), long(int_arg(steps, "Trainer: steps", 1, 1L << 40)),
                                    weight_decay, beta1, beta2, eps, clip, label_smoothing,
                                    int(int_arg(grad_accum, "Trainer: grad_accum", 1, most)),
                                    int(int_arg(shards, "Trainer: shards", 0, 1024)), std::move(precision),
                                    std::move(recompute), seed_arg(data_seed, "Trainer: data_seed").value_or(0),
                                    lora.value_or("")});
           }),
           py::arg("model"), py::kw_only(), py::arg("lr") = t.lr, py::arg("schedule") = t.schedule,
           py::arg("steps") = t.steps, py::arg("weight_decay") = t.weight_decay, py::arg("beta1") = t.beta1,
           py::arg("beta2") = t.beta2, py::arg("eps") = t.eps, py::arg("clip") = t.clip,
           py::arg("grad_accum") = t.grad_accum, py::arg("label_smoothing") = t.label_smoothing,
           py::arg("shards") = t.shards, py::arg("precision") = t.precision, py::arg("recompute") = t.recompute,
           py::arg("data_seed") = t.data_seed, py::arg("lora") = py::none(),
           "schedule: 'constant', 'cosine' (a tenth of the steps' warmup, at most 1000, then down to lr / 10) or 'onecycle', over "
           "`steps`; "
           "shards: the CPU's data-parallel replicas (0: its default); precision: 'fp32' or 'bf16' (with lora also "
           "'int8' or 'q4'); recompute: 'none', 'cheap' or 'block'; lora: "
           "'r=16,alpha=32[,targets=q,k,v,o,gate,up,down][,dropout=0.05][,rslora]': LoRA adapters "
           "train on the frozen model (precision bf16: held in bf16; int8 or q4: its forward through int8 or 4-bit copies, "
           "q4's input gradient through the 4-bit weights), a checkpoint "
           "their peft directory")
      .def("step", &PyTrainer::step, py::arg("batch"), py::arg("targets") = py::none(),
           "one optimizer step; returns the loss. batch: integer ids (B, T + 1), inputs [:, :-1] and targets "
           "[:, 1:]; or ids (B, T) with targets (B, T), where -100 is not counted")
      .def("evaluate", &PyTrainer::evaluate, py::arg("batch"), py::arg("targets") = py::none(),
           "the mean loss on a batch as step takes it, without a step")
      .def("save", &PyTrainer::save, py::arg("dir"), py::kw_only(), py::arg("overwrite") = false,
           "a checkpoint of the model, the optimizer and the step (xfmr.load reads it; resume continues it)")
      .def("resume", &PyTrainer::resume, py::arg("dir"),
           "continues from a checkpoint save wrote, bit for bit; returns its step")
      .def_property_readonly("steps", &PyTrainer::steps, "the steps taken")
      .def_property_readonly("lr", &PyTrainer::lr, "the next step's learning rate")
      .def_property_readonly("grad_norm", &PyTrainer::grad_norm, "the last step's gradient norm (before clipping)");

  m.def(
      "create",
      [](const py::object& architecture, std::optional<int> vocab, std::uint64_t seed, std::optional<float> dropout,
         const std::optional<std::filesystem::path>& tokenizer, const std::string& backend) {
        const PresetInfo arch =
            py::isinstance<py::str>(architecture)
                ? LanguageModelPresets::info(architecture.cast<std::string>())
                : architecture_from_json(py::module_::import("json").attr("dumps")(architecture).cast<std::string>(),
                                         "create: architecture");
        py::gil_scoped_release release;
        return std::make_shared<Model>(Engine::create(
            arch, vocab.value_or(0), seed, published_head(arch, {.dropout = dropout.value_or(arch.dropout)}),
            {.backend = backend, .tokenizer = tokenizer.value_or(""), .tokenizer_required = false}));
      },
      py::arg("architecture"), py::kw_only(), py::arg("vocab") = py::none(), py::arg("seed") = 0,
      py::arg("dropout") = py::none(), py::arg("tokenizer") = py::none(), py::arg("backend") = "cpu",
      "A new model, initialised from seed: architecture is a preset's name (xfmr.presets()) or a dict as "
      "model.config gives; vocab defaults to the tokenizer's size, dropout to the architecture's");
  m.def(
      "presets",
      [] {
        const auto names = LanguageModelPresets::names();
        return std::vector<std::string>(names.begin(), names.end());
      },
      "the names of the shipped language-model presets");
  m.def(
      "quantise",
      [](const std::filesystem::path& from, const std::filesystem::path& to, const std::string& precision,
         const std::string& tokenizer) {
        QuantisedCheckpoint q;
        {
          py::gil_scoped_release release;
          require(is_decoding_precision(precision), "quantise: precision '", precision, "' (int8 or q4)");
          // A language model's (xfmr-lm's checkpoints, published models) through the model; another
          // program's checkpoint by its tensors.
          const bool other_program = is_checkpoint(from) && read_checkpoint_metadata(from).count("format") &&
                                     read_checkpoint_metadata(from).at("format") != "xfmr-lm";
          q = other_program ? quantise_checkpoint(from, to, precision)
                            : quantise_language_model<Be>(from, to, precision, tokenizer);
        }
        py::dict d;
        d["matrices"] = q.matrices;
        d["float_bytes"] = q.float_bytes;
        d["quantised_bytes"] = q.quantised_bytes;
        return d;
      },
      py::arg("src"), py::arg("dst"), py::arg("precision") = "q4", py::arg("tokenizer") = "",
      "Writes a copy of the model src (an xfmr checkpoint or a published model) for decoding to dst, every matrix "
      "in `precision` ('q4': 4-bit blocks of 32 with a scale each; 'int8': a scale a row); returns what it wrote. "
      "xfmr.load(dst) decodes in that precision, without float32 weights");
  m.def(
      "load",
      [](const std::filesystem::path& path, std::optional<std::string> precision, const std::string& backend,
         const std::optional<std::filesystem::path>& tokenizer) {
        py::gil_scoped_release release;
        return std::make_shared<Model>(Engine::load(path, {.backend = backend,
                                                           .precision = precision.value_or(""),
                                                           .tokenizer = tokenizer.value_or(""),
                                                           .tokenizer_required = false}),
                                       std::filesystem::absolute(path).lexically_normal());
      },
      py::arg("path"), py::kw_only(), py::arg("precision") = py::none(), py::arg("backend") = "cpu",
      py::arg("tokenizer") = py::none(),
      "A language model: an xfmr checkpoint, a Hugging Face GPT-2, Llama or Qwen2 directory, a llama2.c file, or a GGUF "
      "file (llama, qwen2, gpt2). "
      "precision: 'fp32', 'bf16', 'int8' or 'q4' (default: the checkpoint's); tokenizer: a file or directory, when the "
      "model does not come with one");
}
