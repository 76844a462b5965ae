// Fuzz target: one example program (examples/<program>.cpp, built into this
// target with its main renamed xfmr_program_main and XFMR_FUZZ_CLI, so that
// it parses and checks everything and then stops before any work).
//   XFMR_FUZZ_ARGV:  the input is the command line, one argument a line.
//   XFMR_FUZZ_STATE: the input is a checkpoint's trainer_state.json, and its
//                    run settings (metadata), as `train --resume` and
//                    `sample --checkpoint` read them.
// The program must return 0, 1 or 2 (run_command turns every exception into
// 1); anything escaping, a crash or a sanitizer report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#ifdef XFMR_FUZZ_STATE
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/text/text.hpp"
#endif

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
  // Two checkpoints of the tiny preset, valid but for the input: ck's
  // trainer_state.json (the library's reader), and ck2's "settings" in its
  // metadata (the program's), each through train --resume; sample reads ck.
  namespace fs = std::filesystem;
  static const fs::path dir = fs::temp_directory_path() / ("xfmr_fuzz_state_" + std::to_string(::getpid()));
  static const std::string corpus_text = "the cat sat on the mat\n";
  static const auto write_checkpoint_files = [](const fs::path& ck, const std::string& settings,
                                                const std::string& trainer_state) {
    fs::create_directories(ck);
    xfmr::SafeTensorsWriter model, optimizer;
    model.set_metadata("format", "xfmr-charlm");
    model.set_metadata("preset", "tiny");
    model.set_metadata("tokenizer", xfmr::CharTokenizer::from_corpus(corpus_text).to_json());
    model.set_metadata("settings", settings);
    model.set_metadata("steps", "10");
    model.set_metadata("data", "corpus.txt");
    model.set_metadata("data_hash", "0");
    model.write(ck / "model.safetensors");
    optimizer.write(ck / "optimizer.safetensors");
    std::ofstream(ck / "trainer_state.json", std::ios::binary | std::ios::trunc) << trainer_state;
  };
  static const std::string valid_settings =
      R"({"attention_dropout": 0.0, "batch": 8, "clip": 0.0, "dropout": -1.0, "grad_accum": 1, "lr": 0.003, )"
      R"("mode": "text", "model": "tiny", "schedule": "cosine", "seed": 1337, "val_fraction": 0.1, )"
      R"("weight_decay": 0.01})";
  static const std::string valid_state = xfmr::trainer_state_json({10, 12345, {10, 10, 10, 10}});
  static const struct Scratch {  // made once, removed at exit
    Scratch() {
      fs::create_directories(dir);
      std::ofstream(dir / "corpus.txt") << corpus_text;
    }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } scratch;
  (void)scratch;
  write_checkpoint_files(dir / "ck", valid_settings, input);
  const std::string ck = (dir / "ck").string(), ck2 = (dir / "ck2").string(), corpus = (dir / "corpus.txt").string();
  run({"program", "train", "--data", corpus, "--resume", ck, "--log-csv", "", "--report", ""});
  run({"program", "sample", "--checkpoint", ck});
  try {
    write_checkpoint_files(dir / "ck2", input, valid_state);
  } catch (const xfmr::Error&) {
    return 0;  // not UTF-8: no safetensors header can hold it as metadata
  }
  run({"program", "train", "--data", corpus, "--resume", ck2, "--log-csv", "", "--report", ""});
#else
#error "define XFMR_FUZZ_ARGV or XFMR_FUZZ_STATE"
#endif
  return 0;
}
