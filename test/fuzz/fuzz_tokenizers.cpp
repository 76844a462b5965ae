// Fuzz target: tokenizer descriptions as checkpoints carry them. The first
// byte picks the kind (characters, words, BPE), the rest is its JSON; what
// loads must encode and decode text and describe itself again, identically.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "xfmr/core/error.hpp"
#include "xfmr/text/bpe.hpp"
#include "xfmr/text/text.hpp"

using namespace xfmr;

namespace {
constexpr std::string_view kText = "The cat sat on the mat, 42 times; l'\xc3\xa9t\xc3\xa9 \xe2\x82\xac\n";

template <class Tokenizer>
void exercise(std::string_view json) {
  const Tokenizer tok = Tokenizer::from_json(json);
  try {
    const auto ids = tok.encode(kText);
    (void)tok.decode(ids);
  } catch (const Error&) {  // a character or word the vocabulary lacks, without <unk>
  }
  const std::string again = tok.to_json();
  if (Tokenizer::from_json(again).to_json() != again) __builtin_trap();  // not a fixed point
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view json(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: exercise<CharTokenizer>(json); break;
      case 1: exercise<WordVocab>(json); break;
      default: exercise<BpeTokenizer>(json); break;
    }
  } catch (const Error&) {
  }
  return 0;
}
