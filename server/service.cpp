// service.cpp: a request into the engine's CompletionRequest (the model's
// name, the prompt within the context, sampling, stops), and the model's
// other routes: /tokenize, /detokenize, /metrics.
#include "service.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
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

void Service::completions(const http::Request& req, http::Response& res, bool chat) {
  answer(read_completion(parse_body(req), chat, facts()), chat, req, res);
}

void Service::tokenize(const http::Request& req, http::Response& res) {
  const json body = parse_body(req);
  const auto text = field<std::string>(body, "content");
  if (!text) bad_request("'content' is required", "content");
  res.set_content(dump(json{{"tokens", tokenizer().encode(*text)}}), "application/json");
}
void Service::detokenize(const http::Request& req, http::Response& res) {
  const json body = parse_body(req);
  const auto t = body.find("tokens");
  if (t == body.end() || !t->is_array()) bad_request("'tokens' must be a list of token ids", "tokens");
  res.set_content(dump(json{{"content", tokenizer().decode(token_ids(*t, "tokens", tokenizer().size()))}}),
                  "application/json");
}

json Service::slots() {
  json out = json::array();
  if (!ready_) return out;
  const std::vector<SlotState> states = engine_->slot_states();
  for (std::size_t i = 0; i < states.size(); ++i) {
    const SlotState& x = states[i];
    out.push_back({{"id", i},
                   {"n_ctx", engine_->batch_context()},
                   {"is_processing", x.busy},
                   {"id_task", x.request},
                   {"n_prompt_tokens", x.prompt_tokens},
                   {"n_prompt_tokens_cached", x.cached_tokens},
                   {"n_decoded", x.generated_tokens},
                   {"n_held", x.held_tokens}});
  }
  return out;
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
  metric("prompt_tokens_cached_total", "counter", "prompt tokens taken from the cache instead of read",
         s.cached_tokens);
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
