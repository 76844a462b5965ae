// infer/translate.hpp: batched translation is each sentence's own beam
// search; how sentences are batched (and so padded) changes nothing.
#include <boost/test/unit_test.hpp>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/translate.hpp"
#include "xfmr/models/seq2seq.hpp"

BOOST_AUTO_TEST_SUITE(test_translate)

using namespace xfmr;
using Be = CpuBackend<float>;

namespace {
struct Tiny {
  static constexpr int MAX_T = 24, D_MODEL = 32, N_HEADS = 2, N_LAYERS = 2, D_FF = 48;
  using Norm = PreNorm;
  using Activation = Relu;
  using Positions = Sinusoidal;
};
}  // namespace

BOOST_AUTO_TEST_CASE(batching_changes_no_translation) {
  const int V = 29;
  Seq2Seq<Tiny, Tiny, Be> model(V, V, 5);
  // Larger weights than the initialisation, so that translations differ by source.
  Rng rng(3);
  model.visit([&](std::string_view, auto& value, auto&) {
    for (auto& v : value) v += float(0.3 * rng.uniform(-1, 1));
  });
  std::vector<std::vector<std::int32_t>> sources;
  for (int n : {3, 9, 5, 12, 1, 7, 4}) {
    std::vector<std::int32_t> s(n);
    for (auto& id : s) id = std::int32_t(3 + rng.below(V - 3));
    sources.push_back(s);
  }
  Be be;
  for (int beam : {1, 3}) {
    const BeamOptions opts{.beam = beam, .max_len = 16, .bos = 1, .eos = 2};
    const auto one = translate(model, be, std::span(sources), 0, opts, 1);
    const auto all = translate(model, be, std::span(sources), 0, opts, 4);
    BOOST_REQUIRE_EQUAL(one.size(), sources.size());
    BOOST_REQUIRE_EQUAL(all.size(), sources.size());
    std::size_t distinct = 0;
    for (std::size_t i = 0; i < sources.size(); ++i) {
      BOOST_TEST(one[i].tokens == all[i].tokens, boost::test_tools::per_element());
      BOOST_TEST(std::abs(one[i].score - all[i].score) < 1e-4);
      distinct += i > 0 && one[i].tokens != one[0].tokens;
    }
    BOOST_TEST(distinct > 0u);  // the sources' translations differ (not a constant output)
  }
}

BOOST_AUTO_TEST_SUITE_END()
