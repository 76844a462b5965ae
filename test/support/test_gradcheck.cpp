// Negative controls: the checker must reject wrong gradients, or every
// passing gradient check in this suite would mean nothing.
#include "support/gradcheck.hpp"
#include "xfmr/layers/linear.hpp"

BOOST_AUTO_TEST_SUITE(test_gradcheck)

using namespace xfmr;
using namespace xfmr::test;

namespace {
GradCase linear_case(Linear<4, 3, Be>& lin, Be& be, Rng& rng) {
  GradCase c;
  c.name = "Linear<4,3>";
  c.input("x", 2 * 4, rng);
  c.output(2 * 3, rng);
  c.forward = [&] { lin.forward(be, crows_of<4>(c.x[0]), rows_of<3>(c.y)); };
  c.backward = [&] { lin.backward(be, crows_of<3>(c.dy), rows_of<4>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { lin.visit(f); };
  return c;
}
}  // namespace

BOOST_AUTO_TEST_CASE(correct_gradients_pass) {
  Rng rng(1);
  Be be;
  Linear<4, 3, Be> lin(rng);
  GradCase c = linear_case(lin, be, rng);
  const CheckResult r = numeric_check(c);
  BOOST_TEST(r.ok());
  BOOST_TEST(r.checked == 8u + 12u + 3u);
  BOOST_TEST(r.worst < 1e-7);  // far inside the 1e-5 bound
}

BOOST_AUTO_TEST_CASE(one_wrong_element_fails) {
  Rng rng(1);
  Be be;
  Linear<4, 3, Be> lin(rng);
  GradCase c = linear_case(lin, be, rng);
  auto probes = analytic_gradients(c);
  probes[1].analytic[5] *= 1.001;  // weight[5] off by 0.1%
  const CheckResult r = finite_differences([&] { c.forward(); return dot(c.y, c.dy); }, probes, Tolerance{});
  BOOST_TEST(!r.ok());
  BOOST_TEST(r.failures.size() == 1u);
  BOOST_TEST(r.failures.front().rfind("weight[5]", 0) == 0u, r.failures.front());
}

BOOST_AUTO_TEST_CASE(a_backward_that_forgets_the_bias_fails) {
  Rng rng(2);
  Be be;
  Linear<4, 3, Be> lin(rng);
  GradCase c = linear_case(lin, be, rng);
  c.backward = [&] {
    lin.backward(be, crows_of<3>(c.dy), rows_of<4>(c.dx[0]));
    lin.visit([](std::string_view n, auto&, auto& g) {
      if (n == "bias") g.zero();  // the bug
    });
  };
  const CheckResult r = numeric_check(c);
  BOOST_TEST(!r.ok());
  BOOST_TEST(r.failures.front().rfind("bias[", 0) == 0u, r.failures.front());
}

BOOST_AUTO_TEST_CASE(relative_error_uses_the_floor_for_tiny_gradients) {
  BOOST_TEST(relative_error(1.0, 1.0 + 1e-6, 1e-4) == 1e-6 / (1.0 + 1e-6), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(relative_error(0.0, 1e-10, 1e-4) == 1e-6, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_SUITE_END()
