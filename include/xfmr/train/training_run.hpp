// training_run.hpp: TrainingRun, the run around a model's Trainer that
// every training front end configures and calls (xfmr-charlm, xfmr-lm,
// xfmr-classify, xfmr-translate, xfmr.Trainer, and a program of one's
// own): AdamW (one of the named recipes below, or one's own numbers), the
// Trainer, a resume with its data's checks, and the loop (train/training_loop.hpp: evaluations, checkpoints
// with their metadata, the log, signals).
//
//   Be be = xfmr::make_backend<Be>("cpu", "bf16");
//   xfmr::TrainingRun<xfmr::LanguageModel<Be>, Be> run(*model, be,
//       {.optimizer = xfmr::adamw_recipe(xfmr::AdamWRecipe::language_model, 0.1),
//        .trainer = {.clip = 1.0, .schedule = ...}, .loop = {.total = 1000, .eval_every = 100}});
//   if (resuming) run.resume(dir, {{"data_hash", hash, "--data is not what the checkpoint trained on"}});
//   const auto o = run.run(group,
//       [&](long) { return run.trainer().step(next_batch, forward); },
//       [&](const xfmr::StepResult& r) { return xfmr::Evaluation{...}; },
//       [&] { run.save(out, metadata, tokenizer_files); });
//   run.finish(out);  // a run a signal stopped ends here, with an Error saying how to resume
//
// What a step trains on and how a model is evaluated stay the front end's
// (they depend on the kind of model and its data); how a run is built,
// resumed, looped and saved is here, once. A run whose plan has no steps
// (loop.total 0: xfmr.Trainer, stepped by its caller) has no loop and
// leaves the process's signals alone.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xfmr/core/distributed.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/core/function_ref.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"
#include "xfmr/train/training_loop.hpp"

namespace xfmr {

// The AdamW recipes xfmr's front ends train with, by name: the betas and
// epsilon, set here alone (the weight decay is each run's setting).
//   standard:        (0.9, 0.999, 1e-8), AdamWOptions' defaults: the character
//                    models (xfmr-charlm) and the classifiers (xfmr-classify)
//   language_model:  (0.9, 0.95, 1e-8), as GPT-2, Llama and nanoGPT train:
//                    xfmr-lm and xfmr.Trainer
//   translator:      (0.9, 0.98, 1e-9), the Transformer paper's: xfmr-translate
enum class AdamWRecipe { standard, language_model, translator };
inline AdamWOptions adamw_recipe(AdamWRecipe recipe, double weight_decay) {
  AdamWOptions o;
  o.weight_decay = weight_decay;
  if (recipe == AdamWRecipe::language_model) o.beta2 = 0.95;
  if (recipe == AdamWRecipe::translator) o.beta2 = 0.98, o.eps = 1e-9;
  return o;
}

struct TrainingRunOptions {
  AdamWOptions optimizer{};
  TrainerOptions trainer{};
  LoopPlan loop{};  // total 0: no loop (the caller steps the Trainer itself)
};

// A value a resumed checkpoint's metadata must hold (its data's
// fingerprint, say): `message` is the Error when it does not.
struct ResumeCheck {
  std::string key, value, message;
};
// The checks against the checkpoint in `dir` (TrainingRun::resume makes
// them; a front end whose data would fail another way first makes them
// before it reads the data).
inline void check_resume(const std::filesystem::path& dir, std::span<const ResumeCheck> checks) {
  if (checks.empty()) return;
  const Metadata saved = read_checkpoint_metadata(dir);
  for (const ResumeCheck& c : checks) require(metadata_value(saved, c.key, dir.string()) == c.value, c.message);
}
inline void check_resume(const std::filesystem::path& dir, std::initializer_list<ResumeCheck> checks) {
  check_resume(dir, std::span<const ResumeCheck>(checks.begin(), checks.size()));
}

// A LoRA run's frozen base (models/lora.hpp: the model whose adapters
// train), held while `copies` is: through the backend's copies of its
// weights when the backend keeps them in a precision of its own
// (make_frozen_base_backend's bf16, int8 or q4: a base loaded from a file is
// then never held in float32); in fp32 its matrices are read into memory
// now (a deferred one), as a Trainer of every weight would.
template <class Backend, class Base>
void hold_frozen_base(Backend& be, Base& base, std::optional<WeightCopies<Backend>>& copies) {
  if (precision_of(be) != "fp32") {
    copies.emplace(be, base, WeightCopyOptions{.panels = false});
    return;
  }
  base.visit([](std::string_view, auto& value, auto&) {
    if constexpr (requires { value.deferred(); })
      if (value.deferred()) (void)value.data();
  });
}

template <class Model, class Backend>
class TrainingRun {
 public:
  using Factory = typename Trainer<Model, Backend>::Factory;

