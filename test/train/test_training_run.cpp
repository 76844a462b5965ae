// TrainingRun (train/training_run.hpp): each recipe's numbers are the
// ones the programs trained with before the run moved into the library;
// a run gives the weights and optimizer state, bit for bit, of AdamW and a
// Trainer wired by hand with those numbers, through its loop, its saves
// and a resume; a resume whose data differs is refused with the front
// end's message; a run without a plan has no loop.
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/temp_dir.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/train/training_run.hpp"

BOOST_AUTO_TEST_SUITE(test_training_run)

using namespace xfmr;
using namespace xfmr::test;
using Be = CpuBackend<float>;
using Lm = LanguageModel<Be>;

namespace {

constexpr int kVocab = 23, kBatch = 4, kT = 8;

std::unique_ptr<Lm> tiny_model() {
  return make_language_model<Be>("tiny", kVocab, 5, {.dropout = 0.1, .attention_dropout = 0.1});
}

TrainerOptions trainer_options(long steps) {
  return {.grad_accum = 2,
          .clip = 1.0,
          .schedule = LrSchedule::parse("cosine", 3e-3, steps),
          .data_seed = 42,
          .split = {.shards = 1}};
}

// A step of random windows drawn from the Trainer's data generator, as the
// programs draw theirs.
template <class T>
StepResult step(T& trainer) {
  std::vector<std::int32_t> ids(kBatch * kT), targets(ids.size());
  return trainer.step(
      [&](int) {
        for (std::size_t i = 0; i < ids.size(); ++i) {
          ids[i] = std::int32_t(trainer.data_rng().below(kVocab));
          targets[i] = std::int32_t(trainer.data_rng().below(kVocab));
        }
        return BatchTargets{kBatch, targets};
      },
      [&](const Shard& s, Lm& m, Be& b) {
        return m.forward(b, std::span<const std::int32_t>(ids).subspan(std::size_t(s.begin) * kT, std::size_t(s.size()) * kT),
                         Shape{s.size(), kT});
      });
}

std::vector<float> parameters(Lm& model) {
  std::vector<float> out;
  model.visit([&](std::string_view, auto& value, auto&) { out.insert(out.end(), value.data(), value.data() + value.size()); });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_recipes_are_the_programs_numbers) {
  // xfmr-charlm and xfmr-classify: (0.9, 0.999, 1e-8); xfmr-lm and
  // xfmr.Trainer: (0.9, 0.95, 1e-8); xfmr-translate: (0.9, 0.98, 1e-9).
  const AdamWOptions s = adamw_recipe(AdamWRecipe::standard, 0.01), l = adamw_recipe(AdamWRecipe::language_model, 0.1),
                     t = adamw_recipe(AdamWRecipe::translator, 0.0);
  BOOST_TEST((s.beta1 == 0.9 && s.beta2 == 0.999 && s.eps == 1e-8 && s.weight_decay == 0.01));
  BOOST_TEST((l.beta1 == 0.9 && l.beta2 == 0.95 && l.eps == 1e-8 && l.weight_decay == 0.1));
  BOOST_TEST((t.beta1 == 0.9 && t.beta2 == 0.98 && t.eps == 1e-9 && t.weight_decay == 0.0));
  const AdamWOptions defaults{};
  BOOST_TEST((s.beta1 == defaults.beta1 && s.beta2 == defaults.beta2 && s.eps == defaults.eps));
}

BOOST_AUTO_TEST_CASE(a_run_trains_what_adamw_and_a_trainer_wired_by_hand_train) {
  constexpr long kSteps = 6;
  for (const AdamWRecipe recipe : {AdamWRecipe::standard, AdamWRecipe::language_model, AdamWRecipe::translator}) {
    const AdamWOptions adamw = adamw_recipe(recipe, 0.05);
    // By hand, as the programs were written before the run.
    auto by_hand = tiny_model();
    Be be;
    AdamW<Be> opt(*by_hand, adamw);
    Trainer<Lm, Be> trainer(*by_hand, be, opt, trainer_options(kSteps));
    for (long k = 0; k < kSteps; ++k) (void)step(trainer);

    // Through the run's loop, saved at its evaluations and stopped half way,
    // then resumed by a second run.
    const TempDir dir("training_run");
    const auto ckpt = dir.path / "ckpt";
    auto first = tiny_model();
    {
      Be be1;
      TrainingRun<Lm, Be> run(*first, be1,
                              {.optimizer = adamw,
                               .trainer = trainer_options(kSteps),
                               .loop = {.total = kSteps, .stop_after = kSteps / 2, .eval_every = 2}});
      const TrainingOutcome o = run.run(
          ProcessGroup::world(), [&](long) { return step(run.trainer()); },
          [&](const StepResult& r) { return Evaluation{r.loss, -1, ""}; },
          [&] { run.save(ckpt, {{"data_hash", "abc"}}); });
      BOOST_TEST(o.stop == kSteps / 2);
      BOOST_TEST(run.steps() == kSteps / 2);
    }
    auto second = tiny_model();
    Be be2;
    TrainingRun<Lm, Be> resumed(*second, be2,
                                {.optimizer = adamw,
                                 .trainer = trainer_options(kSteps),
                                 .loop = {.total = kSteps, .eval_every = 2}});
    BOOST_TEST(error_of([&] { (void)resumed.resume(ckpt, {{"data_hash", "xyz", "--data d.txt is not the text"}}); }) ==
               "--data d.txt is not the text");
    (void)resumed.resume(ckpt, {{"data_hash", "abc", "unexpected"}});
    BOOST_TEST(resumed.steps() == kSteps / 2);
    (void)resumed.run(
        ProcessGroup::world(), [&](long) { return step(resumed.trainer()); },
        [&](const StepResult& r) { return Evaluation{r.loss, -1, ""}; }, [] {});
    BOOST_TEST(resumed.steps() == kSteps);
    const std::vector<float> want = parameters(*by_hand), got = parameters(*second);
    BOOST_TEST(got == want, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(a_run_without_a_plan_is_stepped_by_its_caller) {
  auto model = tiny_model();
  Be be;
  TrainingRun<Lm, Be> run(*model, be, {.trainer = trainer_options(4)});
  (void)step(run.trainer());
  BOOST_TEST(run.steps() == 1);
  BOOST_TEST(!run.stopped());
  BOOST_TEST(error_of([&] { (void)run.interrupted(ProcessGroup::world()); }).find("no plan of steps") !=
             std::string::npos);
  run.finish("");  // nothing to end
}

BOOST_AUTO_TEST_SUITE_END()
