// Training across processes (train/distributed.hpp): run by CTest as
// `mpiexec -n 2 test_distributed` (XFMR_EXPECT_RANKS=2). Two ranks with half
// the batch each take the steps one process takes on the whole batch split
// in two shards (DataParallel), bit for bit: both sum the halves' gradients
// in the same order. Against one unsplit pass the sums' order differs, and
// AdamW's normalisation magnifies the last bits of near-zero gradients.
#define BOOST_TEST_MODULE distributed
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/trainer.hpp"

using namespace xfmr;

namespace {

struct Tiny {
  static constexpr int MAX_T = 8, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 2, D_FF = 32;
  using Norm = PreNorm;
  using Activation = Gelu;
};
using Cpu = CpuBackend<float>;
using Model = Decoder<Tiny, Cpu>;
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
  std::vector<float> weights;
};

// kSteps AdamW steps with clipping; `group` null: this process on the whole
// batch in `shards` shards, else this rank on its rows of it.
Run train(ProcessGroup* group, int shards = 1) {
  Cpu be;
  Model model(kVocab, 42);
  AdamW<Cpu> opt(model, {.weight_decay = 0.1});
  Trainer<Model, Cpu> trainer(model, be, opt,
                              {.clip = 0.5, .schedule = LrSchedule{.lr = 3e-3}, .shards = shards, .group = group},
                              [] { return std::make_unique<Model>(kVocab, 42); });
  const int ranks = group ? group->size() : 1, rank = group ? group->rank() : 0;
  const int rows = kBatch / ranks, first = rank * rows, T = Tiny::MAX_T;
  std::vector<std::int32_t> ids, targets;
  Run out;
  for (int step = 0; step < kSteps; ++step) {
    global_batch(step, ids, targets);
    const std::span<const std::int32_t> my_ids(ids.data() + first * T, std::size_t(rows) * T);
    const std::span<const std::int32_t> my_targets(targets.data() + first * T, std::size_t(rows) * T);
    const auto r = trainer.step([&](int) { return BatchTargets{rows, my_targets}; },
                                [&](const Shard& s, Model& m, Cpu& b) {
                                  return m.forward(b, my_ids.subspan(std::size_t(s.begin) * T, std::size_t(s.size()) * T),
                                                   Shape{s.size(), T});
                                });
    out.losses.push_back(r.loss);
  }
  model.visit([&](std::string_view, auto& value, auto&) { out.weights.insert(out.weights.end(), value.begin(), value.end()); });
  return out;
}

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
