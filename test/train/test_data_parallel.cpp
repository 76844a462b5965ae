#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/data_parallel.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"

BOOST_AUTO_TEST_SUITE(test_data_parallel)

using namespace xfmr;
using namespace xfmr::test;
namespace tt = boost::test_tools;

namespace {
constexpr int V = 7, T = TinyPre::MAX_T;
using Lm = Decoder<TinyPre, Be>;

// A batch of B sequences of ids and next-token targets, the same for a seed.
struct Batch {
  std::vector<std::int32_t> ids, targets;
  Batch(int B, std::uint64_t seed) : ids(std::size_t(B) * T), targets(ids.size()) {
    Rng rng(seed);
    for (auto& i : ids) i = std::int32_t(rng.below(V));
    for (auto& i : targets) i = std::int32_t(rng.below(V));
  }
  int sequences() const { return int(ids.size()) / T; }
};

// Every gradient of a model, concatenated in visit order.
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

// got agrees with want to tol of want's largest element: shards sum in
// another order, and sums that cancel to near zero (a bias gradient) agree
// only to rounding in absolute terms.
void check_close(const Vec& got, const Vec& want, double tol) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  double scale = 0, worst = 0;
  std::size_t at = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > worst) worst = std::abs(got[i] - want[i]), at = i;
  BOOST_TEST(scale > 0.0);
  BOOST_TEST(worst <= tol * scale, "largest difference " << worst << " at element " << at << " (largest value "
                                                         << scale << ")");
}

// The plain step's gradients: one forward and backward over the whole batch,
// the loss gradient scaled by `scale`.
double plain_backward(Be& be, Lm& m, const Batch& batch, double scale = 1.0) {
  CrossEntropyLoss<Be> ce;
  std::vector<double> dlogits(batch.ids.size() * V);
  const double loss = ce.forward(be, m.forward(be, batch.ids, Shape{batch.sequences(), T}), batch.targets, V);
  ce.backward(be, dlogits, scale);
  m.backward(be, std::span<const double>(dlogits));
  return loss;
}

// The same through DataParallel: each shard's loss gradient scaled by its
// share of the batch (times `scale`). Records which thread ran each shard.
struct Sharded {
  std::vector<CrossEntropyLoss<Be>> ce = std::vector<CrossEntropyLoss<Be>>(8);
  std::vector<std::vector<double>> dlogits = std::vector<std::vector<double>>(8);
  std::vector<std::thread::id> threads = std::vector<std::thread::id>(8);
  std::vector<double> losses = std::vector<double>(8, 0.0);
  // Returns backward's sum of the shards' weighted losses.
  double backward(DataParallel<Lm, Be>& dp, const Batch& batch, double scale = 1.0) {
    return dp.backward(batch.sequences(), [&](const Shard& s, Lm& m, Be& be) {
      threads[std::size_t(s.index)] = std::this_thread::get_id();
      const auto rows = std::size_t(s.size()) * T;
      const std::span<const std::int32_t> ids(batch.ids.data() + std::size_t(s.begin) * T, rows);
      const std::span<const std::int32_t> targets(batch.targets.data() + std::size_t(s.begin) * T, rows);
      auto& ce_s = ce[std::size_t(s.index)];
      auto& dl = dlogits[std::size_t(s.index)];
      dl.assign(rows * V, 0.0);
      losses[std::size_t(s.index)] = ce_s.forward(be, m.forward(be, ids, Shape{s.size(), T}), targets, V);
      ce_s.backward(be, dl, scale * s.share());
      m.backward(be, std::span<const double>(dl));
      return losses[std::size_t(s.index)] * s.share();
    });
  }
};

// The batch's logits through DataParallel::forward, each shard writing its
// rows; returns the shards' losses weighted by their shares, summed.
double sharded_logits(DataParallel<Lm, Be>& dp, const Batch& batch, Vec& logits_out) {
  logits_out.assign(batch.ids.size() * V, -1.0);
  std::vector<CrossEntropyLoss<Be>> ce(8);
  return dp.forward(batch.sequences(), [&](const Shard& s, Lm& m, Be& b) {
    const auto first = std::size_t(s.begin) * T, rows = std::size_t(s.size()) * T;
    const auto logits = m.forward(b, std::span(batch.ids).subspan(first, rows), Shape{s.size(), T});
    std::copy(logits.begin(), logits.end(), logits_out.begin() + std::ptrdiff_t(first * V));
    return ce[std::size_t(s.index)].forward(b, logits, std::span(batch.targets).subspan(first, rows), V) * s.share();
  });
}

