// xfmr-serve: a language model behind an OpenAI-compatible HTTP API, many
// requests decoded together (infer/continuous_batching.hpp), and a chat page.
//
//   xfmr-serve --model PATH [--host 127.0.0.1] [--port 8080] [--slots 8] [--context T]
//              [--precision fp32|bf16|int8|q4] [--api-key KEY] [--chat-template chatml|llama3|plain]
//
// GET  /                      the chat page (examples/chat.html, compiled in)
// GET  /health                503 {"status": "loading"} until the model is loaded, then 200
// GET  /v1/models             the one model, named --name (default: the model path's last part), and
//                             its context (max_model_len, as vLLM's)
// POST /v1/completions        OpenAI's shapes, "stream": true as server-sent events ending "data: [DONE]"
// POST /v1/chat/completions   the same for a conversation, rendered by the chat template (text/chat_template.hpp)
// POST /tokenize, /detokenize {"content": text} <-> {"tokens": [ids]}
// GET  /metrics               Prometheus text: requests, tokens, queue, slots
//
// Every bad request is a 4xx with {"error": {"message", "type", "param", "code"}}
// naming the field; past the queue's bound, 503 with Retry-After. SIGINT or
// SIGTERM: no new requests, those running finish (at most --drain seconds,
// then they are cancelled), exit 0; a second signal cancels them at once.
// The model, the batcher, the templates and the stop strings are the
// library's; this file is HTTP and JSON.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "http_connection.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/text/chat_template.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace xfmr;
using namespace xfmr::examples;

// The chat page (examples/chat.html), compiled in by CMake.
extern const char kXfmrChatPage[];

namespace {

// JSON text of answers: a byte that is not UTF-8 (in an error message that
// quotes the input) becomes U+FFFD instead of an exception.
constexpr int kIndent = -1;
constexpr auto kReplace = json::error_handler_t::replace;

struct ServeArgs {
  std::string model, tokenizer, host = "127.0.0.1", backend = "cpu", precision = "fp32", api_key, chat_template, name;
  EngineOptions engine;  // from the options above
  int port = 8080, slots = 8, context = 0, queue = 64, drain = 10;
  std::size_t max_body = 1 << 20;
};

// A 4xx (or 5xx) with OpenAI's error object.
struct HttpError {
  int status = 400;
  std::string message{}, param{};
  const char* type = "invalid_request_error";
};
[[noreturn]] void bad_request(std::string message, std::string param = {}) {
  throw HttpError{400, std::move(message), std::move(param)};
}
void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  res.set_content(json{{"error", err}}.dump(kIndent, ' ', false, kReplace), "application/json");
}

// The request's field `key` as T when present (a wrong type names the field).
template <class T>
std::optional<T> field(const json& body, const char* key) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad_request(std::string("'") + key + "' must be a boolean", key);
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) bad_request(std::string("'") + key + "' must be an integer", key);
    if (it->is_number_unsigned() ? it->get<std::uint64_t>() > std::uint64_t(std::numeric_limits<T>::max())
                                 : it->get<std::int64_t>() < std::int64_t(std::numeric_limits<T>::min()))
      bad_request(std::string("'") + key + "' is out of range", key);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) bad_request(std::string("'") + key + "' must be a number", key);
  } else {
    if (!it->is_string()) bad_request(std::string("'") + key + "' must be a string", key);
  }
  return it->get<T>();
}

// The counters /metrics shows beyond the batcher's.
struct Counters {
  std::atomic<std::uint64_t> http_requests{0}, client_errors{0}, rejected_busy{0};
};

// One request's tokens on their way from the engine's thread to the
// connection's: text safe to send, and the end.
struct Stream {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> pieces;  // a token's text each, UTF-8 (TokenText), not yet sent
  bool done = false;
  Completion result;
  std::uint64_t id = 0;
};

class Service {
 public:
  explicit Service(const ServeArgs& a) : args_(a) {}

