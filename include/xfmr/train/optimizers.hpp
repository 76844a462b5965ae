// optimizers.hpp: AdamW and SGD with momentum over a model's parameters.
//
// An optimizer takes the model's tensors through visit() once, at
// construction, and keeps pointers to them: the model must outlive it and stay
// where it is. step(be, lr) applies one update from the accumulated gradients
// (it does not clear them; call zero_grad). Weight decay is decoupled (AdamW)
// and applies by default to matrices only, never to biases, norm parameters
// or embeddings (names containing "emb", the bigram table).
// visit_state(f) lists the optimizer state as f(name, tensor) with names
// "<param>.exp_avg", "<param>.exp_avg_sq" (AdamW) or
// "<param>.momentum_buffer" (SGD), as in torch's optimizer state; steps()
// is the update count.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

// Default decay rule: matrices (rank >= 2) except embedding tables.
inline bool decays_by_default(std::string_view name, std::size_t rank) {
  return rank >= 2 && name.find("emb") == std::string_view::npos && !name.starts_with("table.");
}

namespace detail {
template <class Backend>
struct Slot {
  using Tensor = typename Backend::Tensor;
  std::string name;
  Tensor* value;
  Tensor* grad;
  bool decay;
  Tensor state1, state2;  // moments, or the momentum buffer and nothing
};

template <class Backend, class Model>
std::vector<Slot<Backend>> collect_slots(Model& model, int states) {
  std::vector<Slot<Backend>> slots;
  model.visit([&](std::string_view name, auto& value, auto& grad) {
    Slot<Backend> s{std::string(name), &value, &grad, decays_by_default(name, value.shape().size()), {}, {}};
    s.state1.resize(value.shape());
    if (states > 1) s.state2.resize(value.shape());
    slots.push_back(std::move(s));
  });
  require(!slots.empty(), "the model has no parameters to optimise");
  return slots;
}
}  // namespace detail

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

template <class Backend>
class AdamW {
 public:
  using S = typename Backend::Scalar;
  using Tensor = typename Backend::Tensor;

  template <class Model>
  AdamW(Model& model, AdamWOptions opts = {}) : opts_(opts), slots_(detail::collect_slots<Backend>(model, 2)) {
    require(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1, "AdamW betas (", opts.beta1, ", ",
            opts.beta2, ") outside [0, 1)");
  }

  void step(Backend& be, double lr) {
    ++steps_;
    const double bc1 = 1.0 - std::pow(opts_.beta1, double(steps_));
    const double bc2 = 1.0 - std::pow(opts_.beta2, double(steps_));
    tensors_.clear();
    for (auto& s : slots_)
      tensors_.push_back({s.value->size(), s.value->data(), s.grad->data(), s.state1.data(), s.state2.data(),
                          S(s.decay ? opts_.weight_decay : 0.0)});
    be.adamw_step(std::span<const AdamWTensor<S>>(tensors_), S(lr), S(opts_.beta1), S(opts_.beta2), S(opts_.eps),
                  S(bc1), S(bc2));
  }

  template <class F>
  void visit_state(F&& f) {
    for (auto& s : slots_) {
      f(s.name + ".exp_avg", s.state1);
      f(s.name + ".exp_avg_sq", s.state2);
    }
  }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t n) { steps_ = n; }
  // Overrides the default decay rule for one parameter.
  void set_decay(std::string_view name, bool decay) { slot(name).decay = decay; }
  bool decays(std::string_view name) { return slot(name).decay; }

 private:
  detail::Slot<Backend>& slot(std::string_view name) {
    for (auto& s : slots_)
      if (s.name == name) return s;
    detail::fail("no parameter named '", name, "'");
  }

  AdamWOptions opts_;
  std::vector<detail::Slot<Backend>> slots_;
  std::vector<AdamWTensor<S>> tensors_;  // step()'s list, kept to reuse its memory
  std::int64_t steps_ = 0;
};

struct SgdOptions {
  double momentum = 0.9, weight_decay = 0.0;
};

template <class Backend>
class Sgd {
 public:
  using S = typename Backend::Scalar;

  template <class Model>
  Sgd(Model& model, SgdOptions opts = {}) : opts_(opts), slots_(detail::collect_slots<Backend>(model, 1)) {}

  void step(Backend& be, double lr) {
    ++steps_;
    for (auto& s : slots_)
      be.sgd_step(s.value->size(), s.value->data(), s.grad->data(), s.state1.data(), S(lr), S(opts_.momentum),
                  S(s.decay ? opts_.weight_decay : 0.0));
  }

  template <class F>
  void visit_state(F&& f) {
    for (auto& s : slots_) f(s.name + ".momentum_buffer", s.state1);
  }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t n) { steps_ = n; }

 private:
  SgdOptions opts_;
  std::vector<detail::Slot<Backend>> slots_;
  std::int64_t steps_ = 0;
};

}  // namespace xfmr
