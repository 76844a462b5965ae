// LoRA adapters in peft's format (io/peft.hpp) against a plain PyTorch
// writer of it (reference/lora_reference.py: fixtures/lora/, adapters for
// two of fixtures/families' bases with the float64 logits of the merged
// base): each loads and gives those logits within 1e-4 of their scale
// (Llama's layout, its q and k rows reordered; GPT-2's fused c_attn and
// two c_proj, rsLoRA); written back, the file holds the reference's
// tensors bit for bit under its names and reads back to the same logits;
// files that are not a LoRA of this model are refused naming why.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/temp_dir.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/io/peft.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/train/training_run.hpp"

BOOST_AUTO_TEST_SUITE(test_peft)

using namespace xfmr;
using namespace xfmr::test;
namespace fs = std::filesystem;
using Cpu = CpuBackend<float>;

namespace {
const fs::path kFixtures = XFMR_FIXTURE_DIR;

std::vector<float> logits_of(LanguageModel<Cpu>& m, const std::vector<std::int32_t>& ids) {
  Cpu be;
  m.set_training(false);
  const auto l = m.forward(be, ids, Shape{1, int(ids.size())});
  return {l.begin(), l.end()};
}
std::vector<std::int32_t> ids_of(const SafeTensors& expected) {
  const auto v = expected.integers("ids");
  return {v.begin(), v.end()};
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_peft_adapter_gives_pytorchs_merged_logits_and_writes_back_the_same) {
  for (const char* family : {"smollm2", "gpt2-ctx2048"}) {
    BOOST_TEST_CONTEXT(family) {
      const fs::path adapter = kFixtures / "lora" / family;
      auto p = load_pretrained<Cpu>(kFixtures / "families" / family);
      const std::vector<float> base = logits_of(*p.model, ids_of(SafeTensors::load(adapter / "expected.safetensors")));
      const LoraOptions o = load_peft_adapter(*p.model, adapter);
      const SafeTensors expected = SafeTensors::load(adapter / "expected.safetensors");
      const auto ids = ids_of(expected);
      const auto want = expected.values<double>("logits");
      const std::vector<float> got = logits_of(*p.model, ids);
      BOOST_REQUIRE_EQUAL(got.size(), want.size());
      double scale = 0, worst = 0, moved = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        worst = std::max(worst, std::abs(double(got[i]) - want[i]));
        moved = std::max(moved, std::abs(double(base[i]) - want[i]));
      }
      BOOST_TEST(worst <= 1e-4 * scale, "logits differ by " << worst << " at scale " << scale);
      BOOST_TEST(moved > 100 * worst, "the adapter moved the logits by " << moved);  // it is not the base's
      // Written back: the reference's tensors, bit for bit, and the same logits read again.
      const TempDir dir("peft");
      save_peft_adapter(*p.model, o, dir.path / "out");
      const SafeTensors ours = SafeTensors::load(dir.path / "out" / "adapter_model.safetensors");
      const SafeTensors theirs = SafeTensors::load(adapter / "adapter_model.safetensors");
      BOOST_TEST(ours.names().size() == theirs.names().size());
      for (const std::string& n : theirs.names()) {
        BOOST_REQUIRE_MESSAGE(ours.contains(n), "no " << n);
        BOOST_TEST(ours.values<float>(n) == theirs.values<float>(n), boost::test_tools::per_element());
      }
      BOOST_TEST(error_of([&] { save_peft_adapter(*p.model, o, dir.path / "out"); }).find("overwrite") !=
                 std::string::npos);
      auto again = load_pretrained<Cpu>(kFixtures / "families" / family);
      (void)load_peft_adapter(*again.model, dir.path / "out");
      BOOST_TEST(logits_of(*again.model, ids) == got, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(what_is_not_a_lora_of_the_model_is_refused) {
  const fs::path adapter = kFixtures / "lora" / "smollm2";
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(adapter / "adapter_config.json"));
  const TempDir dir("peft_bad");
  const auto refused = [&](const nlohmann::json& config, const fs::path& family = "smollm2") {
    fs::create_directories(dir.path / "a");
    fs::copy_file(adapter / "adapter_model.safetensors", dir.path / "a" / "adapter_model.safetensors",
                  fs::copy_options::overwrite_existing);
    std::ofstream(dir.path / "a" / "adapter_config.json") << config.dump();
    auto p = load_pretrained<Cpu>(kFixtures / "families" / family);
    const std::string e = error_of([&] { (void)load_peft_adapter(*p.model, dir.path / "a"); });
    std::size_t left = 0;  // nothing half-loaded
    LoraModel<Cpu>(*p.model).visit([&](std::string_view, auto&, auto&) { ++left; });
    BOOST_TEST(left == 0u);
    return e;
  };
  auto c = good;
  c["use_dora"] = true;
  BOOST_TEST(refused(c).find("use_dora") != std::string::npos);
  c = good;
  c["target_modules"] = {"q_proj", "k_proj"};  // the file holds more
  BOOST_TEST(refused(c).find("holds 28 tensors; target_modules names 8") != std::string::npos);
  c = good;
  c["target_modules"] = {"query_key_value"};
  BOOST_TEST(refused(c).find("'query_key_value' is no projection") != std::string::npos);
  c = good;
  c["fan_in_fan_out"] = true;
  BOOST_TEST(refused(c).find("fan_in_fan_out is for GPT-2's Conv1D") != std::string::npos);
  c = good;
  c["r"] = 3;
  BOOST_TEST(refused(c).find("shape") != std::string::npos);
  c = good;
  c["lora_dropout"] = 1.5;
  BOOST_TEST(refused(c).find("lora_dropout 1.5 outside [0, 1)") != std::string::npos);
  BOOST_TEST(refused(good, "gpt2-ctx2048").find("'q_proj' is no projection of GPT-2") != std::string::npos);
}

// A file's lora_dropout is a training setting: read back in its settings
// (and written again), it draws no mask when the adapter decodes, so the
// logits are those of the same adapter without it, bit for bit (the model
// as load_pretrained gives it, whose dropout keys would drop).
BOOST_AUTO_TEST_CASE(a_files_lora_dropout_is_kept_and_not_drawn_when_decoding) {
  const fs::path adapter = kFixtures / "lora" / "smollm2";
  nlohmann::json config = nlohmann::json::parse(std::ifstream(adapter / "adapter_config.json"));
  config["lora_dropout"] = 0.1;
  const TempDir dir("peft_dropout");
  fs::create_directories(dir.path / "a");
  fs::copy_file(adapter / "adapter_model.safetensors", dir.path / "a" / "adapter_model.safetensors");
  std::ofstream(dir.path / "a" / "adapter_config.json") << config.dump();
  const auto ids = ids_of(SafeTensors::load(adapter / "expected.safetensors"));
  auto plain = load_pretrained<Cpu>(kFixtures / "families" / "smollm2");
  BOOST_TEST(load_peft_adapter(*plain.model, adapter).dropout == 0.0);
  auto p = load_pretrained<Cpu>(kFixtures / "families" / "smollm2");
  const LoraOptions o = load_peft_adapter(*p.model, dir.path / "a");
  BOOST_TEST(o.dropout == 0.1);
  BOOST_TEST(logits_of(*p.model, ids) == logits_of(*plain.model, ids), boost::test_tools::per_element());
  save_peft_adapter(*p.model, o, dir.path / "b");
  BOOST_TEST(nlohmann::json::parse(std::ifstream(dir.path / "b" / "adapter_config.json"))["lora_dropout"] == 0.1);
}

// A frozen base in bf16, int8 or 4 bits (make_frozen_base_backend,
// TrainingRun::hold_frozen_base): the fixture's adapter trains through the
// base's bf16 copies, or its int8 or 4-bit copies' decoding products (the
// input gradient through the file's values in int8, through the 4-bit
// weights in q4), its losses float32's within the rounding, falling; the
// base's matrices, deferred to the file, are never held in float32 (in
// fp32 they are: else this would prove nothing).
BOOST_AUTO_TEST_CASE(a_frozen_base_in_bf16_int8_or_q4_trains_without_float32_weights) {
  using Lm = LanguageModel<Cpu>;
  const std::vector<std::int32_t> ids = {1, 7, 42, 9, 3, 11, 5, 8}, targets = {7, 42, 9, 3, 11, 5, 8, 2};
  const auto train = [&](const char* precision, bool& held) {
    Pretrained<Cpu> p = load_model<Cpu>(kFixtures / "families" / "smollm2");
    (void)load_peft_adapter(*p.model, kFixtures / "lora" / "smollm2");
    LoraModel<Cpu> lora(*p.model);
    Cpu be = make_frozen_base_backend<Cpu>("cpu", precision);
    TrainingRun<Lm, Cpu> run(lora, be, {.trainer = {.schedule = LrSchedule{.lr = 1e-2}, .split = {.shards = 1}}});
    run.hold_frozen_base(*p.model);
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i)
      losses.push_back(run.trainer()
                           .step([&](int) { return BatchTargets{1, targets}; },
                                 [&](const Shard&, Lm& m, Cpu& b) { return m.forward(b, ids, Shape{1, 8}); })
                           .loss);
    held = false;
    p.model->visit([&](std::string_view, auto& value, auto&) {
      if (value.shape().size() == 2 && value.allocated_bytes() > 0) held = true;
    });
    return losses;
  };
  bool held32 = false;
  const std::vector<double> fp32 = train("fp32", held32);
  BOOST_TEST(held32);
  for (const char* precision : {"bf16", "int8", "q4"}) {
    BOOST_TEST_CONTEXT(precision) {
      if (std::string(precision) == "bf16" && !bf16::available()) {
        BOOST_TEST_MESSAGE("skipped bf16: " << bf16::unavailable_reason());
        continue;
      }
      bool held = true;
      const std::vector<double> losses = train(precision, held);
      BOOST_TEST(!held);
      const double within = std::string(precision) == "q4" ? 5e-2 : 2e-2;
      BOOST_TEST(std::abs(losses[0] - fp32[0]) <= within * std::abs(fp32[0]), losses[0] << ", fp32 " << fp32[0]);
      BOOST_TEST(losses[0] != fp32[0]);  // the precision's products, not float32's
      BOOST_TEST_MESSAGE(precision << " losses " << losses.front() << " -> " << losses.back() << ", fp32 "
                                   << fp32.front() << " -> " << fp32.back());
      BOOST_TEST(losses.back() < losses.front() - 0.05, "loss " << losses.front() << " -> " << losses.back());
    }
  }
  BOOST_TEST(error_of([] { (void)make_frozen_base_backend<Cpu>("cpu", "fp16"); }).find("fp32, bf16, int8 or q4") !=
             std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
