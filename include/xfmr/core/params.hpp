// params.hpp: whole-layer helpers built on visit.
//
// Every layer, block and model has
//   void visit(ParameterVisitor<Backend> f);   // f(name, value, grad) per tensor
// and these helpers are the only other way parameters are touched. Names
// follow PyTorch state-dict conventions ("blocks.0.attn.qkv.weight").
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/function_ref.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

// A visit's callable behind a FunctionRef: what every layer's, block's and
// model's visit takes. The walk through a model's layers is then compiled
// once a model rather than once a visitor (a Trainer, its optimizer and its
// checkpoints visit with a dozen between them); a visit is a few hundred
// calls a step.
template <class Backend>
using ParameterVisitor = FunctionRef<void(std::string_view, typename Backend::Tensor&, typename Backend::Tensor&)>;

// Wraps f so that every name it sees gets `prefix` in front. The name is
// put together on the stack (a heap string only past kMaxParameterName
// characters), so a visit that ignores names allocates nothing: a training
// step visits every parameter several times. `prefix` must outlive the
// wrapper: a literal, or a temporary of the visit call's full expression.
inline constexpr std::size_t kMaxParameterName = 200;
template <class F>
auto prefixed(std::string_view prefix, F& f) {
  return [prefix, &f](std::string_view name, auto& value, auto& grad) {
    if (prefix.size() + name.size() > kMaxParameterName) return f(std::string(prefix).append(name), value, grad);
    char joined[kMaxParameterName];
    prefix.copy(joined, prefix.size());
    name.copy(joined + prefix.size(), name.size());
    f(std::string_view(joined, prefix.size() + name.size()), value, grad);
  };
}

// The same for f(name, part) (visit_linears' visitors).
template <class F>
auto prefixed_part(std::string_view prefix, F& f) {
  return [prefix, &f](std::string_view name, auto& part) { f(std::string(prefix).append(name), part); };
}

// A part's dropout keys (DropoutKeys&: Dropout, Residual, attention), where
// it has any: what a block's for_each_dropout walks its parts with.
template <class Part, class F>
void for_each_dropout_of(Part& part, F& f) {
  if constexpr (requires { part.for_each_dropout(f); }) part.for_each_dropout(f);
}

template <class Layer>
void zero_grad(Layer& layer) {
  layer.visit([](std::string_view, auto&, auto& grad) { grad.zero(); });
}

// Copies every parameter value of `from` into `to` (same names and shapes,
// any backends: a model trained on the GPU into a CPU one, or back).
template <class From, class To>
void copy_parameters(From& from, To& to) {
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<double>>> values;
  from.visit([&](std::string_view name, auto& value, auto&) {
    using S = typename std::remove_cvref_t<decltype(value)>::value_type;
    std::vector<S> host(value.size());
    value.copy_to_host(host.data());
    values[std::string(name)] = {value.shape(), std::vector<double>(host.begin(), host.end())};
  });
  std::size_t n = 0;
  to.visit([&](std::string_view name, auto& value, auto&) {
    using S = typename std::remove_cvref_t<decltype(value)>::value_type;
    const auto it = values.find(std::string(name));
    require(it != values.end(), "copy_parameters: the source has no parameter '", name, "'");
    require(it->second.first == value.shape(), "copy_parameters: '", name, "' has shape ",
            shape_string(it->second.first), " in the source, ", shape_string(value.shape()), " in the target");
    const std::vector<S> host(it->second.second.begin(), it->second.second.end());
    value.copy_from_host(host.data());
    ++n;
  });
  require(n == values.size(), "copy_parameters: the source has ", values.size(), " parameters, the target ", n);
}

template <class Layer>
std::size_t parameter_count(Layer& layer) {
  std::size_t n = 0;
  layer.visit([&](std::string_view, auto& value, auto&) { n += value.size(); });
  return n;
}

}  // namespace xfmr
