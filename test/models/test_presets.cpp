// The preset registry (presets.hpp) and the language models it builds at
// run time (models/language_model.hpp): every shipped name is found, each
// list is closed and names its choices, and a LanguageModel is its preset's
// Decoder, bit for bit.
#include <boost/test/unit_test.hpp>

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
    BOOST_TEST(List::info(n).name == n);  // with() finds each by its own name
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
  BOOST_TEST((small.pre_norm && !small.rms_norm && !small.gated && small.bias));
  BOOST_TEST(small.activation == "relu");
  const PresetInfo llama = LanguageModelPresets::info("shakespeare-llama");
  BOOST_TEST((llama.rms_norm && llama.gated && !llama.bias));
  BOOST_TEST(llama.positions == "rope");
  BOOST_TEST(LanguageModelPresets::info("shakespeare-large").dropout == 0.2f);
  BOOST_TEST(!ClassifierPresets::info("sst2").pre_norm);
  BOOST_TEST(TranslatorPresets::info("multi30k").positions == "sinusoidal");
  // with() hands over the type: its compile-time sizes are the info's.
  const int d = TranslatorPresets::with("multi30k", []<class P>() { return P::D_MODEL; });
  BOOST_TEST(d == 256);
}

// make_language_model builds every preset; its parameters are those visit
// lists, and a forward pass is the typed Decoder's, bit for bit. The large
// presets (seconds to initialise) are left out, and so is their typed
// Decoder from the build.
template <class Cfg>
constexpr bool large_preset = 12.0 * Cfg::D_MODEL * Cfg::D_MODEL * Cfg::N_LAYERS > 1e7;

BOOST_AUTO_TEST_CASE(language_models_are_their_presets_decoders) {
  Be be;
  int compared = 0;
  for (std::string_view name : LanguageModelPresets::names()) {
    const PresetInfo p = LanguageModelPresets::info(name);
    if (12.0 * p.d_model * p.d_model * p.n_layers > 1e7) continue;
    BOOST_TEST_CONTEXT(name) {
      const auto model = make_language_model<Be>(name, 11, 5, {.dropout = 0.0f});
      BOOST_TEST(model->preset().name == name);
      BOOST_TEST(model->vocab() == 11);
      BOOST_TEST(model->parameter_count() == parameter_count(*model));
      LanguageModelPresets::with(name, [&]<class Cfg>() {
        if constexpr (large_preset<Cfg>) {
          BOOST_FAIL("the info and the configuration of " << name << " disagree on its size");
        } else {
          ++compared;
          Decoder<Cfg, Be> typed(11, 5);
          const int T = std::min(5, Cfg::MAX_T);
          std::vector<std::int32_t> ids(std::size_t(2) * T);
          for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(i % 11);
          const auto a = typed.forward(be, ids, Shape{2, T});
          const std::vector<float> want(a.begin(), a.end());
          const auto b = model->forward(be, ids, Shape{2, T});
          BOOST_TEST(std::vector<float>(b.begin(), b.end()) == want, boost::test_tools::per_element());
        }
      });
    }
  }
  BOOST_TEST(compared == 6);  // tiny, shakespeare-small, -llama, names, -mid, stories15m
  // tok 65*128 + pos 128*128 + 4 blocks * 198,272 + ln_f 256 + head 128*65+65 (gpt2-small is built in
  // test_gpt2_small.sh, where torch is: 124M parameters take seconds to initialise)
  BOOST_TEST(make_language_model<Be>("shakespeare-mid", 65, 1)->parameter_count() == 826433u);
  BOOST_CHECK_THROW((void)make_language_model<Be>("gpt5", 11, 1), Error);
}

BOOST_AUTO_TEST_SUITE_END()
