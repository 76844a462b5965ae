// stop_signals.hpp: StopSignals, training that stops at a step boundary on
// SIGINT or SIGTERM, so that a run interrupted by the user or a scheduler
// keeps its checkpoint (every program's training loop; README, "Reliability").
#pragma once

#include <signal.h>

#include <csignal>
#include <cstdint>
#include <span>
#include <string>

#include "xfmr/core/error.hpp"
#include "xfmr/core/distributed.hpp"

namespace xfmr {

// SIGINT and SIGTERM while training: the first asks the run to stop at the
// next step boundary, where the caller saves its checkpoint (and whatever
// else it writes), then ends with an xfmr::Error (finish()); the second
// ends the process at once (the handler is installed with SA_RESETHAND).
// Under mpirun the ranks agree each step (one sum of an integer), so that
// they stop at the same step whichever rank the signal reached first.
//
//   xfmr::StopSignals signals;
//   while (trainer.steps() < steps) {
//     trainer.step(next_batch, forward);
//     if (signals.requested(group)) break;
//   }
//   signals.release();           // signals act as before again
//   trainer.save(dir, metadata);
//   signals.finish(trainer.steps(), dir);  // "interrupted (SIGINT) after step N; ... --resume dir"
class StopSignals {
 public:
  StopSignals() {
    caught_ = 0;
    struct sigaction sa {};
    sa.sa_handler = [](int sig) { caught_ = sig; };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() { release(); }
  // After the training loop: the signals act as before again (a signal
  // caught since the last step boundary is raised again now).
  void release() {
    if (released_) return;
    released_ = true;
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    if (caught_ != 0 && !stopped_) ::raise(caught_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // At a step boundary: whether any rank has caught a signal.
  bool requested(ProcessGroup& group) {
    std::int64_t any = caught_ != 0 ? 1 : 0;
    if (group.size() > 1) group.all_reduce_sum(std::span<std::int64_t>(&any, 1));
    stopped_ = stopped_ || any > 0;
    return stopped_;
  }
  bool stopped() const { return stopped_; }
  // After the program has saved what it saves: the run ends with an
  // xfmr::Error saying where it stopped and how to continue.
  void finish(long step, const std::string& out) const {
    if (!stopped_) return;
    const int sig = caught_;
    fail("interrupted", sig == SIGINT ? " (SIGINT)" : sig == SIGTERM ? " (SIGTERM)" : " (on another rank)",
                 " after step ", step,
                 out.empty() ? std::string("; no --out, so no checkpoint")
                             : "; the checkpoint " + out + " continues it: --resume " + out);
  }

 private:
  static inline volatile std::sig_atomic_t caught_ = 0;
  struct sigaction old_int_ {}, old_term_ {};
  bool stopped_ = false, released_ = false;
};

}  // namespace xfmr
