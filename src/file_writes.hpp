// file_writes.hpp (internal): what the library's writers share: a target
// path as the user meant it, hidden temporaries beside it, and writes whose
// every failure (short write, fsync, close) throws with the real errno and
// the user's path.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include "xfmr/core/error.hpp"

namespace xfmr::detail {

// `path` as the user meant it: "run/" and "run/." name the directory run,
// not something inside it (shell completion appends the slash).
inline std::filesystem::path as_target(const std::filesystem::path& path) {
  std::filesystem::path p = path.lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

// "<dir>/.<name>.<tag>.XXXXXX", a mkstemp/mkdtemp template beside `target`.
inline std::string hidden_temp_template(const std::filesystem::path& target, const char* tag) {
  const std::filesystem::path t = as_target(target);
  const std::filesystem::path dir = t.has_parent_path() ? t.parent_path() : std::filesystem::path(".");
  std::string name = t.filename().string();
  name.insert(name.begin(), '.');
  name.append(".").append(tag).append(".XXXXXX");
  return (dir / name).string();
}

// Writes all of `bytes` to `fd`; returns 0, or the errno of the failure
// (a write that makes no progress counts as ENOSPC).
inline int write_all(int fd, std::span<const std::byte> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return ENOSPC;
    done += static_cast<std::size_t>(w);
  }
  return 0;
}

// Creates (or truncates) `path`, writes `bytes`, fsyncs and closes it; every
// failure throws naming `shown` (the path the user knows) and the errno's text.
inline void write_new_file(const std::filesystem::path& path, std::span<const std::byte> bytes,
                           const std::filesystem::path& shown) {
  const int fd = system_call([&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); },
                             shown.string(), ": cannot open for writing");
  int err = write_all(fd, bytes);
  if (err == 0 && ::fsync(fd) != 0 && errno != EINVAL) err = errno;  // EINVAL: a device that does not sync
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) fail(shown.string(), ": ", std::strerror(err));
}

}  // namespace xfmr::detail
