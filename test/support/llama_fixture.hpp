// llama_fixture.hpp: what the Llama checkpoint tests share. The shape of
// make_fixtures.py's Llama fixtures (fixtures/llama2c, fixtures/hf_llama):
// D 32, feed-forward 48, 2 layers, 4 query heads sharing 2 key/value heads,
// vocabulary 40, context 16; and how far logits are from a reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "support/configs.hpp"
#include "xfmr/presets.hpp"

namespace xfmr::test {

struct LlamaFixture : LlamaShape<16, 32, 4, 2, 2, 48> {
  static constexpr int VOCAB = 40;
};

// The largest difference from the reference over its largest magnitude.
template <class T>
double relative_gap(std::span<const float> got, const std::vector<T>& want) {
  if (got.size() != want.size()) return INFINITY;
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    gap = std::max(gap, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return gap / scale;
}

}  // namespace xfmr::test
