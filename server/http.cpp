// http.cpp: http.hpp's parser and server.
#include "http.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "xfmr/core/error.hpp"

namespace xfmr::server::http {

namespace {

using Clock = std::chrono::steady_clock;

bool is_tchar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}
char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }
bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}
// Whether the comma-separated list holds token (any case).
bool has_token(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    if (iequals(trim(list.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}
// What a byte is, for a message that quotes one.
std::string shown(std::string_view s, std::size_t max = 40) {
  std::string out;
  for (char c : s.substr(0, max)) out += (c >= 0x20 && c < 0x7f) ? std::string(1, c) : "?";
  return s.size() > max ? out + "..." : out;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 102: return "Processing";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

// Sends all of data (a blocking socket with a send timeout); false when the client has gone or stalled.
bool send_all(int socket, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(socket, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(std::size_t(n));
  }
  return true;
}

void set_blocking(int socket, bool blocking) {
  const int flags = ::fcntl(socket, F_GETFL);
  ::fcntl(socket, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK);
}

}  // namespace

std::string_view Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

bool client_gone(const Request& req) {
  if (req.socket < 0) return false;
  char c;
  const ssize_t n = ::recv(req.socket, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // bytes of a next request
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  if (req.minor_version == 0) return true;  // an HTTP/1.0 client gets no interim response
  if (!req.probed) {
    req.probed = true;
    static constexpr std::string_view kProcessing = "HTTP/1.1 102 Processing\r\n\r\n";
    return ::send(req.socket, kProcessing.data(), kProcessing.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
  }
  int error = 0;
  socklen_t size = sizeof error;
  if (::getsockopt(req.socket, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error != 0) return true;
  tcp_info info{};
  size = sizeof info;
  return ::getsockopt(req.socket, IPPROTO_TCP, TCP_INFO, &info, &size) == 0 && info.tcpi_state == TCP_CLOSE;
}

// --- RequestParser ---------------------------------------------------------

RequestParser::Status RequestParser::feed(std::string_view bytes) {
  if (stage_ == Stage::failed) return Status::failed;
  buffer_.append(bytes);
  return parse();
}

RequestParser::Status RequestParser::status() const {
  return stage_ == Stage::failed ? Status::failed : stage_ == Stage::done ? Status::complete : Status::more;
}

bool RequestParser::started() const {
  if (stage_ != Stage::head) return true;
  for (std::size_t i = pos_; i < buffer_.size(); ++i)
    if (buffer_[i] != '\r' && buffer_[i] != '\n') return true;
  return false;
}

RequestParser::Status RequestParser::fail(int status, std::string message) {
  stage_ = Stage::failed;
  error_status_ = status;
  error_ = std::move(message);
  return Status::failed;
}

bool RequestParser::next_line(std::string_view& line, std::size_t max) {
  const std::size_t end = buffer_.find('\n', pos_);
  if ((end == std::string::npos ? buffer_.size() : end) - pos_ > max) {
    fail(400, "a line of the chunked body is over " + std::to_string(max) + " bytes");
    return false;
  }
  if (end == std::string::npos) return false;
  line = std::string_view(buffer_).substr(pos_, end - pos_);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  pos_ = end + 1;
  return true;
}

Request RequestParser::take() {
  Request r = std::move(request_);
  request_ = Request{};
  stage_ = Stage::head;
  continue_ = false;
  remaining_ = trailer_bytes_ = scanned_ = 0;
  buffer_.erase(0, pos_);
  pos_ = 0;
  return r;
}

RequestParser::Status RequestParser::parse() {
  for (;;) {
    const std::size_t available = buffer_.size() - pos_;
    switch (stage_) {
      case Stage::head: {
        while (pos_ < buffer_.size() && (buffer_[pos_] == '\r' || buffer_[pos_] == '\n')) ++pos_, scanned_ = 0;
        const std::string_view rest = std::string_view(buffer_).substr(pos_);
        std::size_t end = std::string_view::npos;
        for (std::size_t i = scanned_ > 2 ? scanned_ - 2 : 0; i < rest.size() && end == std::string_view::npos; ++i) {
          if (rest[i] != '\n') continue;
          if (i + 1 < rest.size() && rest[i + 1] == '\n') end = i + 2;
          else if (i + 2 < rest.size() && rest[i + 1] == '\r' && rest[i + 2] == '\n') end = i + 3;
        }
        if (end == std::string_view::npos) {
          scanned_ = rest.size();
          if (rest.size() > limits_.max_head)
            return fail(431, "the request's head is over " + std::to_string(limits_.max_head) + " bytes");
          if (pos_ > 0) buffer_.erase(0, pos_), pos_ = 0;
          return Status::more;
        }
        if (end > limits_.max_head)
          return fail(431, "the request's head is over " + std::to_string(limits_.max_head) + " bytes");
        const std::string head(rest.substr(0, end));
        pos_ += end;
        scanned_ = 0;
        if (parse_head(head) == Status::failed) return Status::failed;
        break;
      }
      case Stage::length_body:
      case Stage::chunk_data: {
        const std::size_t n = std::min(available, remaining_);
        request_.body.append(buffer_, pos_, n);
        pos_ += n;
        remaining_ -= n;
        if (remaining_ > 0) {
          buffer_.erase(0, pos_), pos_ = 0;
          return Status::more;
        }
        stage_ = stage_ == Stage::length_body ? Stage::done : Stage::chunk_end;
        break;
      }
      case Stage::chunk_end: {
        if (available == 0 || (buffer_[pos_] == '\r' && available < 2)) return Status::more;
        if (buffer_[pos_] == '\n') pos_ += 1;
        else if (buffer_[pos_] == '\r' && buffer_[pos_ + 1] == '\n') pos_ += 2;
        else return fail(400, "a chunk of the body does not end with CRLF");
        stage_ = Stage::chunk_size;
        break;
      }
      case Stage::chunk_size: {
        std::string_view line;
        if (!next_line(line, 1024)) return status();
        std::size_t size = 0, digits = 0;
        for (; digits < line.size(); ++digits) {
          const char c = lower(line[digits]);
          const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
          if (d < 0) break;
          if (digits >= 15) return fail(400, "a chunk size of over 15 hex digits");
          size = size * 16 + std::size_t(d);
        }
        const std::string_view after = trim(line.substr(digits));
        if (digits == 0 || (!after.empty() && after.front() != ';'))
          return fail(400, "'" + shown(line) + "' is not a chunk size");
        if (size == 0) {
          stage_ = Stage::trailers;
          break;
        }
        if (size > limits_.max_body || request_.body.size() + size > limits_.max_body)
          return fail(413, "the request body is over " + std::to_string(limits_.max_body) + " bytes");
        remaining_ = size;
        stage_ = Stage::chunk_data;
        break;
      }
      case Stage::trailers: {
        std::string_view line;
        if (!next_line(line, limits_.max_head)) return status();
        trailer_bytes_ += line.size() + 2;
        if (trailer_bytes_ > limits_.max_head)
          return fail(431, "the body's trailers are over " + std::to_string(limits_.max_head) + " bytes");
        if (line.empty()) stage_ = Stage::done;
        else if (line.find(':') == std::string_view::npos)
          return fail(400, "a trailer line without a colon: '" + shown(line) + "'");
        break;
      }
      case Stage::done: return Status::complete;
      case Stage::failed: return Status::failed;
    }
  }
}

RequestParser::Status RequestParser::parse_head(std::string_view head) {
  std::vector<std::string_view> lines;
  while (!head.empty()) {
    std::size_t end = head.find('\n');
    std::string_view line = head.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) lines.push_back(line);
    head.remove_prefix(end == std::string_view::npos ? head.size() : end + 1);
  }
  if (lines.empty()) return fail(400, "an empty request line");
  for (std::string_view line : lines)
    for (char c : line)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return fail(400, "a control character in the request's head: '" + shown(line) + "'");

  // METHOD SP target SP HTTP/1.x
  const std::string_view line = lines[0];
  const std::size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "'" + shown(line) + "' is not a request line (METHOD /path HTTP/1.1)");
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), is_tchar))
    return fail(400, "'" + shown(method) + "' is not a method");
  if (target.empty() || target.front() != '/') return fail(400, "the request target '" + shown(target) + "' is not a path");
  if (version == "HTTP/1.1") request_.minor_version = 1;
  else if (version == "HTTP/1.0") request_.minor_version = 0;
  else if (version.size() == 8 && version.starts_with("HTTP/") && version[6] == '.')
    return fail(505, "HTTP version " + shown(version.substr(5)) + " is not supported (1.0 and 1.1 are)");
  else return fail(400, "'" + shown(version) + "' is not an HTTP version");
  request_.method = method;
  request_.target = target;
  request_.path = target.substr(0, target.find('?'));

  if (lines.size() - 1 > limits_.max_headers)
    return fail(431, "the request has " + std::to_string(lines.size() - 1) + " header lines; at most " +
                         std::to_string(limits_.max_headers));
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string_view h = lines[i];
    if (h.front() == ' ' || h.front() == '\t') return fail(400, "a folded header line: '" + shown(h) + "'");
    const std::size_t colon = h.find(':');
    if (colon == std::string_view::npos) return fail(400, "a header line without a colon: '" + shown(h) + "'");
    const std::string_view name = h.substr(0, colon);
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_tchar))
      return fail(400, "'" + shown(name) + "' is not a header name");
    std::string key(name);
    std::transform(key.begin(), key.end(), key.begin(), lower);
    request_.headers.emplace_back(std::move(key), std::string(trim(h.substr(colon + 1))));
  }

  // The body's framing, and what the client expects of the connection.
  std::string coding;
  bool has_length = false;
  std::size_t length = 0;
  for (const auto& [k, v] : request_.headers) {
    if (k == "transfer-encoding") coding += (coding.empty() ? "" : ",") + v;
    if (k == "content-length") {
      if (v.empty() || v.size() > 18 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return fail(400, "Content-Length '" + shown(v) + "' is not a length");
      const std::size_t n = std::stoull(v);
      if (has_length && n != length) return fail(400, "two different Content-Length headers");
      has_length = true;
      length = n;
    }
  }
  const std::string_view connection = request_.header("connection");
  request_.keep_alive =
      request_.minor_version == 1 ? !has_token(connection, "close") : has_token(connection, "keep-alive");
  if (const std::string_view expect = request_.header("expect"); !expect.empty()) {
    if (!iequals(expect, "100-continue")) return fail(417, "the expectation '" + shown(expect) + "' is not supported");
    continue_ = request_.minor_version == 1;
  }
  if (!coding.empty()) {
    if (!iequals(trim(coding), "chunked"))
      return fail(501, "the transfer coding '" + shown(coding) + "' is not supported (chunked is)");
    if (has_length) return fail(400, "both Content-Length and Transfer-Encoding");
    if (request_.minor_version == 0) return fail(400, "a chunked body in HTTP/1.0");
    stage_ = Stage::chunk_size;
    return Status::more;
  }
  if (length > limits_.max_body)
    return fail(413, "the request body is " + std::to_string(length) + " bytes; at most " +
                         std::to_string(limits_.max_body));
  if (length > 0) {
    request_.body.reserve(length);
    remaining_ = length;
    stage_ = Stage::length_body;
  } else {
    stage_ = Stage::done;
  }
  return Status::more;
}

