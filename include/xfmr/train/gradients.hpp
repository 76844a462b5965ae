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
#include <string>
#include <string_view>

#include "xfmr/core/error.hpp"

namespace xfmr {

template <class Backend, class Model>
double gradient_norm(Backend& be, Model& model) {
  double total = 0.0;
  model.visit([&](std::string_view name, auto&, auto& grad) {
    const double s = be.sum_squares(grad.size(), grad.data());
    require(std::isfinite(s), "non-finite gradient in '", name, "' (sum of squares ", s, ")");
    total += s;
  });
  return std::sqrt(total);
}

template <class Backend, class Model>
double clip_gradients(Backend& be, Model& model, double max_norm) {
  const double norm = gradient_norm(be, model);
  if (max_norm > 0.0 && norm > max_norm) {
    using S = typename Backend::Scalar;
    const S factor = S(max_norm / (norm + 1e-6));
    model.visit([&](std::string_view, auto&, auto& grad) { be.scale(grad.size(), factor, grad.data()); });
  }
  return norm;
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
