// Fuzz target: the readers of corpora, datasets and tokenizer files. The
// input is written to a file and read back as text (plain or gzip), as
// lines and as a labelled TSV, the way the programs read --data, --train
// and the translation files, and as a Hugging Face tokenizer.json.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "xfmr/core/error.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/text/gpt2_bpe.hpp"
#include "xfmr/text/text.hpp"

using namespace xfmr;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("xfmr_fuzz_text_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const std::string text = read_text_file(path);
    (void)split_words(text);
    // Text check_utf8 accepts splits into characters that a character
    // vocabulary built from it encodes and decodes back to the same bytes.
    check_utf8(text, "input");
    const CharTokenizer tok = CharTokenizer::from_corpus(text);
    if (tok.decode(tok.encode(text)) != text) __builtin_trap();
  } catch (const Error&) {
  }
  try {  // what loads encodes text and decodes ids back to bytes
    const Gpt2Tokenizer tok = Gpt2Tokenizer::load_json(path);
    (void)tok.decode(tok.encode("The cat sat on the mat, 42 times; l'\xc3\xa9t\xc3\xa9 <|endoftext|>\n"));
  } catch (const Error&) {
  }
  try {
    (void)read_lines(path);
  } catch (const Error&) {
  }
  try {
    for (const auto& row : read_labeled_tsv(path))
      if (row.label < 0 || row.label >= kMaxClasses) __builtin_trap();  // out of the documented range
  } catch (const Error&) {
  }
  return 0;
}
