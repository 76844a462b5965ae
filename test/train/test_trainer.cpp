#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/trainer.hpp"

BOOST_AUTO_TEST_SUITE(test_trainer)

using namespace xfmr;
using namespace xfmr::test;

namespace {
constexpr int V = 7, T = TinyPre::MAX_T;
using Lm = Decoder<TinyPre, Be>;
using ModelTrainer = Trainer<Lm, Be>;

// Batches of B sequences of ids and targets drawn from the trainer's data
// generator; every `pad_every`-th target is padding (kIgnoreIndex) when set.
struct Data {
  int B;
  int pad_every = 0;
  std::vector<std::int32_t> ids = std::vector<std::int32_t>(std::size_t(B) * T),
                            targets = std::vector<std::int32_t>(std::size_t(B) * T);
  BatchTargets next(Rng& rng) {
    for (auto& i : ids) i = std::int32_t(rng.below(V));
    for (std::size_t i = 0; i < targets.size(); ++i)
      targets[i] = pad_every && i % std::size_t(pad_every) == 1 ? kIgnoreIndex : std::int32_t(rng.below(V));
    return {B, targets};
  }
  auto forward() {
    return [this](const Shard& s, Lm& m, Be& b) {
      return m.forward(b, std::span<const std::int32_t>(ids).subspan(std::size_t(s.begin) * T, std::size_t(s.size()) * T),
                       Shape{s.size(), T});
    };
  }
  auto forward_to_head() {
    return [this](const Shard& s, Lm& m, Be& b) {
      return m.forward_to_head(
          b, std::span<const std::int32_t>(ids).subspan(std::size_t(s.begin) * T, std::size_t(s.size()) * T),
          Shape{s.size(), T});
    };
  }
};

Vec gradients(Lm& m) {
  Vec g;
  m.visit([&](std::string_view, auto&, auto& grad) { g.insert(g.end(), grad.begin(), grad.end()); });
  return g;
}

Vec weights(Lm& m) {
  Vec w;
  m.visit([&](std::string_view, auto& value, auto&) { w.insert(w.end(), value.begin(), value.end()); });
  return w;
}

std::unique_ptr<Lm> make_model(float dropout = 0.0f) {
  return std::make_unique<Lm>(V, 3, DecoderOptions{.dropout = dropout, .attention_dropout = dropout});
}

// `steps` steps of a trainer with these options over fresh batches; returns
// the weights after them and the step results.
struct Run {
  Vec weights;
  std::vector<StepResult> results;
};
Run train(TrainerOptions opts, int B, int steps, int pad_every = 0) {
  Be be;
  auto model = make_model();
  AdamW<Be> opt(*model);
  ModelTrainer trainer(*model, be, opt, opts, [] { return make_model(); });
  Data data{B, pad_every};
  Run run;
  for (int i = 0; i < steps; ++i)
    run.results.push_back(trainer.step([&](int) { return data.next(trainer.data_rng()); }, data.forward()));
  run.weights = weights(*model);
  return run;
}

double largest_difference(const Vec& a, const Vec& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}
}  // namespace

// One step of the Trainer (one shard) is the step written out by hand:
// forward, cross-entropy, backward, clipping, AdamW at the schedule's rate.
BOOST_AUTO_TEST_CASE(a_step_is_the_hand_written_step) {
  const TrainerOptions opts{.clip = 0.5, .schedule = LrSchedule::parse("cosine", 1e-2, 20), .data_seed = 9, .split = {.shards = 1}};
  const Run got = train(opts, 3, 4);

  Be be;
  auto model = make_model();
  AdamW<Be> opt(*model);
  Rng rng(9);
  Data data{3};
  CrossEntropyLoss<Be> ce;
  Vec dlogits;
  for (long step = 0; step < 4; ++step) {
    const BatchTargets batch = data.next(rng);
    zero_grad(*model);
    const double loss = ce.forward(be, model->forward(be, data.ids, Shape{3, T}), batch.targets, V);
    dlogits.resize(data.ids.size() * V);
    ce.backward(be, dlogits, 1.0);
    model->backward(be, std::span<const double>(dlogits));
    const double norm = clip_gradients(be, *model, 0.5);
    opt.step(be, opts.schedule.at(step));
    BOOST_TEST(got.results[std::size_t(step)].loss == loss);
    BOOST_TEST(got.results[std::size_t(step)].grad_norm == norm);
    BOOST_TEST(got.results[std::size_t(step)].step == step + 1);
    BOOST_TEST(got.results[std::size_t(step)].lr == opts.schedule.at(step));
  }
  BOOST_TEST(largest_difference(got.weights, weights(*model)) == 0.0);
}

