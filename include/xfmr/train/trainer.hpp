// trainer.hpp: Trainer<Model, Backend, Optimizer>, one training step for
// every model, and the checkpoints that resume it: the caller gives a model,
// an optimizer and two functions, one that fills a batch and one that runs
// the model on part of it, and asks for a step.
//
//   Trainer<Model, Be> trainer(model, be, opt, {.grad_accum = 2, .clip = 1.0,
//                              .schedule = LrSchedule::parse("cosine", 1e-3, steps)});
//   const StepResult r = trainer.step(
//       [&](int micro) {                       // fill the caller's buffers
//         batches.sample(trainer.data_rng(), ids.data(), targets.data());
//         return BatchTargets{B, targets};     // B sequences, their targets
//       },
//       [&](const Shard& s, Model& m, Be& b) { // the shard's forward
//         return m.forward_to_head(b, std::span(ids).subspan(s.begin * T, s.size() * T), Shape{s.size(), T});
//       });
//   trainer.save("run1", {{"preset", "shakespeare-small"}});   // a checkpoint
//   (a LanguageModel replicates itself for the CPU's shards, clone(); a
//   typed model takes a factory as a fifth argument,
//   [&] { return std::make_unique<Model>(V, seed); })
//   ... later, a Trainer built the same way:
//   const Metadata md = trainer.resume("run1");                // bit for bit
//
// One step: zero the gradients; for each of grad_accum micro-batches, split
// the batch by sequences (DataParallel: one model replica a thread on the
// CPU, one shard elsewhere), run forward, the softmax cross-entropy against
// the batch's targets and backward on every shard; then exchange the
// gradients with the other processes (GradientExchange; nothing in one
// process), clip (or just measure) the global gradient norm and take the
// optimizer step at the schedule's learning rate. On a GPU the step replays
// as CUDA graphs when graph_steps is set (run_step, backend.hpp).
//
// The loss of a micro-batch is the mean over its counted targets (those not
// kIgnoreIndex): each shard's mean is weighed by its share of the batch's
// counted targets, and each micro-batch by 1 / grad_accum, so the gradient
// is that of the step's mean loss whatever the shard count. A batch's
// targets are laid out by sequence: targets.size() / sequences per
// sequence (one per position for a language model, one per sequence for a
// classifier). The forward function returns either the logits, one row
// per target (the model's own memory: the loss writes their gradient over
// them, the fused loss's in-place form, layers/losses.hpp, and the Trainer
// calls backward), or a language model's HeadRows (forward_to_head: the
// Trainer calls the model's head_loss, which holds one block of rows'
// logits at a time and runs the backward).
//
// Stops: a loss that is not finite throws xfmr::Error naming the step, the
// learning rate and the cause: the first parameter that is not finite, or
// logits that overflowed from finite weights; a gradient that is not finite
// throws naming the step and the first tensor. A loss that grows far above
// its start is flagged in StepResult::diverging, once.
//
// Across processes (SplitOptions::group with N > 1 ranks, distributed.hpp;
// gradient_exchange.hpp has the policies): each rank passes its share of
// the global batch; shards are weighed by their share of the global batch's
// counted targets, and every rank takes the same step. No CUDA graphs then.
//
// Checkpoints (io/checkpoint.hpp): save(dir, metadata) writes the
// parameters, the optimizer's state and state() (the steps taken, the data
// generator's state, every dropout layer's call counter) with the caller's
// metadata; resume(dir) reads them back into a Trainer built as the saving
// one was, so that the next step is the one the saving run would have
// taken, bit for bit. With ZeRO-1 both are collectives: every rank calls
// them, rank 0 writes.
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
#include "xfmr/models/model.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/train/gradient_exchange.hpp"
#include "xfmr/train/gradients.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/schedules.hpp"
#include "xfmr/train/step_result.hpp"

namespace xfmr {

struct TrainerOptions {
  // The optimisation.
  int grad_accum = 1;            // micro-batches per step
  double clip = 0.0;             // global gradient-norm clip (0: measure only)
  double label_smoothing = 0.0;  // of the cross-entropy
  LrSchedule schedule{};         // learning rate by step (constant 1e-3 unless given)
  std::uint64_t data_seed = 0;   // seeds data_rng()
  // How a batch is split: over the CPU's threads and over processes (gradient_exchange.hpp).
  SplitOptions split{};
  // A GPU backend's step replayed as CUDA graphs (for steps of one shape).
  bool graph_steps = true;
};

// One (micro-)batch: `sequences` sequences and their targets, laid out by
// sequence (targets.size() must be a multiple of sequences).
struct BatchTargets {
  int sequences = 0;
  std::span<const std::int32_t> targets;
};

template <class Model, class Backend, class Optimizer = AdamW<Backend>>
class Trainer {
  static_assert(TrainableModel<Model>, "Trainer: the model must provide visit(f), for_each_dropout(f) and "
                                       "set_training(bool) (models/model.hpp's TrainableModel)");

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Factory = typename DataParallel<Model, Backend>::Factory;

