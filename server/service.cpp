// service.cpp: a request into the engine's CompletionRequest (the model's
// name, the prompt within the context, sampling, stops), and the model's
// other routes: /tokenize, /detokenize, /metrics.
#include "service.hpp"

#include <algorithm>
#include <cstring>
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
  if (!o.draft.empty()) engine_->set_draft(Engine::load(o.draft, o.draft_engine));
  for (const ServerOptions::Adapter& a : o.adapters) engine_->add_adapter(a.name, a.dir, a.scale);
  engine_->start_batching(
      {.slots = o.slots, .context = context, .prefill_chunk = 128, .queue = o.queue, .speculation = o.speculation});
  if (!o.chat_template.empty()) chat_ = ChatTemplate::named(o.chat_template);
  else chat_ = model_chat_template(o.model);
  name_ = o.name.empty() ? fs::path(o.model).lexically_normal().filename().string() : o.name;
  if (name_.empty()) name_ = fs::path(o.model).lexically_normal().parent_path().filename().string();
  for (const ServerOptions::Adapter& a : o.adapters)
    require(a.name != name_, "--lora ", a.name, ": the model's own name (--name sets it)");
  // Stop markers the tokenizer holds as one id end generation by id; the others as text.
  for (const std::string& s : chat_.stops()) {
    const auto ids = tokenizer().encode(s);
    if (ids.size() == 1) chat_stop_ids_.push_back(ids[0]);
    else chat_stop_strings_.push_back(s);
  }
  ready_ = true;
  std::cerr << "xfmr-serve: " << name_ << " (" << engine_->architecture().name << ", " << engine_->describe() << "), "
            << o.slots << " slots of " << context << " tokens, chat template " << chat_.name();
  if (engine_->has_draft())
    std::cerr << ", draft model " << o.draft << " (" << engine_->draft()->architecture().name << ", "
              << engine_->draft()->describe() << ", " << o.speculation.draft << " tokens a step)";
  for (const ServerOptions::Adapter& a : o.adapters) std::cerr << ", LoRA adapter " << a.name << " (" << a.dir << ")";
  std::cerr << "\n" << std::flush;
}

void Service::completions(const http::Request& req, http::Response& res, bool chat) {
  answer(read_completion(parse_body(req), chat, facts()), chat, req, res);
}

namespace {

// float32 values' little-endian bytes in base64 (OpenAI's encoding_format
// "base64", which its clients ask for by default).
std::string base64_floats(const std::vector<float>& v) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * 4, '\0');
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + std::size_t(b)] = char((u >> (8 * b)) & 0xff);
  }
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t x = 0;
    for (std::size_t j = 0; j < 3; ++j) x = (x << 8) | (j < n ? std::uint8_t(bytes[i + j]) : 0u);
    for (std::size_t j = 0; j < 4; ++j) out += j <= n ? kDigits[(x >> (18 - 6 * j)) & 63] : '=';
  }
  return out;
}

}  // namespace

void Service::embeddings(const http::Request& req, http::Response& res) {
  const json body = parse_body(req);
  for (const auto& [key, value] : body.items())
    if (key != "input" && key != "model" && key != "encoding_format" && key != "user" && key != "dimensions")
      bad_request("'" + key + "' is not a field of /v1/embeddings", key);
  if (const auto m = field<std::string>(body, "model"); m && *m != name_)
    throw HttpError{404, "The model '" + *m + "' does not exist; this server has '" + name_ + "'", "model",
                    "invalid_request_error"};
  const std::string format = field<std::string>(body, "encoding_format").value_or("float");
  if (format != "float" && format != "base64")
    bad_request("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
  (void)field<std::string>(body, "user");
  // The inputs: a text, a list of texts, a list of ids, or a list of lists of ids.
  const auto in = body.find("input");
  if (in == body.end() || in->is_null()) bad_request("'input' is required", "input");
  std::vector<std::vector<std::int32_t>> inputs;
  auto one = [&](const json& x) {
    if (x.is_string()) inputs.push_back(tokenizer().encode(x.get<std::string>()));
    else if (x.is_array() && (x.empty() || x[0].is_number())) inputs.push_back(token_ids(x, "input", tokenizer().size()));
    else bad_request("'input' must be a text, a list of texts, a list of token ids, or a list of such lists", "input");
  };
  if (in->is_array() && !in->empty() && (in->front().is_string() || in->front().is_array())) {
    if (in->size() > 256) bad_request("'input' holds " + std::to_string(in->size()) + " inputs; at most 256", "input");
    for (const json& x : *in) one(x);
  } else {
    one(*in);
  }
  const int context = engine_->max_t();
  const int width = engine_->architecture().d_model;
  if (const auto d = field<int>(body, "dimensions"); d && *d != width)
    bad_request("'dimensions' " + std::to_string(*d) + ": this model's embeddings have " + std::to_string(width),
                "dimensions");
  json data = json::array();
  int tokens = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) bad_request("input " + std::to_string(i) + " is empty", "input");
    if (int(inputs[i].size()) > context)
      bad_request("input " + std::to_string(i) + " is " + std::to_string(inputs[i].size()) +
                      " tokens; the context is " + std::to_string(context),
                  "input");
    tokens += int(inputs[i].size());
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<float> e = engine_->embedding(inputs[i]);
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", format == "float" ? json(e) : json(base64_floats(e))}});
  }
  res.set_content(dump(json{{"object", "list"},
                            {"data", data},
                            {"model", name_},
                            {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}}),
                  "application/json");
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
  metric("draft_tokens_total", "counter", "tokens drafted (prompt lookup or the draft model)", s.drafted_tokens);
  metric("draft_accepted_total", "counter", "drafted tokens drawn as drafted", s.accepted_tokens);
  metric("busy_seconds_total", "counter", "seconds spent in decoding steps", s.busy_seconds);
  metric("tokens_per_second", "gauge", "tokens generated per second of decoding steps",
         s.busy_seconds > 0 ? double(s.generated_tokens) / s.busy_seconds : 0.0);
  metric("queue_length", "gauge", "requests waiting for a slot", s.queued);
  metric("slots_busy", "gauge", "slots decoding a request", s.busy_slots);
  metric("slots", "gauge", "slots", s.slots);
  return o.str();
}

}  // namespace xfmr::server
