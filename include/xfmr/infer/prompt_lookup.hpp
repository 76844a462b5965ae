// prompt_lookup.hpp: the drafts of speculative decoding by prompt lookup
// (continuous_batching.hpp): the tokens that followed the latest earlier
// occurrence of a text's last ids, an answer that copies its input being
// likely to go on as it did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace xfmr {

// Up to `most` tokens that followed the latest earlier occurrence of the
// text's last n ids (n = 3, then 2); none without one. The text is `held`
// then `newest`.
inline std::vector<std::int32_t> prompt_lookup_drafts(std::span<const std::int32_t> held, std::int32_t newest,
                                                      int most) {
  std::vector<std::int32_t> out;
  if (most <= 0) return out;
  const std::size_t size = held.size() + 1;
  auto at = [&](std::size_t i) { return i < held.size() ? held[i] : newest; };
  for (std::size_t n = 3; n >= 2 && out.empty(); --n) {
    if (size < n + 1) continue;
    for (std::size_t start = size - n; start-- > 0;) {  // the latest occurrence before the end
      bool same = true;
      for (std::size_t k = 0; k < n && same; ++k) same = at(start + k) == at(size - n + k);
      if (!same) continue;
      for (std::size_t k = start + n; k < size && int(out.size()) < most; ++k) out.push_back(at(k));
      break;
    }
  }
  return out;
}

}  // namespace xfmr
