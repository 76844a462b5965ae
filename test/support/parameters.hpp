// parameters.hpp: a model's parameters as host floats, by name, for tests
// that compare two models bit for bit (checkpoint round trips).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace xfmr::test {

template <class Model>
std::map<std::string, std::vector<float>> host_parameters(Model& m) {
  std::map<std::string, std::vector<float>> out;
  m.visit([&](std::string_view name, auto& value, auto&) {
    std::vector<typename std::remove_cvref_t<decltype(m)>::S> host(value.size());
    value.copy_to_host(host.data());
    out[std::string(name)].assign(host.begin(), host.end());
  });
  return out;
}

}  // namespace xfmr::test
