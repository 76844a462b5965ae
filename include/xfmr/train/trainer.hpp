// trainer.hpp: Trainer<Model, Backend, Optimizer>, one training step for
// every model: the caller gives a model, an optimizer and two functions,
// one that fills a batch and one that runs the model on part of it, and
// asks for a step.
//
//   Trainer<Model, Be> trainer(model, be, opt, {.grad_accum = 2, .clip = 1.0,
//                              .schedule = LrSchedule::parse("cosine", 1e-3, steps)},
//                              [&] { return std::make_unique<Model>(V, seed); });
//   const StepResult r = trainer.step(
//       [&](int micro) {                       // fill the caller's buffers
//         batches.sample(trainer.data_rng(), ids.data(), targets.data());
//         return BatchTargets{B, targets};     // B sequences, their targets
//       },
//       [&](const Shard& s, Model& m, Be& b) { // the shard's logits
//         return m.forward(b, rows_of(ids, s), Shape{s.size(), T});
//       });
//
// One step: zero the gradients; for each of grad_accum micro-batches, split
// the batch by sequences (DataParallel: one model replica a thread on the
// CPU, one shard elsewhere), run forward, the softmax cross-entropy against
// the batch's targets and backward on every shard; then clip (or just
// measure) the global gradient norm and take the optimizer step at the
// schedule's learning rate. On a GPU the step replays as CUDA graphs when
// graph_steps is set (run_step, backend.hpp).
//
// The loss of a micro-batch is the mean over its counted targets (those not
// kIgnoreIndex): each shard's mean is weighed by its share of the batch's
// counted targets, and each micro-batch by 1 / grad_accum, so the gradient
// is that of the step's mean loss whatever the shard count. A batch's
// targets are laid out by sequence: targets.size() / sequences per
// sequence (one per position for a language model, one per sequence for a
// classifier); the logits have one row per target.
//
// Stops: a loss that is not finite throws xfmr::Error naming the step, the
// learning rate and the cause: the first parameter that is not finite, or
// logits that overflowed from finite weights; a gradient that is not finite
// throws naming the step and the first tensor. A loss that grows far above
// its start is flagged in StepResult::diverging, once.
//
// Across processes (TrainerOptions::group with N > 1 ranks,
// distributed.hpp): each rank passes its share of the global batch; shards
// are weighed by their share of the global batch's counted targets, and the
// loss and the gradients are summed over the ranks before the norm and the
// optimizer step, so every rank takes the same step: over MPI on the host,
// or through the backend's all_reduce_sum where it has one (CudaBackend:
// NCCL, one GPU a rank). No CUDA graphs then.
// Rank r's shards draw the dropout streams r x shards and on, so N ranks of
// S shards draw the masks one process of N x S shards draws.
//
// ZeRO-1 (TrainerOptions::zero = 1; optimizers.hpp): each rank keeps the
// optimizer state of its part of the parameters alone; the gradients are
// reduce-scattered (each rank sums its part), the norm is summed from the
// parts, the optimizer steps each rank's part, and the parameters are
// all-gathered. The weights are those of plain data parallel, bit for bit
// (without clipping; clipped, the norm's sum runs in another order). save()
// and load() are then collectives: every rank calls them, rank 0 writes.
//
// What a run must keep to resume bit for bit: the model's parameters and
// the optimizer's state (save/load), and state(): the steps taken, the
// data generator's state and every dropout layer's call counter.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/blocks/block_stack.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/train/data_parallel.hpp"
#include "xfmr/train/distributed.hpp"
#include "xfmr/train/gradients.hpp"
#include "xfmr/train/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/schedules.hpp"

