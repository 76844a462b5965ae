// weight_copies.hpp: WeightCopies, a scope in which a backend reads a
// model's weight matrices from copies made for decoding: bfloat16 in bf16
// precision (half the bytes a token streams), int8 with a scale a row in
// int8 precision (a quarter; backend/cpu/int8_products.hpp), 4-bit blocks
// in q4 precision (backend/cpu/q4_products.hpp), and in float32 panels
// that a step of one or a few rows streams at the read bandwidth
// (backend/cpu/float_panels.hpp). Each copy is made at the first product
// that reads its matrix, so a matrix no product reads (an embedding that
// is not the head) costs nothing.
//
//   {
//     xfmr::WeightCopies copies(be, model);  // registers every matrix
//     ... start_cache / forward_cached / beam search ...
//   }                                      // copies dropped
//
// A model that holds its weights (trained, or built) keeps them: the
// copies are made from them and add their bytes. A model loaded to decode
// (load_model: its matrices deferred to the file, core/tensor.hpp) never
// holds them in float32: the scope lends each matrix to the backend,
// whose copy is made from the file (the file's pages given back after
// each; an int8 or 4-bit checkpoint's stored rows as they are, a 4-bit
// one's panels read in place), and whose token embedding rows are read
// from the file; a float32 matrix that the precision keeps as it is
// (fewer than 2^17 weights) is read into memory instead.
//
// The float32 weights stay the master copy (checkpoints, training); inside
// the scope they must not change (no optimizer step, no load): the products
// would go on reading the copies. Scopes nest: one opened while the backend
// holds copies already (an outer scope's) neither makes nor drops any. On a
// backend without copies (double, CUDA today) the scope does nothing but
// read deferred matrices into memory, so decoding code can open it
// unconditionally.
//
// The float32 panels pay for themselves over many tokens; a scope for one
// call (generate's, classify's, translate's own, under no outer scope)
// opens with {.panels = false}: a model that holds its weights then keeps
// no panels (a deferred one's panels are its matrices' only copy, made as
// ever). A program that decodes (a server, a sampling loop) opens one
// scope for its life.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "xfmr/core/weight_source.hpp"

namespace xfmr {

struct WeightCopyOptions {
  bool panels = true;  // float32: keep the decoding panels of matrices held in memory too
};

template <class Backend>
class WeightCopies {
  static constexpr bool kHasCopies =
      requires(Backend& be, const typename Backend::Scalar* w, std::shared_ptr<const WeightSource> s) {
        be.keep_weight_copy(w, 1, 1, s, true);
        be.drop_weight_copies();
        be.holds_weight_copies();
      };

 public:
  // Every two-dimensional parameter of model (the products' weights; a tied
  // output projection's is its embedding's, listed by the embedding).
  template <class Model>
  WeightCopies(Backend& be, Model& model, WeightCopyOptions opts = {}) : be_(be) {
    if constexpr (kHasCopies) {
      owner_ = !be.holds_weight_copies();
      if (!owner_) return;
      model.visit([&](std::string_view, auto& value, auto&) {
        if (value.shape().size() != 2) return;
        using S = typename std::remove_cvref_t<decltype(value)>::value_type;
        const int rows = int(value.dim(0)), cols = int(value.dim(1));
        if constexpr (requires { value.deferred(); }) {
          if (value.deferred()) {
            value.lend();  // product_data() is now its reserved address
            if (be.keep_weight_copy(value.product_data(), rows, cols, value.source(), true)) {
              lent_.push_back(&value);
            } else {
              value.give_back();
              value.data();  // a matrix the precision reads as it is: into memory
            }
            return;
          }
          if constexpr (std::is_same_v<S, float>)
            be.keep_weight_copy(value.data(), rows, cols,
                                std::make_shared<MemoryWeights>(value.data(), rows, cols), opts.panels);
        }
      });
    } else {
      settle(model);
    }
  }
  ~WeightCopies() {
    if constexpr (requires(typename Backend::Tensor& t) { t.give_back(); })
      for (auto* value : lent_) value->give_back();
    if constexpr (kHasCopies)
      if (owner_) be_.drop_weight_copies();
  }
  WeightCopies(const WeightCopies&) = delete;
  WeightCopies& operator=(const WeightCopies&) = delete;

 private:
  // Without copies, every deferred matrix read into memory now, before
  // decoding's parallel work would (core/tensor.hpp).
  template <class Model>
  static void settle(Model& model) {
    model.visit([&](std::string_view, auto& value, auto&) {
      if constexpr (requires { value.deferred(); })
        if (value.deferred()) value.data();
    });
  }

  Backend& be_;
  bool owner_ = false;  // this scope made the copies (the outermost)
  std::vector<typename Backend::Tensor*> lent_;  // the deferred matrices lent to the backend
};

}  // namespace xfmr
