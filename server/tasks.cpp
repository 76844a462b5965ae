// tasks.cpp: a request submitted to the engine and answered: whole, once
// it has finished (a client that goes away meanwhile has it cancelled), or
// streamed as server-sent events, an event a token as OpenAI sends them.
#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <string_view>

#include "service.hpp"

namespace xfmr::server {

namespace {

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

}  // namespace

void Service::answer(CompletionParams p, bool chat, const http::Request& req, http::Response& res) {
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
    s->id = engine_->submit(std::move(p.request), on_text, on_finish);
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
  const std::string object = chat ? (p.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  auto usage = [](const Completion& b) {
    return json{{"prompt_tokens", b.prompt_tokens},
                {"completion_tokens", b.completion_tokens()},
                {"total_tokens", b.prompt_tokens + b.completion_tokens()}};
  };
  // A request the model did not end (cut by the drain's deadline or a
  // second signal, or failed) is no answer: an error, never "stop".
  auto failure = [](const Completion& b) -> std::optional<HttpError> {
    if (b.reason == FinishReason::error) return HttpError{500, "generation failed: " + b.error, "", "server_error"};
    if (b.reason == FinishReason::cancelled)
      return HttpError{503,
                       "the request was cut after " + std::to_string(b.completion_tokens()) +
                           " tokens: the server is shutting down",
                       "", "server_shutting_down"};
    return std::nullopt;
  };
  auto reason = [](const Completion& b) -> json { return b.reason == FinishReason::length ? "length" : "stop"; };
  if (!p.stream) {
    // A client that has gone (http::client_gone) is noticed within a
    // wait, and its request cancelled: no slot decodes for nobody.
    std::unique_lock lock(s->m);
    bool gone = false;
    while (!s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done; }))
      if (!gone && http::client_gone(req)) {
        engine_->cancel(s->id);
        gone = true;
      }
    if (gone) return;  // nobody to answer
    if (const auto f = failure(s->result)) throw *f;
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason(s->result)}};
    std::string text;
    for (const std::string& piece : s->pieces) text += piece;
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
    else choice["text"] = text;
    res.set_content(dump(json{{"id", id},
                              {"object", object},
                              {"created", created},
                              {"model", name_},
                              {"choices", json::array({choice})},
                              {"usage", usage(s->result)}}),
                    "application/json");
    return;
  }
  auto event = [](const json& j) { return "data: " + dump(j) + "\n\n"; };
  auto chunk = [=, this](const json& choice) {
    return event(json{{"id", id},
                      {"object", object},
                      {"created", created},
                      {"model", name_},
                      {"choices", json::array({choice})}});
  };
  auto piece = [chat](const std::string& text, const json& finish) {
    json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    if (chat) c["delta"] = text.empty() && !finish.is_null() ? json::object() : json{{"content", text}};
    else c["text"] = text;
    return c;
  };
  res.set_header("Cache-Control", "no-cache");
  res.content_type = "text/event-stream";
  res.stream = [=, this](http::Writer& out) {
    bool done = false;
    if (chat)
      out.write(chunk(
          {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    while (!done && !out.failed()) {
      std::vector<std::string> pieces;
      Completion result;
      {
        std::unique_lock lock(s->m);
        s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done || !s->pieces.empty(); });
        pieces.swap(s->pieces);
        done = s->done;
        result = s->result;
      }
      std::string text;
      for (const std::string& t : pieces) text += chunk(piece(t, nullptr));  // an event a token, as OpenAI sends
      if (done) {
        if (const auto f = failure(result))
          text += event(json{{"error", {{"message", f->message}, {"type", f->type}, {"code", f->status}}}});
        else {
          text += chunk(piece("", reason(result)));
          if (p.include_usage)
            text += event(json{{"id", id},       {"object", object},         {"created", created},
                               {"model", name_}, {"choices", json::array()}, {"usage", usage(result)}});
        }
        text += "data: [DONE]\n\n";
      }
      // An empty wait still probes the connection (a comment line), so a
      // client that has gone is noticed within the wait.
      out.write(text.empty() ? std::string(": waiting\n\n") : text);
    }
    // Whatever ended the stream (done, or the client gone), the slot is freed.
    std::lock_guard lock(s->m);
    if (!s->done) engine_->cancel(s->id);
  };
}

}  // namespace xfmr::server
