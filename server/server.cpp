// server.cpp: serve(): the signals, listening, the model loaded while
// /health says 503, the engine's steps on this thread, and the drain.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <iostream>
#include <thread>

#include "http.hpp"
#include "routes.hpp"
#include "server.hpp"
#include "service.hpp"

namespace xfmr::server {

namespace {

// SIGINT and SIGTERM, whichever thread the kernel gives them to (threads
// that libraries started before main have them unblocked): a handler
// writes the signal's number to a pipe, which one thread reads. The
// handlers are installed whatever the dispositions were (a background job
// of a script inherits SIGINT ignored).
class SignalPipe {
 public:
  SignalPipe() {
    system_call([&] { return ::pipe2(fds_, O_CLOEXEC | O_NONBLOCK); }, "pipe2");
    write_end_ = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = [](int sig) {
      const int saved = errno;
      const unsigned char c = static_cast<unsigned char>(sig);
      (void)!::write(write_end_, &c, 1);
      errno = saved;
    };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::signal(SIGPIPE, SIG_IGN);
  }
  ~SignalPipe() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    write_end_ = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  // The next signal's number; 0 when release() came first.
  int wait() {
    for (;;) {
      pollfd p{.fd = fds_[0], .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return 0;
      unsigned char c = 0;
      const ssize_t n = ::read(fds_[0], &c, 1);
      if (n == 1) return c;
    }
  }
  // Ends a wait() with 0 (the program, not a signal, is done).
  void release() {
    const unsigned char c = 0;
    (void)!::write(fds_[1], &c, 1);
  }

 private:
  static inline volatile int write_end_ = -1;
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {}, old_term_ {};
};

// host:port as a URL's authority ([::1]:8080 for an IPv6 address).
std::string authority(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

int serve(const ServerOptions& o) {
  require(!o.model.empty(), "no model to serve");
  require(o.port >= 0 && o.port <= 65535, "--port ", o.port, " outside [0, 65535]");
  require(o.slots >= 1 && o.slots <= 256, "--slots ", o.slots, " outside [1, 256]");
  require(o.context >= 0, "--context ", o.context, " must be >= 0");
  require(o.queue >= 0 && o.queue <= 4096, "--queue ", o.queue, " outside [0, 4096]");
  require(o.drain >= 0, "--drain ", o.drain, " must be >= 0");
  require(o.max_body >= 1024, "--max-body ", o.max_body, " must be at least 1024 bytes");
  require(o.max_connections >= 1, "--max-connections ", o.max_connections, " must be >= 1");
  require(o.api_key.empty() || o.api_key.find_first_not_of(" \t\r\n") != std::string::npos,
          "the API key is only white space; give a key, or none");
  (void)Engine::check(o.model, o.engine);
  if (!o.chat_template.empty()) (void)ChatTemplate::named(o.chat_template);

  SignalPipe signals;
  Service service(o);
  http::ServerLimits limits;
  limits.max_body = o.max_body;
  limits.workers = o.slots + o.queue + 8;  // a request being decoded holds a worker; 8 for the rest
  limits.max_connections = o.max_connections;
  http::Server http(
      limits, [&](const http::Request& q, http::Response& r) { route(service, o, q, r); },
      [&](int status, const std::string& message, http::Response& r) { error_page(service, status, message, r); });
  const int port = http.listen(o.host, o.port);
  http.start();
  std::cerr << "xfmr-serve: listening on http://" << authority(o.host, port) << "/ (loading the model)\n" << std::flush;

  std::atomic<bool> stopping = false;
  std::jthread signal_waiter([&] {
    const int sig = signals.wait();
    if (sig == 0) return;
    std::cerr << "xfmr-serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": finishing the running requests\n";
    stopping = true;
    if (signals.wait() != 0 && service.ready()) service.engine().cancel_all();  // a second one cancels what runs
  });
  try {
    service.load();
  } catch (...) {
    http.stop();
    signals.release();
    signals.release();
    throw;
  }
  // Drain, once a signal came: no new requests; the running ones get
  // --drain seconds, then are cancelled, and the engine returns.
  std::jthread drainer([&] {
    while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    service.engine().close();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.drain);
    while (!service.engine().idle() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    service.engine().cancel_all();
  });
  // The engine runs here, on the thread that loaded the model: libgomp keeps
  // a team of threads for each thread that starts parallel regions, and with
  // more threads in teams than cores it stops spinning between regions, so
  // every product's fork would wait for a sleeping thread to wake (steps of
  // an engine thread of its own took 1.8x as long; continuous_batching.hpp).
  service.engine().run({});
  drainer.join();
  http.stop();
  signals.release();
  signals.release();
  signal_waiter.join();
  std::cerr << "xfmr-serve: stopped\n";
  return 0;
}

}  // namespace xfmr::server
