// xfmr.cpp: the Python module `xfmr` (pybind11), a thin layer over the
// library: every number comes from the C++ calls a program makes
// (io/pretrained.hpp's load_model, infer/generate.hpp's Generator,
// LanguageModel::forward). docs/python.md shows it in use.
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
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <atomic>
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
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/stop_strings.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/architecture.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/text/text.hpp"

namespace py = pybind11;
using namespace xfmr;

namespace {

using Be = CpuBackend<float>;
using Lm = LanguageModel<Be>;

// What a generation asks for, as generate() and stream() take it.
struct Request {
  std::vector<std::int32_t> prompt;
  GenerateOptions opts;
  std::uint64_t seed = 0;
  std::vector<std::string> stops;
  std::vector<std::int32_t> end_ids;  // tokens that end it, shown as nothing
};

// The result of generate().
struct Completion {
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

// A loaded model with what runs it: its tokenizer, a backend in the asked
// precision, the weights' copies for that precision, and a Generator whose
// cache serves call after call.
class Model {
 public:
  Model(const std::string& path, const std::optional<std::string>& precision, const std::string& backend,
        const std::string& tokenizer) {
    require(backend == "cpu", "backend '", backend, "': the Python module runs on the CPU backend ('cpu')");
    Pretrained<Be> p = load_model<Be>(path);
    precision_ = precision ? *precision : is_int8_checkpoint(p.metadata) ? "int8" : "fp32";
    check_precision_name(precision_);
    // A model without a tokenizer still gives logits and generates ids;
    // text asks for one (tokenizer_() says why there is none).
    try {
      tok_.emplace(load_model_tokenizer(p, tokenizer));
    } catch (const Error& e) {
      if (!tokenizer.empty()) throw;
      no_tokenizer_ = e.what();
    }
    format_ = std::string(format_name(p.format));
    saved_ = std::move(p.saved);
    model_ = std::move(p.model);
    model_->set_training(false);
    be_ = std::make_unique<Be>(make_backend<Be>(backend, precision_));
    copies_ = saved_ ? std::make_unique<WeightCopies<Be>>(*be_, *model_, *saved_)
                     : std::make_unique<WeightCopies<Be>>(*be_, *model_);
    generator_ = std::make_unique<Generator<Lm, Be>>(*model_, *be_);
    if (tok_ && tokenizer_().start() >= 0) end_ids_.push_back(tokenizer_().start());
  }

  bool has_tokenizer() const { return tok_.has_value(); }
  const ModelTokenizer& tokenizer_() const {
    require(tok_.has_value(), no_tokenizer_, " (load the model with tokenizer=PATH)");
    return tok_->tokenizer;
  }

  py::dict config() const {
    py::dict d = py::module_::import("json").attr("loads")(architecture_json(model_->preset()));
    d["vocab"] = model_->vocab();
    d["parameters"] = model_->parameter_count();
    d["format"] = format_;
    d["precision"] = precision_;
    d["tokenizer"] = tok_ ? py::cast(tok_->source.string()) : py::none();
    return d;
  }

  // The ids of `prompt` (text or ids), checked against the model.
  std::vector<std::int32_t> prompt_ids(const py::object& prompt) const {
    std::vector<std::int32_t> ids;
    if (py::isinstance<py::str>(prompt))
      ids = tokenizer_().encode(prompt.cast<std::string>());
    else
      ids = prompt.cast<std::vector<std::int32_t>>();
    if (ids.empty()) {
      require(tokenizer_().start() >= 0, "the prompt is empty, and the tokenizer has no token a text starts after");
      ids.push_back(tokenizer_().start());
    }
    check_ids(ids, "prompt");
    return ids;
  }
  void check_ids(std::span<const std::int32_t> ids, const char* what) const {
    for (std::size_t i = 0; i < ids.size(); ++i)
      require(ids[i] >= 0 && ids[i] < model_->vocab(), what, " id ", ids[i], " at ", i, " outside [0, ",
              model_->vocab(), "), the model's vocabulary");
  }

