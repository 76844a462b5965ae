#define BOOST_TEST_MODULE layer_norm
#include "support/gradcheck.hpp"
#include "xfmr/layers/layer_norm.hpp"

using namespace xfmr;
using namespace xfmr::test;

BOOST_AUTO_TEST_CASE(layer_norm_gradients) {
  Rng rng(1);
  Be be;
  LayerNorm<6, Be> ln;
  // Non-trivial affine parameters, so dx depends on them.
  ln.visit([&](std::string_view, auto& v, auto&) {
    for (auto& e : v) e += 0.5 * rng.uniform(-1, 1);
  });
  GradCase c;
  c.name = "LayerNorm<6>";
  c.input("x", 5 * 6, rng, 2.0);
  c.output(5 * 6, rng);
  c.forward = [&] { ln.forward(be, crows_of<6>(c.x[0]), rows_of<6>(c.y)); };
  c.backward = [&] { ln.backward(be, crows_of<6>(c.dy), rows_of<6>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { ln.visit(f); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(layer_norm_normalises_rows) {
  CpuBackend<float> be;
  LayerNorm<4, CpuBackend<float>> ln;
  std::vector<float> x = {1, 2, 3, 4, -5, 0, 5, 10}, y(8);
  ln.forward(be, ConstRows<float, 4>(x.data(), 2), Rows<float, 4>(y.data(), 2));
  for (int r = 0; r < 2; ++r) {
    float mean = 0, var = 0;
    for (int i = 0; i < 4; ++i) mean += y[r * 4 + i] / 4;
    for (int i = 0; i < 4; ++i) var += (y[r * 4 + i] - mean) * (y[r * 4 + i] - mean) / 4;
    BOOST_TEST(std::abs(mean) < 1e-6f);
    BOOST_TEST(std::abs(var - 1.0f) < 1e-4f);  // eps = 1e-5 shrinks it slightly
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_backward_may_overwrite_its_gradient_input) {
  Rng rng(2);
  Be be;
  LayerNorm<5, Be> ln;
  Vec x = random_vector(15, rng), y(15), dy = random_vector(15, rng), dx(15);
  ln.forward(be, crows_of<5>(x), rows_of<5>(y));
  ln.backward(be, crows_of<5>(dy), rows_of<5>(dx));
  Vec inplace = dy;
  ln.backward(be, crows_of<5>(inplace), rows_of<5>(inplace));
  BOOST_TEST(inplace == dx, boost::test_tools::per_element());
}
