// The presets (presets.hpp: named values of the architecture) and the
// language models built of them at run time (models/language_model.hpp):
// every shipped name is found, each list is closed and names its choices,
// and each small preset builds a model of its known parameter count.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/presets.hpp"

BOOST_AUTO_TEST_SUITE(test_presets)

using namespace xfmr;
using Be = CpuBackend<float>;

namespace {
template <class List>
void check_list(const std::vector<std::string>& expected) {
  std::vector<std::string> names;
  for (std::string_view n : List::names()) names.emplace_back(n);
  BOOST_TEST(names == expected, boost::test_tools::per_element());
  BOOST_TEST(std::set<std::string>(names.begin(), names.end()).size() == names.size());  // unique
  std::string joined;
  for (const auto& n : names) {
    BOOST_TEST(List::contains(n));
    BOOST_TEST(List::info(n).name == n);  // info() finds each by its own name
    joined += (joined.empty() ? "" : ", ") + n;
  }
  BOOST_TEST(List::list() == joined);
  BOOST_TEST(!List::contains("nonesuch"));
  try {
    (void)List::info("nonesuch");
    BOOST_FAIL("an unknown preset was found");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "unknown model 'nonesuch' (choose from " + joined + ")");
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_shipped_lists) {
  check_list<LanguageModelPresets>({"tiny", "shakespeare-small", "shakespeare-llama", "names", "shakespeare-mid",
                                    "shakespeare-large", "distilgpt2", "gpt2-small", "gpt2-medium", "stories15m",
                                    "stories42m", "stories110m", "smollm-135m"});
  check_list<ClassifierPresets>({"tiny", "sst2", "imdb"});
  check_list<TranslatorPresets>({"tiny", "multi30k"});
}

BOOST_AUTO_TEST_CASE(preset_info_reads_the_configuration) {
  const PresetInfo small = LanguageModelPresets::info("shakespeare-small");
  BOOST_TEST(small.shape() == "D64 H4 L4 T32 FF256");
  BOOST_TEST((small.parts.pre_norm && !small.parts.rms_norm && !small.parts.gated() && small.bias));
  BOOST_TEST(small.parts.activation_name() == "relu");
  const PresetInfo llama = LanguageModelPresets::info("shakespeare-llama");
  BOOST_TEST((llama.parts.rms_norm && llama.parts.gated() && !llama.bias));
  BOOST_TEST(llama.parts.positions_name() == "rope");
  BOOST_TEST(LanguageModelPresets::info("shakespeare-large").dropout == 0.2f);
  BOOST_TEST(!ClassifierPresets::info("sst2").parts.pre_norm);
  BOOST_TEST(TranslatorPresets::info("multi30k").parts.positions_name() == "sinusoidal");
  BOOST_TEST(TranslatorPresets::info("multi30k").shape() == "D256 H4 L3 T64 FF512");
  BOOST_TEST(LanguageModelPresets::info("smollm-135m").shape() == "D576 H9 KV3 L30 T2048 FF1536");
}

// make_language_model builds every small preset (the large ones take
// seconds to initialise); its parameters are those visit lists, and their
// count is the architecture's: 65 characters of shakespeare-small give
// 210,497, of shakespeare-llama (D_FF 176, three feed-forward matrices)
// 209,665.
BOOST_AUTO_TEST_CASE(language_models_of_the_presets) {
  Be be;
  int built = 0;
  for (const PresetInfo& p : LanguageModelPresets::all()) {
    if (12.0 * p.d_model * p.d_model * p.n_layers > 1e7) continue;
    BOOST_TEST_CONTEXT(p.name) {
      const auto model = make_language_model<Be>(p.name, 11, 5, {.dropout = 0.0f});
      BOOST_TEST(model->preset().name == p.name);
      BOOST_TEST(model->vocab() == 11);
      BOOST_TEST(model->parameter_count() == parameter_count(*model));
      const int T = std::min(5, p.max_t);
      std::vector<std::int32_t> ids(std::size_t(2) * T);
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(i % 11);
      const auto logits = model->forward(be, ids, Shape{2, T});
      BOOST_TEST(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
      ++built;
    }
  }
  BOOST_TEST(built == 6);  // tiny, shakespeare-small, -llama, names, -mid, stories15m
  BOOST_TEST(make_language_model<Be>("shakespeare-small", 65, 1)->parameter_count() == 210497u);
  BOOST_TEST(make_language_model<Be>("shakespeare-llama", 65, 1)->parameter_count() == 209665u);
  // tok 65*128 + pos 128*128 + 4 blocks * 198,272 + ln_f 256 + head 128*65+65
  BOOST_TEST(make_language_model<Be>("shakespeare-mid", 65, 1)->parameter_count() == 826433u);
  BOOST_CHECK_THROW((void)make_language_model<Be>("gpt5", 11, 1), Error);
}

BOOST_AUTO_TEST_SUITE_END()
