// bpe.hpp: a byte-level BPE tokenizer that xfmr trains itself (Sennrich et
// al. 2016 merges over UTF-8 bytes, so no input is ever unknown).
//
// Words come from pretokenize(); each word is its bytes followed by an
// end-of-word symbol "</w>". train() starts from the 256 bytes + "</w>"
// (+ the given special tokens, first) and repeatedly merges the most
// frequent adjacent pair (ties broken by the pair's symbol ids, so training
// is deterministic) until `vocab_size` symbols or no pair occurs twice.
// encode() applies the learned merges in order of rank; decode() joins the
// symbols, turning "</w>" into spaces. The merges serialise to JSON for the
// checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xfmr {

class BpeTokenizer {
 public:
  // The longest symbol a loaded description may build (64 KiB).
  static constexpr std::size_t kMaxSymbolBytes = std::size_t(1) << 16;

  static BpeTokenizer train(std::span<const std::string> texts, int vocab_size,
                            std::vector<std::string> specials = {"<pad>", "<unk>", "<bos>", "<eos>"},
                            bool lowercase = false);
  static BpeTokenizer from_json(std::string_view json);

  std::vector<std::int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::string to_json() const;

  int size() const { return static_cast<int>(symbols_.size()); }
  std::optional<std::int32_t> special(std::string_view name) const;
  const std::string& symbol(std::int32_t id) const;
  std::size_t merges() const { return merges_.size(); }

 private:
  void init_base(std::vector<std::string> specials);
  std::vector<std::int32_t> encode_word(std::string_view word) const;

  std::vector<std::string> symbols_;
  std::vector<std::pair<std::int32_t, std::int32_t>> merges_;           // in rank order
  std::map<std::pair<std::int32_t, std::int32_t>, std::int32_t> rank_;  // pair -> rank (= merge index)
  int specials_ = 0;
  std::int32_t end_of_word_ = 0;
  bool lowercase_ = false;
};

}  // namespace xfmr
