// random.hpp: normal draws as host floats, for tests that fill a product's
// operands or a model's inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xfmr/core/rng.hpp"

namespace xfmr::test {

// n draws from N(0, scale^2), Rng(seed)'s.
inline std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * float(rng.normal());
  return v;
}

}  // namespace xfmr::test