// The head and the loss a block of rows at a time (forward_to_head, then
// head_loss) give the loss and every gradient of the whole batch's logits
// (forward, the loss, backward) to rounding: blocks of 5 of 18 rows, one
// block of padding alone, untied and tied heads (whose gradient each block
// adds to the embedding's). At scale 0 the loss alone, no gradient. In a
// Trainer, steps by blocks train the weights of steps by whole logits.
BOOST_AUTO_TEST_CASE(the_head_and_loss_by_blocks_give_the_whole_logits_loss_and_gradients) {
  Be be;
  for (const bool tied : {false, true}) {
    BOOST_TEST_CONTEXT("tied head " << tied) {
      Lm model(V, 3, {.tie_weights = tied, .head_block_rows = 5});
      BOOST_TEST(model.head_block_rows() == 5);
      Data data{3};
      Rng rng(11);
      data.next(rng);
      for (int r : {5, 6, 7, 8, 9, 13}) data.targets[std::size_t(r)] = kIgnoreIndex;
      CrossEntropyLoss<Be> ce;
      zero_grad(model);
      const double whole = ce.forward(be, model.forward(be, data.ids, Shape{3, T}), data.targets, V);
      Vec dlogits(data.ids.size() * V);
      ce.backward(be, dlogits, 0.7);
      model.backward(be, std::span<const double>(dlogits));
      const Vec expected = gradients(model);

      zero_grad(model);
      BOOST_TEST(model.forward_to_head(be, data.ids, Shape{3, T}).rows == 3 * T);
      const HeadLoss blocks = model.head_loss(be, ce, data.targets, 0.7);
      BOOST_TEST(std::abs(blocks.loss - whole) < 1e-12);
      BOOST_TEST(!blocks.logits_overflowed);
      const Vec got = gradients(model);
      BOOST_TEST(largest_difference(got, expected) < 1e-12);
      BOOST_TEST(largest_difference(got, Vec(got.size(), 0.0)) > 1e-3);  // the check can fail

      zero_grad(model);
      model.forward_to_head(be, data.ids, Shape{3, T});
      BOOST_TEST(std::abs(model.head_loss(be, ce, data.targets, 0.0).loss - whole) < 1e-12);
      BOOST_TEST(largest_difference(gradients(model), Vec(got.size(), 0.0)) == 0.0);
    }
  }

  // A Trainer's steps, with padding: blocks against whole logits.
  auto steps = [&](bool by_blocks) {
    Lm model(V, 3, {.head_block_rows = 4});
    AdamW<Be> opt(model);
    ModelTrainer trainer(model, be, opt, {.data_seed = 2, .split = {.shards = 1}});
    Data data{3, 4};
    std::vector<double> losses;
    for (int i = 0; i < 3; ++i) {
      auto next = [&](int) { return data.next(trainer.data_rng()); };
      losses.push_back(by_blocks ? trainer.step(next, data.forward_to_head()).loss : trainer.step(next, data.forward()).loss);
    }
    const BatchTargets held_out = data.next(trainer.data_rng());
    losses.push_back((by_blocks ? trainer.evaluate(held_out, data.forward_to_head())
                                : trainer.evaluate(held_out, data.forward()))
                         .mean());
    return std::pair(weights(model), losses);
  };
  const auto [w_blocks, l_blocks] = steps(true);
  const auto [w_whole, l_whole] = steps(false);
  BOOST_TEST(largest_difference(w_blocks, w_whole) < 1e-12);
  for (std::size_t i = 0; i < l_whole.size(); ++i) BOOST_TEST(std::abs(l_blocks[i] - l_whole[i]) < 1e-12);
}

