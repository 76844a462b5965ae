// request.cpp: request.hpp's parsing and checks.
#include "request.hpp"

namespace xfmr::server {

void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

json parse_body(const httplib::Request& req) {
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

}  // namespace xfmr::server