namespace xfmr {

struct TrainerOptions {
  int grad_accum = 1;            // micro-batches per step
  double clip = 0.0;             // global gradient-norm clip (0: measure only)
  double label_smoothing = 0.0;  // of the cross-entropy
  LrSchedule schedule{};         // learning rate by step (constant 1e-3 unless given)
  int shards = 0;                // DataParallel shards on the CPU (0: DataParallel's default)
  bool graph_steps = true;       // a GPU step as CUDA graphs (for steps of one shape)
  std::uint64_t data_seed = 0;   // seeds data_rng()
  ProcessGroup* group = nullptr; // data parallel across processes (distributed.hpp); null: this process alone
  int zero = 0;                  // 1: ZeRO-1 across the group's ranks (the optimizer's state sharded); 0: none
};

// One (micro-)batch: `sequences` sequences and their targets, laid out by
// sequence (targets.size() must be a multiple of sequences).
struct BatchTargets {
  int sequences = 0;
  std::span<const std::int32_t> targets;
};

// A step's outcome: the step number (1-based), its learning rate, the mean
// loss over its micro-batches and the gradient norm before clipping.
struct StepResult {
  long step = 0;
  double lr = 0.0, loss = 0.0, grad_norm = 0.0;
  // True at the first step whose loss exceeds kDivergence times the loss of
  // this run's first step: training is likely diverging (a learning rate
  // too high); the caller warns.
  bool diverging = false;
};
inline constexpr double kDivergence = 4.0;

// A loss summed over batches without gradients: the sum of each target's
// loss and the number of targets counted.
struct LossSum {
  double total = 0.0;
  long counted = 0;
  double mean() const { return counted ? total / double(counted) : 0.0; }
  LossSum& operator+=(const LossSum& o) {
    total += o.total;
    counted += o.counted;
    return *this;
  }
};

// What resumes a run besides the parameters and the optimizer's state.
struct TrainerState {
  long step = 0;
  std::uint64_t data_rng = 0;
  std::vector<std::uint64_t> dropout_calls;
};

// Targets that count towards a loss (not kIgnoreIndex, the padding).
inline long counted_targets(std::span<const std::int32_t> targets) {
  long n = 0;
  for (std::int32_t t : targets) n += t != kIgnoreIndex;
  return n;
}

template <class Model, class Backend, class Optimizer = AdamW<Backend>>
class Trainer {
 public:
  using S = typename Backend::Scalar;
  using Factory = typename DataParallel<Model, Backend>::Factory;

  // make_replica builds a model of model's type and shapes for the CPU's
  // shards (its weights are copied from model before every use); it may be
  // empty with one shard.
  Trainer(Model& model, Backend& be, Optimizer& opt, TrainerOptions opts, Factory make_replica = {})
      : model_(model), be_(be), opt_(opt), opts_(opts), dp_(model, be, std::move(make_replica), opts.shards),
        data_rng_(opts.data_seed) {
    require(opts.grad_accum >= 1, "Trainer: grad_accum ", opts.grad_accum, " must be at least 1");
    require(opts.clip >= 0.0, "Trainer: clip ", opts.clip, " must not be negative");
    require(opts.zero == 0 || opts.zero == 1, "Trainer: ZeRO stage ", opts.zero, " is not 0 or 1");
    if (distributed()) {
      dp_.set_first_stream(std::uint64_t(opts_.group->rank()) * std::uint64_t(dp_.shards()));
      if (zero()) {
        if constexpr (requires { opt_.shard(*opts_.group); }) opt_.shard(*opts_.group);
        else detail::fail("Trainer: ZeRO-1 needs an optimizer that shards its state (AdamW, Sgd)");
      }
    }
    for (int r = 0; r < dp_.shards(); ++r) {
      shard_loss_.emplace_back(opts.label_smoothing);
      if (opts.label_smoothing != 0.0) eval_loss_.emplace_back(0.0);
      shard_dlogits_.emplace_back();
    }
  }

  // One optimisation step (see the top of this file). next_batch(micro)
  // fills the caller's buffers and returns their BatchTargets;
  // forward(shard, model, backend) returns the logits of the shard's
  // sequences (backend memory, one row per target of the shard).
  template <class NextBatch, class Forward>
  StepResult step(NextBatch&& next_batch, Forward&& forward) {
    StepResult r{step_ + 1, opts_.schedule.at(step_), 0.0, 0.0};
    auto body = [&] {
      zero_grad(model_);
      for (int micro = 0; micro < opts_.grad_accum; ++micro)
        r.loss += accumulate(next_batch(micro), forward) / opts_.grad_accum;
      if (distributed()) {
        r.loss = opts_.group->sum(r.loss);
        if (std::isfinite(r.loss)) sum_gradients_over_ranks();
      }
      check_loss(r.loss, r.step);
      r.grad_norm = checked_norm(r.step);
      opt_.step(be_, r.lr);
      if (zero()) gather_parameters();
    };
    // Block recompute frees and allocates a block's buffers within the step:
    // no graph can replay that, so such a step runs directly.
    bool graphs = opts_.graph_steps && !distributed();
    if constexpr (requires { model_.recompute(); }) graphs = graphs && model_.recompute() != Recompute::block;
    if (graphs) run_step(be_, "train", body);
    else body();
    ++step_;
    if (first_loss_ < 0) first_loss_ = r.loss;
    r.diverging = !warned_ && first_loss_ > 0 && r.loss > kDivergence * first_loss_;
    warned_ = warned_ || r.diverging;
    return r;
  }