// Split over shards, or over micro-batches, a step is the gradient of the
// same mean loss: the weights agree with the one-shard step to rounding,
// with padding spread unevenly over the shards (each shard weighs by its
// counted targets). Negative control: weighing shards by sequences instead
// (padding counted) would move the weights by far more.
BOOST_AUTO_TEST_CASE(shards_and_micro_batches_give_the_same_step) {
  const Run one = train({.data_seed = 4, .split = {.shards = 1}}, 5, 3, 3);
  const Run three = train({.data_seed = 4, .split = {.shards = 3}}, 5, 3, 3);
  BOOST_TEST(largest_difference(one.weights, three.weights) < 1e-12);
  for (int i = 0; i < 3; ++i) BOOST_TEST(std::abs(one.results[i].loss - three.results[i].loss) < 1e-12);
  const Run other_data = train({.data_seed = 5, .split = {.shards = 1}}, 5, 3, 3);
  BOOST_TEST(largest_difference(one.weights, other_data.weights) > 1e-6);  // the check can fail

  // Two micro-batches of 2 sequences against one of 4 with the same rows:
  // the data generator draws the same numbers either way only if the
  // micro-batches draw in turn, so compare against a hand-made batch.
  Be be;
  auto a = make_model(), b = make_model();
  AdamW<Be> opt_a(*a), opt_b(*b);
  ModelTrainer whole(*a, be, opt_a, {.split = {.shards = 1}});
  ModelTrainer halves(*b, be, opt_b, {.grad_accum = 2, .split = {.shards = 2}}, [] { return make_model(); });
  Data four{4}, two{2};
  Rng rng(8);
  four.next(rng);
  const StepResult rw = whole.step([&](int) { return BatchTargets{4, four.targets}; }, four.forward());
  const StepResult rh = halves.step(
      [&](int micro) {
        const std::size_t half = std::size_t(2) * T;
        std::copy_n(four.ids.begin() + std::ptrdiff_t(micro * half), half, two.ids.begin());
        std::copy_n(four.targets.begin() + std::ptrdiff_t(micro * half), half, two.targets.begin());
        return BatchTargets{2, two.targets};
      },
      two.forward());
  BOOST_TEST(std::abs(rw.loss - rh.loss) < 1e-12);
  BOOST_TEST(std::abs(rw.grad_norm - rh.grad_norm) < 1e-12);
  BOOST_TEST(largest_difference(weights(*a), weights(*b)) < 1e-12);
}

// A learning rate of 1e6 makes the weights, and then the loss or the
// gradients, overflow: training stops with an error naming the step and
// what is not finite, never with NaN weights silently trained on.
BOOST_AUTO_TEST_CASE(a_non_finite_loss_or_gradient_stops_naming_the_step) {
  using FloatModel = Decoder<TinyPre, CpuBackend<float>>;
  for (const bool by_blocks : {false, true}) {  // forward, or forward_to_head and head_loss
    BOOST_TEST_CONTEXT("head and loss by blocks " << by_blocks) {
      CpuBackend<float> be;
      FloatModel model(V, 3, {.head_block_rows = 5});
      AdamW<CpuBackend<float>> opt(model);
      Trainer<FloatModel, CpuBackend<float>> trainer(model, be, opt,
                                                     {.schedule = LrSchedule{.lr = 1e6}, .split = {.shards = 1}});
      std::vector<std::int32_t> ids(std::size_t(2) * T), targets(ids.size());
      std::string message;
      long steps = 0;
      try {
        for (; steps < 1000; ++steps) {
          for (auto& i : ids) i = std::int32_t(trainer.data_rng().below(V));
          for (auto& i : targets) i = std::int32_t(trainer.data_rng().below(V));
          auto batch = [&](int) { return BatchTargets{2, targets}; };
          if (by_blocks)
            trainer.step(batch, [&](const Shard&, FloatModel& m, CpuBackend<float>& b) {
              return m.forward_to_head(b, ids, Shape{2, T});
            });
          else
            trainer.step(batch, [&](const Shard&, FloatModel& m, CpuBackend<float>& b) {
              return m.forward(b, ids, Shape{2, T});
            });
        }
      } catch (const Error& e) {
        message = e.what();
      }
      BOOST_TEST_MESSAGE("stopped after " << steps << " steps: " << message);
      BOOST_TEST_REQUIRE(!message.empty(), "1000 steps at lr 1e6 never stopped");
      BOOST_TEST(message.find("step " + std::to_string(steps + 1)) != std::string::npos, message);
      const bool loss = message.find("loss is") != std::string::npos;
      const bool gradient = message.find("non-finite gradient in '") != std::string::npos;
      BOOST_TEST((loss || gradient), message);
      if (loss) {
        BOOST_TEST(message.find("(learning rate 1e+06)") != std::string::npos, message);
        BOOST_TEST(message.ends_with("; try a lower learning rate or gradient clipping"), message);
      }
    }
  }
}

