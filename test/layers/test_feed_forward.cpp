#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/layers/feed_forward.hpp"

BOOST_AUTO_TEST_SUITE(test_feed_forward)

using namespace xfmr;
using namespace xfmr::test;

template <class Cfg>
void check_ff(const char* name) {
  constexpr int D = Cfg::D_MODEL;
  Rng rng(5);
  Be be;
  FeedForward<Cfg, Be> ff(rng);
  GradCase c;
  c.name = name;
  c.input("x", 5 * D, rng);
  c.output(5 * D, rng);
  c.forward = [&] { ff.forward(be, crows_of<D>(c.x[0]), rows_of<D>(c.y)); };
  c.backward = [&] { ff.backward(be, crows_of<D>(c.dy), rows_of<D>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { ff.visit(f); };
  check_case(c);
}

BOOST_AUTO_TEST_CASE(feed_forward_gelu_gradients) { check_ff<TinyPre>("FeedForward GELU"); }
BOOST_AUTO_TEST_CASE(feed_forward_relu_gradients) { check_ff<TinyPost>("FeedForward ReLU"); }
BOOST_AUTO_TEST_CASE(feed_forward_swiglu_gradients) { check_ff<TinyLlama>("FeedForward SwiGLU"); }
struct TinyGeglu : TinyPre {
  using Activation = GeGlu;
};
BOOST_AUTO_TEST_CASE(feed_forward_geglu_gradients) { check_ff<TinyGeglu>("FeedForward GeGLU"); }

BOOST_AUTO_TEST_CASE(feed_forward_parameter_names) {
  Rng rng(1);
  FeedForward<TinyPre, Be> ff(rng);
  std::vector<std::string> names;
  ff.visit([&](std::string_view n, auto&, auto&) { names.emplace_back(n); });
  BOOST_TEST((names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  BOOST_TEST(parameter_count(ff) == std::size_t(12 * 8 + 12 + 8 * 12 + 8));
}

// SwiGLU: fc1 holds [gate; up], twice D_FF rows; TinyLlama has no biases.
BOOST_AUTO_TEST_CASE(feed_forward_swiglu_shapes_without_biases) {
  Rng rng(1);
  FeedForward<TinyLlama, Be> ff(rng);
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes;
  ff.visit([&](std::string_view n, auto& v, auto&) {
    names.emplace_back(n);
    shapes.push_back(v.shape());
  });
  BOOST_TEST((names == std::vector<std::string>{"fc1.weight", "fc2.weight"}));
  BOOST_TEST((shapes[0] == std::vector<std::int64_t>{24, 8}));
  BOOST_TEST(parameter_count(ff) == std::size_t(24 * 8 + 8 * 12));
}

BOOST_AUTO_TEST_SUITE_END()