// --- Writer ---------------------------------------------------------------

bool Writer::write(std::string_view data) {
  if (failed_) return false;
  if (data.empty()) return true;
  if (!chunked_) return !(failed_ = !send_all(socket_, data));
  char size[24];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string chunk;
  chunk.reserve(std::size_t(n) + data.size() + 2);
  chunk.append(size, std::size_t(n)).append(data).append("\r\n");
  return !(failed_ = !send_all(socket_, chunk));
}

// --- Server ---------------------------------------------------------------

struct Server::Connection {
  int socket = -1;
  RequestParser parser;
  Clock::time_point since{}, started{}, head_at{};  // idle since; a request's first byte; its head's end
  bool continued = false;  // 100 Continue sent for this request
  bool eof = false;        // the client has closed its sending side
  bool closing = false;    // refused: the client's bytes are read and dropped until it closes (or 2 s)
};

struct Server::Job {
  std::unique_ptr<Connection> c;
  Request request;
};

Server::Server(ServerLimits limits, Handler handler, ErrorPage error_page)
    : limits_(limits), handler_(std::move(handler)), error_page_(std::move(error_page)) {}

Server::~Server() {
  stop();
  if (listen_ >= 0) ::close(listen_);
  if (epoll_ >= 0) ::close(epoll_);
  if (wake_ >= 0) ::close(wake_);
}

