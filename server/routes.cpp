// routes.cpp: the HTTP routes over the Service: authentication on /v1,
// 503 while the model loads, every error as OpenAI's error object.
#include "routes.hpp"

namespace xfmr::server {

// The chat page (server/chat.html), compiled in by CMake.
extern const char kChatPage[];

namespace {

// Compares in a time that does not depend on where the strings differ.
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void dispatch(Service& service, const http::Request& req, http::Response& res) {
  const std::string& path = req.path;
  const bool get = req.method == "GET", post = req.method == "POST";
  if (path == "/health" && get) {
    res.status = service.ready() ? 200 : 503;
    res.set_content(service.ready() ? R"({"status":"ok"})" : R"({"status":"loading"})", "application/json");
  } else if (path == "/" && get) {
    res.set_content(kChatPage, "text/html; charset=utf-8");
  } else if (path == "/metrics" && get) {
    res.set_content(service.metrics(), "text/plain; version=0.0.4");
  } else if (path == "/slots" && get) {
    res.set_content(dump(service.slots()), "application/json");
  } else if (path == "/v1/models" && get) {
    json models = json::array();
    const auto add = [&](const std::string& id, bool adapter) {
      json m = {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "xfmr"},
                {"max_model_len", service.engine().batch_context()}};
      if (adapter) m["parent"] = service.name();  // a LoRA adapter's base, as vLLM lists it
      models.push_back(std::move(m));
    };
    add(service.name(), false);
    for (const std::string& a : service.engine().adapter_names()) add(a, true);
    res.set_content(dump(json{{"object", "list"}, {"data", models}}), "application/json");
  } else if (path == "/v1/completions" && post) {
    service.completions(req, res, false);
  } else if (path == "/v1/chat/completions" && post) {
    service.completions(req, res, true);
  } else if (path == "/v1/embeddings" && post) {
    service.embeddings(req, res);
  } else if (path == "/tokenize" && post) {
    service.tokenize(req, res);
  } else if (path == "/detokenize" && post) {
    service.detokenize(req, res);
  } else {
    for (const char* known : {"/health", "/", "/metrics", "/slots", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                              "/tokenize", "/detokenize"})
      if (path == known) throw HttpError{405, "the method " + req.method + " is not allowed on " + path};
    throw HttpError{404, "no such route: " + path};
  }
}

}  // namespace

void route(Service& service, const ServerOptions& o, const http::Request& req, http::Response& res) {
  ++service.counters().http_requests;
  try {
    if (req.path.starts_with("/v1/") && !o.api_key.empty()) {
      const std::string_view auth = req.header("authorization");
      if (!auth.starts_with("Bearer ") || !same_secret(auth.substr(7), o.api_key))
        throw HttpError{401, "a valid API key is required: 'Authorization: Bearer KEY'"};
    }
    if (req.path != "/health" && req.path != "/" && req.path != "/metrics" && req.path != "/slots" &&
        !service.ready())
      throw HttpError{503, "the model is loading", "", "server_loading"};
    dispatch(service, req, res);
  } catch (const HttpError& e) {
    if (e.status < 500) ++service.counters().client_errors;
    send_error(res, e);
  } catch (const Error& e) {
    ++service.counters().client_errors;
    send_error(res, {400, e.what()});
  } catch (const std::exception& e) {
    send_error(res, {500, e.what(), "", "server_error"});
  }
}

void error_page(Service& service, int status, const std::string& message, http::Response& res) {
  if (status >= 400 && status < 500) ++service.counters().client_errors;
  send_error(res, {status, message, "", status >= 500 ? "server_error" : "invalid_request_error"});
}

}  // namespace xfmr::server
