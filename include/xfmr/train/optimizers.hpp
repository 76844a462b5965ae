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
//
// ZeRO-1 (shard(group), which the Trainer calls for TrainerOptions::zero):
// the parameters, concatenated in visit() order, are cut into one part a
// rank (cut by shard()), and each rank keeps the state of its part
// alone and steps only its part; the Trainer hands it that part of the
// gradients summed over the ranks (a reduce-scatter) and gathers the updated
// parameters from every rank after the step. The update of each element is
// the one the whole optimizer makes, so the weights are the same bits.
// visit_state then gathers the state from every rank (a collective: every
// rank calls it), so a checkpoint holds the whole state, as an unsharded
// optimizer's does, and loads sharded or not, at any number of ranks.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/core/distributed.hpp"

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
  std::size_t offset = 0;  // of the tensor in the concatenation of every parameter, in visit() order
  std::size_t lo = 0, hi = 0;  // the elements [lo, hi) of the tensor the optimizer updates (all, unless sharded)
  Tensor state1, state2;  // moments, or the momentum buffer and nothing: elements [lo, hi)
};

// An optimizer's parameters and their state (`states` tensors each): whole,
// or, after shard(group), only this rank's part of the concatenation of
// every parameter (ZeRO-1).
template <class Backend>
class Slots {
 public:
  using S = typename Backend::Scalar;
  using Tensor = typename Backend::Tensor;

  template <class Model>
  Slots(Model& model, int states) : states_(states) {
    model.visit([&](std::string_view name, auto& value, auto& grad) {
      Slot<Backend> s{std::string(name), &value, &grad, decays_by_default(name, value.shape().size()), total_, 0,
                      value.size(), {}, {}};
      total_ += value.size();
      slots_.push_back(std::move(s));
    });
    require(!slots_.empty(), "the model has no parameters to optimise");
    if constexpr (!kHostMemory) list();  // device state now, never inside a captured step (CUDA graphs)
  }

  // Keeps the state of this rank's part of the parameters alone, zeroed
  // (call before the first step, or load the state after). The parts are
  // about total / N elements each, cut inside a tensor only at multiples of
  // 64 bytes of it: the CPU's update vectorises by address, and an element
  // must take the same path sharded or not for the weights to be the same
  // bits.
  void shard(ProcessGroup& group) {
    if constexpr (!kHostMemory) {
      (void)group;
      fail("ZeRO-1 shards the optimizer in host memory, on the CPU backend (not ", Backend::name, ")");
    } else {
      constexpr std::size_t align = 64 / sizeof(S);
      bounds_.assign(std::size_t(group.size()) + 1, total_);
      bounds_[0] = 0;
      std::size_t t = 0;
      for (std::size_t r = 1; r < std::size_t(group.size()); ++r) {
        const std::size_t want = total_ * r / std::size_t(group.size());
        while (slots_[t].offset + slots_[t].value->size() <= want) ++t;  // the tensor holding element `want`
        const std::size_t at = slots_[t].offset + (want - slots_[t].offset) / align * align;
        bounds_[r] = std::max(bounds_[r - 1], at);
      }
      group_ = &group;
      const std::size_t begin = bounds_[std::size_t(group.rank())], end = bounds_[std::size_t(group.rank()) + 1];
      for (auto& s : slots_) {
        s.lo = std::clamp(begin, s.offset, s.offset + s.value->size()) - s.offset;
        s.hi = std::clamp(end, s.offset, s.offset + s.value->size()) - s.offset;
        s.state1 = Tensor({std::int64_t(s.hi - s.lo)});  // a new tensor: a whole one's memory goes
        if (states_ > 1) s.state2 = Tensor({std::int64_t(s.hi - s.lo)});
      }
      allocated_ = true;
    }
  }
  // The parts shard() cut, rank r's [bounds[r], bounds[r + 1]) (empty unsharded).
  std::span<const std::size_t> bounds() const { return bounds_; }

  // The slots, their state allocated (zeros) on first use in host memory: a
  // sharded optimizer never holds the whole state.
  std::vector<Slot<Backend>>& list() {
    if (!allocated_) {
      for (auto& s : slots_) {
        s.state1.resize(s.value->shape());
        if (states_ > 1) s.state2.resize(s.value->shape());
      }
      allocated_ = true;
    }
    return slots_;
  }
  Slot<Backend>& find(std::string_view name) {
    for (auto& s : slots_)
      if (s.name == name) return s;
    fail("no parameter named '", name, "'");
  }

