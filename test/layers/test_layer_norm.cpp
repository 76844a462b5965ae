#include "support/gradcheck.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/rms_norm.hpp"

BOOST_AUTO_TEST_SUITE(test_layer_norm)

using namespace xfmr;
using namespace xfmr::test;

namespace {

// The gradient check of a norm over 6 features, with non-trivial parameters
// so that dx depends on them.
template <class Norm>
void check_norm_gradients(const char* name, std::uint64_t seed) {
  Rng rng(seed);
  Be be;
  Norm norm;
  norm.visit([&](std::string_view, auto& v, auto&) {
    for (auto& e : v) e += 0.5 * rng.uniform(-1, 1);
  });
  GradCase c;
  c.name = name;
  c.input("x", 5 * 6, rng, 2.0);
  c.output(5 * 6, rng);
  c.forward = [&] { norm.forward(be, crows_of<6>(c.x[0]), rows_of<6>(c.y)); };
  c.backward = [&] { norm.backward(be, crows_of<6>(c.dy), rows_of<6>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { norm.visit(f); };
  check_case(c);
}

// Blocks run a norm's backward in place (dx aliasing dy): the same dx.
template <class Norm>
void check_backward_in_place(std::uint64_t seed) {
  Rng rng(seed);
  Be be;
  Norm norm;
  Vec x = random_vector(15, rng), y(15), dy = random_vector(15, rng), dx(15);
  norm.forward(be, crows_of<5>(x), rows_of<5>(y));
  norm.backward(be, crows_of<5>(dy), rows_of<5>(dx));
  Vec inplace = dy;
  norm.backward(be, crows_of<5>(inplace), rows_of<5>(inplace));
  BOOST_TEST(inplace == dx, boost::test_tools::per_element());
}

}  // namespace

BOOST_AUTO_TEST_CASE(layer_norm_gradients) { check_norm_gradients<LayerNorm<6, Be>>("LayerNorm<6>", 1); }

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
  check_backward_in_place<LayerNorm<5, Be>>(2);
}

// RmsNorm (layers/rms_norm.hpp), the other norm of the Norm slot.
BOOST_AUTO_TEST_CASE(rms_norm_gradients) { check_norm_gradients<RmsNorm<6, Be>>("RmsNorm<6>", 3); }

BOOST_AUTO_TEST_CASE(rms_norm_scales_rows_to_unit_mean_square_without_centring) {
  CpuBackend<float> be;
  RmsNorm<4, CpuBackend<float>> rms(0.0f);
  std::vector<float> x = {1, 2, 3, 4, -5, 0, 5, 10}, y(8);
  rms.forward(be, ConstRows<float, 4>(x.data(), 2), Rows<float, 4>(y.data(), 2));
  for (int r = 0; r < 2; ++r) {
    float ms = 0;
    for (int i = 0; i < 4; ++i) ms += y[r * 4 + i] * y[r * 4 + i] / 4;
    BOOST_TEST(std::abs(ms - 1.0f) < 1e-6f);
    BOOST_TEST(y[r * 4] / y[r * 4 + 3] == x[r * 4] / x[r * 4 + 3], boost::test_tools::tolerance(1e-6f));
  }
  int params = 0;
  rms.visit([&](std::string_view name, auto& v, auto&) {
    BOOST_TEST(name == "weight");
    BOOST_TEST(v.size() == 4u);
    ++params;
  });
  BOOST_TEST(params == 1);
}

BOOST_AUTO_TEST_CASE(rms_norm_backward_may_overwrite_its_gradient_input) {
  check_backward_in_place<RmsNorm<5, Be>>(4);
}

BOOST_AUTO_TEST_SUITE_END()
