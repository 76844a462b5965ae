// model.hpp: what the library asks of a model, as concepts checked where it
// asks (the Trainer, DataParallel, checkpoints, the optimizers, generation):
//
//   Parameterized<M>         visit(f) lists every parameter as f(name, value,
//                            grad) with PyTorch state-dict names (every layer,
//                            block and model: checkpoints, optimizers);
//   TrainableModel<M>        a Parameterized that for_each_dropout(f) lists
//                            every dropout layer's keys (DropoutKeys&: its call
//                            counter is what a resume restores) and has
//                            set_training(bool) (the Trainer, DataParallel);
//   CausalModel<M, Backend>  a TrainableModel that decodes: forward(be, ids, shape) ->
//                            logits (B*T, vocab()), start_cache(cache, B) and
//                            forward_cached(be, ids, B, cache) -> the new
//                            positions' logits, vocab(), max_t() (Decoder,
//                            LanguageModel).
// A model missing one fails at the entry point with a static_assert that
// names this file, not deep inside the Trainer.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/kv_cache.hpp"

namespace xfmr {

template <class M>
concept Parameterized = requires(M& m) { m.visit([](std::string_view, auto&, auto&) {}); };

template <class M>
concept TrainableModel = Parameterized<M> && requires(M& m, bool on) {
  m.for_each_dropout([](DropoutKeys&) {});
  m.set_training(on);
};

template <class M, class Backend>
concept CausalModel = TrainableModel<M> && requires(M& m, Backend& be, std::span<const std::int32_t> ids,
                                           DecodingCache<Backend>& cache) {
  { m.forward(be, ids, Shape{1, 1}) } -> std::convertible_to<std::span<const typename Backend::Activation>>;
  m.start_cache(cache, 1);
  { m.forward_cached(be, ids, 1, cache) } -> std::convertible_to<std::span<const typename Backend::Activation>>;
  { m.vocab() } -> std::convertible_to<int>;
  { m.max_t() } -> std::convertible_to<int>;
};

}  // namespace xfmr
