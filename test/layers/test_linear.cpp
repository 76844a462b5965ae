#include "support/gradcheck.hpp"
#include "xfmr/layers/linear.hpp"

BOOST_AUTO_TEST_SUITE(test_linear)

using namespace xfmr;
using namespace xfmr::test;

BOOST_AUTO_TEST_CASE(linear_gradients_with_bias) {
  Rng rng(1);
  Be be;
  Linear<5, 3, Be> lin(rng);
  GradCase c;
  c.name = "Linear<5,3>";
  c.input("x", 4 * 5, rng);
  c.output(4 * 3, rng);
  c.forward = [&] { lin.forward(be, crows_of<5>(c.x[0]), rows_of<3>(c.y)); };
  c.backward = [&] { lin.backward(be, crows_of<3>(c.dy), rows_of<5>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { lin.visit(f); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(linear_gradients_without_bias) {
  Rng rng(2);
  Be be;
  Linear<4, 6, Be> lin(rng, /*with_bias=*/false);
  BOOST_TEST(parameter_count(lin) == 24u);
  GradCase c;
  c.name = "Linear<4,6> no bias";
  c.input("x", 3 * 4, rng);
  c.output(3 * 6, rng);
  c.forward = [&] { lin.forward(be, crows_of<4>(c.x[0]), rows_of<6>(c.y)); };
  c.backward = [&] { lin.backward(be, crows_of<6>(c.dy), rows_of<4>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { lin.visit(f); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(linear_matches_definition) {
  Rng rng(3);
  CpuBackend<float> be;
  Linear<3, 2, CpuBackend<float>> lin(rng);
  std::vector<float> x = {1, 2, 3, -1, 0, 0.5f}, y(4);
  lin.forward(be, ConstRows<float, 3>(x.data(), 2), Rows<float, 2>(y.data(), 2));
  std::vector<std::string> names;
  const float *w = nullptr, *b = nullptr;
  lin.visit([&](std::string_view n, auto& v, auto&) {
    names.emplace_back(n);
    (n == "weight" ? w : b) = v.data();
  });
  BOOST_TEST((names == std::vector<std::string>{"weight", "bias"}));
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 2; ++o) {
      double want = b[o], magnitude = std::abs(b[o]);
      for (int i = 0; i < 3; ++i) {
        want += double(x[r * 3 + i]) * w[o * 3 + i];
        magnitude += std::abs(double(x[r * 3 + i]) * w[o * 3 + i]);
      }
      BOOST_TEST(std::abs(y[r * 2 + o] - want) <= 1e-6 * magnitude);
    }
}

BOOST_AUTO_TEST_CASE(linear_rejects_mismatched_buffers) {
  Rng rng(4);
  CpuBackend<float> be;
  Linear<3, 2, CpuBackend<float>> lin(rng);
  std::vector<float> x(6), y(6);
  try {
    lin.forward(be, ConstRows<float, 3>(x.data(), 2), Rows<float, 2>(y.data(), 3));
    BOOST_FAIL("mismatched output rows were accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "Linear output has 3 rows, expected 2");
  }
  Tensor<float> t{4, 5};
  BOOST_CHECK_THROW(t.rows<3>(), Error);  // width 5 viewed as 3
}

BOOST_AUTO_TEST_SUITE_END()
