// json_integers.hpp (internal): integers read from JSON descriptions within
// bounds. nlohmann-json converts a float such as 1e100 to an int with
// undefined behaviour, and an unsigned beyond int64 wraps: both are refused
// here with xfmr::Error naming the value and the bounds.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "xfmr/core/error.hpp"

namespace xfmr::detail {

inline std::int64_t json_integer(const nlohmann::json& v, std::int64_t lo, std::int64_t hi, std::string_view what) {
  require(v.is_number_integer(), what, " ", v.dump(), " is not an integer");
  const bool fits = !v.is_number_unsigned() || v.get<std::uint64_t>() <= std::uint64_t(INT64_MAX);
  const std::int64_t x = fits ? v.get<std::int64_t>() : INT64_MAX;
  require(fits && x >= lo && x <= hi, what, " ", v.dump(), " outside [", lo, ", ", hi, "]");
  return x;
}

}  // namespace xfmr::detail
