// temp_dir.hpp: a test's own directory under the system's temporary one,
// made unique (mkdtemp), removed with what it holds at the end.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "xfmr/core/error.hpp"

namespace xfmr::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    std::string name = (std::filesystem::temp_directory_path() / ("xfmr_" + tag + ".XXXXXX")).string();
    require(::mkdtemp(name.data()) != nullptr, "cannot make a temporary directory ", name);
    path = name;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // A file of `content` in it; its path.
  std::filesystem::path write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
    return path / name;
  }
};

}  // namespace xfmr::test
