// checkpoint.cpp: atomic checkpoint directories (see checkpoint.hpp).
#include "xfmr/io/checkpoint.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "temp_names.hpp"

namespace xfmr {

namespace fs = std::filesystem;

namespace {

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  require(out.good(), path.string(), ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  require(out.good(), path.string(), ": write failed");
  fsync_path(path, false);
}

}  // namespace

bool is_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kModelFile, ec) &&
         fs::is_regular_file(dir / kTrainerStateFile, ec);
}

std::string read_trainer_state(const fs::path& dir) {
  require(is_checkpoint(dir), dir.string(), ": not a checkpoint directory (expected ", kModelFile, " and ",
          kTrainerStateFile, ")");
  std::ifstream in(dir / kTrainerStateFile);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void check_checkpoint_destination(const fs::path& dir) {
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  require(!exists || is_checkpoint(dir), "refusing to write a checkpoint over ", dir.string(),
          ": it exists and is not an xfmr checkpoint");
}

void write_checkpoint(const fs::path& dir, const SafeTensorsWriter& model, const SafeTensorsWriter& optimizer,
                      std::string_view trainer_state_json) {
  check_checkpoint_destination(dir);
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  require(fs::is_directory(parent), dir.string(), ": cannot create the parent directory");

  std::string tmpl = detail::hidden_temp_template(dir, "new");
  require(::mkdtemp(tmpl.data()) != nullptr, dir.string(), ": cannot create a temporary directory: ",
          std::strerror(errno));
  const fs::path tmp = tmpl;
  try {
    write_file(tmp / kModelFile, model.serialize());
    write_file(tmp / kOptimizerFile, optimizer.serialize());
    const std::string state(trainer_state_json);
    write_file(tmp / kTrainerStateFile, std::as_bytes(std::span<const char>(state.data(), state.size())));
    ::chmod(tmp.c_str(), 0755);
    fsync_path(tmp, true);
    if (exists) {
      // One atomic swap: the new checkpoint takes the name, the old one the
      // temporary name, and is removed afterwards.
      require(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0, dir.string(),
              ": cannot swap in the new checkpoint: ", std::strerror(errno));
    } else {
      require(::rename(tmp.c_str(), dir.c_str()) == 0, dir.string(), ": cannot move the new checkpoint in place: ",
              std::strerror(errno));
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fsync_path(parent, true);
  fs::remove_all(tmp, ec);  // the old checkpoint after a swap; nothing otherwise
}

}  // namespace xfmr