  // make_replica builds a model of model's type and shapes for the CPU's
  // shards (its weights are copied from model before every use); it may be
  // empty with one shard.
  Trainer(Model& model, Backend& be, Optimizer& opt, TrainerOptions opts, Factory make_replica = {})
      : model_(model), be_(be), opt_(opt), opts_(opts), exchange_(model, be, opt, opts.split),
        dp_(model, be, std::move(make_replica), opts.split.shards), data_rng_(opts.data_seed) {
    require(opts.grad_accum >= 1, "Trainer: grad_accum ", opts.grad_accum, " must be at least 1");
    // The master weights in memory as float32, and the gradients allocated,
    // before any parallel work touches them: a model loaded to decode holds
    // neither (core/tensor.hpp).
    model.visit([](std::string_view, auto& value, auto& grad) {
      value.data();
      grad.data();
    });
    require(opts.clip >= 0.0, "Trainer: clip ", opts.clip, " must not be negative");
    if (exchange_.distributed()) dp_.set_first_stream(exchange_.first_stream(dp_.shards()));
    for (int r = 0; r < dp_.shards(); ++r) {
      shard_loss_.emplace_back(opts.label_smoothing);
      if (opts.label_smoothing != 0.0) eval_loss_.emplace_back(0.0);
    }
  }