// The Trainer's view of a loss it is handed: logits chosen by the test (the
// model's forward still runs, for its backward). A step's loss far above
// the first is flagged once; logits that are not finite, from finite
// weights, are named as the cause of a non-finite loss.
BOOST_AUTO_TEST_CASE(divergence_is_flagged_once_and_overflowing_logits_are_named) {
  Be be;
  Lm model(V, 3);
  AdamW<Be> opt(model);
  ModelTrainer trainer(model, be, opt, {.schedule = LrSchedule{.lr = 1e-9}, .split = {.shards = 1}});
  std::vector<std::int32_t> ids(T, 1), targets(T, 2);
  std::vector<double> logits(std::size_t(T) * V);
  auto step_with = [&](double target_logit) {
    for (std::size_t r = 0; r < std::size_t(T); ++r)
      for (int v = 0; v < V; ++v) logits[r * V + std::size_t(v)] = v == 2 ? target_logit : 0.0;
    return trainer.step([&](int) { return BatchTargets{1, targets}; }, [&](const Shard&, Lm& m, Be& b) {
      m.forward(b, ids, Shape{1, T});
      return std::span<const double>(logits);
    });
  };
  const StepResult first = step_with(0);  // loss ln 7
  BOOST_TEST(first.loss == std::log(7.0), boost::test_tools::tolerance(1e-6));
  BOOST_TEST(!first.diverging);
  BOOST_TEST(!step_with(-5).diverging);  // about 5: under 4 x ln 7 = 7.8
  const StepResult far = step_with(-20);  // about 20
  BOOST_TEST(far.diverging);
  BOOST_TEST(trainer.first_loss() == first.loss);
  BOOST_TEST(!step_with(-40).diverging);  // flagged once
  try {
    step_with(std::numeric_limits<double>::infinity());
    BOOST_FAIL("an infinite logit gave a finite loss");
  } catch (const Error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.starts_with("loss is "), m);
    BOOST_TEST(m.find(" at step 5 (learning rate 1e-09): every parameter is finite, but the logits are not") !=
                   std::string::npos, m);
  }
}

// By blocks (head_loss), logits that overflow from finite weights are
// named as well: a head of finite weights whose first logit is past
// float's largest value.
BOOST_AUTO_TEST_CASE(logits_that_overflow_in_a_block_are_named) {
  using FloatModel = Decoder<TinyPre, CpuBackend<float>>;
  CpuBackend<float> be;
  FloatModel model(V, 3, {.head_block_rows = 5});
  AdamW<CpuBackend<float>> opt(model);
  Trainer<FloatModel, CpuBackend<float>> trainer(model, be, opt, {.split = {.shards = 1}});
  std::vector<std::int32_t> ids(std::size_t(2) * T, 1), targets(ids.size(), 2);
  const auto h = model.hidden(be, ids, Shape{2, T});
  const std::vector<float> h0(h.begin(), h.begin() + TinyPre::D_MODEL);
  model.visit([&](std::string_view name, auto& value, auto&) {
    if (name == "lm_head.weight")  // each row 1e32 h0: the first row's logits 1e32 |h0|^2 > 0
      for (std::size_t i = 0; i < value.size(); ++i) value.data()[i] = 1e32f * h0[i % h0.size()];
    if (name == "lm_head.bias")
      for (auto& b : value) b = std::numeric_limits<float>::max();
  });
  try {
    trainer.step([&](int) { return BatchTargets{2, targets}; },
                 [&](const Shard&, FloatModel& m, CpuBackend<float>& b) { return m.forward_to_head(b, ids, Shape{2, T}); });
    BOOST_FAIL("logits past float's range gave a finite loss");
  } catch (const Error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find(" at step 1 (learning rate 0.001): every parameter is finite, but the logits are not") !=
                   std::string::npos, m);
  }
}

