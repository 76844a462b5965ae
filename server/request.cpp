// request.cpp: request.hpp's parsing and checks.
#include "request.hpp"

#include <algorithm>
#include <random>
#include <set>

namespace xfmr::server {

void send_error(http::Response& res, const HttpError& e) {
  res.status = e.status;
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

json parse_body(const http::Request& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) bad_request("the request body is not valid JSON");
  if (!body.is_object()) bad_request("the request body must be a JSON object");
  return body;
}

std::vector<std::int32_t> token_ids(const json& list, const char* what, int vocab) {
  std::vector<std::int32_t> ids;
  for (const json& t : list) {
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= vocab)
      bad_request(std::string("'") + what + "' holds " + dump(t) + ", not a token id in [0, " + std::to_string(vocab) +
                      ")",
                  what);
    ids.push_back(t.get<std::int32_t>());
  }
  return ids;
}

std::vector<std::int32_t> completion_prompt(const json& body, const ModelTokenizer& tok) {
  const auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) bad_request("'prompt' is required", "prompt");
  if (p->is_string()) return tok.encode(p->get<std::string>());
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) return tok.encode((*p)[0].get<std::string>());
  if (p->is_array() && !p->empty() && (*p)[0].is_number()) return token_ids(*p, "prompt", tok.size());
  bad_request("'prompt' must be a string, a list of one string, or a list of token ids", "prompt");
}

std::vector<ChatMessage> chat_messages(const json& body, const ChatTemplate& chat) {
  const auto m = body.find("messages");
  if (m == body.end() || !m->is_array() || m->empty()) bad_request("'messages' must be a non-empty list", "messages");
  std::vector<ChatMessage> out;
  for (std::size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("role") || !e["role"].is_string())
      bad_request(at + " needs a 'role' string", "messages");
    std::string content;
    std::vector<ToolCall> calls;
    if (const auto tc = e.find("tool_calls"); tc != e.end() && !tc->is_null()) {
      if (!tc->is_array()) bad_request(at + ".tool_calls must be a list", "messages");
      for (const json& call : *tc) {
        const json f = call.is_object() ? call.value("function", json()) : json();
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
            (f.contains("arguments") && !f["arguments"].is_string()))
          bad_request(at + ".tool_calls: each needs a function with a 'name' and 'arguments' (a JSON text)", "messages");
        calls.push_back({f["name"].get<std::string>(), f.value("arguments", "{}")});
      }
    }
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
    out.push_back({e["role"].get<std::string>(), std::move(content), std::move(calls)});
  }
  try {
    chat.render(out);
  } catch (const Error& e) {
    bad_request(e.what(), "messages");
  }
  return out;
}