DataParallel<Lm, Be>::Factory factory(DecoderOptions opts = {}) {
  return [opts] { return std::make_unique<Lm>(V, 99, opts); };  // its weights are replaced
}
}  // namespace

BOOST_AUTO_TEST_CASE(shards_split_the_batch_and_sum_to_its_gradient) {
  for (const bool tied : {false, true}) {
    for (const int shards : {2, 3}) {
      BOOST_TEST_CONTEXT("tie_weights " << tied << ", " << shards << " shards") {
        const DecoderOptions opts{.dropout = 0.0f, .tie_weights = tied};
        Be be;
        Lm plain(V, 5, opts), sharded(V, 5, opts);
        DataParallel<Lm, Be> dp(sharded, be, factory(opts), shards);
        BOOST_TEST(dp.shards() == shards);
        const Batch batch(5, 11);  // 5 sequences: unequal shards (2 + 3, or 1 + 2 + 2)
        zero_grad(plain);
        zero_grad(sharded);
        const double plain_loss = plain_backward(be, plain, batch);
        Sharded run;
        const double loss = run.backward(dp, batch);
        BOOST_TEST(loss == plain_loss, tt::tolerance(1e-13));  // the shards' weighted losses, summed
        const Vec want = gradients(plain), got = gradients(sharded);
        check_close(got, want, 1e-13);
        // Every shard ran, and shard 0 on the calling thread.
        BOOST_TEST((run.threads[0] == std::this_thread::get_id()));
        for (int r = 0; r < shards; ++r) BOOST_TEST((run.threads[std::size_t(r)] != std::thread::id()));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_over_micro_batches) {
  Be be;
  Lm plain(V, 6), sharded(V, 6);
  DataParallel<Lm, Be> dp(sharded, be, factory(), 2);
  const Batch a(4, 1), b(3, 2);
  zero_grad(plain);
  zero_grad(sharded);
  plain_backward(be, plain, a, 0.5);
  plain_backward(be, plain, b, 0.5);
  Sharded run;
  run.backward(dp, a, 0.5);
  run.backward(dp, b, 0.5);
  check_close(gradients(sharded), gradients(plain), 1e-13);
}

BOOST_AUTO_TEST_CASE(shards_weighted_by_counted_targets_match_a_loss_with_ignored_ones) {
  // A loss that averages over counted targets only (padding ignored, as in
  // the translator): each shard's gradient weighted by its counted targets
  // over the batch's, not by its sequences, sums to the batch's gradient.
  Be be;
  Lm plain(V, 13), sharded(V, 13);
  DataParallel<Lm, Be> dp(sharded, be, factory(), 2);
  Batch batch(4, 17);
  for (int t = 1; t < T; ++t) batch.targets[std::size_t(t)] = kIgnoreIndex;  // sequence 0: one counted target
  batch.targets[std::size_t(2 * T + 3)] = kIgnoreIndex;
  const auto counted = [&](int b0, int b1) {
    return std::count_if(batch.targets.begin() + b0 * T, batch.targets.begin() + b1 * T,
                         [](std::int32_t t) { return t != kIgnoreIndex; });
  };
  zero_grad(plain);
  zero_grad(sharded);
  plain_backward(be, plain, batch);
  std::vector<CrossEntropyLoss<Be>> ce(2);
  std::vector<std::vector<double>> dlogits(2);
  dp.backward(batch.sequences(), [&](const Shard& s, Lm& m, Be& b) {
    const auto rows = std::size_t(s.size()) * T;
    const std::span<const std::int32_t> ids(batch.ids.data() + std::size_t(s.begin) * T, rows);
    const std::span<const std::int32_t> targets(batch.targets.data() + std::size_t(s.begin) * T, rows);
    auto& dl = dlogits[std::size_t(s.index)];
    dl.assign(rows * V, 0.0);
    ce[std::size_t(s.index)].forward(b, m.forward(b, ids, Shape{s.size(), T}), targets, V);
    ce[std::size_t(s.index)].backward(b, dl, double(counted(s.begin, s.end)) / double(counted(0, batch.sequences())));
    m.backward(b, std::span<const double>(dl));
  });
  check_close(gradients(sharded), gradients(plain), 1e-13);
}

BOOST_AUTO_TEST_CASE(replicas_follow_the_optimizer) {
  // Three AdamW steps: the replicas must take each step's new weights, or
  // the later gradients (and so the weights) part from the plain run's.
  Be be;
  Lm plain(V, 8), sharded(V, 8);
  AdamW<Be> opt_plain(plain), opt_sharded(sharded);
  DataParallel<Lm, Be> dp(sharded, be, factory(), 2);
  Sharded run;
  for (int step = 0; step < 3; ++step) {
    const Batch batch(4, 20 + step);
    zero_grad(plain);
    zero_grad(sharded);
    plain_backward(be, plain, batch);
    run.backward(dp, batch);
    opt_plain.step(be, 0.05);
    opt_sharded.step(be, 0.05);
  }
  check_close(weights(sharded), weights(plain), 1e-12);
}

BOOST_AUTO_TEST_CASE(one_shard_is_a_plain_step) {
  // One sequence, or one shard asked for: f runs once, on the model itself.
  Be be;
  Lm plain(V, 9), sharded(V, 9);
  DataParallel<Lm, Be> dp(sharded, be, factory(), 2);
  const Batch batch(1, 3);
  zero_grad(plain);
  zero_grad(sharded);
  plain_backward(be, plain, batch);
  int calls = 0;
  const double none = dp.backward(1, [&](const Shard& s, Lm& m, Be& b) {
    ++calls;
    BOOST_TEST(&m == &sharded);
    BOOST_TEST(&b == &be);
    BOOST_TEST((s.begin == 0 && s.end == 1 && s.share() == 1.0));
    plain_backward(b, m, batch);
  });
  BOOST_TEST(calls == 1);
  BOOST_TEST(none == 0.0);  // f returned nothing
  BOOST_TEST(gradients(sharded) == gradients(plain), tt::per_element());  // bit for bit
  DataParallel<Lm, Be> single(sharded, be, nullptr, 1);  // needs no factory
  BOOST_TEST(single.shards() == 1);
}

BOOST_AUTO_TEST_CASE(dropout_masks_differ_by_shard_and_repeat_by_run) {
  // On the branches, and on the attention probabilities alone.
  for (const DecoderOptions opts : {DecoderOptions{.dropout = 0.3f}, DecoderOptions{.attention_dropout = 0.3f}}) {
    BOOST_TEST_CONTEXT("dropout " << opts.dropout << ", attention dropout " << opts.attention_dropout) {
      auto run_once = [&](Vec& grads, std::uint64_t& calls, std::vector<double>& losses) {
        Be be;
        Lm m(V, 4, opts);
        m.set_training(true);
        DataParallel<Lm, Be> dp(m, be, factory(opts), 2);
        const Batch twin(2, 5);
        Batch batch = twin;  // sequence 1 is a copy of sequence 0: only the masks can differ
        std::copy_n(batch.ids.begin(), T, batch.ids.begin() + T);
        std::copy_n(batch.targets.begin(), T, batch.targets.begin() + T);
        zero_grad(m);
        Sharded run;
        run.backward(dp, batch);
        grads = gradients(m);
        losses = run.losses;
        calls = 0;
        m.for_each_dropout([&](auto& d) { calls = std::max(calls, d.calls()); });
      };
      Vec g1, g2;
      std::uint64_t c1 = 0, c2 = 0;
      std::vector<double> l1, l2;
      run_once(g1, c1, l1);
      run_once(g2, c2, l2);
      BOOST_TEST(g1 == g2, tt::per_element());  // the same run, bit for bit
      BOOST_TEST(c1 == 1u);                     // the model's counters moved on by one step
      // The same sequence in the two shards gave different losses: different masks.
      BOOST_TEST(l1[0] != l1[1]);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_input_in_a_shard_is_an_error_and_the_next_step_works) {
  Be be;
  Lm plain(V, 12), sharded(V, 12);
  DataParallel<Lm, Be> dp(sharded, be, factory(), 2);
  Batch bad(4, 7);
  bad.ids[3 * T + 2] = V + 5;  // in shard 1's sequences
  zero_grad(sharded);
  Sharded run;
  try {
    run.backward(dp, bad);
    BOOST_FAIL("an out-of-range token id in shard 1 was not reported");
  } catch (const Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    BOOST_TEST(std::string(e.what()).find(std::to_string(V + 5)) != std::string::npos);
  }
  const Batch good(4, 8);
  zero_grad(plain);
  zero_grad(sharded);
  plain_backward(be, plain, good);
  run.backward(dp, good);
  check_close(gradients(sharded), gradients(plain), 1e-13);
}

BOOST_AUTO_TEST_CASE(wrong_replicas_and_counts_are_errors) {
  Be be;
  Lm m(V, 1);
  BOOST_CHECK_THROW((DataParallel<Lm, Be>(m, be, factory(), -1)), Error);
  BOOST_CHECK_THROW((DataParallel<Lm, Be>(m, be, nullptr, 2)), Error);
  DataParallel<Lm, Be> other_vocab(m, be, [] { return std::make_unique<Lm>(V + 1, 1); }, 2);
  Sharded run;
  BOOST_CHECK_THROW(run.backward(other_vocab, Batch(2, 1)), Error);
  DataParallel<Lm, Be> dp(m, be, factory(), 2);
  BOOST_CHECK_THROW(dp.backward(0, [](const Shard&, Lm&, Be&) {}), Error);
}

// forward: each shard's logits are the whole batch's rows for its
// sequences, and the losses sum as in backward. The model's gradients,
// held from a backward, stay bit for bit (the replicas still hold theirs
// from that backward: adding them would show), and the next backward
// still sums to the batch's gradient. After an optimizer step the replicas
// take the model's new weights.
BOOST_AUTO_TEST_CASE(forward_shards_give_the_batch_logits_and_leave_gradients_alone) {
  Be be;
  Lm plain(V, 6), sharded(V, 6);
  DataParallel<Lm, Be> dp(sharded, be, factory(), 3);
  const Batch batch(5, 21);  // shards of 1, 2 and 2 sequences
  const auto whole = plain.forward(be, batch.ids, Shape{batch.sequences(), T});
  const Vec want(whole.begin(), whole.end());
  CrossEntropyLoss<Be> ce;
  const double want_loss = ce.forward(be, whole, batch.targets, V);

  zero_grad(sharded);
  Sharded earlier;
  earlier.backward(dp, batch);  // gradients in the model and in both replicas
  const Vec held = gradients(sharded);
  for (int step = 0; step < 2; ++step) {
    BOOST_TEST_CONTEXT("forward " << step) {
      Vec got;
      const double loss = sharded_logits(dp, batch, got);
      check_close(got, want, 1e-13);
      BOOST_TEST(loss == want_loss, tt::tolerance(1e-13));
      BOOST_TEST(gradients(sharded) == held, tt::per_element());  // bit for bit: nothing added
    }
  }
  zero_grad(plain);
  zero_grad(sharded);
  plain_backward(be, plain, batch);
  Sharded again;
  again.backward(dp, batch);
  check_close(gradients(sharded), gradients(plain), 1e-13);

  // New weights reach the replicas: after an optimizer step on both models,
  // the sharded forward still matches the plain one.
  AdamW<Be> opt_plain(plain), opt_sharded(sharded);
  opt_plain.step(be, 1e-2);
  opt_sharded.step(be, 1e-2);
  const auto moved = plain.forward(be, batch.ids, Shape{batch.sequences(), T});
  Vec got;
  sharded_logits(dp, batch, got);
  check_close(got, Vec(moved.begin(), moved.end()), 1e-13);
}

// forward's errors: a bad token id in shard 1 is reported, with the id;
// and 0 sequences is an error, as for backward.
BOOST_AUTO_TEST_CASE(forward_reports_bad_input_in_a_shard) {
  Be be;
  Lm m(V, 13);
  DataParallel<Lm, Be> dp(m, be, factory(), 2);
  Batch bad(4, 9);
  bad.ids[2 * T + 1] = -3;  // shard 1's first sequence
  try {
    dp.forward(bad.sequences(), [&](const Shard& s, Lm& mm, Be& b) {
      const std::span<const std::int32_t> ids(bad.ids.data() + std::size_t(s.begin) * T, std::size_t(s.size()) * T);
      mm.forward(b, ids, Shape{s.size(), T});
    });
    BOOST_FAIL("an out-of-range token id in shard 1 was not reported");
  } catch (const Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    BOOST_TEST(std::string(e.what()).find("-3") != std::string::npos);
  }
  BOOST_CHECK_THROW(dp.forward(0, [](const Shard&, Lm&, Be&) {}), Error);
}

// The default shard count: one a thread for small models, one (each
// operation threaded instead) past kShardMaxParameterBytes of parameters.
BOOST_AUTO_TEST_CASE(default_shards_follow_the_model_size) {
  using DP = DataParallel<Lm, Be>;
  BOOST_TEST(DP::default_shards(2, 1000) == 2);
  BOOST_TEST(DP::default_shards(4, DP::kShardMaxParameterBytes) == 4);
  BOOST_TEST(DP::default_shards(4, DP::kShardMaxParameterBytes + 1) == 1);
  BOOST_TEST(DP::default_shards(0, 1000) == 1);
  Be be;
  Lm model(V, 1);
  DP dp(model, be, [] { return std::make_unique<Lm>(V, 0); });
  BOOST_TEST(dp.shards() == std::max(1, be.threads()));  // a tiny model splits
}

BOOST_AUTO_TEST_SUITE_END()
