// Fuzz target: xfmr-serve's HTTP request parser (server/http.hpp's
// RequestParser), fed the input in pieces whose sizes the input's first
// bytes choose, every complete request taken and the parser going on with
// the rest (pipelining). It must end each request complete, wanting more,
// or failed with one of its statuses; a body never past the bound; and the
// same requests whatever the pieces. A crash, a sanitizer report or a
// broken invariant (abort) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "http.hpp"

using namespace xfmr::server::http;

namespace {

struct Parsed {
  std::vector<std::string> requests;  // method, path, body of each
  int error = 0;
};

Parsed parse(std::string_view input, std::string_view pieces) {
  Limits limits;
  limits.max_head = 2048;
  limits.max_headers = 16;
  limits.max_body = 1024;
  RequestParser p(limits);
  Parsed out;
  std::size_t at = 0, k = 0;
  while (at < input.size()) {
    const std::size_t n = pieces.empty() ? input.size() : 1 + std::uint8_t(pieces[k++ % pieces.size()]) % 64;
    auto s = p.feed(input.substr(at, n));
    at += std::min(n, input.size() - at);
    while (s == RequestParser::Status::complete) {
      const Request r = p.take();
      if (r.body.size() > limits.max_body || r.path.empty() || r.path[0] != '/') std::abort();
      out.requests.push_back(r.method + " " + r.path + " " + r.body);
      s = p.feed({});
    }
    if (s == RequestParser::Status::failed) {
      const int e = p.error_status();
      if (e != 400 && e != 413 && e != 417 && e != 431 && e != 501 && e != 505) std::abort();
      if (p.error().empty()) std::abort();
      out.error = e;
      return out;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t split = size == 0 ? 0 : std::min<std::size_t>(std::uint8_t(all[0]) % 8, size - 1);
  const std::string_view pieces = all.substr(1 < size ? 1 : size, split), input = all.substr(std::min(size, 1 + split));
  const Parsed whole = parse(input, {}), piecewise = parse(input, pieces);
  if (whole.requests != piecewise.requests || whole.error != piecewise.error) std::abort();
  return 0;
}
