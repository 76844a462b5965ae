// Fuzz target: a safetensors file as a checkpoint's model or optimizer file.
// SafeTensors::parse, every tensor's values, then loading a tiny decoder and
// its AdamW state (names, shapes, the "steps" metadata) from what parsed.
// Anything but xfmr::Error escaping, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/configs.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/optimizers.hpp"

using namespace xfmr;
using Be = CpuBackend<float>;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Decoder<test::TinyPre, Be> model(7, 1);
  static AdamW<Be> opt(model);
  std::vector<std::byte> bytes(size);
  if (size) std::memcpy(bytes.data(), data, size);
  try {
    const SafeTensors st = SafeTensors::parse(std::move(bytes), "fuzz.safetensors");
    for (const auto& name : st.names()) {
      const TensorInfo& info = st.info(name);
      const bool floating = info.dtype == DType::F64 || info.dtype == DType::F32 || info.dtype == DType::F16 ||
                            info.dtype == DType::BF16;
      if (floating) (void)st.values<float>(name);
      else (void)st.integers(name);
    }
    try {
      load_parameters(model, st);
    } catch (const Error&) {
    }
    load_optimizer_state(opt, st);
  } catch (const Error&) {
  }
  return 0;
}
