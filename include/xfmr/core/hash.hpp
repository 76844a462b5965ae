// hash.hpp: FNV-1a, the 64-bit fingerprint of training data and of a
// tokenizer's files that checkpoints record (a resumed run compares them).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace xfmr {

// FNV-1a of s, continuing from h.
inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// v as 16 hexadecimal digits (how checkpoints record a fingerprint).
inline std::string hex(std::uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace xfmr
