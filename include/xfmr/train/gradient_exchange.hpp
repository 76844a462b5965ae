// gradient_exchange.hpp: GradientExchange, how a training step's loss and
// gradients meet those of the other processes: the Trainer's step calls it
// at four points and knows nothing of MPI, NCCL or ZeRO.
//
// Three policies, chosen by the Trainer's SplitOptions:
//   this process alone      (no group, or one rank): every call is the identity;
//   data parallel           (a group of N > 1 ranks, distributed.hpp): the loss
//                           and the gradients summed over the ranks, through
//                           MPI on the host, or through the backend's own
//                           all_reduce_sum where it has one (CudaBackend: NCCL,
//                           one GPU a rank), so every rank takes the same step;
//   ZeRO-1                  (zero = 1 over such a group; optimizers.hpp): each
//                           rank keeps the optimizer state of its part of the
//                           parameters alone; the gradients are reduce-scattered
//                           (each rank sums its part), the norm is summed from
//                           the parts, the optimizer steps each rank's part,
//                           and the parameters are all-gathered. The weights
//                           are those of plain data parallel, bit for bit
//                           (without clipping; clipped, the norm's sum runs in
//                           another order).
// Rank r's shards draw the dropout streams r x shards and on (first_stream),
// so N ranks of S shards draw the masks one process of N x S shards draws,
// and every rank takes rank 0's dropout counters after each micro-batch
// (a rank with no rows of a short batch stays in step).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/train/gradients.hpp"

namespace xfmr {

// How a step's batch is split: over the CPU's threads (model replicas, one a
// thread: DataParallel) and over processes.
struct SplitOptions {
  int shards = 0;                 // DataParallel shards on the CPU (0: its default)
  ProcessGroup* group = nullptr;  // data parallel across processes (distributed.hpp); null: this process alone
  int zero = 0;                   // 1: ZeRO-1 across the group's ranks (the optimizer's state sharded); 0: none
};

template <class Model, class Backend, class Optimizer>
class GradientExchange {
 public:
  using S = typename Backend::Scalar;

  GradientExchange(Model& model, Backend& be, Optimizer& opt, const SplitOptions& split)
      : model_(model), be_(be), opt_(opt), group_(split.group), zero_(split.zero) {
    require(zero_ == 0 || zero_ == 1, "Trainer: ZeRO stage ", zero_, " is not 0 or 1");
    if (zero()) {
      if constexpr (requires { opt_.shard(*group_); }) opt_.shard(*group_);
      else detail::fail("Trainer: ZeRO-1 needs an optimizer that shards its state (AdamW, Sgd)");
    }
  }

  // More than one rank takes part.
  bool distributed() const { return group_ && group_->size() > 1; }
  bool zero() const { return zero_ == 1 && distributed(); }
  // The first dropout stream of this rank's `shards` shards.
  std::uint64_t first_stream(int shards) const {
    return distributed() ? std::uint64_t(group_->rank()) * std::uint64_t(shards) : 0;
  }

  // x summed over the ranks (a loss, a count of targets).
  template <class T>
  T sum(T x) {
    return distributed() ? group_->sum(x) : x;
  }
  void sum(std::span<double> v) {
    if (distributed()) group_->all_reduce_sum(v);
  }

  // Each rank's gradients replaced by their sum over the ranks; with ZeRO-1
  // only this rank's part of them (the rest is left as it was).
  void sum_gradients() {
    if (!distributed()) return;
    if constexpr (requires(std::span<const std::span<S>> t) { be_.all_reduce_sum(*group_, t); }) {
      // Device memory (CudaBackend): the backend's own collective (NCCL).
      grad_spans_.clear();
      model_.visit([&](std::string_view, auto&, auto& grad) { grad_spans_.emplace_back(grad.data(), grad.size()); });
      be_.all_reduce_sum(*group_, std::span<const std::span<S>>(grad_spans_));
    } else {
      sum_host_gradients();
    }
  }

  // The global gradient norm, clipped to `clip` when positive (with
  // ZeRO-1, from every rank's parts).
  double clip_gradients(double clip) {
    return zero() ? sharded_norm(clip) : xfmr::clip_gradients(be_, model_, clip, norm_scratch_);
  }

