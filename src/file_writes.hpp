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
#include <functional>
#include <span>
#include <string>
#include <vector>

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
// With `stream`, the bytes are what it writes to the file (returning 0 or
// an errno), a part at a time, instead.
inline void write_new_file(const std::filesystem::path& path, std::span<const std::byte> bytes,
                           const std::filesystem::path& shown, const std::function<int(int fd)>& stream = {}) {
  const int fd = system_call([&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); },
                             shown.string(), ": cannot open for writing");
  int err = 0;
  try {
    err = stream ? stream(fd) : write_all(fd, bytes);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (err == 0 && ::fsync(fd) != 0 && errno != EINVAL) err = errno;  // EINVAL: a device that does not sync
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) fail(shown.string(), ": ", std::strerror(err));
}

// The bytes of the regular file `path`; failures name it with the errno's text.
inline std::vector<std::byte> read_whole_file(const std::filesystem::path& path) {
  const int fd = system_call([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }, path.string(),
                             ": cannot open for reading");
  std::vector<std::byte> bytes;
  std::byte block[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(path.string(), ": ", std::strerror(err));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), block, block + n);
  }
  ::close(fd);
  return bytes;
}

// A file of a directory written whole (write_directory).
struct NewFile {
  std::string name;
  std::span<const std::byte> bytes;
  std::function<int(int fd)> stream = {};  // when set, writes the file's bytes instead (write_new_file)
};

// Writes `files` into a new hidden directory beside `dir` (made with its
// parents when missing), fsyncs them, and moves it in place: a rename, or one
// atomic swap (RENAME_EXCHANGE) with an existing `dir`, whose old contents are
// then removed; a crash at any point leaves the old directory or the new one
// whole. Errors name the files by their final place and `what` is written
// ("checkpoint", "export"). The caller checks first that what `dir` holds
// may go (checkpoint.cpp).
void write_directory(const std::filesystem::path& dir, std::span<const NewFile> files, const char* what);

}  // namespace xfmr::detail
