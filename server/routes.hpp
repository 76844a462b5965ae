// routes.hpp: the server's HTTP routes (routes.cpp).
#pragma once

#include "http.hpp"
#include "server.hpp"
#include "service.hpp"

namespace xfmr::server {

// Answers one request: the route, authentication on /v1, 503 while the
// model loads, every error as OpenAI's error object.
void route(Service& service, const ServerOptions& o, const http::Request& req, http::Response& res);
// The HTTP layer's own errors (a malformed request, a body too large, a
// timeout) as OpenAI's error object.
void error_page(Service& service, int status, const std::string& message, http::Response& res);

}  // namespace xfmr::server
