// llama2c_tokenizer.cpp: Llama2cTokenizer (text/llama2c_tokenizer.hpp).
#include "xfmr/text/llama2c_tokenizer.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "xfmr/core/error.hpp"

namespace xfmr {

namespace {
constexpr std::int32_t kMaxTokenLength = 1 << 16;

// The byte a piece "<0xHH>" stands for, or -1.
int byte_piece(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}
}  // namespace

Llama2cTokenizer Llama2cTokenizer::load(const std::filesystem::path& file) {
  const std::string source = file.string();
  std::error_code ec;
  require(std::filesystem::is_regular_file(file, ec), source, ": no llama2.c tokenizer there");
  std::ifstream in(file, std::ios::binary);
  require(bool(in), source, ": cannot open it");
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse(bytes, source);
}

Llama2cTokenizer Llama2cTokenizer::parse(std::string_view bytes, const std::string& source) {
  std::size_t at = 0;
  auto read = [&](void* to, std::size_t n, const char* what, std::size_t entry) {
    require(bytes.size() - at >= n, source, ": ends inside ", what, entry == std::size_t(-1) ? std::string() : " of piece " + std::to_string(entry),
            " (", bytes.size(), " bytes)");
    std::memcpy(to, bytes.data() + at, n);
    at += n;
  };
  std::int32_t max_length = 0;
  read(&max_length, 4, "the header", std::size_t(-1));
  require(max_length > 0 && max_length <= kMaxTokenLength, source, ": max_token_length ", max_length, " (1..",
          kMaxTokenLength, ")");
  Llama2cTokenizer t;
  while (at < bytes.size()) {
    const std::size_t id = t.pieces_.size();
    float score;
    std::int32_t length;
    read(&score, 4, "the score", id);
    read(&length, 4, "the length", id);
    require(std::isfinite(score), source, ": piece ", id, " has a score that is not finite");
    require(length >= 0 && length <= max_length, source, ": piece ", id, " is ", length,
            " bytes long (0..max_token_length ", max_length, ")");
    std::string piece(std::size_t(length), '\0');
    read(piece.data(), piece.size(), "the bytes", id);
    t.ids_.emplace(piece, std::int32_t(id));
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  require(t.vocab_size() > kEos, source, ": ", t.vocab_size(), " pieces; BOS and EOS need ids 1 and 2");
  t.space_ = t.lookup(" ");
  return t;
}

const std::string& Llama2cTokenizer::piece(std::int32_t id) const {
  require(id >= 0 && id < vocab_size(), "token id ", id, " outside the vocabulary (0..", vocab_size() - 1, ")");
  return pieces_[std::size_t(id)];
}

std::int32_t Llama2cTokenizer::lookup(std::string_view p) const {
  const auto it = ids_.find(std::string(p));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::int32_t> Llama2cTokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<std::int32_t> ids;
  if (bos) ids.push_back(kBos);
  if (!text.empty()) {
    require(space_ >= 0, "llama2.c tokenizer: no piece \" \" for the dummy prefix");
    ids.push_back(space_);
  }
  // Code points (a lead byte and up to three continuation bytes), or their bytes.
  for (std::size_t i = 0; i < text.size();) {
    std::size_t n = 1;
    while (i + n < text.size() && n < 4 && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    const std::string_view point = text.substr(i, n);
    if (const std::int32_t id = lookup(point); id >= 0) {
      ids.push_back(id);
    } else {
      for (unsigned char b : point) {
        const std::int32_t byte_id = kFirstByte + b;
        require(byte_id < vocab_size() && byte_piece(pieces_[std::size_t(byte_id)]) == b,
                "llama2.c tokenizer: no byte piece for 0x", "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15],
                " at id ", byte_id);
        ids.push_back(byte_id);
      }
    }
    i += n;
  }
  // Merge the best-scoring adjacent pair until none is a piece (BOS's
  // pair too, as run.c has it).
  std::string pair;
  for (;;) {
    float best = -1e10f;
    std::int32_t best_id = -1;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      pair = pieces_[std::size_t(ids[i])];
      pair += pieces_[std::size_t(ids[i + 1])];
      const std::int32_t id = lookup(pair);
      if (id >= 0 && scores_[std::size_t(id)] > best) best = scores_[std::size_t(id)], best_id = id, best_at = i;
    }
    if (best_id < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + std::ptrdiff_t(best_at) + 1);
  }
  if (eos) ids.push_back(kEos);
  return ids;
}

std::string Llama2cTokenizer::decode(std::int32_t prev, std::int32_t id) const {
  std::string_view p = piece(id);
  if (prev == kBos && !p.empty() && p[0] == ' ') p.remove_prefix(1);
  if (const int b = byte_piece(p); b >= 0) return std::string(1, char(b));
  return std::string(p);
}

std::string Llama2cTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  std::int32_t prev = -1;
  for (std::int32_t id : ids) {
    out += decode(prev, id);
    prev = id;
  }
  return out;
}

}  // namespace xfmr
