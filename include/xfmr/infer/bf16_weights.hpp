// bf16_weights.hpp: Bf16WeightCopies, a scope in which a bf16 backend reads
// a model's weight matrices from bfloat16 copies (decoding with bf16
// weights: half the bytes a token streams).
//
//   {
//     xfmr::Bf16WeightCopies bf16(be, model);  // rounds every matrix once
//     ... start_cache / forward_cached / beam search ...
//   }                                          // copies dropped
//
// The float32 weights stay the master copy (checkpoints, training); inside
// the scope they must not change (no optimizer step, no load): the products
// would go on reading the copies. Scopes nest: one opened while the backend
// holds copies already (an outer scope's) neither makes nor drops any. On a backend without bf16 precision
// (float32, double, CUDA today) the scope does nothing, so decoding code
// can open it unconditionally.
#pragma once

#include <string_view>

namespace xfmr {

template <class Backend>
class Bf16WeightCopies {
  static constexpr bool kHasCopies = requires(Backend& be, const typename Backend::Scalar* w) {
    be.keep_bf16_copy(w, 1, 1);
    be.drop_bf16_copies();
    be.bf16_copy_bytes();
  };

 public:
  // Every two-dimensional parameter of model (the products' weights; a tied
  // output projection's is its embedding's, listed by the embedding).
  template <class Model>
  Bf16WeightCopies(Backend& be, Model& model) : be_(be) {
    if constexpr (kHasCopies) {
      owner_ = be.bf16_copy_bytes() == 0;
      if (!owner_) return;
      model.visit([&](std::string_view, auto& value, auto&) {
        if (value.shape().size() == 2) be.keep_bf16_copy(value.data(), int(value.dim(0)), int(value.dim(1)));
      });
    }
  }
  ~Bf16WeightCopies() {
    if constexpr (kHasCopies)
      if (owner_) be_.drop_bf16_copies();
  }
  Bf16WeightCopies(const Bf16WeightCopies&) = delete;
  Bf16WeightCopies& operator=(const Bf16WeightCopies&) = delete;

 private:
  Backend& be_;
  bool owner_ = false;  // this scope made the copies (the outermost)
};

}  // namespace xfmr
