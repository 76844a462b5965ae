// weight_copies.hpp: WeightCopies, a scope in which a backend in a
// decoding precision reads a model's weight matrices from copies made once:
// bfloat16 in bf16 precision (half the bytes a token streams), int8 with a
// scale a row in int8 precision (a quarter; backend/cpu/int8_products.hpp).
//
//   {
//     xfmr::WeightCopies copies(be, model);  // rounds or quantises every matrix once
//     ... start_cache / forward_cached / beam search ...
//   }                                      // copies dropped
//
// The float32 weights stay the master copy (checkpoints, training); inside
// the scope they must not change (no optimizer step, no load): the products
// would go on reading the copies. Scopes nest: one opened while the backend
// holds copies already (an outer scope's) neither makes nor drops any. On a
// backend in float32, or without copies (double, CUDA today), the scope
// does nothing, so decoding code can open it unconditionally.
#pragma once

#include <string_view>

namespace xfmr {

template <class Backend>
class WeightCopies {
  static constexpr bool kHasCopies = requires(Backend& be, const typename Backend::Scalar* w) {
    be.keep_weight_copy(w, 1, 1);
    be.drop_weight_copies();
    be.weight_copy_bytes();
  };

 public:
  // Every two-dimensional parameter of model (the products' weights; a tied
  // output projection's is its embedding's, listed by the embedding).
  template <class Model>
  WeightCopies(Backend& be, Model& model) : be_(be) {
    if constexpr (kHasCopies) {
      owner_ = be.weight_copy_bytes() == 0;
      if (!owner_) return;
      model.visit([&](std::string_view, auto& value, auto&) {
        if (value.shape().size() == 2) be.keep_weight_copy(value.data(), int(value.dim(0)), int(value.dim(1)));
      });
    }
  }
  ~WeightCopies() {
    if constexpr (kHasCopies)
      if (owner_) be_.drop_weight_copies();
  }
  WeightCopies(const WeightCopies&) = delete;
  WeightCopies& operator=(const WeightCopies&) = delete;

 private:
  Backend& be_;
  bool owner_ = false;  // this scope made the copies (the outermost)
};

}  // namespace xfmr
