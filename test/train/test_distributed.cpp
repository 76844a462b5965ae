// Training across processes (core/distributed.hpp): run by CTest as
// `mpiexec -n 2 test_distributed` (XFMR_EXPECT_RANKS=2). Two ranks with half
// the batch each take the steps one process takes on the whole batch split
// in two shards (DataParallel), bit for bit: both sum the halves' gradients
// in the same order. Against one unsplit pass the sums' order differs, and
// AdamW's normalisation magnifies the last bits of near-zero gradients.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <string>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/trainer.hpp"

BOOST_AUTO_TEST_SUITE(test_distributed)

using namespace xfmr;

namespace {

struct Tiny {
  static constexpr int MAX_T = 8, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 2, D_FF = 32;
  using Norm = PreNorm;
  using Activation = Gelu;
};
using Cpu = CpuBackend<float>;
using Lm = Decoder<Tiny, Cpu>;
constexpr int kVocab = 11, kBatch = 8, kSteps = 20;

ProcessGroup& world() { return ProcessGroup::world(); }

// The global batch of `step`: the same on every rank; the next token is the
// id plus one. Rows 5 and 6 ignore most of their targets, so the ranks'
// halves count different numbers.
void global_batch(int step, std::vector<std::int32_t>& ids, std::vector<std::int32_t>& targets) {
  Rng rng(1000 + std::uint64_t(step));
  ids.resize(std::size_t(kBatch) * Tiny::MAX_T);
  targets.resize(ids.size());
  for (auto& i : ids) i = std::int32_t(rng.below(kVocab));
  for (std::size_t i = 0; i < ids.size(); ++i) targets[i] = (ids[i] + 1) % kVocab;
  for (int row = 5; row <= 6; ++row)
    for (int t = 0; t < 6; ++t) targets[std::size_t(row * Tiny::MAX_T + t)] = kIgnoreIndex;
}

struct Run {
  std::vector<double> losses;
  std::vector<float> weights, state;  // the parameters, the optimizer's state (whole, gathered under ZeRO-1)
};

struct Setup {
  ProcessGroup* group = nullptr;  // null: this process on the whole batch
  int shards = 1, zero = 0;
  double clip = 0.5;
  float dropout = 0.0f;
  int steps = kSteps;
  std::string save{};  // a checkpoint of the run's end written here (rank 0), with trainer_state in `saved`
  std::string resume{};  // a checkpoint to start from, and its trainer state
  const TrainerState* resume_state = nullptr;
  TrainerState* saved = nullptr;
};

// AdamW steps with clipping (s.clip); s.group null: this process on the
// whole batch in s.shards shards, else this rank on its rows of it.
Run train(const Setup& s) {
  Cpu be;
  const DecoderOptions model_opts{.dropout = s.dropout};
  Lm model(kVocab, 42, model_opts);
  AdamW<Cpu> opt(model, {.weight_decay = 0.1});
  Trainer<Lm, Cpu> trainer(
      model, be, opt,
      {.clip = s.clip, .schedule = LrSchedule{.lr = 3e-3}, .split = {.shards = s.shards, .group = s.group, .zero = s.zero}},
      [&] { return std::make_unique<Lm>(kVocab, 42, model_opts); });
  if (!s.resume.empty()) {
    trainer.resume(s.resume);
    BOOST_TEST(trainer.steps() == s.resume_state->step);
  }
  const int ranks = s.group ? s.group->size() : 1, rank = s.group ? s.group->rank() : 0;
  const int rows = kBatch / ranks, first = rank * rows, T = Tiny::MAX_T;
  std::vector<std::int32_t> ids, targets;
  Run out;
  while (trainer.steps() < s.steps) {
    global_batch(int(trainer.steps()), ids, targets);
    const std::span<const std::int32_t> my_ids(ids.data() + first * T, std::size_t(rows) * T);
    const std::span<const std::int32_t> my_targets(targets.data() + first * T, std::size_t(rows) * T);
    const auto r = trainer.step([&](int) { return BatchTargets{rows, my_targets}; },
                                [&](const Shard& sh, Lm& m, Cpu& b) {
                                  return m.forward(b, my_ids.subspan(std::size_t(sh.begin) * T, std::size_t(sh.size()) * T),
                                                   Shape{sh.size(), T});
                                });
    out.losses.push_back(r.loss);
  }
  model.visit([&](std::string_view, auto& value, auto&) { out.weights.insert(out.weights.end(), value.begin(), value.end()); });
  opt.visit_state([&](const std::string&, auto& t) { out.state.insert(out.state.end(), t.begin(), t.end()); });
  if (!s.save.empty()) {
    trainer.save(s.save);  // every rank: ZeRO-1 gathers the optimizer's state; rank 0 writes
    if (s.saved) *s.saved = trainer.state();
    if (s.group) s.group->require_same("the save", "done");  // no rank reads it before it is written
  }
  return out;
}
Run train(ProcessGroup* group, int shards = 1) { return train(Setup{.group = group, .shards = shards}); }

std::string fingerprint(const std::vector<float>& w) {
  std::uint64_t h = 1469598103934665603ull;
  for (float f : w) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return std::to_string(h);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_ranks_are_the_ones_mpiexec_started) {
  if (const char* want = std::getenv("XFMR_EXPECT_RANKS")) BOOST_TEST(world().size() == std::atoi(want));
  BOOST_TEST(world().rank() >= 0);
  BOOST_TEST(world().rank() < world().size());
}

BOOST_AUTO_TEST_CASE(all_reduce_sums_in_the_same_bits_everywhere) {
  // Lengths that do not divide by the ranks, and the empty one.
  for (std::size_t n : {0u, 1u, 7u, 1000u}) {
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = double(i) + 0.25 * (world().rank() + 1);
    world().all_reduce_sum(std::span<double>(v));
    const int N = world().size();
    for (std::size_t i = 0; i < n; ++i) BOOST_TEST(v[i] == N * double(i) + 0.25 * N * (N + 1) / 2);
  }
  BOOST_TEST(world().sum(std::int64_t(world().rank() + 1)) == std::int64_t(world().size()) * (world().size() + 1) / 2);
}

BOOST_AUTO_TEST_CASE(ranks_with_half_the_batch_take_the_whole_batch_step) {
  const Run split = train(&world());
  // Every rank holds the same weights, bit for bit.
  world().require_same("the fingerprint of the trained weights", fingerprint(split.weights));
  if (world().root()) {
    // One process, the batch in as many shards as ranks: the same bits.
    const Run sharded = train(nullptr, world().size());
    BOOST_TEST(split.losses == sharded.losses, boost::test_tools::per_element());
    BOOST_TEST(fingerprint(split.weights) == fingerprint(sharded.weights));
    // One process, one pass over the batch: the same training, to rounding.
    const Run whole = train(nullptr, 1);
    for (int s = 0; s < kSteps; ++s)
      BOOST_TEST(std::abs(split.losses[s] - whole.losses[s]) <= 1e-6 * whole.losses[s], "step " << s + 1);
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < whole.weights.size(); ++i) {
      err = std::max(err, std::abs(double(split.weights[i]) - whole.weights[i]));
      scale = std::max(scale, std::abs(double(whole.weights[i])));
    }
    BOOST_TEST(err <= 1e-4 * scale, "weights differ by " << err << " at scale " << scale);
    BOOST_TEST(whole.losses.back() < 0.8 * whole.losses.front());  // it learned something
  }
}

