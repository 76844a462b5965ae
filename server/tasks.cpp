// tasks.cpp: a request submitted to the engine and answered: whole, once
// it has finished (a client that goes away meanwhile has it cancelled), or
// streamed as server-sent events, an event a token as OpenAI sends them.
// A request of n choices is n requests to the engine (choice i with seed +
// i), whose prompt the batcher reads once (its prompt cache).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <string_view>

#include "service.hpp"

namespace xfmr::server {

namespace {

// A token's text (UTF-8, safe to send) and, when asked, its logprobs.
struct Piece {
  int choice = 0;
  std::string text;
  std::optional<TokenLogprobs> logprobs;
};

// A request's tokens on their way from the engine's thread to the
// connection's: pieces not yet sent, and each choice's end.
struct Stream {
  std::mutex m;
  std::condition_variable cv;
  std::vector<Piece> pieces;
  std::vector<std::optional<Completion>> results;  // a choice's, once it has finished
  std::vector<std::uint64_t> ids;                  // the engine's request of each choice
  bool done() const {
    return std::all_of(results.begin(), results.end(), [](const auto& r) { return r.has_value(); });
  }
};

json usage_of(const std::vector<std::optional<Completion>>& results) {
  const Completion& first = *results.front();
  int completion = 0;
  for (const auto& r : results) completion += r->completion_tokens();
  return {{"prompt_tokens", first.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", first.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", first.cached_tokens}}}};
}

// llama-server's `timings`: the prompt's (the ids read, not those the
// cache held) and the generation's, over the choices.
json timings_of(const std::vector<std::optional<Completion>>& results) {
  const Completion& first = *results.front();
  int predicted = 0;
  double predicted_s = 0;
  for (const auto& r : results) predicted += r->completion_tokens(), predicted_s = std::max(predicted_s, r->generation_seconds);
  const int read = first.prompt_tokens - first.cached_tokens;
  auto per_second = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  return {{"cache_n", first.cached_tokens},
          {"prompt_n", read},
          {"prompt_ms", first.prompt_seconds * 1e3},
          {"prompt_per_second", per_second(read, first.prompt_seconds)},
          {"predicted_n", predicted},
          {"predicted_ms", predicted_s * 1e3},
          {"predicted_per_second", per_second(predicted, predicted_s)}};
}

}  // namespace

