// http_connection.hpp: whether the client of a request being answered has
// gone, for xfmr-serve's answers that are not streamed (a stream notices
// when a write fails). cpp-httplib 0.11 (Debian 12's) hands a handler
// neither its socket nor a closed-connection test (later versions have
// Request::is_connection_closed), so the socket is found by the request's
// two ports among the process's descriptors, and probed as those versions
// do: a peek that reads the end of the stream, or fails, means gone.
// Linux (/proc/self/fd).
#pragma once

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace xfmr::server {

inline int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The descriptor of req's connection: the socket whose own port is
// req.local_port and whose peer's is req.remote_port; -1 if none is.
inline int connection_socket(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t local_size = sizeof local, peer_size = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0)
      continue;
    if (port_of(local) == req.local_port && port_of(peer) == req.remote_port) return fd;
  }
  return -1;
}

// True once the peer of socket fd has closed its end or the connection
// failed; false while it is open (or fd is -1: nothing to probe). Reads
// nothing: a peek, which does not wait.
inline bool connection_closed(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace xfmr::server