  Request request(const py::object& prompt, int max_tokens, double temperature, int top_k, double top_p,
                  std::optional<std::uint64_t> seed, std::optional<std::vector<std::string>> stop,
                  bool ignore_eos) const {
    Request r;
    r.prompt = prompt_ids(prompt);
    r.opts.sampling = {.temperature = temperature, .top_k = top_k, .top_p = top_p};
    r.opts.sampling.validate();
    require(max_tokens >= 0, "max_tokens ", max_tokens, " is negative");
    r.opts.max_tokens = max_tokens;
    r.opts.vocabulary = tok_ && tok_->padding > 0 ? tokenizer_().size() : 0;
    r.seed = seed ? *seed : std::random_device{}();
    if (stop) r.stops = *stop;
    if (!ignore_eos) r.end_ids = end_ids_;
    return r;
  }

  // Runs r on the calling thread, the GIL released; on_text(text) for each
  // token's text (returning false ends it). interrupt() is asked after each
  // token (true ends it).
  template <class OnText, class Interrupt>
  Completion run(const Request& r, OnText&& on_text, Interrupt&& interrupt) {
    std::lock_guard lock(busy_);
    Completion c;
    c.finish_reason = "length";
    std::optional<TokenText> text;
    if (tok_) text.emplace(tokenizer_(), r.prompt.back(), r.stops), c.text.emplace();
    Rng rng(r.seed);
    c.ids = (*generator_)(r.prompt, r.opts, rng, [&](std::int32_t id) {
      const bool end = std::find(r.end_ids.begin(), r.end_ids.end(), id) != r.end_ids.end();
      std::string piece = text ? text->feed(id, !end) : std::string();
      const bool stopped = end || (text && text->stopped());
      if (stopped) c.finish_reason = "stop";
      if (text) *c.text += piece;
      if (!on_text(std::move(piece)) || stopped) return false;
      if (!interrupt()) return true;
      c.finish_reason = "cancelled";
      return false;
    });
    if (text) {
      std::string rest = text->flush();
      *c.text += rest;
      if (!rest.empty()) on_text(std::move(rest));
    }
    return c;
  }

  Completion generate(const Request& r) {
    bool interrupted = false;
    Completion c;
    {
      py::gil_scoped_release release;
      end_open_stream();
      c = run(
          r, [](std::string) { return true; },
          [&] {
            py::gil_scoped_acquire acquire;
            interrupted = PyErr_CheckSignals() != 0;
            return interrupted;
          });
    }
    if (interrupted) throw py::error_already_set();
    return c;
  }

  // Logits of ids (T) or a batch (B, T): numpy float32 (T, vocab) or (B, T, vocab).
  py::array_t<float> logits(const py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>& ids) {
    require(ids.ndim() == 1 || ids.ndim() == 2, "logits: ids of ", ids.ndim(), " dimensions (1: T, or 2: B, T)");
    const int B = ids.ndim() == 2 ? int(ids.shape(0)) : 1, T = int(ids.shape(ids.ndim() - 1));
    require(B > 0 && T > 0, "logits: no ids");
    require(T <= model_->max_t(), "logits: ", T, " positions; the model's context is ", model_->max_t());
    const std::span<const std::int32_t> in(ids.data(), std::size_t(B) * T);
    check_ids(in, "logits:");
    const int V = model_->vocab();
    std::vector<py::ssize_t> shape = {T, V};
    if (ids.ndim() == 2) shape.insert(shape.begin(), B);
    py::array_t<float> out(shape);
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release release;
      end_open_stream();
      std::lock_guard lock(busy_);
      model_->set_training(false);
      const auto logits = model_->forward(*be_, in, Shape{B, T});
      std::copy(logits.begin(), logits.end(), dst);
    }
    return out;
  }