  // f(name + "." + suffix[k], state tensor k) for every parameter, in
  // order, each tensor of its parameter's shape. Sharded, the tensors are
  // gathered whole from every rank first, and what f leaves in this rank's
  // part is kept: every rank must call it (save and load alike).
  template <class F>
  void visit_state(const std::array<const char*, 2>& suffix, F&& f) {
    if constexpr (kHostMemory) {
      if (group_) {
        visit_gathered_state(suffix, f);
        return;
      }
    }
    for (auto& s : list()) {
      f(s.name + "." + suffix[0], s.state1);
      if (states_ > 1) f(s.name + "." + suffix[1], s.state2);
    }
  }

 private:
  static constexpr bool kHostMemory = std::is_same_v<Tensor, xfmr::Tensor<S>>;
  static Tensor& state(Slot<Backend>& s, int k) { return k == 0 ? s.state1 : s.state2; }

  template <class F>
  void visit_gathered_state(const std::array<const char*, 2>& suffix, F& f) {
    std::vector<S> flat[2];
    for (int k = 0; k < states_; ++k) {
      flat[k].assign(total_, S(0));
      for (auto& s : slots_) std::copy_n(state(s, k).data(), s.hi - s.lo, flat[k].data() + s.offset + s.lo);
      group_->all_gather(std::span<S>(flat[k]), bounds());
    }
    Tensor whole;
    for (auto& s : slots_)
      for (int k = 0; k < states_; ++k) {
        whole = Tensor(s.value->shape());
        std::copy_n(flat[k].data() + s.offset, whole.size(), whole.data());
        f(s.name + "." + suffix[std::size_t(k)], whole);
        std::copy_n(whole.data() + s.lo, s.hi - s.lo, state(s, k).data());
      }
  }

  int states_;
  std::size_t total_ = 0;
  std::vector<Slot<Backend>> slots_;
  ProcessGroup* group_ = nullptr;
  std::vector<std::size_t> bounds_;
  bool allocated_ = false;
};
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
  AdamW(Model& model, AdamWOptions opts = {}) : opts_(opts), slots_(model, 2) {
    require(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1, "AdamW betas (", opts.beta1, ", ",
            opts.beta2, ") outside [0, 1)");
  }

  void step(Backend& be, double lr) {
    ++steps_;
    const double bc1 = 1.0 - std::pow(opts_.beta1, double(steps_));
    const double bc2 = 1.0 - std::pow(opts_.beta2, double(steps_));
    tensors_.clear();
    for (auto& s : slots_.list())
      if (s.hi > s.lo)
        tensors_.push_back({s.hi - s.lo, s.value->data() + s.lo, s.grad->data() + s.lo, s.state1.data(),
                            s.state2.data(), S(s.decay ? opts_.weight_decay : 0.0)});
    be.adamw_step(std::span<const AdamWTensor<S>>(tensors_), S(lr), S(opts_.beta1), S(opts_.beta2), S(opts_.eps),
                  S(bc1), S(bc2));
  }

  template <class F>
  void visit_state(F&& f) {
    slots_.visit_state({"exp_avg", "exp_avg_sq"}, f);
  }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t n) { steps_ = n; }
  // Overrides the default decay rule for one parameter.
  void set_decay(std::string_view name, bool decay) { slots_.find(name).decay = decay; }
  bool decays(std::string_view name) { return slots_.find(name).decay; }
  // ZeRO-1: from now on this rank keeps, and steps, only its part of the
  // parameters (see the top of this file).
  void shard(ProcessGroup& group) { slots_.shard(group); }
  std::span<const std::size_t> shard_bounds() const { return slots_.bounds(); }

 private:
  AdamWOptions opts_;
  detail::Slots<Backend> slots_;
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
  Sgd(Model& model, SgdOptions opts = {}) : opts_(opts), slots_(model, 1) {}

  void step(Backend& be, double lr) {
    ++steps_;
    for (auto& s : slots_.list())
      if (s.hi > s.lo)
        be.sgd_step(s.hi - s.lo, s.value->data() + s.lo, s.grad->data() + s.lo, s.state1.data(), S(lr),
                    S(opts_.momentum), S(s.decay ? opts_.weight_decay : 0.0));
  }

  template <class F>
  void visit_state(F&& f) {
    slots_.visit_state({"momentum_buffer", nullptr}, f);
  }
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t n) { steps_ = n; }
  void shard(ProcessGroup& group) { slots_.shard(group); }
  std::span<const std::size_t> shard_bounds() const { return slots_.bounds(); }

 private:
  SgdOptions opts_;
  detail::Slots<Backend> slots_;
  std::int64_t steps_ = 0;
};

}  // namespace xfmr
