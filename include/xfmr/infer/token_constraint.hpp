// token_constraint.hpp: TokenConstraint, what a request may draw step by
// step (structured output: json_grammar.hpp's JsonConstraint), which the
// batcher (continuous_batching.hpp) applies to each step's logits.
#pragma once

#include <cstdint>
#include <vector>

namespace xfmr {

// What a request may draw, step by step (structured output:
// json_grammar.hpp's JsonConstraint): a decoder draws only allowed ids.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // mask[id] = 1 for each id allowed now, with `left` tokens left after
  // this one; false when none is.
  virtual bool allowed(std::vector<std::uint8_t>& mask, int left) const = 0;
  // The id drawn.
  virtual void accept(std::int32_t id) = 0;
};

}  // namespace xfmr
