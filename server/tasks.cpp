// tasks.cpp: a request submitted to the engine and answered: whole, once
// it has finished (a client that goes away meanwhile has it cancelled), or
// streamed as server-sent events, an event a token as OpenAI sends them.
#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>
#include <string_view>

#include "http_connection.hpp"
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

void Service::answer(CompletionRequest r, bool chat, bool stream, bool include_usage, const httplib::Request& req,
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
    const int socket = xfmr::server::connection_socket(req);
    std::unique_lock lock(s->m);
    bool gone = false;
    while (!s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done; }))
      if (!gone && xfmr::server::connection_closed(socket)) {
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
    res.set_content(dump(json{{"id", id},
                              {"object", object},
                              {"created", created},
                              {"model", name_},
                              {"choices", json::array({choice})},
                              {"usage", usage(s->result)}}),
                    "application/json");
    return;
  }
  auto chunk = [=, this](const json& choice) {
    return "data: " +
           dump(json{{"id", id},
                     {"object", object},
                     {"created", created},
                     {"model", name_},
                     {"choices", json::array({choice})}}) +
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
              out += "data: " +
                     dump(json{{"error", {{"message", "generation failed: " + result.error}, {"type", "server_error"}}}}) +
                     "\n\n";
            } else {
              out += chunk(piece("", reason(result)));
              if (include_usage)
                out += "data: " +
                       dump(json{{"id", id},       {"object", object},         {"created", created},
                                 {"model", name_}, {"choices", json::array()}, {"usage", usage(result)}}) +
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


}  // namespace xfmr::server
