// utf8.cpp: UTF-8 checks and repairs (text.hpp's utf8_* and check_utf8),
// by Unicode's table 3-7 of well-formed byte sequences.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

std::size_t utf8_character_size(std::string_view s, std::size_t i) {
  // Unicode's table 3-7: no overlong forms, no surrogates, nothing past U+10FFFF.
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  const std::size_t n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  const unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
  const unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  if (n > 1 && (b(1) < lo || b(1) > hi)) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  return n;
}

namespace {
// The bytes of a well-formed beginning of a character at i (1 to 3: an
// incomplete one; 0: the byte at i begins none), Unicode's table 3-7.
std::size_t utf8_valid_start(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0) return 0;
  const unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
  const unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  std::size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) break;
  }
  return k;
}
}  // namespace

std::size_t utf8_complete_prefix(std::string_view text) {
  // A lead byte among the last three whose character would run past the end.
  for (std::size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const std::size_t i = text.size() - back;
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xc0) == 0x80) continue;  // a continuation byte: look further back
    return c >= 0xc2 && utf8_character_size(text, i) == 0 && utf8_valid_start(text, i) == back ? i : text.size();
  }
  return text.size();
}

std::string utf8_repaired(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (const std::size_t n = utf8_character_size(text, i); n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart
      i += std::max<std::size_t>(1, utf8_valid_start(text, i));
    }
  }
  return out;
}

void check_utf8(std::string_view text, const std::string& source) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_character_size(text, i);
    if (n == 0) {
      const std::size_t line = 1 + std::size_t(std::count(text.begin(), text.begin() + std::ptrdiff_t(i), '\n'));
      const std::size_t line_start = text.rfind('\n', i == 0 ? 0 : i - 1);
      const std::size_t column = line_start == std::string_view::npos || i == 0 ? i + 1 : i - line_start;
      fail(source, source.empty() ? "" : ": ", "invalid UTF-8 at line ", line, ", byte ", column, " of the line (byte ",
           i, " of the text)");
    }
    i += n;
  }
}

std::vector<std::string_view> utf8_characters(std::string_view text) {
  check_utf8(text, "");
  std::vector<std::string_view> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); i += out.back().size()) out.push_back(text.substr(i, utf8_character_size(text, i)));
  return out;
}

}  // namespace xfmr
