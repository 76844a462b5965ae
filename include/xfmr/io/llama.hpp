// llama.hpp: what the Llama checkpoint formats (io/hf_llama.hpp,
// io/llama2c.hpp) ask of the Decoder they fill: Llama's block, pre-norm
// RMSNorm, SwiGLU, rotary positions, no biases, heads D_MODEL / N_HEADS wide.
#pragma once

#include <type_traits>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/positional.hpp"
#include "xfmr/layers/rms_norm.hpp"
#include "xfmr/presets.hpp"

namespace xfmr::detail {

// Llama's parts (a Dynamic configuration's sizes and biases are checked at
// run time, llama_check_preset).
template <class Cfg, class Backend>
inline constexpr bool kLlamaShaped =
    std::is_same_v<typename Cfg::Norm, PreNorm> && std::is_same_v<typename Cfg::Activation, SwiGlu> &&
    std::is_same_v<norm_layer_t<Cfg, Cfg::D_MODEL, Backend>, RmsNorm<Cfg::D_MODEL, Backend>> &&
    rotary_positions<Cfg>() &&
    (!is_static_config<Cfg>() || (!linear_bias<Cfg>() && qk_head_dim<Cfg>() * Cfg::N_HEADS == Cfg::D_MODEL &&
                                  v_head_dim<Cfg>() * Cfg::N_HEADS == Cfg::D_MODEL));

// llama_check_preset: llama_shaped, or an xfmr::Error naming the preset.
void llama_check_preset(const PresetInfo& p);

}  // namespace xfmr::detail

namespace xfmr {
// kLlamaShaped at run time: whether a preset is Llama's block (pre-norm
// RMSNorm, SwiGLU, rotary positions, no biases).
bool llama_shaped(const PresetInfo& p);
}  // namespace xfmr
