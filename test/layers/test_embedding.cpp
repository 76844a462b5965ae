#include "support/gradcheck.hpp"
#include "xfmr/layers/embedding.hpp"

BOOST_AUTO_TEST_SUITE(test_embedding)

using namespace xfmr;
using namespace xfmr::test;

BOOST_AUTO_TEST_CASE(embedding_gradients_with_repeated_ids) {
  Rng rng(1);
  Be be;
  Embedding<4, Be> emb(7, rng);
  const std::vector<std::int32_t> ids = {3, 0, 3, 6, 1, 3};  // 3 repeats: scatter-add must sum
  GradCase c;
  c.name = "Embedding<4> vocab 7";
  c.output(ids.size() * 4, rng);
  c.forward = [&] { emb.forward(be, ids, rows_of<4>(c.y)); };
  c.backward = [&] { emb.backward(be, crows_of<4>(c.dy)); };
  c.visit = [&](const ParamFn& f) { emb.visit(f); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(embedding_gathers_rows) {
  Rng rng(2);
  CpuBackend<float> be;
  Embedding<3, CpuBackend<float>> emb(5, rng);
  const std::vector<std::int32_t> ids = {4, 2};
  std::vector<float> y(6);
  emb.forward(be, ids, Rows<float, 3>(y.data(), 2));
  const float* w = nullptr;
  emb.visit([&](std::string_view, auto& v, auto&) { w = v.data(); });
  for (int d = 0; d < 3; ++d) {
    BOOST_TEST(y[d] == w[4 * 3 + d]);
    BOOST_TEST(y[3 + d] == w[2 * 3 + d]);
  }
}

BOOST_AUTO_TEST_CASE(embedding_rejects_out_of_range_ids) {
  Rng rng(3);
  CpuBackend<float> be;
  Embedding<3, CpuBackend<float>> emb(65, rng);
  std::vector<float> y(9);
  for (std::int32_t bad : {65, 70, -1}) {
    const std::vector<std::int32_t> ids = {1, bad, 2};
    try {
      emb.forward(be, ids, Rows<float, 3>(y.data(), 3));
      BOOST_FAIL("id " << bad << " was accepted");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()) ==
                 "token id " + std::to_string(bad) + " at position 1 out of range [0, 65)");
    }
  }
  BOOST_CHECK_THROW((Embedding<3, CpuBackend<float>>(0, rng)), Error);
}

BOOST_AUTO_TEST_SUITE_END()
