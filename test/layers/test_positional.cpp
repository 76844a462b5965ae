#define BOOST_TEST_MODULE positional
#include <cmath>

#include "support/gradcheck.hpp"
#include "xfmr/layers/positional.hpp"

using namespace xfmr;
using namespace xfmr::test;

BOOST_AUTO_TEST_CASE(learned_positions_gradients) {
  Rng rng(1);
  Be be;
  LearnedPositions<5, 4, Be> pos(rng);
  const Shape bt{3, 4};  // T < MAX_T: the last table row gets no gradient
  GradCase c;
  c.name = "LearnedPositions<5,4>";
  c.input("x", bt.rows() * 4, rng);
  c.output(bt.rows() * 4, rng);
  c.forward = [&] { pos.forward(be, crows_of<4>(c.x[0]), rows_of<4>(c.y), bt); };
  c.backward = [&] { pos.backward(be, crows_of<4>(c.dy), rows_of<4>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { pos.visit(f); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(sinusoidal_positions_gradients_and_table) {
  Be be;
  Rng rng(2);
  SinusoidalPositions<8, 6, Be> pos;
  const Shape bt{2, 8};
  GradCase c;
  c.name = "SinusoidalPositions<8,6>";
  c.input("x", bt.rows() * 6, rng);
  c.output(bt.rows() * 6, rng);
  c.forward = [&] { pos.forward(be, crows_of<6>(c.x[0]), rows_of<6>(c.y), bt); };
  c.backward = [&] { pos.backward(be, crows_of<6>(c.dy), rows_of<6>(c.dx[0])); };
  check_case(c);
  // PE(t, 2i) = sin(t / 10000^(2i/D)), PE(t, 2i+1) = cos(...)
  const auto& table = pos.table();
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < 3; ++i) {
      const double a = t / std::pow(10000.0, 2.0 * i / 6);
      BOOST_TEST(table[t * 6 + 2 * i] == std::sin(a), boost::test_tools::tolerance(1e-12));
      BOOST_TEST(table[t * 6 + 2 * i + 1] == std::cos(a), boost::test_tools::tolerance(1e-12));
    }
}

BOOST_AUTO_TEST_CASE(positions_reject_sequences_longer_than_max_t) {
  Rng rng(3);
  CpuBackend<float> be;
  LearnedPositions<32, 4, CpuBackend<float>> pos(rng);
  std::vector<float> x(40 * 4), y(40 * 4);
  try {
    pos.forward(be, ConstRows<float, 4>(x.data(), 40), Rows<float, 4>(y.data(), 40), Shape{1, 40});
    BOOST_FAIL("T = 40 > MAX_T = 32 was accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "sequence length 40 exceeds MAX_T 32");
  }
  // Rows that do not match B*T.
  BOOST_CHECK_THROW(pos.forward(be, ConstRows<float, 4>(x.data(), 40), Rows<float, 4>(y.data(), 40), Shape{2, 16}),
                    Error);
}
