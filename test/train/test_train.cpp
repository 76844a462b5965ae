#include <cmath>

#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/gradients.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/schedules.hpp"

BOOST_AUTO_TEST_SUITE(test_train)

using namespace xfmr;
using namespace xfmr::test;
namespace tt = boost::test_tools;

namespace {
// One named parameter, to drive optimizers against torch's numbers.
struct OneTensor {
  Tensor<double> value{3}, grad{3};
  std::string name = "w.weight";
  template <class F>
  void visit(F&& f) {
    f(name, value, grad);
  }
};
const std::vector<std::vector<double>> kGrads = {{0.1, 0.2, -0.3}, {-0.5, 0.05, 0.2}, {0.3, -0.1, 0.0}};
}  // namespace

BOOST_AUTO_TEST_CASE(adamw_matches_torch) {
  OneTensor m;
  m.value.resize({1, 3});  // a matrix, so weight decay applies
  m.grad.resize({1, 3});
  m.value[0] = 1.0, m.value[1] = -2.0, m.value[2] = 3.0;
  Be be;
  AdamW<Be> opt(m, {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  for (const auto& g : kGrads) {
    std::copy(g.begin(), g.end(), m.grad.begin());
    opt.step(be, 0.1);
  }
  // torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), float64
  const Vec want = {0.9644319304790916, -2.206637953116517, 3.1164181723224544};
  BOOST_TEST(Vec(m.value.begin(), m.value.end()) == want, tt::tolerance(1e-13) << tt::per_element());
  BOOST_TEST(opt.steps() == 3);
  std::vector<std::string> state;
  opt.visit_state([&](const std::string& n, auto&) { state.push_back(n); });
  BOOST_TEST((state == std::vector<std::string>{"w.weight.exp_avg", "w.weight.exp_avg_sq"}));
}

BOOST_AUTO_TEST_CASE(sgd_momentum_matches_torch) {
  OneTensor m;
  m.value.resize({1, 3});
  m.grad.resize({1, 3});
  m.value[0] = 1.0, m.value[1] = -2.0, m.value[2] = 3.0;
  Be be;
  Sgd<Be> opt(m, {.momentum = 0.9, .weight_decay = 0.01});
  for (const auto& g : kGrads) {
    std::copy(g.begin(), g.end(), m.grad.begin());
    opt.step(be, 0.1);
  }
  const Vec want = {1.032282789, -2.0424086179999996, 3.026390427};  // torch.optim.SGD, same settings
  BOOST_TEST(Vec(m.value.begin(), m.value.end()) == want, tt::tolerance(1e-13) << tt::per_element());
}

BOOST_AUTO_TEST_CASE(weight_decay_skips_biases_norms_and_embeddings) {
  Decoder<TinyPre, Be> model(5, 1);
  AdamW<Be> opt(model);
  BOOST_TEST(opt.decays("blocks.0.attn.qkv.weight"));
  BOOST_TEST(opt.decays("lm_head.weight"));
  BOOST_TEST(!opt.decays("blocks.0.attn.qkv.bias"));
  BOOST_TEST(!opt.decays("blocks.0.ln1.weight"));
  BOOST_TEST(!opt.decays("ln_f.weight"));
  BOOST_TEST(!opt.decays("tok_emb.weight"));
  BOOST_TEST(!opt.decays("pos_emb.weight"));
  BOOST_CHECK_THROW(opt.decays("nope"), Error);
}

BOOST_AUTO_TEST_CASE(schedules) {
  const auto one = LrSchedule::parse("onecycle", 0.01, 100);
  // torch.optim.lr_scheduler.OneCycleLR(max_lr=0.01, total_steps=100)
  BOOST_TEST(one.at(0) == 0.0004, tt::tolerance(1e-12));
  BOOST_TEST(one.at(10) == 0.002951639484641007, tt::tolerance(1e-12));
  BOOST_TEST(one.at(29) == 0.01, tt::tolerance(1e-12));
  BOOST_TEST(one.at(30) == 0.009994965352845242, tt::tolerance(1e-12));
  BOOST_TEST(one.at(50) == 0.00793893450575732, tt::tolerance(1e-12));
  BOOST_TEST(one.at(99) == 4e-08, tt::tolerance(1e-9));

  const auto cos = LrSchedule::parse("cosine", 1e-3, 1000);  // warmup 100, min 1e-4
  BOOST_TEST(cos.at(0) == 1e-5, tt::tolerance(1e-12));
  BOOST_TEST(cos.at(99) == 1e-3, tt::tolerance(1e-12));
  BOOST_TEST(cos.at(550) == 5.5e-4, tt::tolerance(1e-9));
  BOOST_TEST(cos.at(1000) == 1e-4, tt::tolerance(1e-12));
  BOOST_TEST(LrSchedule::parse("constant", 3e-4, 10).at(7) == 3e-4);
  try {
    LrSchedule::parse("linear", 1e-3, 10);
    BOOST_FAIL("unknown schedule accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "unknown schedule 'linear' (expected constant, cosine or onecycle)");
  }
}

BOOST_AUTO_TEST_CASE(clipping_and_non_finite_gradients) {
  Be be;
  Decoder<TinyPre, Be> model(5, 2);
  double expect = 0;
  model.visit([&](std::string_view, auto&, auto& g) {
    for (auto& v : g) {
      v = 0.5;
      expect += 0.25;
    }
  });
  const double norm = clip_gradients(be, model, 1.0);
  BOOST_TEST(norm == std::sqrt(expect), tt::tolerance(1e-12));
  BOOST_TEST(gradient_norm(be, model) == 1.0, tt::tolerance(1e-5));
  model.visit([&](std::string_view name, auto&, auto& g) {
    if (name == "blocks.0.ff.fc1.bias") g[3] = std::nan("");
  });
  try {
    gradient_norm(be, model);
    BOOST_FAIL("NaN gradient accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).rfind("non-finite gradient in 'blocks.0.ff.fc1.bias'", 0) == 0u, e.what());
  }
  BOOST_TEST(first_non_finite_parameter(be, model) == "");
  model.visit([&](std::string_view name, auto& v, auto&) {
    if (name == "ln_f.bias") v[0] = INFINITY;
  });
  BOOST_TEST(first_non_finite_parameter(be, model) == "ln_f.bias");
}

BOOST_AUTO_TEST_CASE(loss_scale_and_accuracy) {
  Be be;
  const Vec logits = {2.0, 0.5, -1.0, 0.1, 0.3, 0.2};
  const std::vector<std::int32_t> targets = {0, 2};
  CrossEntropyLoss<Be> ce;
  const double loss = ce.forward(be, logits, targets, 3);
  Vec d1(6), d2(6);
  ce.backward(be, d1);
  ce.backward(be, d2, 0.25);  // one of 4 micro-batches
  for (int i = 0; i < 6; ++i) BOOST_TEST(d2[i] == 0.25 * d1[i], tt::tolerance(1e-15));
  BOOST_TEST(loss > 0.0);
  const auto acc = accuracy<double>(logits, targets, 3);
  BOOST_TEST(acc.correct == 1);  // row 0 right (class 0), row 1 predicts 1, not 2
  BOOST_TEST(acc.counted == 2);
  BOOST_CHECK_THROW(ce.forward(be, logits, targets, 4), Error);
}

BOOST_AUTO_TEST_CASE(decoder_learns_a_repeating_sequence) {
  // Smoke test of the whole loop: forward, loss, backward, clip, AdamW.
  using F = CpuBackend<float>;
  F be;
  Decoder<TinyPre, F> model(5, 3);
  AdamW<F> opt(model);
  CrossEntropyLoss<F> ce;
  const Shape bt{4, 6};
  std::vector<std::int32_t> ids(bt.rows()), targets(bt.rows());
  for (int b = 0; b < bt.B; ++b)
    for (int t = 0; t < bt.T; ++t) {
      ids[b * bt.T + t] = (b + t) % 5;
      targets[b * bt.T + t] = (b + t + 1) % 5;
    }
  std::vector<float> dlogits(bt.rows() * 5);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    zero_grad(model);
    const auto logits = model.forward(be, ids, bt);
    const double loss = ce.forward(be, logits, targets, 5);
    ce.backward(be, dlogits);
    model.backward(be, dlogits);
    clip_gradients(be, model, 1.0);
    opt.step(be, 1e-2);
    (step == 0 ? first : last) = loss;
  }
  BOOST_TEST(first > 1.3);  // about log(5) at the start
  BOOST_TEST(last < 0.05, "loss went from " << first << " to " << last);
}

BOOST_AUTO_TEST_SUITE_END()
