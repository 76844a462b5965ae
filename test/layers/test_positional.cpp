#include <cmath>

#include "support/gradcheck.hpp"
#include "xfmr/layers/positional.hpp"

BOOST_AUTO_TEST_SUITE(test_positional)

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

// Rotary positions: each pair (2i, 2i+1) of each head turned by
// pos / 10000^(2i/HD); columns past the heads untouched; backward is the
// transpose (<R x, g> = <x, R^T g>) and undoes the turn; a query-key dot
// product depends on the positions' difference only; positions past MAX_T
// are refused.
BOOST_AUTO_TEST_CASE(rotary_positions_turn_pairs_by_their_angles) {
  Be be;
  Rng rng(3);
  RotaryPositions<9, 4, Be> rope;
  const int B = 2, T = 5, H = 3, ld = H * 4 + 2, offset = 2;
  const Vec x = random_vector(std::size_t(B) * T * ld, rng);
  Vec y = x;
  rope.forward(be, B, T, offset, H, y.data(), ld);
  for (int r = 0; r < B * T; ++r) {
    const double pos = offset + r % T;
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < 4; i += 2) {
        const double a = pos / std::pow(10000.0, i / 4.0), x0 = x[r * ld + h * 4 + i], x1 = x[r * ld + h * 4 + i + 1];
        BOOST_TEST(y[r * ld + h * 4 + i] == x0 * std::cos(a) - x1 * std::sin(a), boost::test_tools::tolerance(1e-12));
        BOOST_TEST(y[r * ld + h * 4 + i + 1] == x0 * std::sin(a) + x1 * std::cos(a),
                   boost::test_tools::tolerance(1e-12));
      }
    for (int c = H * 4; c < ld; ++c) BOOST_TEST(y[r * ld + c] == x[r * ld + c]);
  }
  const Vec g = random_vector(x.size(), rng);
  Vec gt = g;
  rope.backward(be, B, T, offset, H, gt.data(), ld);
  BOOST_TEST(dot(y, g) == dot(x, gt), boost::test_tools::tolerance(1e-12));
  rope.backward(be, B, T, offset, H, y.data(), ld);
  BOOST_TEST(y == x, boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());

  // One query and one key head, turned at positions (4, 1) and (7, 4): the same dot product.
  const Vec q = random_vector(4, rng), k = random_vector(4, rng);
  auto turned_dot = [&](int pq, int pk) {
    Vec qq = q, kk = k;
    rope.forward(be, 1, 1, pq, 1, qq.data(), 4);
    rope.forward(be, 1, 1, pk, 1, kk.data(), 4);
    return dot(qq, kk);
  };
  BOOST_TEST(turned_dot(4, 1) == turned_dot(7, 4), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(std::abs(turned_dot(4, 1) - turned_dot(4, 2)) > 1e-6);
  Vec row(4);
  BOOST_CHECK_THROW(rope.forward(be, 1, 2, 8, 1, row.data(), 4), Error);
}

BOOST_AUTO_TEST_SUITE_END()
