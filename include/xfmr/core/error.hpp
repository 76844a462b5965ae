// error.hpp: the one exception type xfmr throws for bad input, and the helpers
// that build its messages. Every message names the offending value and the
// limit it broke, e.g. "token id 70 out of range [0, 65)".
#pragma once

#include <cerrno>
#include <charconv>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
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

}  // namespace detail

// fail("no tensor '", name, "' in ", file): throws xfmr::Error with the parts
// written one after the other.
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(detail::concat(std::forward<Parts>(parts)...));
}

namespace detail {
using xfmr::fail;
}  // namespace detail

// require(cond, "x has ", n, " rows, expected ", m): throws xfmr::Error when
// cond is false. Message parts are only formatted on failure.
template <class... Parts>
void require(bool cond, Parts&&... parts) {
  if (!cond) [[unlikely]]
    fail(std::forward<Parts>(parts)...);
}

// system_call([&] { return ::open(...); }, path, ": cannot open"): runs the
// POSIX call and returns its result; when it fails (-1, or a null pointer)
// throws xfmr::Error with the parts and ": " and the text of errno, read as
// soon as the call returns. The one place the library reads errno after a
// call that throws: read in the expression that makes the call (another
// argument of the same require), it may be read before the call runs.
template <class Call, class... Parts>
auto system_call(Call&& call, Parts&&... parts) {
  const auto result = std::forward<Call>(call)();
  bool failed = false;
  if constexpr (std::is_pointer_v<std::remove_const_t<decltype(result)>>)
    failed = result == nullptr;
  else
    failed = result == -1;
  if (failed) [[unlikely]] {
    const int err = errno;
    fail(std::forward<Parts>(parts)..., ": ", std::strerror(err));
  }
  return result;
}

// The whole of `text` as an integer of type T, or xfmr::Error naming `what`,
// the text and T's range (no std::stoll exceptions, no silent wrap-around).
template <class T>
T parse_integer(std::string_view text, std::string_view what) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  require(ec != std::errc::invalid_argument && end == text.data() + text.size() && !text.empty(), what, " '", text,
          "' is not an integer");
  require(ec != std::errc::result_out_of_range, what, " '", text, "' is out of range");
  return value;
}

}  // namespace xfmr
