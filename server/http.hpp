// http.hpp: xfmr-serve's HTTP/1.1 layer. Connections are held by one
// event thread (epoll) until a whole request has come, within deadlines
// for its head and its body; only a complete request takes one of the
// workers, which answers it (whole, or streamed in chunks) and hands a
// kept-alive connection back. So clients that send slowly, send nothing,
// or hold idle connections hold no worker, and their number is bounded on
// its own (docs/DESIGN.md's "The HTTP layer" says why not cpp-httplib 0.11).
//
//   http::Server s(limits, [](const http::Request& q, http::Response& r) {
//     r.set_content(R"({"ok":true})", "application/json");
//   }, error_page);
//   int port = s.listen("127.0.0.1", 0);
//   s.start();  ...  s.stop();
//
// The request parser (RequestParser) is a class of its own, fed bytes as
// they come, for the fuzz target (test/fuzz/fuzz_http.cpp). It takes
// HTTP/1.0 and 1.1, Content-Length and chunked bodies (the bound on the
// body holds for both), pipelined requests and `Expect: 100-continue`; what
// it refuses is an error with its status: 400 (malformed), 413 (body past
// the bound, before any 100 Continue), 417 (another expectation), 431 (head
// too large), 501 (another transfer coding), 505 (another HTTP version).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace xfmr::server::http {

struct Limits {
  std::size_t max_head = 64 << 10;  // request line and headers, bytes
  std::size_t max_headers = 100;
  std::size_t max_body = 1 << 20;  // bytes, after chunked decoding
};

struct Request {
  std::string method, target, path;  // path: the target up to '?'
  int minor_version = 1;             // HTTP/1.<minor_version>
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  bool keep_alive = true;  // the client keeps the connection (HTTP/1.1 unless "close")

  // The value of header `name` (lower case), "" when absent.
  std::string_view header(std::string_view name) const;

  // Set by the Server: the connection, for client_gone().
  int socket = -1;
  bool client_done = false;   // the client closed its sending side with the request (a half-close)
  mutable bool probed = false;  // client_gone() sent its interim response
};

// Whether the client of req has gone, for an answer that is not streamed
// (a stream notices when a write fails); reads nothing, waits for nothing.
// An end of stream is a client gone only once a write shows it (a client
// that half-closes after its request is answered): the first end seen
// sends an interim response (102, which HTTP/1.1 clients skip), and the
// peer's reset to it, seen by the next call, is the client gone.
bool client_gone(const Request& req);

class RequestParser {
 public:
  enum class Status { more, complete, failed };
  explicit RequestParser(Limits limits = {}) : limits_(limits) {}

  // Appends bytes and parses as far as they go.
  Status feed(std::string_view bytes);
  Status status() const;
  bool started() const;  // whether any byte of a request (past blank lines) has come
  bool head_done() const { return stage_ != Stage::head; }
  bool expects_continue() const { return continue_; }
  int error_status() const { return error_status_; }
  const std::string& error() const { return error_; }
  // The complete request; the parser goes on with the bytes after it (a
  // pipelined request).
  Request take();

 private:
  enum class Stage { head, length_body, chunk_size, chunk_data, chunk_end, trailers, done, failed };
  Status parse();
  Status parse_head(std::string_view head);
  Status fail(int status, std::string message);
  // The next line (CRLF or LF) from pos_, without its end; false when it has not all come.
  bool next_line(std::string_view& line, std::size_t max);

  Limits limits_;
  Stage stage_ = Stage::head;
  std::string buffer_;        // bytes not yet consumed, from pos_
  std::size_t pos_ = 0;       // first byte of buffer_ not consumed
  std::size_t scanned_ = 0;   // head: bytes from pos_ searched for its end
  std::size_t remaining_ = 0; // body: bytes of the body or chunk still to come
  std::size_t trailer_bytes_ = 0;
  Request request_;
  bool continue_ = false;
  int error_status_ = 0;
  std::string error_;
};

// A streamed answer's sink: chunked for HTTP/1.1, raw to an HTTP/1.0
// client (which reads to the connection's end).
class Writer {
 public:
  Writer(int socket, bool chunked) : socket_(socket), chunked_(chunked) {}
  // Sends data now; false once the client has gone (and from then on).
  bool write(std::string_view data);
  bool failed() const { return failed_; }

 private:
  friend class Server;
  int socket_;
  bool chunked_, failed_ = false;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain", body;
  std::vector<std::pair<std::string, std::string>> headers;
  // A streamed answer (content_type, then whatever stream writes, until it
  // returns); called on the worker's thread after the head has gone.
  std::function<void(Writer&)> stream;

  void set_content(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

struct ServerLimits : Limits {
  int workers = 16;            // requests answered at once
  int max_connections = 1024;  // connections held (idle, sending, answered); past it a 503 and close
  std::size_t max_waiting = 256;  // complete requests waiting for a worker; past it a 503
  std::chrono::milliseconds head_timeout{10'000};  // from a request's first byte to its head's end
  std::chrono::milliseconds body_timeout{60'000};  // from the head's end to the body's
  std::chrono::milliseconds idle_timeout{30'000};  // a kept-alive connection between requests
  std::chrono::milliseconds write_timeout{30'000}; // a write the client does not take
};

using Handler = std::function<void(const Request&, Response&)>;
// Fills an error's response (its body) for a status and message of the HTTP layer's.
using ErrorPage = std::function<void(int status, const std::string& message, Response&)>;

class Server {
 public:
  Server(ServerLimits limits, Handler handler, ErrorPage error_page);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (0: any free port) and listens; the port. Throws
  // xfmr::Error when it cannot.
  int listen(const std::string& host, int port);
  // The event thread and the workers.
  void start();
  // No new connections or requests; the requests being answered finish;
  // every connection closes. Returns once all threads have.
  void stop();

  // What the server holds now (for /metrics and the tests).
  std::size_t connections() const { return connections_.load(); }

 private:
  struct Connection;
  struct Job;
  void loop();
  void work();
  void accept_all();
  void on_readable(Connection& c);
  bool advance(std::unique_ptr<Connection>& c);  // false: c was handed off or closed
  void close(std::unique_ptr<Connection> c);
  void refuse(int socket, int status, const std::string& message);
  void answer(Job& job);
  std::string head_of(const Response& r, bool keep_alive, bool chunked, bool sized) const;

  ServerLimits limits_;
  Handler handler_;
  ErrorPage error_page_;
  int listen_ = -1, epoll_ = -1, wake_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> connections_{0};
  std::vector<std::unique_ptr<Connection>> open_;  // by socket; the event thread's
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> jobs_;               // complete requests for the workers
  std::vector<std::unique_ptr<Connection>> returned_;   // kept-alive connections back from them
  std::thread loop_;
  std::vector<std::thread> workers_;
};

}  // namespace xfmr::server::http