BOOST_AUTO_TEST_CASE(dropout_draws_the_masks_of_one_process_with_a_shard_a_rank) {
  // Rank r of one shard draws stream r, as shard r of one process does: the
  // same bits.
  const Run split = train(Setup{.group = &world(), .dropout = 0.2f});
  world().require_same("the fingerprint of the trained weights", fingerprint(split.weights));
  if (world().root()) {
    const Run one = train(Setup{.shards = world().size(), .dropout = 0.2f});
    BOOST_TEST(split.losses == one.losses, boost::test_tools::per_element());
    BOOST_TEST(fingerprint(split.weights) == fingerprint(one.weights));
    // The masks are drawn: without dropout the run differs.
    BOOST_TEST(fingerprint(one.weights) != fingerprint(train(Setup{.shards = world().size()}).weights));
  }
  // With two shards a rank, rank r draws streams 2r and 2r + 1, as shards 2r
  // and 2r + 1 of one process do; the shards' sums associate differently
  // ((a + b) + (c + d) against ((a + b) + c) + d), so rounding apart, where
  // other masks would move the loss by far more.
  const Run split2 = train(Setup{.group = &world(), .shards = 2, .dropout = 0.2f});
  if (world().root()) {
    const Run one = train(Setup{.shards = 2 * world().size(), .dropout = 0.2f});
    for (int s = 0; s < kSteps; ++s)
      BOOST_TEST(std::abs(split2.losses[s] - one.losses[s]) <= 1e-6 * one.losses[s], "step " << s + 1);
  }
}

BOOST_AUTO_TEST_CASE(zero_1_gives_the_weights_of_plain_data_parallel) {
  // Without clipping the same bits: every element takes the same update.
  const Run plain = train(Setup{.group = &world(), .clip = 0.0});
  const Run zero = train(Setup{.group = &world(), .zero = 1, .clip = 0.0});
  BOOST_TEST(zero.losses == plain.losses, boost::test_tools::per_element());
  BOOST_TEST(fingerprint(zero.weights) == fingerprint(plain.weights));
  BOOST_TEST(fingerprint(zero.state) == fingerprint(plain.state));  // the state gathered whole
  world().require_same("the fingerprint of the ZeRO-1 weights", fingerprint(zero.weights));
  // Clipped, the norm sums the ranks' parts in another order: rounding apart.
  const Run clipped = train(Setup{.group = &world(), .clip = 0.5});
  const Run clipped_zero = train(Setup{.group = &world(), .zero = 1, .clip = 0.5});
  for (int s = 0; s < kSteps; ++s)
    BOOST_TEST(std::abs(clipped_zero.losses[s] - clipped.losses[s]) <= 1e-6 * clipped.losses[s], "step " << s + 1);
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < clipped.weights.size(); ++i) {
    err = std::max(err, std::abs(double(clipped_zero.weights[i]) - clipped.weights[i]));
    scale = std::max(scale, std::abs(double(clipped.weights[i])));
  }
  BOOST_TEST(err <= 1e-5 * scale, "weights differ by " << err << " at scale " << scale);
}

