// params.hpp: whole-layer helpers built on visit.
//
// Every layer, block and model has
//   template <class F> void visit(F&& f);   // f(name, value, grad) per tensor
// and these helpers are the only other way parameters are touched. Names
// follow PyTorch state-dict conventions ("blocks.0.attn.qkv.weight").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace xfmr {

// Wraps f so that every name it sees gets `prefix` in front.
template <class F>
auto prefixed(std::string prefix, F& f) {
  return [prefix = std::move(prefix), &f](std::string_view name, auto& value, auto& grad) {
    f(prefix + std::string(name), value, grad);
  };
}

template <class Layer>
void zero_grad(Layer& layer) {
  layer.visit([](std::string_view, auto&, auto& grad) { grad.zero(); });
}

template <class Layer>
std::size_t parameter_count(Layer& layer) {
  std::size_t n = 0;
  layer.visit([&](std::string_view, auto& value, auto&) { n += value.size(); });
  return n;
}

}  // namespace xfmr
