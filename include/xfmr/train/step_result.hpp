// step_result.hpp: what Trainer::step returns (trainer.hpp), apart so that
// what only reads it (training_loop.hpp) needs no model or backend.
#pragma once

namespace xfmr {

// A step's outcome: the step number (1-based), its learning rate, the mean
// loss over its micro-batches and the gradient norm before clipping.
struct StepResult {
  long step = 0;
  double lr = 0.0, loss = 0.0, grad_norm = 0.0;
  // True at the first step whose loss exceeds kDivergence times the loss of
  // this run's first step: training is likely diverging (a learning rate
  // too high); the caller warns.
  bool diverging = false;
  double first_loss = 0.0;  // the loss of this run's first step (what diverging compares with)
};
inline constexpr double kDivergence = 4.0;

}  // namespace xfmr
