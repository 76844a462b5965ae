// TrainingLoop and Epochs (train/training_loop.hpp): which steps run, when
// evaluations and saves happen, --stop-after, and an epoch order that a run
// resumed mid-epoch draws again.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "xfmr/core/rng.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/train/training_loop.hpp"

BOOST_AUTO_TEST_SUITE(test_training_loop)

using namespace xfmr;

namespace {

struct Run {
  std::vector<long> steps, evals, saves;
  TrainingOutcome outcome;
};

LoopPlan plan_of(long total, long stop_after, long eval_every) {
  LoopPlan p;
  p.total = total, p.stop_after = stop_after, p.eval_every = eval_every;
  return p;
}

Run run_loop(long start, const LoopPlan& plan) {
  Run r;
  TrainingLoop loop(plan);
  r.outcome = loop.run(
      start, ProcessGroup::world(),
      [&](long k) {
        r.steps.push_back(k);
        return StepResult{.step = k + 1, .lr = 0.1, .loss = 1.0 / double(k + 1)};
      },
      [&](const StepResult& s) {
        r.evals.push_back(s.step);
        return Evaluation{s.loss, 2 * s.loss, ": ok"};
      },
      [&] { r.saves.push_back(r.steps.empty() ? start : r.steps.back() + 1); });
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(steps_evaluations_and_saves) {
  const Run r = run_loop(0, plan_of(10, 0, 4));
  BOOST_TEST(r.steps == (std::vector<long>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), boost::test_tools::per_element());
  BOOST_TEST(r.evals == (std::vector<long>{4, 8, 10}), boost::test_tools::per_element());  // and at the end
  BOOST_TEST(r.saves == r.evals, boost::test_tools::per_element());
  BOOST_TEST(r.outcome.start == 0);
  BOOST_TEST(r.outcome.stop == 10);
  BOOST_TEST(r.outcome.batch_losses.size() == 10u);
  BOOST_TEST(r.outcome.evals.size() == 3u);
  BOOST_TEST(r.outcome.last.train == 0.1);
  BOOST_TEST(r.outcome.last.val == 0.2);
}

BOOST_AUTO_TEST_CASE(stop_after_and_resume) {
  const Run first = run_loop(0, plan_of(10, 6, 4));
  BOOST_TEST(first.outcome.stop == 6);
  BOOST_TEST(first.evals == (std::vector<long>{4, 6}), boost::test_tools::per_element());  // evaluated and saved at the stop
  const Run rest = run_loop(6, plan_of(10, 0, 4));
  BOOST_TEST(rest.steps == (std::vector<long>{6, 7, 8, 9}), boost::test_tools::per_element());
  BOOST_TEST(rest.evals == (std::vector<long>{8, 10}), boost::test_tools::per_element());
  const Run done = run_loop(10, plan_of(10, 0, 4));  // nothing to train
  BOOST_TEST(done.steps.empty());
  BOOST_TEST(done.saves.empty());
}

// An epoch's order is drawn at its start; a run resumed mid-epoch from the
// state a checkpoint saved ("epoch_rng") draws the same one again.
BOOST_AUTO_TEST_CASE(epochs_resume_mid_epoch) {
  const long per_epoch = 3, total = 9, stop = 4;  // stop inside the second epoch
  auto draw = [](Rng& rng) { return rng.below(1000); };
  std::vector<std::uint64_t> whole, resumed;
  Metadata md;
  {
    Rng rng(7);
    Epochs e(per_epoch, 0, rng);
    std::uint64_t order = 0;
    for (long k = 0; k < total; ++k) {
      if (e.draw_at(k, rng)) order = draw(rng);
      whole.push_back(order);
      if (k + 1 == stop) md["epoch_rng"] = std::to_string(e.state());
    }
  }
  {
    Rng rng(7);  // the first run up to the stop
    Epochs e(per_epoch, 0, rng);
    std::uint64_t order = 0;
    for (long k = 0; k < stop; ++k) {
      if (e.draw_at(k, rng)) order = draw(rng);
      resumed.push_back(order);
    }
    Rng again(rng.state());  // the generator as a checkpoint restores it
    Epochs r(per_epoch, stop, again, &md, "ck");
    for (long k = stop; k < total; ++k) {
      if (r.draw_at(k, again)) order = draw(again);
      resumed.push_back(order);
    }
  }
  BOOST_TEST(whole == resumed, boost::test_tools::per_element());
  BOOST_TEST(whole[0] != whole[3]);  // a new epoch draws a new order
}

BOOST_AUTO_TEST_SUITE_END()
