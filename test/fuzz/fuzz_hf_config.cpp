// Fuzz target: a Hugging Face config.json as each reader takes it:
// HfLlamaConfig (llama, qwen2, mistral; rope scaling) and Gpt2Config, each
// with the architecture it gives and written back, and the architecture
// JSON an xfmr checkpoint records. Anything but xfmr::Error escaping, a
// crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "xfmr/io/architecture.hpp"
#include "xfmr/io/gpt2.hpp"
#include "xfmr/io/hf_llama.hpp"

using namespace xfmr;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const HfLlamaConfig c = HfLlamaConfig::from_json(text, "config.json");
    (void)hf_llama_architecture(c);
    (void)HfLlamaConfig::from_json(c.to_json(), "config.json written back");
  } catch (const Error&) {
  }
  try {
    const Gpt2Config c = Gpt2Config::from_json(text, "config.json");
    (void)gpt2_architecture(c);
    (void)Gpt2Config::from_json(c.to_json(), "config.json written back");
  } catch (const Error&) {
  }
  try {
    (void)architecture_json(architecture_from_json(text, "architecture"));
  } catch (const Error&) {
  }
  return 0;
}
