// server.cpp: serve(): listening, the signals, the model loaded while
// /health says 503, the engine's steps on this thread, and the drain.
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "routes.hpp"
#include "server.hpp"
#include "service.hpp"

namespace xfmr::server {

int serve(const ServerOptions& o) {
  require(!o.model.empty(), "no model to serve");
  require(o.port >= 0 && o.port <= 65535, "--port ", o.port, " outside [0, 65535]");
  require(o.slots >= 1 && o.slots <= 256, "--slots ", o.slots, " outside [1, 256]");
  require(o.context >= 0, "--context ", o.context, " must be >= 0");
  require(o.queue >= 0 && o.queue <= 4096, "--queue ", o.queue, " outside [0, 4096]");
  require(o.drain >= 0, "--drain ", o.drain, " must be >= 0");
  (void)Engine::check(o.model, o.engine);
  if (!o.chat_template.empty()) (void)ChatTemplate::named(o.chat_template);

  // SIGINT and SIGTERM go to one thread (sigwait), whatever thread they hit.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Service service(o);
  httplib::Server http;
  http.set_payload_max_length(o.max_body);
  const std::size_t threads = std::size_t(o.slots) + std::size_t(o.queue) + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  add_routes(http, service, o);

  // cpp-httplib listens with a backlog of 5: a burst of clients connecting
  // at once overflows it and the kernel drops their connections. Its
  // listening socket is listened on again with the system's bound.
  int listening = -1;
  http.set_socket_options([&](int fd) {
    httplib::default_socket_options(fd);
    listening = fd;
  });
  const int port = o.port == 0 ? http.bind_to_any_port(o.host) : (http.bind_to_port(o.host, o.port) ? o.port : -1);
  require(port > 0, "cannot listen on ", o.host, ":", o.port, " (in use, or not an address of this machine)");
  system_call([&] { return ::listen(listening, SOMAXCONN); }, "listen on ", o.host, ":", port);
  std::cerr << "xfmr-serve: listening on http://" << o.host << ":" << port << "/ (loading the model)\n" << std::flush;
  std::jthread listener([&] { http.listen_after_bind(); });

  std::atomic<bool> stopping = false, released = false;  // released: the program, not a signal, ends the waits
  std::jthread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!released)
      std::cerr << "xfmr-serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": finishing the running requests\n";
    stopping = true;
    sigwait(&signals, &sig);  // a second one cancels what runs
    if (service.ready()) service.engine().cancel_all();
  });
  try {
    service.load();
  } catch (...) {
    http.stop();
    released = true;
    pthread_kill(signal_waiter.native_handle(), SIGTERM);  // releases both of its waits, one after the other
    while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    pthread_kill(signal_waiter.native_handle(), SIGTERM);
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
  listener.join();
  released = true;
  pthread_kill(signal_waiter.native_handle(), SIGTERM);  // releases the second sigwait
  std::cerr << "xfmr-serve: stopped\n";
  return 0;
}

}  // namespace xfmr::server