json Service::logprobs_json(const std::vector<TokenLogprobs>& lps, bool chat, std::size_t text_offset) const {
  const ModelTokenizer& tok = tokenizer();
  auto token = [&](std::int32_t id) { return tok.decode(std::vector<std::int32_t>{id}); };
  if (chat) {
    auto entry = [&](const TokenLogprob& t) {
      const std::string text = token(t.id);
      return json{{"token", text}, {"logprob", t.logprob}, {"bytes", std::vector<unsigned char>(text.begin(), text.end())}};
    };
    json content = json::array();
    for (const TokenLogprobs& lp : lps) {
      json e = entry(lp.token);
      e["top_logprobs"] = json::array();
      for (const TokenLogprob& t : lp.top) e["top_logprobs"].push_back(entry(t));
      content.push_back(std::move(e));
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& lp : lps) {
    const std::string text = token(lp.token.id);
    tokens.push_back(text);
    values.push_back(lp.token.logprob);
    json top = json::object();
    for (const TokenLogprob& t : lp.top) top[token(t.id)] = t.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::pair<std::string, json> Service::tool_answer(const std::string& text, CompletionParams::Tools mode,
                                                  const std::string& id) const {
  ChatTemplate::Answer parsed;
  if (mode == CompletionParams::Tools::forced) {
    // The call's JSON alone (its opening was the prompt's end).
    const std::string opening = chat_.tool_call_opening();
    parsed = chat_.parse_tool_calls(opening.empty() ? text : opening + text + "\n</tool_call>");
    if (parsed.calls.empty()) parsed.content = text;
  } else if (mode == CompletionParams::Tools::offered) {
    parsed = chat_.parse_tool_calls(text);
  } else {
    parsed.content = text;
  }
  json calls = json::array();
  for (std::size_t k = 0; k < parsed.calls.size(); ++k)
    calls.push_back({{"id", "call_" + id + "_" + std::to_string(k)},
                     {"type", "function"},
                     {"function", {{"name", parsed.calls[k].name}, {"arguments", parsed.calls[k].arguments}}}});
  return {parsed.content, calls};
}

void Service::answer(CompletionParams p, bool chat, const http::Request& req, http::Response& res) {
  auto s = std::make_shared<Stream>();
  s->results.resize(std::size_t(p.n));
  const bool logprobs = p.request.logprobs >= 0;
  const std::string model = p.request.adapter.empty() ? name_ : p.request.adapter;  // the id it asked for
  try {
    for (int i = 0; i < p.n; ++i) {
      CompletionRequest r = p.request;
      r.seed = p.request.seed + std::uint64_t(i);
      const auto on_step = [s, i, logprobs](const TokenStep& t) {
        std::lock_guard lock(s->m);
        if (!t.text.empty() || (logprobs && t.logprobs))
          s->pieces.push_back({i, std::string(t.text), t.logprobs ? std::optional(*t.logprobs) : std::nullopt});
        s->cv.notify_all();
        return true;
      };
      const auto on_finish = [s, i](const Completion& result) {
        std::lock_guard lock(s->m);
        s->results[std::size_t(i)] = result;
        s->cv.notify_all();
      };
      const std::uint64_t id = engine_->submit(std::move(r), OnStep(on_step), on_finish);
      std::lock_guard lock(s->m);
      s->ids.push_back(id);
    }
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(s->m);
      for (std::uint64_t id : s->ids) engine_->cancel(id);
    }
    if (dynamic_cast<const QueueFull*>(&e)) {
      ++counters_.rejected_busy;
      res.set_header("Retry-After", "1");
      throw HttpError{503, std::string("the server is busy: ") + e.what(), "", "server_busy"};
    }
    if (std::string_view(e.what()).find("shutting down") != std::string_view::npos)
      throw HttpError{503, e.what(), "", "server_shutting_down"};
    if (dynamic_cast<const Error*>(&e)) bad_request(e.what());
    throw;
  }
  const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(s->ids.front());
  const std::int64_t created = std::time(nullptr);
  const std::string object = chat ? (p.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
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
  auto cancel_all = [this, s] {
    for (std::uint64_t x : s->ids) engine_->cancel(x);
  };
  if (!p.stream) {
    // A client that has gone (http::client_gone) is noticed within a
    // wait, and its request cancelled: no slot decodes for nobody.
    std::unique_lock lock(s->m);
    bool gone = false;
    while (!s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done(); }))
      if (!gone && http::client_gone(req)) {
        cancel_all();
        gone = true;
      }
    if (gone) return;  // nobody to answer
    for (const auto& r : s->results)
      if (const auto f = failure(*r)) throw *f;
    json choices = json::array();
    for (int i = 0; i < p.n; ++i) {
      const Completion& r = *s->results[std::size_t(i)];
      std::string text;
      for (const Piece& piece : s->pieces)
        if (piece.choice == i) text += piece.text;
      json choice = {{"index", i},
                     {"logprobs", logprobs ? logprobs_json(r.logprobs, chat, 0) : json(nullptr)},
                     {"finish_reason", reason(r)}};
      if (chat) {
        const auto [content, calls] = tool_answer(text, p.tools, std::to_string(s->ids[std::size_t(i)]));
        choice["message"] = {{"role", "assistant"}, {"content", content}};
        if (!calls.empty()) {
          choice["message"]["tool_calls"] = calls;
          if (content.empty()) choice["message"]["content"] = nullptr;
          choice["finish_reason"] = "tool_calls";
        }
      } else {
        choice["text"] = text;
      }
      choices.push_back(std::move(choice));
    }
    res.set_content(dump(json{{"id", id},
                              {"object", object},
                              {"created", created},
                              {"model", model},
                              {"choices", choices},
                              {"usage", usage_of(s->results)},
                              {"timings", timings_of(s->results)}}),
                    "application/json");
    return;
  }
  auto event = [](const json& j) { return "data: " + dump(j) + "\n\n"; };
  auto chunk = [=, this](const json& choice) {
    return event(json{{"id", id},
                      {"object", object},
                      {"created", created},
                      {"model", model},
                      {"choices", json::array({choice})}});
  };
  res.set_header("Cache-Control", "no-cache");
  res.content_type = "text/event-stream";
  res.stream = [=, this](http::Writer& out) {
    std::vector<std::size_t> offsets(std::size_t(p.n), 0);  // completions' text_offset, per choice
    std::vector<bool> ended(std::size_t(p.n), false);
    // With tools, a choice's text is held to its end, then sent as text or as calls.
    const bool held = p.tools != CompletionParams::Tools::none;
    std::vector<std::string> texts(std::size_t(p.n));
    auto piece = [&](const Piece& x) {
      json c = {{"index", x.choice}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (x.logprobs) c["logprobs"] = logprobs_json({*x.logprobs}, chat, offsets[std::size_t(x.choice)]);
      if (chat) c["delta"] = {{"content", x.text}};
      else c["text"] = x.text;
      offsets[std::size_t(x.choice)] += x.text.size();
      return chunk(c);
    };
    if (chat)
      for (int i = 0; i < p.n; ++i)
        out.write(chunk({{"index", i},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"logprobs", nullptr},
                         {"finish_reason", nullptr}}));
    bool done = false;
    while (!done && !out.failed()) {
      std::vector<Piece> pieces;
      std::vector<std::optional<Completion>> results;
      {
        std::unique_lock lock(s->m);
        s->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return s->done() || !s->pieces.empty(); });
        pieces.swap(s->pieces);
        results = s->results;
        done = s->done();
      }
      std::string text;
      for (const Piece& x : pieces)
        if (held) texts[std::size_t(x.choice)] += x.text;
        else text += piece(x);  // an event a token, as OpenAI sends
      // A choice's end once all its text has gone; a failure ends the stream.
      std::optional<HttpError> failed;
      for (int i = 0; i < p.n && !failed; ++i) {
        const auto& r = results[std::size_t(i)];
        if (!r || ended[std::size_t(i)]) continue;
        if ((failed = failure(*r))) break;
        json c = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", reason(*r)}};
        if (held) {
          const auto [content, calls] = tool_answer(texts[std::size_t(i)], p.tools, std::to_string(s->ids[std::size_t(i)]));
          json delta = json::object();
          if (!content.empty()) delta["content"] = content;
          if (!calls.empty()) {
            delta["tool_calls"] = calls;
            for (std::size_t k = 0; k < calls.size(); ++k) delta["tool_calls"][k]["index"] = k;
            c["finish_reason"] = "tool_calls";
          }
          if (!delta.empty())
            text += chunk({{"index", i}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
        }
        if (chat) c["delta"] = json::object();
        else c["text"] = "";
        text += chunk(c);
        ended[std::size_t(i)] = true;
      }
      if (failed) {
        text += event(json{{"error", {{"message", failed->message}, {"type", failed->type}, {"code", failed->status}}}});
        text += "data: [DONE]\n\n";
        out.write(text);
        break;
      }
      if (done) {
        if (p.include_usage)
          text += event(json{{"id", id},
                             {"object", object},
                             {"created", created},
                             {"model", model},
                             {"choices", json::array()},
                             {"usage", usage_of(results)},
                             {"timings", timings_of(results)}});
        text += "data: [DONE]\n\n";
      }
      // An empty wait still probes the connection (a comment line), so a
      // client that has gone is noticed within the wait.
      out.write(text.empty() ? std::string(": waiting\n\n") : text);
    }
    // Whatever ended the stream (done, or the client gone), the slots are freed.
    std::lock_guard lock(s->m);
    if (!s->done()) cancel_all();
  };
}

}  // namespace xfmr::server
