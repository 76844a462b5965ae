// routes.cpp: the HTTP routes over the Service: authentication on /v1,
// 503 while the model loads, every error as OpenAI's error object.
#include "routes.hpp"

#include <httplib.h>

namespace xfmr::server {

// The chat page (server/chat.html), compiled in by CMake.
extern const char kChatPage[];

void add_routes(httplib::Server& http, Service& service, const ServerOptions& o) {
  http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    ++service.counters().http_requests;
    if (req.path.starts_with("/v1/") && !o.api_key.empty() &&
        req.get_header_value("Authorization") != "Bearer " + o.api_key) {
      ++service.counters().client_errors;
      send_error(res, {401, "a valid API key is required: 'Authorization: Bearer KEY'", "", "invalid_request_error"});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path != "/health" && req.path != "/" && req.path != "/metrics" && !service.ready()) {
      send_error(res, {503, "the model is loading", "", "server_loading"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto handle = [&](auto&& f) {
    return [&, f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const HttpError& e) {
        if (e.status < 500) ++service.counters().client_errors;
        send_error(res, e);
      } catch (const Error& e) {
        ++service.counters().client_errors;
        send_error(res, {400, e.what()});
      } catch (const std::exception& e) {
        send_error(res, {500, e.what(), "", "server_error"});
      }
    };
  };
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    res.status = service.ready() ? 200 : 503;
    res.set_content(service.ready() ? R"({"status":"ok"})" : R"({"status":"loading"})", "application/json");
  });
  http.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(kChatPage, "text/html; charset=utf-8");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(service.metrics(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", handle([&](const httplib::Request&, httplib::Response& res) {
             res.set_content(dump(json{{"object", "list"},
                                       {"data", json::array({{{"id", service.name()},
                                                              {"object", "model"},
                                                              {"created", 0},
                                                              {"owned_by", "xfmr"},
                                                              {"max_model_len", service.engine().batch_context()}}})}}),
                             "application/json");
           }));
  http.Post("/v1/completions",
            handle([&](const httplib::Request& q, httplib::Response& r) { service.completions(q, r, false); }));
  http.Post("/v1/chat/completions",
            handle([&](const httplib::Request& q, httplib::Response& r) { service.completions(q, r, true); }));
  http.Post("/tokenize", handle([&](const httplib::Request& q, httplib::Response& r) { service.tokenize(q, r); }));
  http.Post("/detokenize", handle([&](const httplib::Request& q, httplib::Response& r) { service.detokenize(q, r); }));
  http.set_error_handler([&](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status >= 400 && res.status < 500) ++service.counters().client_errors;
    const char* what = res.status == 404   ? "no such route"
                       : res.status == 413 ? "the request body is too large"
                                           : "the request was refused";
    send_error(res, {res.status, what});
  });

}

}  // namespace xfmr::server
