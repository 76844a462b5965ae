// errors.hpp: what a test asks of a call that should fail.
#pragma once

#include <functional>
#include <string>

#include "xfmr/core/error.hpp"

namespace xfmr::test {

// The message of the xfmr::Error f throws, or "" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace xfmr::test
