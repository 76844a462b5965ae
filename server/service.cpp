// service.cpp: a request into the engine's CompletionRequest (the model's
// name, the prompt within the context, sampling, stops), and the model's
// other routes: /tokenize, /detokenize, /metrics.
#include "service.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>

namespace xfmr::server {

namespace fs = std::filesystem;

void Service::load() {
  const ServerOptions& o = options_;
  engine_.emplace(Engine::load(o.model, o.engine));
  const int context = o.context > 0 ? o.context : std::min(engine_->max_t(), 2048);
  require(context <= engine_->max_t(), "--context ", context, " exceeds the model's ", engine_->max_t());
  engine_->start_batching({.slots = o.slots, .context = context, .prefill_chunk = 128, .queue = o.queue});
  if (!o.chat_template.empty()) chat_ = ChatTemplate::named(o.chat_template);
  else chat_ = model_chat_template(o.model);
  name_ = o.name.empty() ? fs::path(o.model).lexically_normal().filename().string() : o.name;
  if (name_.empty()) name_ = fs::path(o.model).lexically_normal().parent_path().filename().string();
  // Stop markers the tokenizer holds as one id end generation by id; the others as text.
  for (const std::string& s : chat_.stops()) {
    const auto ids = tokenizer().encode(s);
    if (ids.size() == 1) chat_stop_ids_.push_back(ids[0]);
    else chat_stop_strings_.push_back(s);
  }
  ready_ = true;
  std::cerr << "xfmr-serve: " << name_ << " (" << engine_->architecture().name << ", " << engine_->describe() << "), "
            << o.slots << " slots of " << context << " tokens, chat template " << chat_.name() << "\n"
            << std::flush;
}

void Service::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const json body = parse_body(req);
  if (const auto m = field<std::string>(body, "model"); m && *m != name_)
    throw HttpError{404, "The model '" + *m + "' does not exist; this server has '" + name_ + "'", "model",
                    "invalid_request_error"};
  if (const auto n = field<int>(body, "n"); n && *n != 1) bad_request("'n' must be 1", "n");
  std::string prompt_text;
  std::vector<std::int32_t> prompt;
  if (chat) {
    prompt = tokenizer().encode(chat_.render(chat_messages(body, chat_)));
  } else {
    prompt = completion_prompt(body, tokenizer());
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
  answer(std::move(r), chat, stream, include_usage, req, res);
}


void Service::tokenize(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req);
  const auto text = field<std::string>(body, "content");
  if (!text) bad_request("'content' is required", "content");
  res.set_content(dump(json{{"tokens", tokenizer().encode(*text)}}), "application/json");
}
void Service::detokenize(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req);
  const auto t = body.find("tokens");
  if (t == body.end() || !t->is_array()) bad_request("'tokens' must be a list of token ids", "tokens");
  res.set_content(dump(json{{"content", tokenizer().decode(token_ids(*t, "tokens", tokenizer().size()))}}),
                  "application/json");
}

std::string Service::metrics() {
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

}  // namespace xfmr::server
