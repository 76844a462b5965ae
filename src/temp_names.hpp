// temp_names.hpp (internal): names for temporaries written beside a target.
#pragma once

#include <filesystem>
#include <string>

namespace xfmr::detail {

// "<dir>/.<name>.<tag>.XXXXXX", a mkstemp/mkdtemp template beside `target`.
inline std::string hidden_temp_template(const std::filesystem::path& target, const char* tag) {
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::string name = target.filename().string();
  name.insert(name.begin(), '.');
  name.append(".").append(tag).append(".XXXXXX");
  return (dir / name).string();
}

}  // namespace xfmr::detail