  // make_replica: the CPU's shards' model (Trainer's); empty with one shard.
  TrainingRun(Model& model, Backend& be, const TrainingRunOptions& o, Factory make_replica = {})
      : model_(model),
        be_(be),
        opt_(model, o.optimizer),
        trainer_(model, be_, opt_, o.trainer, std::move(make_replica)),
        plan_(o.loop) {
    if (plan_.total > 0) loop_.emplace(plan_);
  }
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // A LoRA run's frozen base, held for the run's life (xfmr::hold_frozen_base).
  template <class Base>
  void hold_frozen_base(Base& base) {
    xfmr::hold_frozen_base(be_, base, copies_);
  }

  Model& model() { return model_; }
  Backend& backend() { return be_; }
  Trainer<Model, Backend>& trainer() { return trainer_; }
  long steps() const { return trainer_.steps(); }

  // Continues the checkpoint in `dir` (Trainer::resume, at most the plan's
  // steps), once each check's key in its metadata holds the check's value;
  // the metadata.
  Metadata resume(const std::filesystem::path& dir, std::span<const ResumeCheck> checks = {}) {
    check_resume(dir, checks);
    return trainer_.resume(dir, plan_.total);
  }
  Metadata resume(const std::filesystem::path& dir, std::initializer_list<ResumeCheck> checks) {
    return resume(dir, std::span<const ResumeCheck>(checks.begin(), checks.size()));
  }

  // A checkpoint of the run (Trainer::save): every rank calls it, rank 0 writes.
  void save(const std::filesystem::path& dir, const Metadata& metadata = {},
            std::span<const AttachedFile> attached = {}) {
    trainer_.save(dir, metadata, attached);
  }

  // The loop from the Trainer's step to the plan's stop (TrainingLoop::run).
  TrainingOutcome run(ProcessGroup& group, FunctionRef<StepResult(long)> step,
                      FunctionRef<Evaluation(const StepResult&)> evaluate, FunctionRef<void()> save) {
    return loop().run(trainer_.steps(), group, step, evaluate, save);
  }
  // Inside an evaluation, at a batch boundary: whether a signal stops the run.
  bool interrupted(ProcessGroup& group) { return loop().interrupted(group); }
  bool stopped() const { return loop_ && loop_->stopped(); }
  // After the front end has written its report: a run a signal stopped ends
  // with an Error saying how to resume from `out`.
  void finish(const std::string& out) const {
    if (loop_) loop_->finish(trainer_.steps(), out);
  }

 private:
  TrainingLoop& loop() {
    require(loop_.has_value(), "the training run has no plan of steps (TrainingRunOptions::loop.total)");
    return *loop_;
  }

  Model& model_;
  Backend& be_;
  AdamW<Backend> opt_;
  Trainer<Model, Backend> trainer_;
  LoopPlan plan_;
  std::optional<TrainingLoop> loop_;
  std::optional<WeightCopies<Backend>> copies_;  // hold_frozen_base's
};

}  // namespace xfmr
