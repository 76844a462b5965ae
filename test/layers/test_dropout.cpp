#include "support/gradcheck.hpp"
#include "xfmr/layers/dropout.hpp"

BOOST_AUTO_TEST_SUITE(test_dropout)

using namespace xfmr;
using namespace xfmr::test;

BOOST_AUTO_TEST_CASE(dropout_gradients_with_a_fixed_mask) {
  Rng rng(1);
  Be be;
  Dropout<6, Be> drop(0.3f, 42);
  GradCase c;
  c.name = "Dropout<6> p=0.3";
  c.input("x", 8 * 6, rng);
  c.output(8 * 6, rng);
  // Each forward is the same call number, so every evaluation sees one mask.
  c.forward = [&] {
    drop.set_calls(5);
    drop.forward(be, crows_of<6>(c.x[0]), rows_of<6>(c.y));
  };
  c.backward = [&] { drop.backward(be, crows_of<6>(c.dy), rows_of<6>(c.dx[0])); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(dropout_rate_scale_and_determinism) {
  CpuBackend<float> be;
  const int rows = 1000;
  std::vector<float> x(rows * 8, 1.0f), y1(x.size()), y2(x.size()), y3(x.size());
  Dropout<8, CpuBackend<float>> a(0.25f, 7), b(0.25f, 7);
  a.forward(be, ConstRows<float, 8>(x.data(), rows), Rows<float, 8>(y1.data(), rows));
  b.forward(be, ConstRows<float, 8>(x.data(), rows), Rows<float, 8>(y2.data(), rows));
  a.forward(be, ConstRows<float, 8>(x.data(), rows), Rows<float, 8>(y3.data(), rows));
  BOOST_TEST(y1 == y2, boost::test_tools::per_element());  // same seed, same call: same mask
  BOOST_TEST((y1 != y3));                                   // next call: a new mask
  std::size_t zeros = 0;
  for (float v : y1) {
    BOOST_TEST((v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f));
    zeros += v == 0.0f;
  }
  const double rate = double(zeros) / y1.size();
  BOOST_TEST(std::abs(rate - 0.25) < 0.02, "observed drop rate " << rate);
}

BOOST_AUTO_TEST_CASE(dropout_is_identity_in_evaluation) {
  CpuBackend<float> be;
  Dropout<4, CpuBackend<float>> d(0.5f, 3);
  d.set_training(false);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, y(8);
  d.forward(be, ConstRows<float, 4>(x.data(), 2), Rows<float, 4>(y.data(), 2));
  BOOST_TEST(y == x, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(dropout_mask_does_not_depend_on_thread_count) {
  CpuBackend<float> be;
  const int rows = 4096;  // large enough to run in parallel
  std::vector<float> x(rows * 16, 1.0f), y_many(x.size()), y_one(x.size());
  Dropout<16, CpuBackend<float>> d(0.1f, 99);
  d.forward(be, ConstRows<float, 16>(x.data(), rows), Rows<float, 16>(y_many.data(), rows));
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  d.set_calls(0);
  d.forward(be, ConstRows<float, 16>(x.data(), rows), Rows<float, 16>(y_one.data(), rows));
#ifdef _OPENMP
  omp_set_num_threads(saved);
#endif
  BOOST_TEST(y_many == y_one, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(dropout_rejects_bad_probability) {
  BOOST_CHECK_THROW((Dropout<4, CpuBackend<float>>(1.0f, 1)), Error);
  BOOST_CHECK_THROW((Dropout<4, CpuBackend<float>>(-0.1f, 1)), Error);
}

BOOST_AUTO_TEST_SUITE_END()