int Server::listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); e != 0)
    fail("cannot listen on ", host, ":", port, ": ", ::gai_strerror(e));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && listen_ < 0; a = a->ai_next) {
    const int s = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    const int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s, SOMAXCONN) == 0) listen_ = s;
    else why = std::strerror(errno), ::close(s);
  }
  ::freeaddrinfo(found);
  require(listen_ >= 0, "cannot listen on ", host, ":", port, ": ", why);
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  ::getsockname(listen_, reinterpret_cast<sockaddr*>(&address), &size);
  return ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(address).sin6_port
                                             : reinterpret_cast<sockaddr_in&>(address).sin_port);
}

void Server::start() {
  require(listen_ >= 0, "http::Server::start before listen");
  // Each connection is a descriptor: the soft limit goes up to the hard
  // one, and the connections stay below it.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur != RLIM_INFINITY)
      limits_.max_connections = int(std::min<rlim_t>(rlim_t(limits_.max_connections), files.rlim_cur / 2));
  }
  epoll_ = system_call([] { return ::epoll_create1(EPOLL_CLOEXEC); }, "epoll_create1");
  wake_ = system_call([] { return ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }, "eventfd");
  for (int fd : {listen_, wake_}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    system_call([&] { return ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &e); }, "epoll_ctl");
  }
  loop_ = std::thread([this] { loop(); });
  for (int i = 0; i < limits_.workers; ++i) workers_.emplace_back([this] { work(); });
}

