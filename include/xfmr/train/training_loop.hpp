// training_loop.hpp: the loop every training program runs around its
// Trainer (xfmr-charlm, xfmr-lm, xfmr-classify, xfmr-translate, and a
// program of one's own): steps until the plan's end or --stop-after, an
// evaluation (and a checkpoint) every eval_every steps and at the stop, the
// CSV log and the progress line of every step, a warning when the loss
// diverges, and SIGINT / SIGTERM taken at a step boundary (the ranks agree
// on it), after which the run is saved as at a stop, without an
// evaluation. An evaluation's own loop asks interrupted(group) at each of
// its batches and returns early when it says so: a signal that comes
// during an evaluation stops the run there, and that evaluation's numbers
// are not kept.
//
//   TrainingLoop loop({.total = steps, .eval_every = 100, .tokens_per_step = B * T, .log_csv = "log.csv"});
//   const TrainingOutcome o = loop.run(
//       trainer.steps(), group,
//       [&](long step) { return trainer.step(next_batch, forward); },   // step: 0-based
//       [&](const StepResult& r) { return Evaluation{train, val, ": train loss ..."}; },
//       [&] { trainer.save(dir, metadata); });
//   write_html_report(..., o.batch_losses, o.evals);
//   loop.finish(trainer.steps(), dir);  // a run stopped by a signal ends here with an Error
//
// What a step trains on (an epoch's order, a rank's rows) is the step
// callback's; the loop is the same for every model. Compiled once
// (src/training_run.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "xfmr/core/function_ref.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/train/report.hpp"
#include "xfmr/train/stop_signals.hpp"
#include "xfmr/train/step_result.hpp"

namespace xfmr {

struct LoopPlan {
  long total = 0;        // the plan's steps (the schedule spans them)
  long stop_after = 0;   // stop at this step, evaluated and saved, to resume later (0: at total)
  long eval_every = 1;   // evaluate, then save, every this many steps (and at the stop)
  long tokens_per_step = 0;  // for the progress line's tokens/s
  std::string log_csv{};  // the CSV log (none when empty)
};

// What an evaluation found: the losses for the curves and the log (val < 0:
// none), and the rest of the line printed after "step N".
struct Evaluation {
  double train = -1, val = -1;
  std::string line;
};

struct TrainingOutcome {
  long start = 0, stop = 0;  // the steps the run began at and ended at
  std::vector<std::pair<long, double>> batch_losses;  // (step, loss), 1-based steps
  std::vector<LossPoint> evals;
  Evaluation last;           // the last evaluation (losses -1 when none ran)
  double wall_s = 0, tokens_per_s = 0;
};

class TrainingLoop {
 public:
  explicit TrainingLoop(LoopPlan plan) : plan_(std::move(plan)) {}

  // From step `start` (the Trainer's, after a resume) to the stop: step(k)
  // runs step k (0-based) and returns the Trainer's result; evaluate and
  // save run at each evaluation. The CSV log is written at the end.
  TrainingOutcome run(long start, ProcessGroup& group, FunctionRef<StepResult(long)> step,
                      FunctionRef<Evaluation(const StepResult&)> evaluate, FunctionRef<void()> save);
  // Whether a signal stopped the run.
  bool stopped() const { return signals_.stopped(); }
  // Inside an evaluation (or any long work of the evaluate callback), at a
  // batch boundary: whether any rank has caught a signal, when the run
  // stops there. Every rank must ask as often as the others (it is a
  // collective under mpirun).
  bool interrupted(ProcessGroup& group) { return signals_.requested(group); }
  // After the program has written what it writes: a run a signal stopped
  // ends with an xfmr::Error saying where and how to resume from `out`.
  void finish(long step, const std::string& out) const { signals_.finish(step, out); }

 private:
  LoopPlan plan_;
  StopSignals signals_;  // from the loop's construction on, SIGINT and SIGTERM stop at a step boundary
};

// Epochs whose order (or batches) is drawn from the Trainer's data
// generator at each epoch's start, so that a run resumed mid-epoch draws
// the same order again: state() is where the current epoch's draw began
// (saved in a checkpoint's metadata as "epoch_rng"); at an epoch's end the
// generator is where the next one's begins. An epoch's draws are all made
// at its start: its steps draw nothing more from the generator.
class Epochs {
 public:
  // A run at step `start` (the Trainer's, after any resume) whose
  // generator is `rng`; mid-epoch, the state the checkpoint `checkpoint`
  // saved (its metadata `md`).
  Epochs(long steps_per_epoch, long start, const Rng& rng, const Metadata* md = nullptr,
         const std::string& checkpoint = "")
      : per_epoch_(steps_per_epoch), start_(start), state_(rng.state()) {
    if (md && start % per_epoch_ != 0)
      state_ = parse_integer<std::uint64_t>(metadata_value(*md, "epoch_rng", checkpoint), checkpoint + ": epoch_rng");
  }
  // Before step `step`: true when an epoch's order is to be drawn from
  // `rng` now (a new epoch, or the run's first step), `rng` set to where it begins.
  bool draw_at(long step, Rng& rng) {
    if (step % per_epoch_ == 0 && step != start_) state_ = rng.state();
    if (step % per_epoch_ != 0 && step != start_) return false;
    rng.set_state(state_);
    return true;
  }
  long epoch_of(long step) const { return step / per_epoch_; }  // 0-based, of a 0-based step
  std::uint64_t state() const { return state_; }

 private:
  long per_epoch_, start_;
  std::uint64_t state_;
};

}  // namespace xfmr
