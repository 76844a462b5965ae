// request.hpp: an HTTP request's JSON read and checked: OpenAI's error
// object for what is wrong, naming the field (a 4xx), the fields' types
// and ranges, and a completion request whole (read_completion, the fuzz
// target's subject: test/fuzz/fuzz_serve_request.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "http.hpp"
#include "xfmr/infer/json_grammar.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/io/model_tokenizer.hpp"
#include "xfmr/text/chat_template.hpp"

namespace xfmr::server {

using json = nlohmann::json;

// JSON text of answers: a byte that is not UTF-8 (in an error message that
// quotes the input) becomes U+FFFD instead of an exception.
inline std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A 4xx (or 5xx) with OpenAI's error object.
struct HttpError {
  int status = 400;
  std::string message{}, param{};
  const char* type = "invalid_request_error";
};
[[noreturn]] inline void bad_request(std::string message, std::string param = {}) {
  throw HttpError{400, std::move(message), std::move(param)};
}
void send_error(http::Response& res, const HttpError& e);

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

// The body, a JSON object.
json parse_body(const http::Request& req);
// A list of token ids below `vocab`, field `what`.
std::vector<std::int32_t> token_ids(const json& list, const char* what, int vocab);
// "prompt": a text, a list of one text, or a list of token ids.
std::vector<std::int32_t> completion_prompt(const json& body, const ModelTokenizer& tok);
// "messages" (with assistants' tool_calls and tool results), which `chat` must render.
std::vector<ChatMessage> chat_messages(const json& body, const ChatTemplate& chat);
// "stop": a string or a list of up to 4.
std::vector<std::string> stop_strings(const json& body);

// What a completion request is read against: the model's.
struct ModelFacts {
  const ModelTokenizer& tokenizer;
  const ChatTemplate& chat;
  const std::vector<std::int32_t>& chat_stop_ids;      // the template's stops that are one token
  const std::vector<std::string>& chat_stop_strings;  // and the others
  const std::string& name;                            // the model's id in the API
  int context;                                        // tokens a slot holds
  const std::vector<std::string>* adapters = nullptr;  // LoRA adapters' ids in the API (a request's "model")
};

struct CompletionParams {
  CompletionRequest request;  // choice i draws with request.seed + i
  int n = 1;                  // choices
  // Tools: none offered; offered (the answer's calls parsed back); or a
  // call forced (required, or a named function: the answer is the call's
  // JSON, written under its schema).
  enum class Tools { none, offered, forced } tools = Tools::none;
  bool stream = false, include_usage = false;
};

// A /v1/completions (chat false) or /v1/chat/completions body, checked
// whole: every field's type and range, the prompt within the context, and
// no field this server does not implement (echo, best_of, logit_bias,
// functions, penalties, ...: each refused by name, as is any field OpenAI's
// API does not have); response_format's schema compiled (json_grammar.hpp),
// tools offered through the chat template.
CompletionParams read_completion(const json& body, bool chat, const ModelFacts& model);

}  // namespace xfmr::server