  // After the optimizer's step (ZeRO-1: every rank's part of the
  // parameters to every rank).
  void after_step() {
    if (!zero()) return;
    for_my_part([&](auto& value, auto&, std::size_t offset, std::size_t lo, std::size_t hi) {
      std::copy(value.data() + lo, value.data() + hi, flat_.data() + offset + lo);
    });
    group_->all_gather(std::span<S>(flat_), opt_.shard_bounds());
    std::size_t at = 0;
    model_.visit([&](std::string_view, auto& value, auto&) {
      value.copy_from_host(flat_.data() + at);
      at += value.size();
    });
  }

  // Every rank's dropout counters set to rank 0's, as one process's replicas
  // take its model's: a rank that ran no forward pass (no sequences, or no
  // counted targets) stays in step with the others.
  void take_root_dropout_calls() {
    if (!distributed()) return;
    calls_.clear();
    model_.for_each_dropout([&](auto& d) { calls_.push_back(group_->root() ? std::int64_t(d.calls()) : 0); });
    if (calls_.empty()) return;
    group_->all_reduce_sum(std::span<std::int64_t>(calls_));
    std::size_t i = 0;
    model_.for_each_dropout([&](auto& d) { d.set_calls(std::uint64_t(calls_[i++])); });
  }

 private:
  void sum_host_gradients() {
    std::size_t n = 0;
    model_.visit([&](std::string_view, auto&, auto& grad) { n += grad.size(); });
    flat_.resize(n);
    std::size_t at = 0;
    model_.visit([&](std::string_view, auto&, auto& grad) {
      grad.copy_to_host(flat_.data() + at);
      at += grad.size();
    });
    if (!zero()) {
      group_->all_reduce_sum(std::span<S>(flat_));
      at = 0;
      model_.visit([&](std::string_view, auto&, auto& grad) {
        grad.copy_from_host(flat_.data() + at);
        at += grad.size();
      });
      return;
    }
    group_->reduce_scatter_sum(std::span<S>(flat_), opt_.shard_bounds());
    for_my_part([&](auto&, auto& grad, std::size_t offset, std::size_t lo, std::size_t hi) {
      std::copy(flat_.data() + offset + lo, flat_.data() + offset + hi, grad.data() + lo);
    });
  }

  // f(value, grad, offset, lo, hi) for every parameter: its offset in the
  // concatenation of every parameter and the elements [lo, hi) of it in this
  // rank's part (ZeRO-1, the optimizer's shard_bounds(); host memory).
  template <class F>
  void for_my_part(F&& f) {
    const std::size_t r = std::size_t(group_->rank()), begin = opt_.shard_bounds()[r],
                      end = opt_.shard_bounds()[r + 1];
    std::size_t at = 0;
    model_.visit([&](std::string_view, auto& value, auto& grad) {
      const std::size_t lo = std::clamp(begin, at, at + value.size()) - at;
      const std::size_t hi = std::clamp(end, at, at + value.size()) - at;
      f(value, grad, at, lo, hi);
      at += value.size();
    });
  }

  // ZeRO-1: the global gradient norm from every rank's part of every
  // tensor, and this rank's part clipped (clip_factor, gradients.hpp).
  double sharded_norm(double clip) {
    sums_.clear();
    for_my_part([&](auto&, auto& grad, std::size_t, std::size_t lo, std::size_t hi) {
      sums_.push_back(hi > lo ? be_.sum_squares(hi - lo, grad.data() + lo) : 0.0);
    });
    group_->all_reduce_sum(std::span<double>(sums_));
    const double norm = norm_from_sums(model_, sums_);
    if (const double factor = clip_factor(norm, clip); factor != 1.0)
      for_my_part([&](auto&, auto& grad, std::size_t, std::size_t lo, std::size_t hi) {
        if (hi > lo) be_.scale(hi - lo, S(factor), grad.data() + lo);
      });
    return norm;
  }

  Model& model_;
  Backend& be_;
  Optimizer& opt_;
  ProcessGroup* group_;
  int zero_;
  std::vector<S> flat_;                   // every gradient (or parameter), on the host
  std::vector<double> sums_;              // sharded_norm's sums of squares, a tensor each
  NormScratch<S> norm_scratch_;           // clip_gradients' lists
  std::vector<std::int64_t> calls_;       // take_root_dropout_calls' counters
  std::vector<std::span<S>> grad_spans_;  // every gradient, for a backend's own all-reduce
};

}  // namespace xfmr
