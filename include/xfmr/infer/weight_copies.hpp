// weight_copies.hpp: WeightCopies, a scope in which a backend reads a
// model's weight matrices from copies made for decoding: bfloat16 in bf16
// precision (half the bytes a token streams), int8 with a scale a row in
// int8 precision (a quarter; backend/cpu/int8_products.hpp), and in
// float32 panels that a step of one or a few rows streams at the read
// bandwidth (backend/cpu/float_panels.hpp; each matrix packed at the first
// such product that reads it, so twice its bytes from then on).
//
//   {
//     xfmr::WeightCopies copies(be, model);  // rounds or quantises every matrix once
//     ... start_cache / forward_cached / beam search ...
//   }                                      // copies dropped
//
// Opened with a SafeTensors holding int8 matrices (an int8 checkpoint's
// model file, which load_parameters loaded into model), a scope in int8
// precision keeps the file's rows and scales as they are instead of
// quantising the model's (dequantised) weights again.
//
// The float32 weights stay the master copy (checkpoints, training); inside
// the scope they must not change (no optimizer step, no load): the products
// would go on reading the copies. Scopes nest: one opened while the backend
// holds copies already (an outer scope's) neither makes nor drops any. On a
// backend without copies (double, CUDA today) the scope does nothing, so
// decoding code can open it unconditionally.
//
// The float32 panels pay for themselves over many tokens; a scope for one
// call (generate's, classify's, translate's own, under no outer scope)
// opens with {.panels = false}: the copies its precision needs, no panels.
// A program that decodes (a server, a sampling loop) opens one scope for
// its life.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/safetensors.hpp"

namespace xfmr {

struct WeightCopyOptions {
  bool panels = true;  // float32: keep the decoding panels too
};

template <class Backend>
class WeightCopies {
  static constexpr bool kHasCopies = requires(Backend& be, const typename Backend::Scalar* w) {
    be.keep_weight_copy(w, 1, 1);
    be.keep_decoding_copy(w, 1, 1);
    be.drop_weight_copies();
    be.holds_weight_copies();
  };
  static constexpr bool kKeepsSavedRows =
      requires(Backend& be, const typename Backend::Scalar* w, const std::int8_t* q, const float* s) {
        be.keep_weight_copy(w, 1, 1, q, s);
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
        const int rows = int(value.dim(0)), cols = int(value.dim(1));
        be.keep_weight_copy(value.data(), rows, cols);
        if (opts.panels) be.keep_decoding_copy(value.data(), rows, cols);
      });
    }
  }
  template <class Model>
  WeightCopies(Backend& be, Model& model, const SafeTensors& saved, WeightCopyOptions opts = {}) : be_(be) {
    if constexpr (kHasCopies) {
      owner_ = !be.holds_weight_copies();
      if (!owner_) return;
      model.visit([&](std::string_view name, auto& value, auto&) {
        if (value.shape().size() != 2) return;
        const int rows = int(value.dim(0)), cols = int(value.dim(1));
        if (opts.panels) be.keep_decoding_copy(value.data(), rows, cols);
        const std::string key(name);
        if constexpr (kKeepsSavedRows) {
          if (saved.contains(key) && saved.info(key).dtype == DType::I8) {
            require(saved.info(key).shape == value.shape(), saved.source(), ": tensor '", key, "' has shape ",
                    shape_string(saved.info(key).shape), " but the model expects ", shape_string(value.shape()));
            const std::vector<float> scale = saved.values<float>(key + kScaleSuffix);
            require(scale.size() == std::size_t(rows), saved.source(), ": '", key, kScaleSuffix, "' holds ",
                    scale.size(), " scales for ", rows, " rows");
            const auto q = saved.bytes(key);
            be.keep_weight_copy(value.data(), rows, cols, reinterpret_cast<const std::int8_t*>(q.data()),
                                scale.data());
            return;
          }
        }
        be.keep_weight_copy(value.data(), rows, cols);
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