  // The loss of one batch without gradients, dropout off, split as a step
  // is (evaluation): plain cross-entropy, without label smoothing. Sum the
  // results over batches and take mean(). Across processes each rank passes
  // its share of the batch (none at all is allowed) and every rank gets the
  // sum over the ranks.
  template <class Forward>
  LossSum evaluate(const BatchTargets& batch, Forward&& forward) {
    LossSum sum;
    if (batch.sequences > 0 || !distributed()) sum = evaluate_here(batch, forward);
    if (distributed()) {
      double parts[2] = {sum.total, double(sum.counted)};
      opts_.group->all_reduce_sum(std::span<double>(parts));
      sum = {parts[0], long(parts[1])};
    }
    return sum;
  }

  // The loss of this run's first step (-1 before it).
  double first_loss() const { return first_loss_; }
  // Steps taken so far (the next step's 0-based index).
  long steps() const { return step_; }
  // The learning rate of the next step.
  double lr() const { return opts_.schedule.at(step_); }
  // The generator the caller draws its batches from (seeded data_seed).
  Rng& data_rng() { return data_rng_; }
  int shards() const { return dp_.shards(); }
  // The split the steps use, for passes that need more than a loss
  // (inference over a batch, accuracy): DataParallel::forward.
  DataParallel<Model, Backend>& data_parallel() { return dp_; }
  const TrainerOptions& options() const { return opts_; }

  TrainerState state() {
    TrainerState st{step_, data_rng_.state(), {}};
    model_.for_each_dropout([&](auto& d) { st.dropout_calls.push_back(d.calls()); });
    return st;
  }
  void restore(const TrainerState& st) {
    require(st.step >= 0, "trainer state: step ", st.step, " is negative");
    std::size_t i = 0, layers = 0;
    model_.for_each_dropout([&](auto&) { ++layers; });
    require(st.dropout_calls.size() == layers, "trainer state has ", st.dropout_calls.size(),
            " dropout counters, the model ", layers, " dropout layers");
    model_.for_each_dropout([&](auto& d) { d.set_calls(st.dropout_calls[i++]); });
    step_ = st.step;
    data_rng_.set_state(st.data_rng);
  }

  // The parameters and the optimizer's state, into the two files of a
  // checkpoint (io/checkpoint.hpp); load() reads them back from one, or
  // from its two files already read (a caller that needed the model file's
  // metadata first).
  void save(SafeTensorsWriter& model_file, SafeTensorsWriter& optimizer_file) {
    add_parameters(model_file, model_);
    add_optimizer_state(optimizer_file, opt_);
  }
  void load(const SafeTensors& model_file, const SafeTensors& optimizer_file) {
    load_parameters(model_, model_file);
    load_optimizer_state(opt_, optimizer_file);
  }
  void load(const std::filesystem::path& checkpoint) {
    load(SafeTensors::load(checkpoint / kModelFile), SafeTensors::load(checkpoint / kOptimizerFile));
  }

 private:
  std::size_t per_sequence(const BatchTargets& batch) const {
    require(batch.sequences >= 1 && !batch.targets.empty() && batch.targets.size() % std::size_t(batch.sequences) == 0,
            "Trainer: a batch of ", batch.sequences, " sequences has ", batch.targets.size(),
            " targets; need a positive multiple of the sequences");
    return batch.targets.size() / std::size_t(batch.sequences);
  }
  static int classes(std::span<const S> logits, std::span<const std::int32_t> targets) {
    require(!logits.empty() && logits.size() % targets.size() == 0, "Trainer: ", logits.size(), " logits for ",
            targets.size(), " targets; need one row of logits per target");
    return int(logits.size() / targets.size());
  }

  bool distributed() const { return opts_.group && opts_.group->size() > 1; }
  bool zero() const { return opts_.zero == 1 && distributed(); }

