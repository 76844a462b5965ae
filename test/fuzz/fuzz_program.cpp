// Fuzz target: one example program (examples/<program>.cpp, built into this
// target with its main renamed xfmr_program_main and XFMR_FUZZ_CLI, so that
// it parses and checks everything and then stops before any work).
//   XFMR_FUZZ_ARGV:  the input is the command line, one argument a line.
//   XFMR_FUZZ_STATE: the input is the trainer_state.json of a checkpoint that
//                    `train --resume` and `sample --checkpoint` read.
// The program must return 0, 1 or 2 (run_command turns every exception into
// 1); anything escaping, a crash or a sanitizer report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

int xfmr_program_main(int argc, char** argv);

namespace {

int run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int status = xfmr_program_main(static_cast<int>(args.size()), argv.data());
  if (status < 0 || status > 2) __builtin_trap();
  return status;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
#if defined(XFMR_FUZZ_ARGV)
  std::vector<std::string> args = {"program"};
  std::size_t start = 0;
  while (start <= input.size() && args.size() < 24) {
    std::size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    args.push_back(input.substr(start, end - start));
    start = end + 1;
  }
  run(args);
#elif defined(XFMR_FUZZ_STATE)
  namespace fs = std::filesystem;
  static const fs::path dir = fs::temp_directory_path() / ("xfmr_fuzz_state_" + std::to_string(::getpid()));
  static const bool made = [] {
    fs::create_directories(dir / "ck");
    std::ofstream(dir / "ck" / "model.safetensors") << "";
    std::ofstream(dir / "ck" / "optimizer.safetensors") << "";
    std::ofstream(dir / "corpus.txt") << "the cat sat on the mat\n";
    return true;
  }();
  (void)made;
  std::ofstream(dir / "ck" / "trainer_state.json", std::ios::binary | std::ios::trunc) << input;
  const std::string ck = (dir / "ck").string(), corpus = (dir / "corpus.txt").string();
  run({"program", "train", "--data", corpus, "--resume", ck, "--log-csv", "", "--report", ""});
  run({"program", "sample", "--checkpoint", ck});
#else
#error "define XFMR_FUZZ_ARGV or XFMR_FUZZ_STATE"
#endif
  return 0;
}
