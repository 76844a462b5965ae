// mask.hpp: which keys a query may attend to.
//
// causal: query i (at absolute position i + T_kv - T_q, so a query block that
// ends a longer cached key sequence lines up) sees keys j <= that position.
// key_padding: (B, T_kv) bytes, nonzero = padded key, never attended (the
// PyTorch key_padding_mask convention). A query row whose keys are all masked
// gets zero probabilities and a zero output, never NaN.
#pragma once

#include <cstdint>

namespace xfmr {

struct AttentionMask {
  bool causal = false;
  const std::uint8_t* key_padding = nullptr;  // (B, T_kv) or nullptr

  bool allowed(int b, int i, int j, int t_q, int t_kv) const {
    if (causal && j > i + (t_kv - t_q)) return false;
    if (key_padding && key_padding[static_cast<long>(b) * t_kv + j]) return false;
    return true;
  }
};

}  // namespace xfmr