  // Each rank's gradients replaced by their sum over the ranks; with ZeRO-1
  // only this rank's part of them (the rest is left as it was).
  void sum_gradients_over_ranks() {
    if constexpr (requires(std::span<const std::span<S>> t) { be_.all_reduce_sum(*opts_.group, t); }) {
      // Device memory (CudaBackend): the backend's own collective (NCCL).
      grad_spans_.clear();
      model_.visit([&](std::string_view, auto&, auto& grad) { grad_spans_.emplace_back(grad.data(), grad.size()); });
      be_.all_reduce_sum(*opts_.group, std::span<const std::span<S>>(grad_spans_));
    } else {
      sum_host_gradients_over_ranks();
    }
  }
  void sum_host_gradients_over_ranks() {
    std::size_t n = 0;
    model_.visit([&](std::string_view, auto&, auto& grad) { n += grad.size(); });
    flat_.resize(n);
    std::size_t at = 0;
    model_.visit([&](std::string_view, auto&, auto& grad) {
      grad.copy_to_host(flat_.data() + at);
      at += grad.size();
    });
    if (!zero()) {
      opts_.group->all_reduce_sum(std::span<S>(flat_));
      at = 0;
      model_.visit([&](std::string_view, auto&, auto& grad) {
        grad.copy_from_host(flat_.data() + at);
        at += grad.size();
      });
      return;
    }
    opts_.group->reduce_scatter_sum(std::span<S>(flat_), opt_.shard_bounds());
    for_my_part([&](auto&, auto& grad, std::size_t offset, std::size_t lo, std::size_t hi) {
      std::copy(flat_.data() + offset + lo, flat_.data() + offset + hi, grad.data() + lo);
    });
  }

