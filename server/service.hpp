// service.hpp: what the routes call: the model (the library's Engine) and
// what the server adds to it (its name, the chat template and its stops,
// the counters), loaded while /health says 503.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "request.hpp"
#include "server.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/text/chat_template.hpp"

namespace xfmr::server {

// The counters /metrics shows beyond the engine's.
struct Counters {
  std::atomic<std::uint64_t> http_requests{0}, client_errors{0}, rejected_busy{0};
};

class Service {
 public:
  explicit Service(const ServerOptions& o) : options_(o) {}

  void load();
  bool ready() const { return ready_; }
  const std::string& name() const { return name_; }
  const ModelTokenizer& tokenizer() const { return engine_->tokenizer(); }
  Engine& engine() { return *engine_; }
  Counters& counters() { return counters_; }

  // POST /v1/completions (chat false) and /v1/chat/completions.
  void completions(const http::Request& req, http::Response& res, bool chat);
  void tokenize(const http::Request& req, http::Response& res);
  // POST /v1/embeddings: the engine's embedding of each input.
  void embeddings(const http::Request& req, http::Response& res);
  void detokenize(const http::Request& req, http::Response& res);
  std::string metrics();
  // GET /slots: each slot's state (the engine's batcher).
  json slots();

 private:
  // tasks.cpp: submits r to the engine and answers it, whole or streamed.
  void answer(CompletionParams p, bool chat, const http::Request& req, http::Response& res);
  // OpenAI's logprobs object of a choice (chat's content list, or
  // completions' tokens and offsets from text_offset).
  json logprobs_json(const std::vector<TokenLogprobs>& lps, bool chat, std::size_t text_offset) const;
  // A chat answer with its tool calls read back (the chat format's, or a
  // forced call's JSON): {content, calls} as OpenAI's message has them.
  std::pair<std::string, json> tool_answer(const std::string& text, CompletionParams::Tools mode,
                                           const std::string& id) const;
  ModelFacts facts() const {
    return {tokenizer(), chat_, chat_stop_ids_, chat_stop_strings_, name_, engine_->batch_context(),
            &engine_->adapter_names()};
  }

  ServerOptions options_;
  std::atomic<bool> ready_{false};
  std::optional<Engine> engine_;
  ChatTemplate chat_;
  std::vector<std::int32_t> chat_stop_ids_;
  std::vector<std::string> chat_stop_strings_;
  std::string name_;
  Counters counters_;
};

}  // namespace xfmr::server
