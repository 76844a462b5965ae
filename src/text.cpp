// text.cpp: corpus reading, tokenizers and dataset batching (see text.hpp,
// datasets.hpp).
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "json_bounds.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

using nlohmann::json;

// ---- files -----------------------------------------------------------------

namespace {

// Why `path` cannot be read as a file, or "" when it can: a regular file or
// a pipe (`--data <(zcat corpus.gz)`); directories and devices cannot.
std::string unreadable_kind(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  switch (st.type()) {
    case fs::file_type::regular:
    case fs::file_type::fifo: return "";
    case fs::file_type::not_found: return "no such file";
    case fs::file_type::directory: return "is a directory, not a file";
    case fs::file_type::character:
    case fs::file_type::block: return "is a device, not a file";
    case fs::file_type::socket: return "is a socket, not a file";
    default: return ec ? "cannot be read: " + ec.message() : "is not a file";
  }
}

// Inflates one or more concatenated gzip members (as gzip writes and reads
// them); bytes after the last member that start no member are an error,
// where zlib's gzread skipped them silently.
std::string gunzip(std::string_view raw, const std::string& name) {
  z_stream z{};
  require(inflateInit2(&z, 15 + 16) == Z_OK, name, ": cannot start zlib");
  struct End {
    z_stream& z;
    ~End() { inflateEnd(&z); }
  } end{z};  // also when an error below throws (fuzzing found the leak)
  std::string out;
  char buf[1 << 16];
  std::size_t pos = 0;
  int ret = Z_OK;
  while (pos < raw.size()) {
    require(raw.size() - pos >= 2 && std::uint8_t(raw[pos]) == 0x1f && std::uint8_t(raw[pos + 1]) == 0x8b, name,
            ": ", raw.size() - pos, " bytes after the gzip data at byte ", pos, " are not gzip (trailing garbage)");
    inflateReset(&z);
    do {
      const std::size_t chunk = std::min<std::size_t>(raw.size() - pos, 1u << 30);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data() + pos));
      z.avail_in = static_cast<uInt>(chunk);
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof buf;
      ret = inflate(&z, Z_NO_FLUSH);
      pos += chunk - z.avail_in;
      out.append(buf, sizeof buf - z.avail_out);
      if (ret != Z_OK && ret != Z_STREAM_END) break;
      if (out.size() > kMaxTextBytes) break;
    } while (ret != Z_STREAM_END && (pos < raw.size() || z.avail_out == 0));
    if (ret != Z_STREAM_END) break;
  }
  const std::string msg = z.msg ? z.msg : "the stream ends early";
  require(out.size() <= kMaxTextBytes, name, ": decompresses past the limit of ", kMaxTextBytes, " bytes");
  require(ret == Z_STREAM_END, name, ": corrupt or truncated gzip data: ", msg);
  return out;
}

}  // namespace

std::string read_text_file(const std::filesystem::path& path) {
  const std::string kind = unreadable_kind(path);
  require(kind.empty(), path.string(), ": ", kind);
  // A FIFO is opened without waiting for a writer, then given kFifoWaitSeconds
  // for one to write: a named pipe nobody writes to ends in an error, not
  // in a process that waits without a word.
  const bool fifo = std::filesystem::is_fifo(path);
  const int fd = system_call([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0)); },
                             path.string(), ": cannot open");
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  if (fifo) {
    pollfd p{fd, POLLIN, 0};
    int ready;
    while ((ready = ::poll(&p, 1, kFifoWaitSeconds * 1000)) < 0 && errno == EINTR) {}
    require(ready > 0, path.string(), ": a FIFO that no process wrote to in ", kFifoWaitSeconds,
            " s (start its writer first)");
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  }
  std::string raw;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      fail(path.string(), ": read failed: ", std::strerror(err));
    }
    if (n == 0) break;
    raw.append(buf, static_cast<std::size_t>(n));
    require(raw.size() <= kMaxTextBytes, path.string(), ": larger than the limit of ", kMaxTextBytes, " bytes");
  }
  require(!raw.empty(), path.string(), ": file is empty");
  const bool gzip = raw.size() >= 2 && std::uint8_t(raw[0]) == 0x1f && std::uint8_t(raw[1]) == 0x8b;
  if (!gzip) return raw;
  std::string text = gunzip(raw, path.string());
  require(!text.empty(), path.string(), ": file is empty (after decompression)");
  return text;
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  const std::string text = read_text_file(path);
  check_utf8(text, path.string());
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

