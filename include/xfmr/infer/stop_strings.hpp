// stop_strings.hpp: streamed text that ends at the first of some strings,
// none of which is ever sent (an OpenAI request's "stop").
//
//   xfmr::StopStrings stops({"\nUser:"});
//   for each token:  send(stops.feed(tok.piece(prev, id)));  if (stops.stopped()) break;
//   at the end:      send(stops.flush());
//
// feed(piece) returns the text that is safe to send now: everything before
// a stop string once one has appeared (then stopped() is true and the rest
// is dropped), else everything but the longest tail that could still begin
// one. flush() returns that tail when generation ends another way.
// TokenText puts a tokenizer's pieces, the stop strings and whole UTF-8
// characters together, as a server or a binding streams text.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/io/model_tokenizer.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops = {}) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  }

  std::string feed(std::string_view piece) {
    if (stopped_) return {};
    held_ += piece;
    std::size_t first = std::string::npos;
    for (const std::string& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
      stopped_ = true;
      std::string out = held_.substr(0, first);
      held_.clear();
      return out;
    }
    // Keep the longest tail of held_ that is a proper prefix of a stop string.
    std::size_t keep = 0;
    for (const std::string& s : stops_)
      for (std::size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
        if (std::string_view(held_).substr(held_.size() - n) == std::string_view(s).substr(0, n)) {
          keep = n;
          break;
        }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  std::string flush() {
    std::string out = stopped_ ? std::string() : std::move(held_);
    held_.clear();
    return out;
  }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// The text of tokens as they are drawn, for a stream: each token's piece
// (ModelTokenizer::piece, after the token before it), cut at the first
// stop string, and handed out in whole UTF-8 characters, ill-formed bytes
// as U+FFFD (text/text.hpp), so that every part is valid UTF-8.
//
//   xfmr::TokenText text(tok, prompt.back(), {"\n\n"});
//   on each token id:  send(text.feed(id));  if (text.stopped()) stop;
//   at the end:        send(text.flush());
class TokenText {
 public:
  TokenText(const ModelTokenizer& tok, std::int32_t last_prompt_id, std::vector<std::string> stops = {})
      : tok_(tok), prev_(last_prompt_id), stops_(std::move(stops)) {}

  // The text id completes. An id whose text is not to be shown (an end
  // token) passes show = false: it is only the next piece's context.
  std::string feed(std::int32_t id, bool show = true) {
    if (show) raw_ += stops_.feed(tok_.piece(prev_, id));
    prev_ = id;
    const std::size_t complete = utf8_complete_prefix(raw_);
    std::string out = utf8_repaired(std::string_view(raw_).substr(0, complete));
    raw_.erase(0, complete);
    return out;
  }
  // What is held back, when generation ends another way than a stop string.
  std::string flush() {
    std::string out = utf8_repaired(raw_ + stops_.flush());
    raw_.clear();
    return out;
  }
  bool stopped() const { return stops_.stopped(); }

 private:
  const ModelTokenizer& tok_;
  std::int32_t prev_;
  StopStrings stops_;
  std::string raw_;  // a character whose last bytes have not come yet
};

}  // namespace xfmr