  // Loading happens while /health says 503.
  void load() {
    engine_.emplace(Engine::load(args_.model, args_.engine));
    const int context = args_.context > 0 ? args_.context : std::min(engine_->max_t(), 2048);
    require(context <= engine_->max_t(), "--context ", context, " exceeds the model's ", engine_->max_t());
    engine_->start_batching({.slots = args_.slots, .context = context, .prefill_chunk = 128, .queue = args_.queue});
    if (!args_.chat_template.empty()) chat_ = ChatTemplate::named(args_.chat_template);
    else if (fs::is_directory(args_.model)) chat_ = ChatTemplate::for_model(args_.model);
    name_ = args_.name.empty() ? fs::path(args_.model).lexically_normal().filename().string() : args_.name;
    if (name_.empty()) name_ = fs::path(args_.model).lexically_normal().parent_path().filename().string();
    // Stop markers the tokenizer holds as one id end generation by id; the others as text.
    for (const std::string& s : chat_.stops()) {
      const auto ids = tokenizer().encode(s);
      if (ids.size() == 1) chat_stop_ids_.push_back(ids[0]);
      else chat_stop_strings_.push_back(s);
    }
    ready_ = true;
    std::cerr << "xfmr-serve: " << name_ << " (" << engine_->architecture().name << ", " << engine_->describe() << "), "
              << args_.slots << " slots of " << context << " tokens, chat template " << chat_.name() << "\n"
              << std::flush;
  }