// state() with the parameters and optimizer state saved (save/load through
// a checkpoint directory) resumes bit for bit, dropout (branches and
// attention probabilities) included.
BOOST_AUTO_TEST_CASE(save_load_and_restore_resume_bitwise) {
  const auto dir = std::filesystem::temp_directory_path() / ("xfmr_trainer_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const TrainerOptions opts{.data_seed = 17, .split = {.shards = 2}};
  Be be;
  auto straight = make_model(0.3f);
  AdamW<Be> opt_s(*straight);
  ModelTrainer ts(*straight, be, opt_s, opts, [] { return make_model(0.3f); });
  Data data{4};
  auto next = [&](ModelTrainer& t) { return [&](int) { return data.next(t.data_rng()); }; };
  for (int i = 0; i < 5; ++i) ts.step(next(ts), data.forward());

  auto first = make_model(0.3f);
  AdamW<Be> opt_f(*first);
  ModelTrainer tf(*first, be, opt_f, opts, [] { return make_model(0.3f); });
  for (int i = 0; i < 2; ++i) tf.step(next(tf), data.forward());
  tf.save(dir, {{"preset", "tiny-pre"}, {"note", "two steps"}});
  const TrainerState st = tf.state();
  BOOST_TEST(st.step == 2);

  auto second = make_model(0.3f);
  AdamW<Be> opt_2(*second);
  ModelTrainer t2(*second, be, opt_2, opts, [] { return make_model(0.3f); });
  // A run planned for fewer steps than the checkpoint took refuses it, before reading a tensor.
  BOOST_TEST(test::error_of([&] { (void)t2.resume(dir, 1); }) ==
             dir.string() + ": the checkpoint is at step 2; the run ends at step 1");
  BOOST_TEST(t2.steps() == 0);
  const Metadata md = t2.resume(dir, 2);
  BOOST_TEST(md == (Metadata{{"note", "two steps"}, {"preset", "tiny-pre"}}));
  BOOST_TEST(read_checkpoint_metadata(dir) == md);
  BOOST_TEST(t2.steps() == 2);
  for (int i = 0; i < 3; ++i) t2.step(next(t2), data.forward());
  BOOST_TEST(largest_difference(weights(*straight), weights(*second)) == 0.0);
  // Negative control: without restore() the dropout masks and data differ.
  auto third = make_model(0.3f);
  AdamW<Be> opt_3(*third);
  ModelTrainer t3(*third, be, opt_3, opts, [] { return make_model(0.3f); });
  load_parameters(*third, SafeTensors::load(dir / kModelFile));
  load_optimizer_state(opt_3, SafeTensors::load(dir / kOptimizerFile));
  for (int i = 0; i < 3; ++i) t3.step(next(t3), data.forward());
  BOOST_TEST(largest_difference(weights(*straight), weights(*third)) > 1e-6);
  // An int8 checkpoint (quantise_checkpoint's, here marked by hand: this
  // model is double) is for decoding: resuming refuses it.
  const auto int8_dir = dir.string() + "_int8";
  SafeTensorsWriter marked;
  add_parameters(marked, *third);
  marked.set_metadata(kWeightsKey, kInt8Weights);
  write_checkpoint(int8_dir, marked, st);
  try {
    t3.resume(int8_dir);
    BOOST_ERROR("resumed from int8 weights");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("holds int8 weights for decoding") != std::string::npos, e.what());
  }
  std::filesystem::remove_all(int8_dir);
  std::filesystem::remove_all(dir);

  TrainerState wrong = st;
  wrong.dropout_calls.pop_back();
  BOOST_CHECK_THROW(t3.restore(wrong), Error);
}

// Batches the trainer cannot split say so.
BOOST_AUTO_TEST_CASE(malformed_batches_are_errors) {
  Be be;
  auto model = make_model();
  AdamW<Be> opt(*model);
  ModelTrainer trainer(*model, be, opt, {.split = {.shards = 1}});
  Data data{2};
  const std::vector<std::int32_t> odd(5, 1);
  BOOST_CHECK_THROW(trainer.step([&](int) { return BatchTargets{2, odd}; }, data.forward()), Error);
  BOOST_CHECK_THROW(trainer.step([&](int) { return BatchTargets{0, data.targets}; }, data.forward()), Error);
  // Five targets a sequence against six rows of logits.
  BOOST_CHECK_THROW(trainer.evaluate(BatchTargets{2, std::span(data.targets).first(2 * T - 2)}, data.forward()), Error);
  BOOST_CHECK_THROW(ModelTrainer(*model, be, opt, {.grad_accum = 0}), Error);
}

// evaluate(): the plain mean cross-entropy over counted targets, without
// label smoothing, dropout off, and the weights untouched.
BOOST_AUTO_TEST_CASE(evaluate_is_the_plain_mean_loss) {
  Be be;
  auto model = std::make_unique<Lm>(V, 3, DecoderOptions{.dropout = 0.5f, .attention_dropout = 0.5f});
  AdamW<Be> opt(*model);
  ModelTrainer trainer(*model, be, opt, {.label_smoothing = 0.2, .split = {.shards = 2}}, [] { return make_model(0.5f); });
  Data data{3, 4};
  Rng rng(2);
  data.next(rng);
  const Vec before = weights(*model);
  const LossSum got = trainer.evaluate({3, data.targets}, data.forward());
  model->set_training(false);
  CrossEntropyLoss<Be> ce;
  const double want = ce.forward(be, model->forward(be, data.ids, Shape{3, T}), data.targets, V);
  BOOST_TEST(got.counted == counted_targets(data.targets));
  BOOST_TEST(got.counted < long(data.targets.size()));
  BOOST_TEST(std::abs(got.mean() - want) < 1e-12);
  BOOST_TEST(largest_difference(before, weights(*model)) == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