void Server::stop() {
  if (!loop_.joinable()) return;
  stopping_ = true;
  const std::uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
  loop_.join();
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  for (auto& c : returned_) close(std::move(c));
  returned_.clear();
}

void Server::close(std::unique_ptr<Connection> c) {
  if (!c) return;
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c->socket, nullptr);
  ::close(c->socket);
  --connections_;
}

void Server::refuse(int socket, int status, const std::string& message) {
  Response r;
  r.status = status;
  error_page_(status, message, r);
  const std::string out = head_of(r, false, false, true) + r.body;
  (void)!::send(socket, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort: it fits the buffer
}

std::string Server::head_of(const Response& r, bool keep_alive, bool chunked, bool sized) const {
  std::string h = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  h += "Content-Type: " + r.content_type + "\r\n";
  if (sized) h += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  for (const auto& [k, v] : r.headers) h += k + ": " + v + "\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

void Server::accept_all() {
  for (;;) {
    const int s = ::accept4(listen_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s < 0) return;  // none waiting (or no descriptor: the next round tries again)
    if (connections_ >= std::size_t(limits_.max_connections)) {
      refuse(s, 503, "the server holds " + std::to_string(limits_.max_connections) + " connections; try again");
      ::close(s);
      continue;
    }
    const int one = 1;
    ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.fd = s;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, s, &e) != 0) {
      ::close(s);
      continue;
    }
    ++connections_;
    if (std::size_t(s) >= open_.size()) open_.resize(std::size_t(s) + 1);
    open_[std::size_t(s)].reset(new Connection{.socket = s, .parser = RequestParser(limits_), .since = Clock::now()});
  }
}

void Server::on_readable(Connection& c) {
  char buffer[16384];
  for (int reads = 0; reads < 64; ++reads) {  // at most 1 MiB a round: the other connections get theirs
    const ssize_t n = ::recv(c.socket, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      c.eof = true;
      return;
    }
    if (c.closing) continue;  // dropped
    if (c.parser.feed(std::string_view(buffer, std::size_t(n))) != RequestParser::Status::more) {
      // Whole (or refused): what follows waits for the answer; only a
      // half-close just after the request is looked for now.
      if (::recv(c.socket, buffer, 1, MSG_PEEK | MSG_DONTWAIT) == 0) c.eof = true;
      return;
    }
  }
}

bool Server::advance(std::unique_ptr<Connection>& c) {
  RequestParser& p = c->parser;
  const auto now = Clock::now();
  if (c->closing) {
    if (c->eof) close(std::move(c));
    return c != nullptr;
  }
  if (p.status() == RequestParser::Status::failed) {
    refuse(c->socket, p.error_status(), p.error());
    // The client's bytes still coming are read and dropped for a while:
    // closing with bytes unread would reset the connection, and the
    // client might lose the answer.
    ::shutdown(c->socket, SHUT_WR);
    c->closing = true;
    c->since = now;
    if (c->eof) close(std::move(c));
    return c != nullptr;
  }
  if (c->started == Clock::time_point{} && p.started()) c->started = now;
  if (c->head_at == Clock::time_point{} && p.head_done()) c->head_at = now;
  if (p.status() == RequestParser::Status::more) {
    if (c->eof) {
      close(std::move(c));  // the client closed before its request was whole
      return false;
    }
    if (p.head_done() && p.expects_continue() && !c->continued) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)!::send(c->socket, kContinue.data(), kContinue.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      c->continued = true;
    }
    return true;
  }
  // A whole request: to a worker; the connection leaves the event loop until it is answered.
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c->socket, nullptr);
  auto job = std::make_unique<Job>();
  job->request = p.take();
  job->request.socket = c->socket;
  job->request.client_done = c->eof;
  job->c = std::move(c);
  {
    std::unique_lock lock(m_);
    if (jobs_.size() >= limits_.max_waiting) {
      lock.unlock();
      refuse(job->c->socket, 503, "the server is busy: " + std::to_string(limits_.max_waiting) + " requests wait; try again");
      close(std::move(job->c));
      return false;
    }
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return false;
}