namespace {
// A character for an error message: printable as is, otherwise escaped.
std::string shown(std::string_view ch) {
  if (ch.size() == 1 && (static_cast<unsigned char>(ch[0]) < 0x20 || ch[0] == 0x7f)) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(ch[0]));
    return buf;
  }
  return std::string(ch);
}
}  // namespace

// ---- word pre-tokenization -------------------------------------------------

namespace {
bool is_split_punct(char c) {
  return c == '.' || c == ',' || c == '!' || c == '?' || c == ';' || c == ':' || c == '"' || c == '(' || c == ')' ||
         c == '[' || c == ']';
}
}  // namespace

std::vector<std::string> pretokenize(std::string_view text, bool lowercase) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) out.push_back(std::move(cur)), cur.clear();
  };
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      flush();
    } else if (is_split_punct(c)) {
      flush();
      out.emplace_back(1, c);
    } else {
      cur += lowercase && c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
    }
  }
  flush();
  return out;
}

std::string detokenize(std::span<const std::string> words) {
  std::string out;
  bool glue_next = false;
  for (const auto& w : words) {
    const bool closes = w.size() == 1 && std::string_view(".,!?;:)]").find(w[0]) != std::string_view::npos;
    if (!out.empty() && !closes && !glue_next) out += ' ';
    out += w;
    glue_next = w == "(" || w == "[";
  }
  return out;
}

// ---- CharTokenizer ---------------------------------------------------------

CharTokenizer CharTokenizer::from_corpus(std::string_view corpus, bool with_unknown) {
  require(!corpus.empty(), "cannot build a character vocabulary from empty text");
  check_utf8(corpus, "");
  std::set<std::string, std::less<>> seen;  // byte order = code-point order for UTF-8
  for (std::size_t i = 0, n = 0; i < corpus.size(); i += n) {
    n = utf8_character_size(corpus, i);
    if (const std::string_view ch = corpus.substr(i, n); !seen.contains(ch)) seen.emplace(ch);
  }
  CharTokenizer t;
  for (const auto& s : seen) t.tokens_.push_back(s);
  if (with_unknown) {
    t.unknown_ = static_cast<std::int32_t>(t.tokens_.size());
    t.tokens_.push_back("<unk>");
  }
  for (std::size_t i = 0; i < t.tokens_.size(); ++i) t.ids_.emplace(t.tokens_[i], static_cast<std::int32_t>(i));
  return t;
}

CharTokenizer CharTokenizer::byte_level() {
  CharTokenizer t;
  t.byte_level_ = true;
  for (int b = 0; b < 256; ++b) t.tokens_.push_back(std::string(1, static_cast<char>(b)));
  return t;
}

std::vector<std::int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  if (byte_level_) {
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  check_utf8(text, "");
  ids.reserve(text.size());  // an upper bound: one id a byte
  for (std::size_t offset = 0; offset < text.size();) {
    const std::string_view ch = text.substr(offset, utf8_character_size(text, offset));
    const auto it = ids_.find(ch);
    if (it != ids_.end()) {
      ids.push_back(it->second);
    } else {
      require(unknown_.has_value(), "character '", shown(ch), "' at byte ", offset,
              " is not in the vocabulary of ", tokens_.size(), " characters");
      ids.push_back(*unknown_);
    }
    offset += ch.size();
  }
  return ids;
}

std::string CharTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (auto id : ids) out += token(id);
  return out;
}

const std::string& CharTokenizer::token(std::int32_t id) const {
  require(id >= 0 && id < size(), "token id ", id, " out of range [0, ", size(), ")");
  return tokens_[id];
}

