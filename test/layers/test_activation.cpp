#include <cmath>

#include "support/gradcheck.hpp"
#include "xfmr/layers/activation.hpp"

BOOST_AUTO_TEST_SUITE(test_activation)

using namespace xfmr;
using namespace xfmr::test;

template <class Kind>
void check_activation(const char* name) {
  Rng rng(11);
  Be be;
  Activation<Kind, 7, Be> act;
  GradCase c;
  c.name = name;
  c.input("x", 3 * 7, rng, 3.0);
  // Keep ReLU inputs away from its kink, where a central difference is meaningless.
  for (auto& v : c.x[0])
    if (std::abs(v) < 1e-3) v += 0.01;
  c.output(3 * 7, rng);
  c.forward = [&] { act.forward(be, crows_of<7>(c.x[0]), rows_of<7>(c.y)); };
  c.backward = [&] { act.backward(be, crows_of<7>(c.dy), rows_of<7>(c.dx[0])); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(relu_gradients) { check_activation<Relu>("ReLU"); }
BOOST_AUTO_TEST_CASE(gelu_gradients) { check_activation<Gelu>("GELU (tanh)"); }

BOOST_AUTO_TEST_CASE(gelu_matches_tanh_formula) {
  CpuBackend<double> be;
  const std::vector<double> x = {-3.0, -1.0, -0.1, 0.0, 0.5, 2.0};
  std::vector<double> y(x.size());
  be.gelu_forward(x.size(), x.data(), y.data());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    BOOST_TEST(y[i] == want, boost::test_tools::tolerance(1e-14));
  }
  // Known values of torch.nn.functional.gelu(x, approximate="tanh").
  BOOST_TEST(y[1] == -0.15880800939172324, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(y[5] == 1.954597694087775, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(relu_zeroes_negatives) {
  CpuBackend<float> be;
  const std::vector<float> x = {-2, -0.0f, 0.5f, 3};
  std::vector<float> y(4);
  be.relu_forward(4, x.data(), y.data());
  BOOST_TEST(y == (std::vector<float>{0, 0, 0.5f, 3}), boost::test_tools::per_element());
}

// GeGLU's backend ops on rows of [gate | up]: the gradient in double, and
// the formula gelu(g) u with GELU's tanh form.
// A gated activation's backward written over its input (dh = h: the
// feed-forward's under block recompute) gives the bits it gives apart, in
// double and in float.
template <class Kind>
void check_in_place(int rows, int n) {
  const auto check = [&]<class S>(S) {
    Rng rng(14);
    CpuBackend<S> be;
    std::vector<S> h(std::size_t(rows) * 2 * n), dy(std::size_t(rows) * n), apart(h.size());
    for (auto& v : h) v = S(3.0 * rng.normal());
    for (auto& v : dy) v = S(rng.normal());
    Kind::backward(be, rows, n, h.data(), dy.data(), apart.data());
    Kind::backward(be, rows, n, h.data(), dy.data(), h.data());
    BOOST_TEST(h == apart, boost::test_tools::per_element());
  };
  check(0.0);
  check(0.0f);
}

BOOST_AUTO_TEST_CASE(geglu_gradients_and_formula) {
  Rng rng(13);
  Be be;
  const int rows = 3, n = 5;
  GradCase c;
  c.name = "GeGLU";
  c.input("h", rows * 2 * n, rng, 3.0);
  c.output(rows * n, rng);
  c.forward = [&] { GeGlu::forward(be, rows, n, c.x[0].data(), c.y.data()); };
  c.backward = [&] { GeGlu::backward(be, rows, n, c.x[0].data(), c.dy.data(), c.dx[0].data()); };
  check_case(c);
  check_in_place<GeGlu>(rows, 37);
  c.forward();
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < n; ++j) {
      const double g = c.x[0][r * 2 * n + j], u = c.x[0][r * 2 * n + n + j];
      const double gelu = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
      BOOST_TEST(c.y[r * n + j] == gelu * u, boost::test_tools::tolerance(1e-13));
    }
}

// SwiGLU's backend ops on rows of [gate | up]: the gradient in double, and
// the formula silu(g) u = g u / (1 + exp(-g)).
BOOST_AUTO_TEST_CASE(swiglu_gradients_and_formula) {
  Rng rng(12);
  Be be;
  const int rows = 3, n = 5;
  GradCase c;
  c.name = "SwiGLU";
  c.input("h", rows * 2 * n, rng, 3.0);
  c.output(rows * n, rng);
  c.forward = [&] { SwiGlu::forward(be, rows, n, c.x[0].data(), c.y.data()); };
  c.backward = [&] { SwiGlu::backward(be, rows, n, c.x[0].data(), c.dy.data(), c.dx[0].data()); };
  check_case(c);
  check_in_place<SwiGlu>(rows, 37);
  c.forward();
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < n; ++j) {
      const double g = c.x[0][r * 2 * n + j], u = c.x[0][r * 2 * n + n + j];
      BOOST_TEST(c.y[r * n + j] == g * u / (1 + std::exp(-g)), boost::test_tools::tolerance(1e-14));
    }
}

BOOST_AUTO_TEST_SUITE_END()