  bool ready() const { return ready_; }
  const std::string& name() const { return name_; }
  const ModelTokenizer& tokenizer() const { return engine_->tokenizer(); }
  Engine& engine() { return *engine_; }
  Counters& counters() { return counters_; }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat) {
    const json body = parse_body(req);
    if (const auto m = field<std::string>(body, "model"); m && *m != name_)
      throw HttpError{404, "The model '" + *m + "' does not exist; this server has '" + name_ + "'", "model",
                      "invalid_request_error"};
    if (const auto n = field<int>(body, "n"); n && *n != 1) bad_request("'n' must be 1", "n");
    std::string prompt_text;
    std::vector<std::int32_t> prompt;
    if (chat) {
      prompt_text = chat_.render(messages(body));
      prompt = encode(prompt_text);
    } else {
      prompt = completion_prompt(body, prompt_text);
    }
    if (prompt.empty()) {
      if (tokenizer().start() < 0) bad_request("'prompt' is empty", "prompt");
      prompt.push_back(tokenizer().start());
    }
    const int context = engine_->batch_context();
    if (int(prompt.size()) >= context)
      bad_request(
          "the prompt is " + std::to_string(prompt.size()) + " tokens; the context is " + std::to_string(context),
          chat ? "messages" : "prompt");
    auto max_tokens = field<int>(body, "max_tokens");
    if (!max_tokens && chat) max_tokens = field<int>(body, "max_completion_tokens");
    const int room = context - int(prompt.size());
    if (max_tokens && (*max_tokens < 1 || *max_tokens > room))
      bad_request("'max_tokens' " + std::to_string(*max_tokens) + " outside [1, " + std::to_string(room) +
                      "]: the prompt's " + std::to_string(prompt.size()) + " tokens leave " + std::to_string(room) +
                      " of the context's " + std::to_string(context),
                  "max_tokens");
    CompletionRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens.value_or(chat ? room : std::min(16, room));
    r.sampling.temperature = field<double>(body, "temperature").value_or(1.0);
    r.sampling.top_p = field<double>(body, "top_p").value_or(1.0);
    r.sampling.top_k = field<int>(body, "top_k").value_or(0);
    if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2))
      bad_request("'temperature' must be in [0, 2]", "temperature");
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) bad_request("'top_p' must be in (0, 1]", "top_p");
    if (r.sampling.top_k < 0) bad_request("'top_k' must be >= 0", "top_k");
    r.seed = field<std::uint64_t>(body, "seed").value_or(std::random_device{}());
    // ignore_eos (an extension, llama.cpp's and vLLM's): decode past the end-of-text token (benchmarks).
    r.ignore_eos = field<bool>(body, "ignore_eos").value_or(false);
    r.stop = stop_strings(body);
    if (chat) {
      r.stop_ids = chat_stop_ids_;
      r.stop.insert(r.stop.end(), chat_stop_strings_.begin(), chat_stop_strings_.end());
    }
    const bool stream = field<bool>(body, "stream").value_or(false);
    bool include_usage = false;
    if (const auto so = body.find("stream_options"); so != body.end() && so->is_object())
      include_usage = field<bool>(*so, "include_usage").value_or(false);
    run(std::move(r), chat, stream, include_usage, req, res);
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_body(req);
    const auto text = field<std::string>(body, "content");
    if (!text) bad_request("'content' is required", "content");
    res.set_content(json{{"tokens", encode(*text)}}.dump(kIndent, ' ', false, kReplace), "application/json");
  }
  void detokenize(const httplib::Request& req, httplib::Response& res) {
    const json body = parse_body(req);
    const auto t = body.find("tokens");
    if (t == body.end() || !t->is_array()) bad_request("'tokens' must be a list of token ids", "tokens");
    res.set_content(json{{"content", tokenizer().decode(token_ids(*t, "tokens"))}}.dump(kIndent, ' ', false, kReplace),
                    "application/json");
  }

  std::string metrics() {
    const BatchStats s = ready_ ? engine_->stats() : BatchStats{};
    std::ostringstream o;
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
      o << "# HELP xfmr_" << name << " " << help << "\n# TYPE xfmr_" << name << " " << type << "\nxfmr_" << name << " "
        << value << "\n";
    };
    metric("http_requests_total", "counter", "HTTP requests received", counters_.http_requests.load());
    metric("http_client_errors_total", "counter", "requests answered with a 4xx", counters_.client_errors.load());
    metric("requests_rejected_total", "counter", "requests refused with 503: the queue was full",
           counters_.rejected_busy.load());
    metric("requests_total", "counter", "generation requests accepted", s.requests);
    metric("requests_finished_total", "counter", "generation requests finished", s.finished);
    metric("requests_cancelled_total", "counter", "generation requests cancelled (client gone)", s.cancelled);
    metric("prompt_tokens_total", "counter", "prompt tokens read", s.prompt_tokens);
    metric("tokens_generated_total", "counter", "tokens generated", s.generated_tokens);
    metric("steps_total", "counter", "batched decoding steps", s.steps);
    metric("busy_seconds_total", "counter", "seconds spent in decoding steps", s.busy_seconds);
    metric("tokens_per_second", "gauge", "tokens generated per second of decoding steps",
           s.busy_seconds > 0 ? double(s.generated_tokens) / s.busy_seconds : 0.0);
    metric("queue_length", "gauge", "requests waiting for a slot", s.queued);
    metric("slots_busy", "gauge", "slots decoding a request", s.busy_slots);
    metric("slots", "gauge", "slots", s.slots);
    return o.str();
  }

 private:
  static json parse_body(const httplib::Request& req) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) bad_request("the request body is not valid JSON");
    if (!body.is_object()) bad_request("the request body must be a JSON object");
    return body;
  }
  std::vector<std::int32_t> encode(const std::string& text) const { return tokenizer().encode(text); }
  std::vector<std::int32_t> token_ids(const json& list, const char* what) const {
    std::vector<std::int32_t> ids;
    const int V = tokenizer().size();
    for (const json& t : list) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= V)
        bad_request(std::string("'") + what + "' holds " + t.dump(kIndent, ' ', false, kReplace) +
                        ", not a token id in [0, " + std::to_string(V) + ")",
                    what);
      ids.push_back(t.get<std::int32_t>());
    }
    return ids;
  }
  // "prompt": a text, a list of one text, or a list of token ids.
  std::vector<std::int32_t> completion_prompt(const json& body, std::string& text) const {
    const auto p = body.find("prompt");
    if (p == body.end() || p->is_null()) bad_request("'prompt' is required", "prompt");
    if (p->is_string()) return encode(text = p->get<std::string>());
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) return encode(text = (*p)[0].get<std::string>());
    if (p->is_array() && !p->empty() && (*p)[0].is_number()) return token_ids(*p, "prompt");
    bad_request("'prompt' must be a string, a list of one string, or a list of token ids", "prompt");
  }
  std::vector<ChatMessage> messages(const json& body) const {
    const auto m = body.find("messages");
    if (m == body.end() || !m->is_array() || m->empty()) bad_request("'messages' must be a non-empty list", "messages");
    std::vector<ChatMessage> out;
    for (std::size_t i = 0; i < m->size(); ++i) {
      const json& e = (*m)[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!e.is_object() || !e.contains("role") || !e["role"].is_string())
        bad_request(at + " needs a 'role' string", "messages");
      std::string content;
      const auto c = e.find("content");
      if (c == e.end() || c->is_null()) content = "";
      else if (c->is_string()) content = c->get<std::string>();
      else if (c->is_array()) {  // [{"type": "text", "text": ...}, ...]
        for (const json& part : *c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string())
            bad_request(at + ".content: only parts of type 'text' are supported", "messages");
          content += part["text"].get<std::string>();
        }
      } else {
        bad_request(at + ".content must be a string or a list of text parts", "messages");
      }
      out.push_back({e["role"].get<std::string>(), std::move(content)});
    }
    try {
      chat_.render(out);
    } catch (const Error& e) {
      bad_request(e.what(), "messages");
    }
    return out;
  }
  static std::vector<std::string> stop_strings(const json& body) {
    const auto s = body.find("stop");
    if (s == body.end() || s->is_null()) return {};
    if (s->is_string()) return {s->get<std::string>()};
    if (!s->is_array() || s->size() > 4) bad_request("'stop' must be a string or a list of up to 4 strings", "stop");
    std::vector<std::string> out;
    for (const json& e : *s) {
      if (!e.is_string()) bad_request("'stop' must be a string or a list of up to 4 strings", "stop");
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  // Submits the request and answers it, whole or streamed.
  void run(CompletionRequest r, bool chat, bool stream, bool include_usage, const httplib::Request& req,
           httplib::Response& res) {
    auto s = std::make_shared<Stream>();
    const auto on_text = [s](std::string_view piece) {
      std::lock_guard lock(s->m);
      if (!piece.empty()) s->pieces.emplace_back(piece);
      s->cv.notify_all();
      return true;
    };
    const auto on_finish = [s](const Completion& result) {
      std::lock_guard lock(s->m);
      s->result = result;
      s->done = true;
      s->cv.notify_all();
    };
    try {
      s->id = engine_->submit(std::move(r), on_text, on_finish);
    } catch (const QueueFull& e) {
      ++counters_.rejected_busy;
      res.set_header("Retry-After", "1");
      throw HttpError{503, std::string("the server is busy: ") + e.what(), "", "server_busy"};
    } catch (const Error& e) {
      if (std::string_view(e.what()).find("shutting down") != std::string_view::npos)
        throw HttpError{503, e.what(), "", "server_shutting_down"};
      bad_request(e.what());
    }
    const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(s->id);
    const std::int64_t created = std::time(nullptr);
    const std::string object = chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    auto usage = [](const Completion& b) {
      return json{{"prompt_tokens", b.prompt_tokens},
                  {"completion_tokens", b.completion_tokens()},
                  {"total_tokens", b.prompt_tokens + b.completion_tokens()}};
    };
    auto reason = [](const Completion& b) -> json {
      if (b.reason == FinishReason::length) return "length";
      return "stop";
    };
    if (!stream) {
      // A client that has gone (http_connection.hpp) is noticed within a
      // wait, and its request cancelled: no slot decodes for nobody.
      const int socket = xfmr_serve::connection_socket(req);
      std::unique_lock lock(s->m);
      bool gone = false;
      while (!s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done; }))
        if (!gone && xfmr_serve::connection_closed(socket)) {
          engine_->cancel(s->id);
          gone = true;
        }
      if (gone) return;  // nobody to answer
      if (s->result.reason == FinishReason::error)
        throw HttpError{500, "generation failed: " + s->result.error, "", "server_error"};
      json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason(s->result)}};
      std::string text;
      for (const std::string& p : s->pieces) text += p;
      if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
      else choice["text"] = text;
      res.set_content(json{{"id", id},
                           {"object", object},
                           {"created", created},
                           {"model", name_},
                           {"choices", json::array({choice})},
                           {"usage", usage(s->result)}}
                          .dump(kIndent, ' ', false, kReplace),
                      "application/json");
      return;
    }
    auto chunk = [=, this](const json& choice) {
      return "data: " +
             json{{"id", id},
                  {"object", object},
                  {"created", created},
                  {"model", name_},
                  {"choices", json::array({choice})}}
                 .dump(kIndent, ' ', false, kReplace) +
             "\n\n";
    };
    auto piece = [chat](const std::string& text, const json& finish) {
      json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
      if (chat) c["delta"] = text.empty() && !finish.is_null() ? json::object() : json{{"content", text}};
      else c["text"] = text;
      return c;
    };
    auto started = std::make_shared<bool>(false);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](std::size_t, httplib::DataSink& sink) {
          try {
            if (chat && !*started) {
              const std::string first = chunk({{"index", 0},
                                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                                               {"logprobs", nullptr},
                                               {"finish_reason", nullptr}});
              if (!sink.write(first.data(), first.size())) return false;
            }
            *started = true;
            std::vector<std::string> pieces;
            bool done = false;
            Completion result;
            {
              std::unique_lock lock(s->m);
              s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done || !s->pieces.empty(); });
              pieces.swap(s->pieces);
              done = s->done;
              result = s->result;
            }
            std::string out;
            for (const std::string& p : pieces) out += chunk(piece(p, nullptr));  // an event a token, as OpenAI sends
            if (done) {
              if (result.reason == FinishReason::error) {
                out +=
                    "data: " +
                    json{{"error", {{"message", "generation failed: " + result.error}, {"type", "server_error"}}}}.dump(
                        kIndent, ' ', false, kReplace) +
                    "\n\n";
              } else {
                out += chunk(piece("", reason(result)));
                if (include_usage)
                  out += "data: " +
                         json{{"id", id},       {"object", object},         {"created", created},
                              {"model", name_}, {"choices", json::array()}, {"usage", usage(result)}}
                             .dump(kIndent, ' ', false, kReplace) +
                         "\n\n";
              }
              out += "data: [DONE]\n\n";
            }
            // An empty wait still probes the connection (a comment line), so a
            // client that has gone is noticed within the wait.
            if (out.empty()) out = ": waiting\n\n";
            if (!sink.write(out.data(), out.size())) return false;
            if (done) sink.done();
            return true;
          } catch (const std::exception& e) {
            std::cerr << "xfmr-serve: a stream failed: " << e.what() << "\n";
            return false;
          }
        },
        [this, s](bool) {
          // Whatever ended the response (done, or the client gone), the slot is freed.
          std::lock_guard lock(s->m);
          if (!s->done) engine_->cancel(s->id);
        });
  }

  ServeArgs args_;
  std::atomic<bool> ready_{false};
  std::optional<Engine> engine_;
  ChatTemplate chat_;
  std::vector<std::int32_t> chat_stop_ids_;
  std::vector<std::string> chat_stop_strings_;
  std::string name_;
  Counters counters_;
};