std::optional<std::int32_t> CharTokenizer::find(std::string_view tok) const {
  const auto it = ids_.find(tok);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string CharTokenizer::to_json() const {
  json j;
  j["type"] = byte_level_ ? "bytes" : "chars";
  if (!byte_level_) {
    json chars = json::array();
    for (std::size_t i = 0; i < tokens_.size(); ++i)
      if (!unknown_ || static_cast<std::int32_t>(i) != *unknown_) chars.push_back(tokens_[i]);
    j["chars"] = chars;
    j["unknown"] = unknown_.has_value();
  }
  return j.dump();
}

CharTokenizer CharTokenizer::from_json(std::string_view text) try {
  detail::check_json_depth(text, "tokenizer description");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    detail::fail("tokenizer description is not valid JSON: ", e.what());
  }
  require(j.is_object() && j.contains("type"), "tokenizer description has no type");
  if (j["type"] == "bytes") return byte_level();
  require(j["type"] == "chars" && j.contains("chars") && j["chars"].is_array(), "unknown tokenizer description ",
          j.dump());
  CharTokenizer t;
  for (const auto& c : j["chars"]) {
    require(c.is_string(), "tokenizer character is not a string: ", c.dump());
    require(t.ids_.emplace(c.get<std::string>(), static_cast<std::int32_t>(t.tokens_.size())).second,
            "tokenizer lists '", c.get<std::string>(), "' twice");
    t.tokens_.push_back(c.get<std::string>());
  }
  if (j.value("unknown", false)) {
    t.unknown_ = static_cast<std::int32_t>(t.tokens_.size());
    t.tokens_.push_back("<unk>");
    t.ids_.emplace("<unk>", *t.unknown_);
  }
  require(!t.tokens_.empty(), "tokenizer has no characters");
  return t;
} catch (const json::exception& e) {  // a value of the wrong type (found by fuzzing)
  detail::fail("tokenizer description is malformed: ", e.what());
}

// ---- WordVocab -------------------------------------------------------------

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    std::size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

WordVocab WordVocab::build(std::span<const std::string> texts, int min_freq, std::vector<std::string> specials,
                           std::size_t max_words) {
  require(min_freq >= 1, "minimum word frequency ", min_freq, " must be at least 1");
  WordVocab v;
  v.min_freq_ = min_freq;
  for (auto& s : specials) {
    require(v.ids_.emplace(s, static_cast<std::int32_t>(v.words_.size())).second, "special token '", s, "' given twice");
    v.words_.push_back(s);
  }
  v.specials_ = static_cast<int>(specials.size());
  const auto unk = v.ids_.find("<unk>");
  require(unk != v.ids_.end(), "a word vocabulary needs an <unk> special token");
  v.unknown_ = unk->second;
  std::map<std::string, long, std::less<>> counts;
  for (const auto& t : texts)
    for (auto w : split_words(t)) ++counts[std::string(w)];
  // Most frequent first, ties alphabetical: a stable, readable order.
  std::vector<std::pair<std::string, long>> kept;
  for (auto& [w, c] : counts)
    if (c >= min_freq && !v.ids_.count(w)) kept.emplace_back(w, c);
  std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (max_words > 0 && kept.size() > max_words) kept.resize(max_words);
  for (auto& [w, c] : kept) {
    v.ids_.emplace(w, static_cast<std::int32_t>(v.words_.size()));
    v.words_.push_back(w);
  }
  return v;
}

std::vector<std::int32_t> WordVocab::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  for (auto w : split_words(text)) ids.push_back(id(w));
  return ids;
}

std::string WordVocab::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (auto id : ids) {
    if (!out.empty()) out += ' ';
    out += word(id);
  }
  return out;
}

std::int32_t WordVocab::id(std::string_view w) const {
  const auto it = ids_.find(w);
  return it == ids_.end() ? unknown_ : it->second;
}

std::optional<std::int32_t> WordVocab::special(std::string_view name) const {
  const auto it = ids_.find(name);
  if (it == ids_.end() || it->second >= specials_) return std::nullopt;
  return it->second;
}

const std::string& WordVocab::word(std::int32_t id) const {
  require(id >= 0 && id < size(), "word id ", id, " out of range [0, ", size(), ")");
  return words_[id];
}

std::string WordVocab::to_json() const {
  json j;
  j["type"] = "words";
  j["specials"] = specials_;
  j["min_freq"] = min_freq_;
  j["words"] = words_;
  return j.dump();
}

