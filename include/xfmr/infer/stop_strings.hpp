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
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace xfmr
