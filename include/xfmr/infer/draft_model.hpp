// draft_model.hpp: DraftModel, the drafts of speculative decoding by a
// draft model (continuous_batching.hpp's Speculation::draft): a smaller
// model of the same tokenizer draws each decoding slot's next tokens
// greedily, one ragged step of its own a token, batched over the slots.
//
// It has a cache pool of its own, one row a slot of the batcher's, whose
// ids (held) are always a prefix of the slot's text: its first step of a
// draw feeds each busy slot's rows the ids they lack (the prompt as far as
// the model has read it: one step behind; the tokens drawn since the last
// drafts; the newest token, whose logits draw the first draft), at most
// prefill_chunk in all past a few a slot, and draws a slot's first draft
// once its rows have caught up; each further step feeds the last draft
// and draws the next. share() gives a slot another's rows of a prompt
// prefix, as the batcher's prompt cache gives the model's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xfmr/layers/kv_cache.hpp"

namespace xfmr {

template <class Model, class Backend>
class DraftModel {
 public:
  // What one slot asks of a draw (a free slot: busy false).
  struct Ask {
    bool busy = false;
    bool decoding = false;                // its prompt read; else its rows follow the prompt as far as read
    std::span<const std::int32_t> held;   // the ids the model's rows hold
    std::int32_t next = 0;                // decoding: the newest token, not fed yet
    int want = 0;                         // decoding: the drafts wanted (0: none, and nothing fed)
    int vocabulary = 0;                   // drafts drawn below it
    std::vector<std::int32_t>* drafts = nullptr;  // where they go (empty on entry)
  };

  // most: the drafts a slot ever asks (a catch-up within most + 2 ids is a step's own).
  DraftModel(Model& model, Backend& be, int slots, int context, int prefill_chunk, int most)
      : model_(model), be_(be), context_(std::min(context, model.max_t())), chunk_(prefill_chunk), most_(most) {
    model_.set_training(false);
    model_.start_cache(cache_, slots, context_);
    held_.resize(std::size_t(slots));
  }

  // Slot `to` takes slot `from`'s rows of the prompt prefix `prefix` (as
  // far as from's rows hold it).
  void share(int from, int to, std::span<const std::int32_t> prefix) {
    const auto& d = held_[std::size_t(from)];
    const std::size_t n = std::min(d.size(), prefix.size());
    const int same = int(std::mismatch(d.begin(), d.begin() + std::ptrdiff_t(n), prefix.begin()).first - d.begin());
    cache_.copy_prefix(be_, from, to, same);
    held_[std::size_t(to)].assign(d.begin(), d.begin() + same);
  }
  // Slot s's rows are not trusted (a failed step).
  void forget(int s) { held_[std::size_t(s)].clear(); }
  // The slots the last draw's first step fed (those a failure ends).
  const std::vector<int>& stepped() const { return owners_; }

  // Each decoding slot's drafts (asks[s] for slot s).
  void draw(std::span<const Ask> asks) {
    segs_.clear(), ids_.clear(), owners_.clear();
    int budget = chunk_;
    for (int s = 0; s < int(asks.size()); ++s) {
      const Ask& a = asks[std::size_t(s)];
      if (!a.busy || (a.decoding && a.want == 0)) continue;
      auto& held = held_[std::size_t(s)];
      // The text the rows should hold: held, then the newest token (fed again: its logits draw the first draft).
      const std::size_t n = a.held.size() + (a.decoding ? 1 : 0);
      const auto text = [&a](std::size_t i) { return i < a.held.size() ? a.held[i] : a.next; };
      std::size_t same = 0;
      while (same < held.size() && same < n && held[same] == text(same)) ++same;
      if (a.decoding) same = std::min(same, n - 1);
      held.resize(same);
      const std::size_t end = std::min(n, std::size_t(context_));
      if (same >= end || (a.decoding && int(n) + a.want - 1 > context_)) continue;
      int feed = int(end - same);
      if (feed > most_ + 2) {  // more than a step adds: from the chunk's budget
        if (budget <= 0) continue;
        feed = std::min(feed, budget);
        budget -= feed;
      }
      segs_.push_back({s, int(same), feed, 1});
      for (std::size_t i = same; i < same + std::size_t(feed); ++i) ids_.push_back(text(i));
      owners_.push_back(s);
    }
    const std::size_t V = std::size_t(model_.vocab());
    while (!segs_.empty()) {
      const auto out = model_.forward_cached(be_, ids_, segs_, cache_);
      const auto logits = be_.host_view(out, staging_);
      std::size_t fed = 0;
      next_segs_.clear(), next_ids_.clear();
      for (std::size_t i = 0; i < segs_.size(); ++i) {
        const int s = segs_[i].slot;
        const Ask& a = asks[std::size_t(s)];
        auto& held = held_[std::size_t(s)];
        held.insert(held.end(), ids_.begin() + std::ptrdiff_t(fed),
                    ids_.begin() + std::ptrdiff_t(fed + std::size_t(segs_[i].rows)));
        fed += std::size_t(segs_[i].rows);
        // Caught up: the rows hold the slot's text, its newest token and the drafts so far.
        if (!a.decoding || held.size() != a.held.size() + 1 + a.drafts->size()) continue;
        const auto row = logits.subspan(i * V, std::min(V, std::size_t(a.vocabulary)));
        const std::int32_t d = std::int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        a.drafts->push_back(d);
        if (int(a.drafts->size()) < a.want) {
          next_segs_.push_back({s, int(held.size()), 1, 1});
          next_ids_.push_back(d);
        }
      }
      segs_.swap(next_segs_), ids_.swap(next_ids_);
    }
  }

 private:
  Model& model_;
  Backend& be_;
  int context_, chunk_, most_;  // positions a slot's rows hold; the prompt ids a first step feeds; drafts a slot asks
  DecodingCache<Backend> cache_;
  std::vector<std::vector<std::int32_t>> held_;  // each slot's rows' ids
  std::vector<StepSegment> segs_, next_segs_;
  std::vector<std::int32_t> ids_, next_ids_;
  std::vector<int> owners_;
  std::vector<typename Backend::Scalar> staging_;
};

}  // namespace xfmr