BOOST_AUTO_TEST_CASE(a_zero_1_checkpoint_resumes_at_any_rank_count_bit_for_bit) {
  const std::string dir = (std::filesystem::temp_directory_path() / "xfmr_test_distributed_zero").string();
  if (world().root()) std::filesystem::remove_all(dir);
  world().require_same("the directory", dir);
  TrainerState state;
  const Run straight = train(Setup{.group = &world(), .zero = 1, .clip = 0.0});
  train(Setup{.group = &world(), .zero = 1, .clip = 0.0, .steps = kSteps / 2, .save = dir, .saved = &state});
  // At the same rank count, sharded again: the same bits.
  const Run resumed = train(Setup{.group = &world(), .zero = 1, .clip = 0.0, .resume = dir, .resume_state = &state});
  BOOST_TEST(fingerprint(resumed.weights) == fingerprint(straight.weights));
  BOOST_TEST(fingerprint(resumed.state) == fingerprint(straight.state));
  // Without ZeRO at the same count, and in one process of as many shards as ranks.
  const Run plain = train(Setup{.group = &world(), .clip = 0.0, .resume = dir, .resume_state = &state});
  BOOST_TEST(fingerprint(plain.weights) == fingerprint(straight.weights));
  if (world().root()) {
    const Run one = train(Setup{.shards = world().size(), .clip = 0.0, .resume = dir, .resume_state = &state});
    BOOST_TEST(fingerprint(one.weights) == fingerprint(straight.weights));
    BOOST_TEST(fingerprint(one.state) == fingerprint(straight.state));
    std::filesystem::remove_all(dir);
  }
}

BOOST_AUTO_TEST_CASE(a_rank_without_sequences_still_takes_the_step) {
  // A short last batch: one sequence, two ranks; rank 1 has none of it.
  auto run = [](ProcessGroup* group, int zero) {
    Cpu be;
    Lm model(kVocab, 42);
    AdamW<Cpu> opt(model);
    Trainer<Lm, Cpu> trainer(model, be, opt, {.schedule = LrSchedule{.lr = 3e-3}, .split = {.group = group, .zero = zero}});
    std::vector<std::int32_t> ids, targets;
    global_batch(0, ids, targets);
    const int T = Tiny::MAX_T;
    const bool mine = !group || group->root();
    const std::span<const std::int32_t> my_ids(ids.data(), mine ? std::size_t(T) : 0);
    const std::span<const std::int32_t> my_targets(targets.data(), mine ? std::size_t(T) : 0);
    auto forward = [&](const Shard& sh, Lm& m, Cpu& b) { return m.forward(b, my_ids, Shape{sh.size(), T}); };
    const StepResult r = trainer.step([&](int) { return BatchTargets{mine ? 1 : 0, my_targets}; }, forward);
    const LossSum eval = trainer.evaluate({mine ? 1 : 0, my_targets}, forward);
    std::vector<float> w;
    model.visit([&](std::string_view, auto& value, auto&) { w.insert(w.end(), value.begin(), value.end()); });
    return std::tuple(r.loss, eval.counted, fingerprint(w));
  };
  for (int zero : {0, 1}) {
    const auto split = run(&world(), zero);
    world().require_same("the weights after a short batch", std::get<2>(split));
    if (world().root()) {
      const auto one = run(nullptr, 0);
      BOOST_TEST(std::get<0>(split) == std::get<0>(one));
      BOOST_TEST(std::get<1>(split) == std::get<1>(one));  // evaluation counts every rank's targets once
      BOOST_TEST(std::get<2>(split) == std::get<2>(one));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rerun_repeats_bit_for_bit) {
  BOOST_TEST(fingerprint(train(&world()).weights) == fingerprint(train(&world()).weights));
}

BOOST_AUTO_TEST_CASE(a_setting_that_differs_between_ranks_is_named) {
  world().require_same("the preset", "tiny");
  if (world().size() == 1) return;
  try {
    world().require_same("the preset", world().root() ? "tiny" : "shakespeare-small");
    BOOST_ERROR("no error");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "ranks disagree on the preset: rank 0 has 'tiny', rank 1 has "
                                        "'shakespeare-small'");
  }
}

BOOST_AUTO_TEST_SUITE_END()
