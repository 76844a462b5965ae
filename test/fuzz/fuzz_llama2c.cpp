// Fuzz target: a llama2.c .bin checkpoint (the legacy header or version 1's
// "ak42"), as a user's file reaches xfmr: the format detected by
// checkpoint_format, then read_llama2c (every header field against its
// limit, the weights' sizes against the file's) and the architecture its
// config gives. The bytes go through a file in the temporary directory
// (run_fuzz.sh: memory where it can), as the reader takes a path. Anything but xfmr::Error escaping, a crash or a
// sanitizer report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "xfmr/io/llama2c.hpp"
#include "xfmr/io/pretrained.hpp"

using namespace xfmr;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const struct Scratch {  // removed at exit
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("xfmr_fuzz_llama2c." + std::to_string(::getpid()) + ".bin");
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } scratch;
  const std::filesystem::path& path = scratch.path;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    (void)checkpoint_format(path);
    const Llama2cCheckpoint ck = read_llama2c(path);
    (void)llama2c_architecture(ck.config);
  } catch (const Error&) {
  }
  return 0;
}
