// json_bounds.hpp (internal): JSON read within bounds.
// - json_integer: nlohmann-json converts a float such as 1e100 to an int with
//   undefined behaviour, and an unsigned beyond int64 wraps: both are refused
//   with xfmr::Error naming the value and the bounds.
// - check_json_depth: nesting is bounded before parsing; nlohmann-json's
//   dump() recurses, and a value nested 100,000 deep overflowed the stack
//   while an error message was being built.
// - non_finite_number: NaN and Infinity, which JSON has not (Python's
//   json.dump writes them), named with their field.
// - parse_json_object: all three, then the parse, for a file's top-level object.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
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

// Nesting of [ and { that no description of ours comes near.
inline constexpr int kMaxJsonDepth = 64;

// Refuses JSON text nested deeper than `limit` (brackets inside strings do
// not count), naming `what`. Malformed text passes: the parser reports it.
inline void check_json_depth(std::string_view text, std::string_view what, int limit = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      require(++depth <= limit, what, " nests deeper than ", limit, " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// Where text holds NaN, Infinity or -Infinity outside a string: "'key' is
// NaN", the key the last string before it; empty when it holds none.
inline std::string non_finite_number(std::string_view text) {
  bool in_string = false, escaped = false;
  std::size_t start = 0;
  std::string_view last;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false, last = text.substr(start, i - start);
    } else if (c == '"') {
      in_string = true;
      start = i + 1;
    } else {
      for (std::string_view token : {"-Infinity", "Infinity", "NaN", "-NaN"})
        if (text.substr(i).starts_with(token))
          return "'" + std::string(last.substr(0, 80)) + "' is " + std::string(token);
    }
  }
  return {};
}

// A JSON object's text, depth-checked and parsed; `source` names the file
// and `what` the object (a "GPT-2 config") in errors.
inline nlohmann::json parse_json_object(std::string_view text, const std::string& source, std::string_view what) {
  check_json_depth(text, source);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    if (const std::string nf = non_finite_number(text); !nf.empty())
      fail(source, ": ", nf, ", a number JSON does not have (Python's json.dump writes it for a float that is not "
           "finite); a finite number is needed");
    fail(source, ": not valid JSON (", e.what(), ")");
  }
  require(j.is_object(), source, ": ", what, " must be a JSON object");
  return j;
}

}  // namespace xfmr::detail
