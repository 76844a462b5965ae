// error.hpp: the one exception type xfmr throws for bad input, and the helpers
// that build its messages. Every message names the offending value and the
// limit it broke, e.g. "token id 70 out of range [0, 65)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace xfmr {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

template <class... Parts>
[[nodiscard]] std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(concat(std::forward<Parts>(parts)...));
}

}  // namespace detail

// require(cond, "x has ", n, " rows, expected ", m): throws xfmr::Error when
// cond is false. Message parts are only formatted on failure.
template <class... Parts>
void require(bool cond, Parts&&... parts) {
  if (!cond) [[unlikely]]
    detail::fail(std::forward<Parts>(parts)...);
}

}  // namespace xfmr
