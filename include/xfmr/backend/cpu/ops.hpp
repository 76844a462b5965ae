// ops.hpp: CpuOps<S>, the table of one compiled copy of the CPU families'
// operations (family.hpp): a pointer to each function template of
// XFMR_CPU_OPS_NS that a family's members call, and ops<S>(), which fills
// the table with this translation unit's copy. src/kernels/ops_<level>.cpp
// fill float's for each instruction-set level, src/cpu_backend_double.cpp
// double's; cpu_ops<S>() (family.hpp) gives the one in use.
#pragma once

#include "xfmr/backend/cpu/activation.hpp"
#include "xfmr/backend/cpu/attention.hpp"
#include "xfmr/backend/cpu/classifier.hpp"
#include "xfmr/backend/cpu/dropout.hpp"
#include "xfmr/backend/cpu/embedding.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/gemm.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/layer_norm.hpp"
#include "xfmr/backend/cpu/linear.hpp"
#include "xfmr/backend/cpu/losses.hpp"
#include "xfmr/backend/cpu/optimizers.hpp"
#include "xfmr/backend/cpu/positional.hpp"
#include "xfmr/backend/cpu/residual.hpp"
#include "xfmr/backend/cpu/rms_norm.hpp"

namespace xfmr::detail {

template <class S>
struct CpuOps {
  CpuLevel level;  // the instruction set this copy was compiled for (double: portable)
  // linear.hpp
  decltype(&detail::gemm<S>) gemm;
  decltype(&detail::bias_add<S>) bias_add;
  decltype(&detail::bias_grad<S>) bias_grad;
  decltype(&detail::quantise_rows) quantise_rows;  // int8_products.hpp (float)
  decltype(&detail::quantise_rows_q4) quantise_rows_q4;  // q4_products.hpp (float)
  decltype(&detail::quantise_weight_rows) quantise_weight_rows;  // int8_products.hpp (float)
  decltype(&detail::pack_panel_q4) pack_panel_q4;                // q4_products.hpp (float)
  // residual.hpp
  decltype(&detail::add<S>) add;
  decltype(&detail::add_to<S>) add_to;
  // positional.hpp
  decltype(&detail::add_positions_forward<S>) add_positions_forward;
  decltype(&detail::add_positions_backward<S>) add_positions_backward;
  decltype(&detail::rope_forward<S>) rope_forward;
  decltype(&detail::rope_backward<S>) rope_backward;
  // layer_norm.hpp, rms_norm.hpp
  decltype(&detail::layer_norm_forward<S>) layer_norm_forward;
  decltype(&detail::layer_norm_backward<S>) layer_norm_backward;
  decltype(&detail::rms_norm_forward<S>) rms_norm_forward;
  decltype(&detail::rms_norm_backward<S>) rms_norm_backward;
  // activation.hpp
  decltype(&detail::relu_forward<S>) relu_forward;
  decltype(&detail::relu_backward<S>) relu_backward;
  decltype(&detail::gelu_forward<S>) gelu_forward;
  decltype(&detail::gelu_backward<S>) gelu_backward;
  decltype(&detail::swiglu_forward<S>) swiglu_forward;
  decltype(&detail::swiglu_backward<S>) swiglu_backward;
  decltype(&detail::geglu_forward<S>) geglu_forward;
  decltype(&detail::geglu_backward<S>) geglu_backward;
  // dropout.hpp, embedding.hpp, classifier.hpp
  decltype(&detail::dropout_forward<S>) dropout_forward;
  decltype(&detail::dropout_backward<S>) dropout_backward;
  decltype(&detail::embedding_forward<S>) embedding_forward;
  decltype(&detail::embedding_backward<S>) embedding_backward;
  decltype(&detail::mean_pool_forward<S>) mean_pool_forward;
  decltype(&detail::mean_pool_backward<S>) mean_pool_backward;
  // losses.hpp
  decltype(&detail::cross_entropy_forward<S>) cross_entropy_forward;
  decltype(&detail::cross_entropy_backward<S>) cross_entropy_backward;
  decltype(&detail::cross_entropy_forward_backward<S>) cross_entropy_forward_backward;
  // optimizers.hpp
  decltype(&detail::sum_squares<S>) sum_squares;
  decltype(&detail::scale<S>) scale;
  decltype(&detail::adamw_step<S>) adamw_step;
  decltype(&detail::sgd_step<S>) sgd_step;
  // attention.hpp: the heads and rows paths (attention_heads.hpp), the tiled one (attention_tiled.hpp)
  decltype(&detail::attention_forward<S>) attention_forward;
  decltype(&detail::attention_backward<S>) attention_backward;
  decltype(&detail::flash_attention_forward<S>) flash_attention_forward;
  decltype(&detail::flash_attention_backward<S>) flash_attention_backward;
};

inline namespace XFMR_CPU_OPS_NS {

// This translation unit's copy of every operation, compiled for `level`.
template <class S>
CpuOps<S> ops(CpuLevel level) {
  return {
      .level = level,
      .gemm = &gemm<S>,
      .bias_add = &bias_add<S>,
      .bias_grad = &bias_grad<S>,
      .quantise_rows = &quantise_rows,
      .quantise_rows_q4 = &quantise_rows_q4,
      .quantise_weight_rows = &quantise_weight_rows,
      .pack_panel_q4 = &pack_panel_q4,
      .add = &add<S>,
      .add_to = &add_to<S>,
      .add_positions_forward = &add_positions_forward<S>,
      .add_positions_backward = &add_positions_backward<S>,
      .rope_forward = &rope_forward<S>,
      .rope_backward = &rope_backward<S>,
      .layer_norm_forward = &layer_norm_forward<S>,
      .layer_norm_backward = &layer_norm_backward<S>,
      .rms_norm_forward = &rms_norm_forward<S>,
      .rms_norm_backward = &rms_norm_backward<S>,
      .relu_forward = &relu_forward<S>,
      .relu_backward = &relu_backward<S>,
      .gelu_forward = &gelu_forward<S>,
      .gelu_backward = &gelu_backward<S>,
      .swiglu_forward = &swiglu_forward<S>,
      .swiglu_backward = &swiglu_backward<S>,
      .geglu_forward = &geglu_forward<S>,
      .geglu_backward = &geglu_backward<S>,
      .dropout_forward = &dropout_forward<S>,
      .dropout_backward = &dropout_backward<S>,
      .embedding_forward = &embedding_forward<S>,
      .embedding_backward = &embedding_backward<S>,
      .mean_pool_forward = &mean_pool_forward<S>,
      .mean_pool_backward = &mean_pool_backward<S>,
      .cross_entropy_forward = &cross_entropy_forward<S>,
      .cross_entropy_backward = &cross_entropy_backward<S>,
      .cross_entropy_forward_backward = &cross_entropy_forward_backward<S>,
      .sum_squares = &sum_squares<S>,
      .scale = &scale<S>,
      .adamw_step = &adamw_step<S>,
      .sgd_step = &sgd_step<S>,
      .attention_forward = &attention_forward<S>,
      .attention_backward = &attention_backward<S>,
      .flash_attention_forward = &flash_attention_forward<S>,
      .flash_attention_backward = &flash_attention_backward<S>,
  };
}

}  // namespace XFMR_CPU_OPS_NS
}  // namespace xfmr::detail