  // save_pretrained: a Hugging Face directory (GPT-2 or Llama), with the
  // tokenizer's files when it has one.
  void export_hf(const std::filesystem::path& dir, bool overwrite) {
    py::gil_scoped_release release;
    end_open_stream();
    std::lock_guard lock(busy_);
    const std::vector<AttachedFile> attached = tok_ ? tok_->tokenizer.attached_files() : std::vector<AttachedFile>{};
    save_pretrained(*model_, dir, overwrite, attached);
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
  std::optional<FoundTokenizer> tok_;
  std::string format_, precision_;
  std::optional<SafeTensors> saved_;
  std::unique_ptr<Lm> model_;
  std::unique_ptr<Be> be_;
  std::unique_ptr<WeightCopies<Be>> copies_;
  std::unique_ptr<Generator<Lm, Be>> generator_;
  std::vector<std::int32_t> end_ids_;
  std::string no_tokenizer_;  // why there is no tokenizer
  std::mutex busy_;           // held by the call running the model
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

  TokenStream(std::shared_ptr<Model> model, Request r) : model_(std::move(model)), state_(std::make_shared<State>()) {
    model_->end_open_stream();
    model_->set_open_stream(state_);
    worker_ = std::thread([model = model_, state = state_, r = std::move(r)] {
      try {
        Completion c = model->run(
            r,
            [&state](std::string text) {
              std::unique_lock lock(state->m);
              if (text.empty()) return true;
              state->pieces.push_back(std::move(text));
              state->changed.notify_all();
              state->changed.wait(lock, [&] { return state->pieces.size() < kReadAhead || state->cancelled; });
              return true;
            },
            [&state] { return state->cancelled.load(); });
        std::lock_guard lock(state->m);
        state->ids = std::move(c.ids);
        state->finish_reason = c.finish_reason;
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

  std::string next() {
    State& s = *state_;
    std::unique_lock lock(s.m);
    while (s.pieces.empty() && !s.done) {
      {
        py::gil_scoped_release release;
        s.changed.wait_for(lock, std::chrono::milliseconds(50));
      }
      if (PyErr_CheckSignals() != 0) {
        lock.unlock();
        close();
        throw py::error_already_set();
      }
    }
    if (!s.pieces.empty()) {
      std::string text = std::move(s.pieces.front());
      s.pieces.pop_front();
      s.changed.notify_all();
      return text;
    }
    if (s.error) std::rethrow_exception(std::exchange(s.error, nullptr));
    throw py::stop_iteration();
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
    std::lock_guard lock(state_->m);
    return state_->ids;
  }
  std::optional<std::string> finish_reason() {
    std::lock_guard lock(state_->m);
    return state_->done && !state_->error ? std::optional(state_->finish_reason) : std::nullopt;
  }

 private:
  std::shared_ptr<Model> model_;
  std::shared_ptr<State> state_;
  std::thread worker_;
};

// model.tokenizer: the model's, kept alive by it.
struct Tokenizer {
  std::shared_ptr<Model> model;
  const ModelTokenizer& tok() const { return model->tokenizer_(); }
};

}  // namespace

PYBIND11_MODULE(xfmr, m) {
  m.doc() = "xfmr: transformer models with hand-derived backward passes (docs/python.md)";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);

  py::class_<Completion>(m, "Completion", "What generate() returns")
      .def_readonly("ids", &Completion::ids, "the tokens drawn after the prompt")
      .def_readonly("text", &Completion::text, "their text, cut at a stop string (None without a tokenizer)")
      .def_readonly("finish_reason", &Completion::finish_reason,
                    "'stop' (an end token or a stop string) or 'length' (max_tokens)")
      .def("__repr__", [](const Completion& c) {
        return "Completion(" + std::to_string(c.ids.size()) + " tokens, finish_reason='" + c.finish_reason + "')";
      });

  py::class_<Tokenizer>(m, "Tokenizer", "The model's tokenizer")
      .def(
          "encode", [](const Tokenizer& t, const std::string& text) { return t.tok().encode(text); }, py::arg("text"),
          "the ids of text")
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<std::int32_t>& ids) {
            t.model->check_ids(ids, "decode:");
            return utf8_repaired(t.tok().decode(ids));
          },
          py::arg("ids"), "the text of ids (bytes that are not UTF-8 as U+FFFD)")
      .def("__len__", [](const Tokenizer& t) { return t.tok().size(); })
      .def_property_readonly(
          "start",
          [](const Tokenizer& t) -> std::optional<int> {
            return t.tok().start() >= 0 ? std::optional(t.tok().start()) : std::nullopt;
          },
          "the token a text starts after (GPT-2's <|endoftext|>), or None");

  py::class_<TokenStream>(m, "TokenStream", "Iterates over a generation's text, token by token")
      .def("__iter__", [](TokenStream& s) -> TokenStream& { return s; })
      .def("__next__", &TokenStream::next)
      .def("close", &TokenStream::close, "ends the generation")
      .def_property_readonly("ids", &TokenStream::ids, "the tokens drawn, once it has ended")
      .def_property_readonly("finish_reason", &TokenStream::finish_reason,
                             "'stop', 'length' or 'cancelled' (closed) once it has ended");

  const SamplingOptions sampling;
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "A language model loaded by xfmr.load")
      .def_property_readonly("config", &Model::config, "its architecture, vocabulary, format and precision")
      .def_property_readonly(
          "tokenizer",
          [](std::shared_ptr<Model> self) -> std::optional<Tokenizer> {
            if (!self->has_tokenizer()) return std::nullopt;
            return Tokenizer{std::move(self)};
          },
          "its tokenizer, or None")
      .def(
          "generate",
          [](Model& self, const py::object& prompt, int max_tokens, double temperature, int top_k, double top_p,
             std::optional<std::uint64_t> seed, std::optional<std::vector<std::string>> stop, bool ignore_eos) {
            return self.generate(self.request(prompt, max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos));
          },
          py::arg("prompt"), py::kw_only(), py::arg("max_tokens") = 100, py::arg("temperature") = sampling.temperature,
          py::arg("top_k") = sampling.top_k, py::arg("top_p") = sampling.top_p, py::arg("seed") = py::none(),
          py::arg("stop") = py::none(), py::arg("ignore_eos") = false,
          "Tokens after prompt (text or ids): greedy at temperature 0; ends at the end-of-text token (unless "
          "ignore_eos), at a stop string, or after max_tokens")
      .def(
          "stream",
          [](std::shared_ptr<Model> self, const py::object& prompt, int max_tokens, double temperature, int top_k,
             double top_p, std::optional<std::uint64_t> seed, std::optional<std::vector<std::string>> stop,
             bool ignore_eos) {
            (void)self->tokenizer_();  // a stream is text
            Request r = self->request(prompt, max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos);
            return std::make_unique<TokenStream>(std::move(self), std::move(r));
          },
          py::arg("prompt"), py::kw_only(), py::arg("max_tokens") = 100, py::arg("temperature") = sampling.temperature,
          py::arg("top_k") = sampling.top_k, py::arg("top_p") = sampling.top_p, py::arg("seed") = py::none(),
          py::arg("stop") = py::none(), py::arg("ignore_eos") = false,
          "generate's tokens as an iterator of their text, as they are drawn")
      .def("export_hf", &Model::export_hf, py::arg("dir"), py::kw_only(), py::arg("overwrite") = false,
           "writes a Hugging Face directory (GPT2LMHeadModel or LlamaForCausalLM, with the tokenizer's files); an "
           "existing one only with overwrite=True")
      .def("logits", &Model::logits, py::arg("ids"),
           "the logits of ids (T) or of a batch (B, T): a float32 array (T, vocab) or (B, T, vocab)");