WordVocab WordVocab::from_json(std::string_view text) try {
  detail::check_json_depth(text, "vocabulary description");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    detail::fail("vocabulary description is not valid JSON: ", e.what());
  }
  require(j.is_object() && j.value("type", "") == "words" && j.contains("words") && j["words"].is_array(),
          "not a word vocabulary description");
  WordVocab v;
  v.min_freq_ = int(detail::json_integer(j.value("min_freq", json(1)), 1, INT32_MAX, "vocabulary min_freq"));
  for (const auto& w : j["words"]) {
    require(w.is_string(), "vocabulary word is not a string: ", w.dump());
    require(v.ids_.emplace(w.get<std::string>(), static_cast<std::int32_t>(v.words_.size())).second,
            "vocabulary lists '", w.get<std::string>(), "' twice");
    v.words_.push_back(w.get<std::string>());
  }
  // The specials lead the list (<unk> among them); a count of 0 left
  // special("<bos>") empty for the programs that need it.
  v.specials_ = int(detail::json_integer(j.value("specials", json(0)), 1, std::int64_t(v.words_.size()),
                                         "vocabulary specials count"));
  const auto unk = v.ids_.find("<unk>");
  require(unk != v.ids_.end(), "vocabulary has no <unk> token");
  require(unk->second < v.specials_, "vocabulary's <unk> (word ", unk->second, ") is not among its ", v.specials_,
          " specials");
  v.unknown_ = unk->second;
  return v;
} catch (const json::exception& e) {  // a value of the wrong type (found by fuzzing)
  detail::fail("vocabulary description is malformed: ", e.what());
}

// ---- datasets --------------------------------------------------------------

LmBatcher::LmBatcher(std::span<const std::int32_t> tokens, int batch, int length)
    : tokens_(tokens), batch_(batch), length_(length) {
  require(batch > 0 && length > 0, "batch ", batch, " x length ", length, " must be positive");
  require(tokens.size() > std::size_t(length), "a stream of ", tokens.size(), " tokens is too short for windows of ",
          length, " + 1");
}

void LmBatcher::window(std::size_t offset, std::int32_t* ids, std::int32_t* targets) const {
  std::copy_n(tokens_.data() + offset, length_, ids);
  std::copy_n(tokens_.data() + offset + 1, length_, targets);
}

void LmBatcher::sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const {
  const std::size_t starts = tokens_.size() - length_;  // offsets 0 .. size-length-1
  for (int b = 0; b < batch_; ++b)
    window(rng.below(starts), ids + std::size_t(b) * length_, targets + std::size_t(b) * length_);
}

void LmBatcher::fixed(std::uint64_t seed, int i, std::int32_t* ids, std::int32_t* targets) const {
  Rng rng(detail::mix64(seed) ^ detail::mix64(std::uint64_t(i) + 1));
  sample(rng, ids, targets);
}

NamesSplit split_names(const std::vector<std::string>& lines, double train_fraction, std::uint64_t seed) {
  std::vector<std::string> names;
  for (const auto& l : lines)
    if (!l.empty()) names.push_back(l);
  require(names.size() >= 2, "names mode needs at least 2 non-empty lines, got ", names.size());
  require(train_fraction > 0 && train_fraction < 1, "train fraction ", train_fraction, " outside (0, 1)");
  Rng rng(seed);
  for (std::size_t i = names.size() - 1; i > 0; --i) std::swap(names[i], names[rng.below(i + 1)]);
  const std::size_t n_train = std::clamp<std::size_t>(std::size_t(train_fraction * names.size()), 1, names.size() - 1);
  NamesSplit s;
  s.train.assign(names.begin(), names.begin() + n_train);
  s.val.assign(names.begin() + n_train, names.end());
  return s;
}

SequenceBatcher::SequenceBatcher(std::vector<std::vector<std::int32_t>> sequences, int batch, int length,
                                 std::int32_t sep, std::int32_t pad_id, std::int32_t ignore_index)
    : seqs_(std::move(sequences)), batch_(batch), length_(length), sep_(sep), pad_(pad_id), ignore_(ignore_index) {
  require(batch > 0 && length > 1, "batch ", batch, " x length ", length, " too small");
  require(!seqs_.empty(), "no sequences to batch");
  for (std::size_t i = 0; i < seqs_.size(); ++i)
    require(seqs_[i].size() + 1 <= std::size_t(length), "sequence ", i + 1, " has ", seqs_[i].size(),
            " tokens; with its separator that exceeds the context of ", length);
}