void Server::loop() {
  epoll_event events[64];
  auto last_sweep = Clock::now();
  while (!stopping_) {
    const int n = ::epoll_wait(epoll_, events, 64, 100);
    for (int i = 0; i < n && !stopping_; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_) {
        accept_all();
      } else if (fd == wake_) {
        std::uint64_t count;
        (void)!::read(wake_, &count, sizeof count);
        std::vector<std::unique_ptr<Connection>> back;
        {
          std::lock_guard lock(m_);
          back.swap(returned_);
        }
        for (auto& c : back) {
          // A kept-alive connection, answered: idle again, unless the bytes
          // it sent after its request (pipelined) already make one.
          c->since = Clock::now();
          c->started = c->head_at = {};
          c->continued = false;
          epoll_event e{};
          e.events = EPOLLIN | EPOLLRDHUP;
          e.data.fd = c->socket;
          if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, c->socket, &e) != 0) {
            close(std::move(c));
            continue;
          }
          const std::size_t s = std::size_t(c->socket);
          if (s >= open_.size()) open_.resize(s + 1);
          open_[s] = std::move(c);
          open_[s]->parser.feed({});
          advance(open_[s]);
        }
      } else if (std::size_t(fd) < open_.size() && open_[std::size_t(fd)]) {
        on_readable(*open_[std::size_t(fd)]);
        advance(open_[std::size_t(fd)]);
      }
    }
    // Deadlines: an idle connection, a head or a body that does not come in time.
    const auto now = Clock::now();
    if (now - last_sweep < std::chrono::milliseconds(100)) continue;
    last_sweep = now;
    for (auto& c : open_) {
      if (!c) continue;
      const bool late = c->closing                          ? now - c->since > std::chrono::seconds(2)
                        : c->started == Clock::time_point{} ? now - c->since > limits_.idle_timeout
                        : c->head_at == Clock::time_point{} ? now - c->started > limits_.head_timeout
                                                            : now - c->head_at > limits_.body_timeout;
      if (!late) continue;
      if (!c->closing && c->started != Clock::time_point{})
        refuse(c->socket, 408,
               c->head_at == Clock::time_point{} ? "the request's head did not come within " +
                                                       std::to_string(limits_.head_timeout.count() / 1000) + " s"
                                                 : "the request's body did not come within " +
                                                       std::to_string(limits_.body_timeout.count() / 1000) + " s");
      close(std::move(c));
    }
  }
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, listen_, nullptr);
  ::close(listen_);
  listen_ = -1;
  for (auto& c : open_) close(std::move(c));
  open_.clear();
}

void Server::work() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    answer(*job);
  }
}

void Server::answer(Job& job) {
  const Request& q = job.request;
  const int s = job.c->socket;
  Response r;
  try {
    handler_(q, r);
  } catch (const std::exception& e) {
    r = Response{};
    r.status = 500;
    error_page_(500, e.what(), r);
  }
  set_blocking(s, true);
  const timeval timeout{.tv_sec = limits_.write_timeout.count() / 1000,
                        .tv_usec = (limits_.write_timeout.count() % 1000) * 1000};
  ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  bool keep = q.keep_alive && !q.client_done && !stopping_;
  bool ok = false;
  if (r.stream) {
    const bool chunked = q.minor_version == 1;
    keep = keep && chunked;
    Writer w(s, chunked);
    w.failed_ = !send_all(s, head_of(r, keep, chunked, false));
    r.stream(w);  // called even when the head failed: it ends what it started
    ok = !w.failed_ && (!chunked || send_all(s, "0\r\n\r\n"));
  } else {
    ok = send_all(s, head_of(r, keep, false, true) + r.body);
  }
  if (ok && keep) {
    set_blocking(s, false);
    {
      std::lock_guard lock(m_);
      returned_.push_back(std::move(job.c));
    }
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  } else {
    ::close(s);
    job.c.reset();
    --connections_;
  }
}

}  // namespace xfmr::server::http
