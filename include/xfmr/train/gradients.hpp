// gradients.hpp: whole-model gradient utilities.
//
// gradient_norm(): the global L2 norm over every parameter gradient; throws
//   xfmr::Error naming the first tensor whose gradient is not finite.
// clip_gradients(): scales all gradients by max_norm / norm when the norm
//   exceeds max_norm (torch.nn.utils.clip_grad_norm_); returns the norm.
// first_non_finite_parameter(): the name of the first parameter holding a
//   NaN or infinity, or "" (to explain a non-finite loss).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr {

// The name of model's t-th parameter in visit() order.
template <class Model>
std::string parameter_name(Model& model, std::size_t t) {
  std::string found;
  std::size_t i = 0;
  model.visit([&](std::string_view name, auto&, auto&) {
    if (i++ == t) found = name;
  });
  return found;
}

// The global norm from each gradient's sum of squares (model's t-th
// parameter's is sums[t]); throws naming the first whose sum is not finite.
template <class Model>
double norm_from_sums(Model& model, std::span<const double> sums) {
  double total = 0.0;
  for (std::size_t t = 0; t < sums.size(); ++t) {
    if (!std::isfinite(sums[t]))
      detail::fail("non-finite gradient in '", parameter_name(model, t), "' (sum of squares ", sums[t], ")");
    total += sums[t];
  }
  return std::sqrt(total);
}

// What clip_gradients scales the gradients by at this norm (1: left alone).
inline double clip_factor(double norm, double max_norm) {
  return max_norm > 0.0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

// gradient_norm's lists, kept by a caller that takes the norm every step
// (GradientExchange) so that a step allocates nothing.
template <class S>
struct NormScratch {
  std::vector<SquaresTensor<S>> tensors;
  std::vector<double> sums;
};

template <class Backend, class Model>
double gradient_norm(Backend& be, Model& model, NormScratch<typename Backend::Scalar>& scratch) {
  using S = typename Backend::Scalar;
  std::vector<SquaresTensor<S>>& tensors = scratch.tensors;
  std::vector<double>& sums = scratch.sums;
  tensors.clear();
  model.visit([&](std::string_view, auto&, auto& grad) { tensors.push_back({grad.data(), grad.size()}); });
  sums.assign(tensors.size(), 0.0);
  if constexpr (requires { be.sum_squares_each(std::span<const SquaresTensor<S>>(tensors), std::span<double>(sums)); })
    be.sum_squares_each(std::span<const SquaresTensor<S>>(tensors), std::span<double>(sums));  // one host read
  else
    for (std::size_t t = 0; t < tensors.size(); ++t) sums[t] = be.sum_squares(tensors[t].n, tensors[t].x);
  return norm_from_sums(model, sums);
}
template <class Backend, class Model>
double gradient_norm(Backend& be, Model& model) {
  NormScratch<typename Backend::Scalar> scratch;
  return gradient_norm(be, model, scratch);
}

template <class Backend, class Model>
double clip_gradients(Backend& be, Model& model, double max_norm, NormScratch<typename Backend::Scalar>& scratch) {
  const double norm = gradient_norm(be, model, scratch);
  if (const double factor = clip_factor(norm, max_norm); factor != 1.0) {
    using S = typename Backend::Scalar;
    model.visit([&](std::string_view, auto&, auto& grad) { be.scale(grad.size(), S(factor), grad.data()); });
  }
  return norm;
}
template <class Backend, class Model>
double clip_gradients(Backend& be, Model& model, double max_norm) {
  NormScratch<typename Backend::Scalar> scratch;
  return clip_gradients(be, model, max_norm, scratch);
}

template <class Backend, class Model>
std::string first_non_finite_parameter(Backend& be, Model& model) {
  std::string found;
  model.visit([&](std::string_view name, auto& value, auto&) {
    if (found.empty() && !std::isfinite(be.sum_squares(value.size(), value.data()))) found = name;
  });
  return found;
}

}  // namespace xfmr