void SequenceBatcher::row(const std::vector<std::int32_t>* seq, std::int32_t* ids, std::int32_t* targets) const {
  std::fill(ids, ids + length_, pad_);
  std::fill(targets, targets + length_, ignore_);
  if (!seq) return;
  const int n = static_cast<int>(seq->size());
  ids[0] = sep_;
  for (int t = 0; t < n; ++t) ids[t + 1] = targets[t] = (*seq)[t];
  targets[n] = sep_;
}

void SequenceBatcher::sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const {
  for (int b = 0; b < batch_; ++b)
    row(&seqs_[rng.below(seqs_.size())], ids + std::size_t(b) * length_, targets + std::size_t(b) * length_);
}

void SequenceBatcher::in_order(int i, std::int32_t* ids, std::int32_t* targets) const {
  for (int b = 0; b < batch_; ++b) {
    const std::size_t k = std::size_t(i) * batch_ + b;
    row(k < seqs_.size() ? &seqs_[k] : nullptr, ids + std::size_t(b) * length_, targets + std::size_t(b) * length_);
  }
}

std::vector<LabeledText> read_labeled_tsv(const std::filesystem::path& path) {
  const auto lines = read_lines(path);
  require(!lines.empty() && lines[0].find('\t') != std::string::npos, path.string(),
          ": expected a header line 'label<TAB>text'");
  std::vector<LabeledText> rows;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty()) continue;
    const auto tab = line.find('\t');
    require(tab != std::string::npos, path.string(), ":", i + 1, ": no tab between label and text");
    const std::string label = line.substr(0, tab);
    const std::string where = path.string() + ":" + std::to_string(i + 1) + ": label";
    const long long value = parse_integer<long long>(label, where);
    require(value >= 0 && value < kMaxClasses, where, " ", value, " outside 0..", kMaxClasses - 1,
            " (the class count follows the largest label)");
    rows.push_back({static_cast<int>(value), line.substr(tab + 1)});
  }
  require(!rows.empty(), path.string(), ": no examples after the header");
  return rows;
}

ClassBatch make_class_batch(std::span<const std::vector<std::int32_t>> sequences, std::span<const int> labels,
                            int max_t, std::int32_t pad_id, std::int32_t cls_id) {
  require(sequences.size() == labels.size() && !sequences.empty(), "batch of ", sequences.size(), " sequences and ",
          labels.size(), " labels");
  ClassBatch b;
  b.B = static_cast<int>(sequences.size());
  const int extra = cls_id >= 0 ? 1 : 0;
  for (const auto& s : sequences) b.T = std::max(b.T, static_cast<int>(s.size()) + extra);
  b.T = std::clamp(b.T, 1, max_t);
  b.ids.assign(std::size_t(b.B) * b.T, pad_id);
  b.padding.assign(std::size_t(b.B) * b.T, 1);
  for (int i = 0; i < b.B; ++i) {
    std::int32_t* row = b.ids.data() + std::size_t(i) * b.T;
    std::uint8_t* pad = b.padding.data() + std::size_t(i) * b.T;
    int t = 0;
    if (extra) row[t] = cls_id, pad[t++] = 0;
    for (std::size_t k = 0; k < sequences[i].size() && t < b.T; ++k) row[t] = sequences[i][k], pad[t++] = 0;
    if (t == 0) pad[0] = 0;  // an empty sequence still contributes its pad token, never an all-masked row
    b.labels.push_back(labels[i]);
  }
  return b;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

void check_vocabulary(std::size_t size, std::size_t specials, int d_model, const std::string& what,
                      const std::string& options) {
  require(size > specials, what, " holds only its ", specials, " special tokens: every word would read as <unk> (",
          options, " keeps too few words)");
  require(size <= kMaxVocabulary, what, " has ", size, " tokens, over the limit of ", kMaxVocabulary, " (", options,
          ")");
  const double bytes = 16.0 * double(size) * d_model;
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  require(memory <= 0 || bytes <= memory / 2, what, " has ", size, " tokens, whose embedding of width ", d_model,
          " would take ", std::lround(bytes / 1e9), " GB to train, more than half this machine's ",
          std::lround(memory / 1e9), " GB (", options, ")");
}

}  // namespace xfmr
