// routes.hpp: the server's HTTP routes (routes.cpp).
#pragma once

#include <httplib.h>

#include "server.hpp"
#include "service.hpp"

namespace xfmr::server {

void add_routes(httplib::Server& http, Service& service, const ServerOptions& o);

}  // namespace xfmr::server