  m.def(
      "quantise",
      [](const std::filesystem::path& from, const std::filesystem::path& to) {
        QuantisedCheckpoint q;
        {
          py::gil_scoped_release release;
          q = quantise_checkpoint(from, to);
        }
        py::dict d;
        d["matrices"] = q.matrices;
        d["float_bytes"] = q.float_bytes;
        d["int8_bytes"] = q.int8_bytes;
        return d;
      },
      py::arg("src"), py::arg("dst"),
      "Writes an int8 copy of the xfmr checkpoint src (every float32 matrix, per row) to dst, for decoding; returns "
      "what it wrote");
  m.def(
      "load",
      [](const std::filesystem::path& path, std::optional<std::string> precision, const std::string& backend,
         const std::optional<std::filesystem::path>& tokenizer) {
        py::gil_scoped_release release;
        return std::make_shared<Model>(path.string(), precision, backend, tokenizer ? tokenizer->string() : "");
      },
      py::arg("path"), py::kw_only(), py::arg("precision") = py::none(), py::arg("backend") = "cpu",
      py::arg("tokenizer") = py::none(),
      "A language model: an xfmr checkpoint, a Hugging Face GPT-2, Llama or Qwen2 directory, or a llama2.c file. "
      "precision: 'fp32', 'bf16' or 'int8' (default: the checkpoint's); tokenizer: a file or directory, when the "
      "model does not come with one");
}
