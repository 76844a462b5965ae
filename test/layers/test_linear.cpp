#include "support/errors.hpp"
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

// LoRA (layers/lora.hpp): adapters on two ranges of the outputs (as q and
// v of a fused qkv), B drawn too (it starts at zero): the gradients of the
// input, of A and B, and of the base when it is not frozen, in double.
BOOST_AUTO_TEST_CASE(lora_gradients) {
  for (const bool frozen : {false, true}) {
    Rng rng(4);
    Be be;
    Linear<5, 7, Be> lin(rng);
    auto& ad = lin.adapters();
    ad.add("q", 0, 3, 2, 0.75, rng);
    ad.add("v", 4, 3, 3, 1.5, rng);
    for (auto& x : ad.list()) x.b.generate([&] { return rng.uniform(-1, 1); });
    ad.freeze(frozen);
    GradCase c;
    c.name = frozen ? "Linear<5,7> LoRA, frozen base" : "Linear<5,7> LoRA";
    c.input("x", 4 * 5, rng);
    c.output(4 * 7, rng);
    c.forward = [&] { lin.forward(be, crows_of<5>(c.x[0]), rows_of<7>(c.y)); };
    c.backward = [&] { lin.backward(be, crows_of<7>(c.dy), rows_of<5>(c.dx[0])); };
    c.visit = [&](const ParamFn& f) {
      if (!frozen) lin.visit(f);
      ad.visit(f);
    };
    check_case(c);
    if (frozen)  // the base's gradients were never touched
      lin.visit([](std::string_view n, auto&, auto& g) { BOOST_TEST(g.allocated_bytes() == 0u, n); });
  }
}

// An adapted Linear gives what its merged weight gives: W + scale B A on
// the adapter's rows. Adapters refuse a rank past their widths and a
// range past the outputs.
BOOST_AUTO_TEST_CASE(lora_equals_its_merged_weight) {
  Rng rng(5);
  Be be;
  Linear<6, 8, Be> lin(rng), merged(rng);
  auto& ad = lin.adapters();
  ad.add("gate", 0, 4, 2, 2.0, rng);
  ad.add("up", 4, 4, 2, 0.5, rng);
  for (auto& x : ad.list()) x.b.generate([&] { return rng.uniform(-1, 1); });
  copy_parameters(lin, merged);
  for (const auto& x : ad.list())
    for (int o = 0; o < x.width; ++o)
      for (int i = 0; i < 6; ++i) {
        double d = 0;
        for (int k = 0; k < x.rank; ++k) d += x.b.data()[o * x.rank + k] * x.a.data()[k * 6 + i];
        merged.weight().data()[(x.begin + o) * 6 + i] += x.scale * d;
      }
  const Vec in = random_vector(3 * 6, rng);
  Vec y(3 * 8), want(3 * 8);
  lin.forward(be, crows_of<6>(in), rows_of<8>(y));
  merged.forward(be, crows_of<6>(in), rows_of<8>(want));
  for (std::size_t i = 0; i < y.size(); ++i) BOOST_TEST(std::abs(y[i] - want[i]) <= 1e-12);
  BOOST_TEST(error_of([&] { ad.add("k", 0, 4, 5, 1.0, rng); }).find("LoRA rank 5 outside [1, 4]") != std::string::npos);
  BOOST_TEST(error_of([&] { ad.add("k", 6, 4, 2, 1.0, rng); }).find("columns [6, 10) of a Linear with 8 outputs") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { ad.add("up", 0, 4, 2, 1.0, rng); }).find("a second LoRA adapter named up") !=
             std::string::npos);
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