int serve(int argc, char** argv) {
  ServeArgs a;
  po::options_description opts("xfmr-serve: an OpenAI-compatible server for a language model");
  opts.add_options()("help", "show this help")(
      "model", po::value(&a.model), "a Hugging Face directory, a llama2.c .bin, or an xfmr-lm checkpoint (required)")(
      "tokenizer", po::value(&a.tokenizer), "as xfmr-lm sample's (default: the model's)")(
      "host", po::value(&a.host)->default_value(a.host), "address to listen on (0.0.0.0: every interface)")(
      "port", po::value(&a.port)->default_value(a.port), "port to listen on (0: any free one, printed)")(
      "slots", po::value(&a.slots)->default_value(a.slots), "sequences decoded together")(
      "context", po::value(&a.context)->default_value(a.context),
      "tokens a slot holds, prompt and answer (0: the model's context, at most 2048)")(
      "queue", po::value(&a.queue)->default_value(a.queue), "requests waiting for a slot before 503")(
      "precision", po::value(&a.precision)->default_value(a.precision), kDecodePrecisionHelp)(
      "backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp)(
      "api-key", po::value(&a.api_key), "require 'Authorization: Bearer KEY' on /v1 routes")(
      "chat-template", po::value(&a.chat_template),
      "chatml, llama3 or plain (default: the model's "
      "tokenizer_config.json's, else plain)")("name", po::value(&a.name),
                                              "the model's id in the API (default: the model path's last part)")(
      "max-body", po::value(&a.max_body)->default_value(a.max_body), "largest request body, bytes (413 past it)")(
      "drain", po::value(&a.drain)->default_value(a.drain), "seconds running requests get to finish after SIGTERM");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.model.empty(), "--model PATH is required");
  require(a.port >= 0 && a.port <= 65535, "--port ", a.port, " outside [0, 65535]");
  require(a.slots >= 1 && a.slots <= 256, "--slots ", a.slots, " outside [1, 256]");
  require(a.context >= 0, "--context ", a.context, " must be >= 0");
  require(a.queue >= 0 && a.queue <= 4096, "--queue ", a.queue, " outside [0, 4096]");
  require(a.drain >= 0, "--drain ", a.drain, " must be >= 0");
  a.engine = engine_options(vm, a.backend, a.precision, a.tokenizer);
  (void)Engine::check(a.model, a.engine);
  if (!a.chat_template.empty()) (void)ChatTemplate::named(a.chat_template);

  // SIGINT and SIGTERM go to one thread (sigwait), whatever thread they hit.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Service service(a);
  httplib::Server http;
  http.set_payload_max_length(a.max_body);
  const std::size_t threads = std::size_t(a.slots) + std::size_t(a.queue) + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    ++service.counters().http_requests;
    if (req.path.starts_with("/v1/") && !a.api_key.empty() &&
        req.get_header_value("Authorization") != "Bearer " + a.api_key) {
      ++service.counters().client_errors;
      send_error(res, {401, "a valid API key is required: 'Authorization: Bearer KEY'", "", "invalid_request_error"});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path != "/health" && req.path != "/" && req.path != "/metrics" && !service.ready()) {
      send_error(res, {503, "the model is loading", "", "server_loading"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto handle = [&](auto&& f) {
    return [&, f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const HttpError& e) {
        if (e.status < 500) ++service.counters().client_errors;
        send_error(res, e);
      } catch (const Error& e) {
        ++service.counters().client_errors;
        send_error(res, {400, e.what()});
      } catch (const std::exception& e) {
        send_error(res, {500, e.what(), "", "server_error"});
      }
    };
  };
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    res.status = service.ready() ? 200 : 503;
    res.set_content(service.ready() ? R"({"status":"ok"})" : R"({"status":"loading"})", "application/json");
  });
  http.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(kXfmrChatPage, "text/html; charset=utf-8");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(service.metrics(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", handle([&](const httplib::Request&, httplib::Response& res) {
             res.set_content(json{{"object", "list"},
                                  {"data", json::array({{{"id", service.name()},
                                                         {"object", "model"},
                                                         {"created", 0},
                                                         {"owned_by", "xfmr"},
                                                         {"max_model_len", service.engine().batch_context()}}})}}
                                 .dump(kIndent, ' ', false, kReplace),
                             "application/json");
           }));
  http.Post("/v1/completions",
            handle([&](const httplib::Request& q, httplib::Response& r) { service.completions(q, r, false); }));
  http.Post("/v1/chat/completions",
            handle([&](const httplib::Request& q, httplib::Response& r) { service.completions(q, r, true); }));
  http.Post("/tokenize", handle([&](const httplib::Request& q, httplib::Response& r) { service.tokenize(q, r); }));
  http.Post("/detokenize", handle([&](const httplib::Request& q, httplib::Response& r) { service.detokenize(q, r); }));
  http.set_error_handler([&](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status >= 400 && res.status < 500) ++service.counters().client_errors;
    const char* what = res.status == 404   ? "no such route"
                       : res.status == 413 ? "the request body is too large"
                                           : "the request was refused";
    send_error(res, {res.status, what});
  });

  // cpp-httplib listens with a backlog of 5: a burst of clients connecting
  // at once overflows it and the kernel drops their connections. Its
  // listening socket is listened on again with the system's bound.
  int listening = -1;
  http.set_socket_options([&](int fd) {
    httplib::default_socket_options(fd);
    listening = fd;
  });
  const int port = a.port == 0 ? http.bind_to_any_port(a.host) : (http.bind_to_port(a.host, a.port) ? a.port : -1);
  require(port > 0, "cannot listen on ", a.host, ":", a.port, " (in use, or not an address of this machine)");
  system_call([&] { return ::listen(listening, SOMAXCONN); }, "listen on ", a.host, ":", port);
  std::cerr << "xfmr-serve: listening on http://" << a.host << ":" << port << "/ (loading the model)\n" << std::flush;
  std::jthread listener([&] { http.listen_after_bind(); });

  std::atomic<bool> stopping = false, released = false;  // released: the program, not a signal, ends the waits
  std::jthread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!released)
      std::cerr << "xfmr-serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": finishing the running requests\n";
    stopping = true;
    sigwait(&signals, &sig);  // a second one cancels what runs
    if (service.ready()) service.engine().cancel_all();
  });
  try {
    service.load();
  } catch (...) {
    http.stop();
    released = true;
    pthread_kill(signal_waiter.native_handle(), SIGTERM);  // releases both of its waits, one after the other
    while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    pthread_kill(signal_waiter.native_handle(), SIGTERM);
    throw;
  }
  // Drain, once a signal came: no new requests; the running ones get
  // --drain seconds, then are cancelled, and the engine returns.
  std::jthread drainer([&] {
    while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    service.engine().close();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.drain);
    while (!service.engine().idle() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    service.engine().cancel_all();
  });
  // The engine runs here, on the thread that loaded the model: libgomp keeps
  // a team of threads for each thread that starts parallel regions, and with
  // more threads in teams than cores it stops spinning between regions, so
  // every product's fork would wait for a sleeping thread to wake (steps of
  // an engine thread of its own took 1.8x as long; continuous_batching.hpp).
  service.engine().run({});
  drainer.join();
  http.stop();
  listener.join();
  released = true;
  pthread_kill(signal_waiter.native_handle(), SIGTERM);  // releases the second sigwait
  std::cerr << "xfmr-serve: stopped\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_command("xfmr-serve", [&] { return serve(argc, argv); });
}