  // f(value, grad, offset, lo, hi) for every parameter: its offset in the
  // concatenation of every parameter and the elements [lo, hi) of it in this
  // rank's part (ZeRO-1, the optimizer's shard_bounds(); host memory).
  template <class F>
  void for_my_part(F&& f) {
    const std::size_t r = std::size_t(opts_.group->rank()), begin = opt_.shard_bounds()[r],
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
  // tensor, and this rank's part clipped (clip_gradients, gradients.hpp).
  double sharded_norm() {
    sums_.clear();
    for_my_part([&](auto&, auto& grad, std::size_t, std::size_t lo, std::size_t hi) {
      sums_.push_back(hi > lo ? be_.sum_squares(hi - lo, grad.data() + lo) : 0.0);
    });
    opts_.group->all_reduce_sum(std::span<double>(sums_));
    names_.clear();
    model_.visit([&](std::string_view name, auto&, auto&) { names_.emplace_back(name); });
    const double norm = norm_from_sums(names_, sums_);
    if (const double factor = clip_factor(norm, opts_.clip); factor != 1.0)
      for_my_part([&](auto&, auto& grad, std::size_t, std::size_t lo, std::size_t hi) {
        if (hi > lo) be_.scale(hi - lo, S(factor), grad.data() + lo);
      });
    return norm;
  }

  // ZeRO-1, after the step: every rank's part of the parameters to every rank.
  void gather_parameters() {
    for_my_part([&](auto& value, auto&, std::size_t offset, std::size_t lo, std::size_t hi) {
      std::copy(value.data() + lo, value.data() + hi, flat_.data() + offset + lo);
    });
    opts_.group->all_gather(std::span<S>(flat_), opt_.shard_bounds());
    std::size_t at = 0;
    model_.visit([&](std::string_view, auto& value, auto&) {
      value.copy_from_host(flat_.data() + at);
      at += value.size();
    });
  }

  // This rank's part of evaluate().
  template <class Forward>
  LossSum evaluate_here(const BatchTargets& batch, Forward& forward) {
    const std::size_t per = per_sequence(batch);
    model_.set_training(false);
    LossSum sum;
    try {
      sum.total = dp_.forward(batch.sequences, [&](const Shard& s, Model& m, Backend& b) {
        const auto targets = batch.targets.subspan(std::size_t(s.begin) * per, std::size_t(s.size()) * per);
        const long c = counted_targets(targets);
        if (c == 0) return 0.0;
        const std::span<const S> logits = forward(s, m, b);
        auto& ce = eval_loss_.empty() ? shard_loss_[std::size_t(s.index)] : eval_loss_[std::size_t(s.index)];
        return ce.forward(b, logits, targets, classes(logits, targets)) * double(c);
      });
    } catch (...) {
      model_.set_training(true);
      throw;
    }
    model_.set_training(true);
    sum.counted = counted_targets(batch.targets);
    return sum;
  }

  // The loss of a micro-batch: this rank's shards, each weighed by its share
  // of the counted targets of the whole batch (of every rank's shares).
  // Across processes a rank may have no sequences of a (short) batch.
  template <class Forward>
  double accumulate(const BatchTargets& batch, Forward& forward) {
    const bool none_here = distributed() && batch.sequences == 0 && batch.targets.empty();
    const std::size_t per = none_here ? 0 : per_sequence(batch);
    const long local = counted_targets(batch.targets);
    const long counted = distributed() ? long(opts_.group->sum(std::int64_t(local))) : local;
    const double loss = counted == 0 || local == 0 ? 0.0 : accumulate_here(batch, per, counted, forward);
    if (distributed()) take_root_dropout_calls();
    return loss;
  }

  // Every rank's dropout counters set to rank 0's, as one process's replicas
  // take its model's: a rank that ran no forward pass (no sequences, or no
  // counted targets) stays in step with the others.
  void take_root_dropout_calls() {
    calls_.clear();
    model_.for_each_dropout([&](auto& d) { calls_.push_back(opts_.group->root() ? std::int64_t(d.calls()) : 0); });
    if (calls_.empty()) return;
    opts_.group->all_reduce_sum(std::span<std::int64_t>(calls_));
    std::size_t i = 0;
    model_.for_each_dropout([&](auto& d) { d.set_calls(std::uint64_t(calls_[i++])); });
  }

  // accumulate()'s forward and backward passes over this rank's shards.
  template <class Forward>
  double accumulate_here(const BatchTargets& batch, std::size_t per, long counted, Forward& forward) {
    const double loss = dp_.backward(batch.sequences, [&](const Shard& s, Model& m, Backend& b) {
      const auto targets = batch.targets.subspan(std::size_t(s.begin) * per, std::size_t(s.size()) * per);
      const long c = counted_targets(targets);
      if (c == 0) return 0.0;
      const double share = double(c) / double(counted);
      auto& ce = shard_loss_[std::size_t(s.index)];
      const std::span<const S> logits = forward(s, m, b);
      const double shard_loss = ce.forward(b, logits, targets, classes(logits, targets));
      if (!std::isfinite(shard_loss)) {  // reported below
        logits_overflowed_[std::size_t(s.index)] = !std::isfinite(b.sum_squares(logits.size(), logits.data()));
        return shard_loss;
      }
      const std::span<S> dlogits(shard_dlogits_[std::size_t(s.index)].reserve(logits.size()), logits.size());
      ce.backward(b, dlogits, share / opts_.grad_accum);
      m.backward(b, std::span<const S>(dlogits));
      return shard_loss * share;
    });
    return loss;
  }

  // A loss that is not finite stops the run, naming the step and the cause.
  void check_loss(double loss, long step) {
    if (!std::isfinite(loss)) {
      const std::string bad = first_non_finite_parameter(be_, model_);
      const bool overflowed = std::find(logits_overflowed_.begin(), logits_overflowed_.end(), 1) != logits_overflowed_.end();
      detail::fail("loss is ", loss, " at step ", step, " (learning rate ", opts_.schedule.at(step - 1), "): ",
                   !bad.empty()  ? "parameter '" + bad + "' is the first that is not finite"
                   : overflowed ? std::string("every parameter is finite, but the logits are not: the weights grew "
                                              "until the forward pass overflowed")
                                : std::string("every parameter and logit is finite: the loss itself overflowed"),
                   "; try a lower learning rate or gradient clipping");
    }
  }

  // The global gradient norm, clipped to opts_.clip when set (with ZeRO-1,
  // from every rank's parts); a gradient that is not finite is named.
  double checked_norm(long step) {
    try {
      return zero() ? sharded_norm() : clip_gradients(be_, model_, opts_.clip);
    } catch (const Error& e) {
      detail::fail("at step ", step, ": ", e.what());
    }
  }

  Model& model_;
  Backend& be_;
  Optimizer& opt_;
  TrainerOptions opts_;
  DataParallel<Model, Backend> dp_;
  Rng data_rng_;
  long step_ = 0;
  double first_loss_ = -1.0;
  bool warned_ = false;
  std::vector<char> logits_overflowed_ = std::vector<char>(std::size_t(dp_.shards()), 0);  // a shard's, at a non-finite loss
  std::deque<CrossEntropyLoss<Backend>> shard_loss_;  // one a shard (they do not move)
  std::deque<CrossEntropyLoss<Backend>> eval_loss_;   // without smoothing, when training smooths
  std::deque<typename Backend::template Buffer<S>> shard_dlogits_;  // (rows, classes), backend memory
  std::vector<S> flat_;  // every gradient (or parameter), on the host, for the collectives over ranks
  std::vector<double> sums_;  // sharded_norm's sums of squares, a tensor each
  std::vector<std::string> names_;  // and the tensors' names
  std::vector<std::int64_t> calls_;  // take_root_dropout_calls' counters
  std::vector<std::span<S>> grad_spans_;  // every gradient, for a backend's own all-reduce
};

}  // namespace xfmr