std::vector<std::string> stop_strings(const json& body) {
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

namespace {

// Fields of OpenAI's API this server does not implement: each is refused
// when it asks for something (a value other than its neutral one), so
// that nobody gets an answer as if it had not been sent.
bool neutral(const std::string& key, const json& v) {
  if (v.is_null()) return true;
  if (key == "echo") return v == false;
  if (key == "best_of") return v == 1;
  if (key == "logit_bias" || key == "metadata") return v.is_object() && v.empty();
  if (key == "presence_penalty" || key == "frequency_penalty") return v.is_number() && v.get<double>() == 0.0;
  if (key == "suffix") return v == "";
  if (key == "tools" || key == "functions") return v.is_array() && v.empty();
  if (key == "tool_choice" || key == "function_call") return v == "none";
  return false;
}

const std::set<std::string> kRead = {"model", "max_tokens", "temperature", "top_p", "top_k",   "seed",
                                     "stream", "stream_options", "stop", "ignore_eos", "n", "user", "logprobs",
                                     "response_format"};
const std::set<std::string> kReadCompletion = {"prompt"};
const std::set<std::string> kReadChat = {"messages", "max_completion_tokens", "parallel_tool_calls", "store",
                                         "top_logprobs", "tools", "tool_choice"};
const std::set<std::string> kUnimplemented = {"echo", "best_of", "logit_bias", "suffix", "functions", "function_call",
                                              "presence_penalty", "frequency_penalty", "metadata"};

// "tools": OpenAI's functions, each with its parameters' schema.
std::vector<ChatTool> chat_tools(const json& body) {
  std::vector<ChatTool> tools;
  const auto t = body.find("tools");
  if (t == body.end() || t->is_null()) return tools;
  if (!t->is_array() || t->size() > 64) bad_request("'tools' must be a list of up to 64 functions", "tools");
  for (const json& tool : *t) {
    const json f = tool.is_object() && tool.value("type", "") == "function" ? tool.value("function", json()) : json();
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad_request("'tools': each must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
    if (f.contains("parameters") && !f["parameters"].is_object())
      bad_request("'tools': a function's parameters must be a JSON schema (an object)", "tools");
    tools.push_back({f["name"].get<std::string>(), f.value("description", ""),
                     f.contains("parameters") ? f["parameters"].dump() : std::string()});
  }
  return tools;
}

}  // namespace

CompletionParams read_completion(const json& body, bool chat, const ModelFacts& model) {
  constexpr int kMaxChoices = 16;
  for (const auto& [key, value] : body.items()) {
    if (kRead.contains(key) || (chat ? kReadChat : kReadCompletion).contains(key)) continue;
    if (kUnimplemented.contains(key)) {
      if (neutral(key, value)) continue;
      bad_request("'" + key + "' is not supported by this server", key);
    }
    bad_request("'" + key + "' is not a field of " + (chat ? "/v1/chat/completions" : "/v1/completions"), key);
  }
  // "model": the model's name, or a LoRA adapter's (--lora NAME=DIR), which the request's rows then take.
  std::string adapter;
  if (const auto m = field<std::string>(body, "model"); m && *m != model.name) {
    if (model.adapters && std::find(model.adapters->begin(), model.adapters->end(), *m) != model.adapters->end()) {
      adapter = *m;
    } else {
      std::string names = "'" + model.name + "'";
      if (model.adapters)
        for (const std::string& a : *model.adapters) names += ", '" + a + "'";
      throw HttpError{404, "The model '" + *m + "' does not exist; this server has " + names, "model",
                      "invalid_request_error"};
    }
  }
  const int n = field<int>(body, "n").value_or(1);
  if (n < 1 || n > kMaxChoices) bad_request("'n' " + std::to_string(n) + " outside [1, " + std::to_string(kMaxChoices) + "]", "n");
  std::vector<std::int32_t> prompt;
  std::shared_ptr<const JsonSchema> forced_call;
  CompletionParams::Tools tool_mode = CompletionParams::Tools::none;
  if (chat) {
    std::vector<ChatTool> tools = chat_tools(body);
    std::string choice = tools.empty() ? "none" : "auto", named;
    if (const auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
      if (tc->is_string()) choice = tc->get<std::string>();
      else if (tc->is_object() && tc->value("type", "") == "function" && tc->contains("function") &&
               (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
               (*tc)["function"]["name"].is_string())
        choice = "function", named = (*tc)["function"]["name"].get<std::string>();
      else bad_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
      if (choice != "none" && choice != "auto" && choice != "required" && choice != "function")
        bad_request("'tool_choice' \"" + choice + "\" (none, auto, required or a function)", "tool_choice");
      if (choice != "none" && tools.empty()) bad_request("'tool_choice' without 'tools'", "tool_choice");
    }
    if (choice == "none") tools.clear();
    std::string text;
    try {
      text = model.chat.render(chat_messages(body, model.chat), tools);
    } catch (const Error& e) {
      bad_request(e.what(), "messages");
    }
    if (choice == "required" || choice == "function") {
      try {
        if (!named.empty() && std::none_of(tools.begin(), tools.end(), [&](const ChatTool& t) { return t.name == named; }))
          bad_request("'tool_choice' names '" + named + "', which is not among 'tools'", "tool_choice");
        forced_call = JsonSchema::compile(json::parse(model.chat.tool_call_schema(tools, named)));
      } catch (const Error& e) {
        bad_request(std::string("'tools': ") + e.what(), "tools");
      }
      text += model.chat.tool_call_opening();
      tool_mode = CompletionParams::Tools::forced;
    } else if (!tools.empty()) {
      tool_mode = CompletionParams::Tools::offered;
    }
    prompt = model.tokenizer.encode(text);
  } else {
    prompt = completion_prompt(body, model.tokenizer);
  }
  if (prompt.empty()) {
    if (model.tokenizer.start() < 0) bad_request("'prompt' is empty", "prompt");
    prompt.push_back(model.tokenizer.start());
  }
  const int context = model.context;
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
  CompletionParams p;
  p.n = n;
  p.tools = tool_mode;
  CompletionRequest& r = p.request;
  r.adapter = adapter;
  if (forced_call && body.contains("response_format") && body["response_format"].is_object() &&
      body["response_format"].value("type", "text") != "text")
    bad_request("'response_format' with a forced tool call: the call's schema is the answer's", "response_format");
  r.json_schema = forced_call;
  // response_format: text, any JSON object, or a value of a JSON schema
  // (json_grammar.hpp: each token drawn keeps the text a value's prefix).
  if (const auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad_request("'response_format' must be an object with a 'type'", "response_format");
    const std::string type = (*rf)["type"];
    try {
      if (type == "json_object") {
        r.json_schema = JsonSchema::any_object();
      } else if (type == "json_schema") {
        const auto js = rf->find("json_schema");
        if (js == rf->end() || !js->is_object() || !js->contains("schema"))
          bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format");
        r.json_schema = JsonSchema::compile((*js)["schema"]);
      } else if (type != "text") {
        bad_request("'response_format.type' \"" + type + "\" (text, json_object or json_schema)", "response_format");
      }
    } catch (const Error& e) {
      bad_request(std::string("'response_format': ") + e.what(), "response_format");
    }
    if (r.json_schema && field<bool>(body, "ignore_eos").value_or(false))
      bad_request("'ignore_eos' with a 'response_format': the value ends with the end-of-text token", "ignore_eos");
  }
  // logprobs: chat's a boolean with top_logprobs (0-20) beside it;
  // completions' the number of likeliest ids (0-5), as OpenAI's API has them.
  if (chat) {
    const bool asked = field<bool>(body, "logprobs").value_or(false);
    const auto top = field<int>(body, "top_logprobs");
    if (top && (*top < 0 || *top > 20)) bad_request("'top_logprobs' must be in [0, 20]", "top_logprobs");
    if (top && !asked) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.logprobs = asked ? top.value_or(0) : -1;
  } else if (const auto top = field<int>(body, "logprobs")) {
    if (*top < 0 || *top > 5) bad_request("'logprobs' must be in [0, 5]", "logprobs");
    r.logprobs = *top;
  }
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens.value_or(chat || r.json_schema ? room : std::min(16, room));
  if (r.json_schema) {
    const int shortest = r.json_schema->node(r.json_schema->root()).min_chars;
    if (r.max_tokens < shortest)
      bad_request("'max_tokens' " + std::to_string(r.max_tokens) + " is fewer than the schema's shortest value needs (" +
                      std::to_string(shortest) + " characters, a token each at worst)",
                  "max_tokens");
  }
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
  (void)field<std::string>(body, "user");
  r.stop = stop_strings(body);
  if (chat) {
    r.stop_ids = model.chat_stop_ids;
    r.stop.insert(r.stop.end(), model.chat_stop_strings.begin(), model.chat_stop_strings.end());
  }
  p.stream = field<bool>(body, "stream").value_or(false);
  if (const auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) bad_request("'stream_options' must be an object", "stream_options");
    for (const auto& [key, value] : so->items())
      if (key != "include_usage") bad_request("'stream_options." + key + "' is not supported", "stream_options");
    p.include_usage = field<bool>(*so, "include_usage").value_or(false);
  }
  return p;
}

}  // namespace xfmr::server