  // One optimisation step (see the top of this file). next_batch(micro)
  // fills the caller's buffers and returns their BatchTargets;
  // forward(shard, model, backend) returns the logits of the shard's
  // sequences (backend memory, one row per target of the shard) or HeadRows.
  template <class NextBatch, class Forward>
  StepResult step(NextBatch&& next_batch, Forward&& forward) {
    StepResult r{step_ + 1, opts_.schedule.at(step_), 0.0, 0.0};
    auto body = [&] {
      zero_grad(model_);
      for (int micro = 0; micro < opts_.grad_accum; ++micro)
        r.loss += accumulate(next_batch(micro), forward) / opts_.grad_accum;
      if (exchange_.distributed()) {
        r.loss = exchange_.sum(r.loss);
        if (std::isfinite(r.loss)) exchange_.sum_gradients();
      }
      check_loss(r.loss, r.step);
      r.grad_norm = checked_norm(r.step);
      opt_.step(be_, r.lr);
      exchange_.after_step();
    };
    // Block recompute allocates nothing within a step now (its saved buffers
    // change hands), but its graph replay has not yet run on a GPU
    // (test_cuda_parity's graph_steps_train_bit_for_bit_like_eager): until
    // it has, such a step runs directly.
    bool graphs = opts_.graph_steps && !exchange_.distributed();
    if constexpr (requires { model_.recompute(); }) graphs = graphs && model_.recompute() != Recompute::block;
    if (graphs) run_step(be_, "train", body);
    else body();
    ++step_;
    if (first_loss_ < 0) first_loss_ = r.loss;
    r.diverging = !warned_ && first_loss_ > 0 && r.loss > kDivergence * first_loss_;
    r.first_loss = first_loss_;
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
    if (batch.sequences > 0 || !exchange_.distributed()) sum = evaluate_here(batch, forward);
    if (exchange_.distributed()) {
      double parts[2] = {sum.total, double(sum.counted)};
      exchange_.sum(std::span<double>(parts));
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

  // What resumes the run besides the parameters and the optimizer's state.
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

  // Writes a checkpoint of the run into `dir` (io/checkpoint.hpp: replaced
  // atomically; a directory that is not a checkpoint is refused), with
  // `metadata` beside the parameters. Every rank calls it; rank 0 writes.
  // `attached`: files the checkpoint carries (a language model's tokenizer:
  // ModelTokenizer::attached_files()), so that it stands alone.
  void save(const std::filesystem::path& dir, const Metadata& metadata = {}, std::span<const AttachedFile> attached = {}) {
    SafeTensorsWriter model_file, optimizer_file;
    add_parameters(model_file, model_);
    add_optimizer_state(optimizer_file, opt_);  // gathers every rank's part under ZeRO-1
    if (exchange_.distributed() && !opts_.split.group->root()) return;
    for (const auto& [key, value] : metadata) model_file.set_metadata(key, value);
    write_checkpoint(dir, model_file, optimizer_file, state(), attached);
  }
  // Continues the run save() wrote into `dir`: its parameters, optimizer
  // state and trainer state, into this Trainer's model and optimizer (built
  // as the saving run's were). Returns the checkpoint's metadata. `total`
  // > 0: the steps the run plans, which a checkpoint must not be past.
  Metadata resume(const std::filesystem::path& dir, long total = 0) {
    const TrainerState st = read_trainer_state(dir);
    require(total <= 0 || st.step <= total, dir.string(), ": the checkpoint is at step ", st.step,
            "; the run ends at step ", total);
    const SafeTensors model_file = SafeTensors::load(dir / kModelFile);
    const std::string quantised = quantised_weights(model_file.metadata());
    require(quantised.empty(), dir.string(), ": holds ", quantised,
            " weights for decoding; training resumes from the float32 checkpoint they were made from");
    load_parameters(model_, model_file);
    load_optimizer_state(opt_, SafeTensors::load(dir / kOptimizerFile));
    restore(st);
    return model_file.metadata();
  }

 private:
  std::size_t per_sequence(const BatchTargets& batch) const {
    require(batch.sequences >= 1 && !batch.targets.empty() && batch.targets.size() % std::size_t(batch.sequences) == 0,
            "Trainer: a batch of ", batch.sequences, " sequences has ", batch.targets.size(),
            " targets; need a positive multiple of the sequences");
    return batch.targets.size() / std::size_t(batch.sequences);
  }
  static int classes(std::span<const A> logits, std::span<const std::int32_t> targets) {
    require(!logits.empty() && logits.size() % targets.size() == 0, "Trainer: ", logits.size(), " logits for ",
            targets.size(), " targets; need one row of logits per target");
    return int(logits.size() / targets.size());
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
        auto& ce = eval_loss_.empty() ? shard_loss_[std::size_t(s.index)] : eval_loss_[std::size_t(s.index)];
        return shard_loss(s, m, b, forward, ce, targets, 0.0) * double(c);
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
    const bool none_here = exchange_.distributed() && batch.sequences == 0 && batch.targets.empty();
    const std::size_t per = none_here ? 0 : per_sequence(batch);
    const long local = counted_targets(batch.targets);
    const long counted = long(exchange_.sum(std::int64_t(local)));
    const double loss = counted == 0 || local == 0 ? 0.0 : accumulate_here(batch, per, counted, forward);
    exchange_.take_root_dropout_calls();
    return loss;
  }

  // accumulate()'s forward and backward passes over this rank's shards.
  template <class Forward>
  double accumulate_here(const BatchTargets& batch, std::size_t per, long counted, Forward& forward) {
    const double loss = dp_.backward(batch.sequences, [&](const Shard& s, Model& m, Backend& b) {
      const auto targets = batch.targets.subspan(std::size_t(s.begin) * per, std::size_t(s.size()) * per);
      const long c = counted_targets(targets);
      if (c == 0) return 0.0;
      const double share = double(c) / double(counted);
      const double l = shard_loss(s, m, b, forward, shard_loss_[std::size_t(s.index)], targets,
                                  share / opts_.grad_accum);
      return std::isfinite(l) ? l * share : l;  // a loss that is not finite is reported by check_loss
    });
    return loss;
  }

  // A shard's loss: the mean over its counted targets, and (scale != 0) the
  // gradients of scale * that loss. Not finite: the shard's
  // logits_overflowed_ says whether its logits were not (the gradient over
  // them is not finite where they were not), and no backward runs.
  template <class Forward>
  double shard_loss(const Shard& s, Model& m, Backend& b, Forward& forward, CrossEntropyLoss<Backend>& ce,
                    std::span<const std::int32_t> targets, double scale) {
    const auto out = forward(s, m, b);
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(out)>, HeadRows>) {
      const HeadLoss h = m.head_loss(b, ce, targets, scale);
      logits_overflowed_[std::size_t(s.index)] = h.logits_overflowed;
      return h.loss;
    } else {
      const std::span<const A> logits = out;
      const std::span<A> dlogits(const_cast<A*>(logits.data()), logits.size());  // the model's own, written over
      const double l = ce.forward_backward(b, logits, targets, classes(logits, targets), dlogits, scale);
      logits_overflowed_[std::size_t(s.index)] =
          !std::isfinite(l) && !std::isfinite(b.sum_squares(dlogits.size(), dlogits.data()));
      if (std::isfinite(l) && scale != 0.0) m.backward(b, std::span<const A>(dlogits));
      return l;
    }
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
                                : std::string("every parameter and logit is finite (or a logit fell to -inf): the "
                                              "loss itself overflowed"),
                   "; try a lower learning rate or gradient clipping");
    }
  }

  // The global gradient norm, clipped to opts_.clip when set (with ZeRO-1,
  // from every rank's parts); a gradient that is not finite is named.
  double checked_norm(long step) {
    try {
      return exchange_.clip_gradients(opts_.clip);
    } catch (const Error& e) {
      detail::fail("at step ", step, ": ", e.what());
    }
  }

  Model& model_;
  Backend& be_;
  Optimizer& opt_;
  TrainerOptions opts_;
  GradientExchange<Model, Backend, Optimizer> exchange_;
  DataParallel<Model, Backend> dp_;
  Rng data_rng_;
  long step_ = 0;
  double first_loss_ = -1.0;
  bool warned_ = false;
  std::vector<char> logits_overflowed_ = std::vector<char>(std::size_t(dp_.shards()), 0);  // a shard's, at a non-finite loss
  std::deque<CrossEntropyLoss<Backend>> shard_loss_;  // one a shard (they do not move)
  std::deque<CrossEntropyLoss<Backend>> eval_loss_;   // without smoothing, when training smooths
};

}  // namespace xfmr
