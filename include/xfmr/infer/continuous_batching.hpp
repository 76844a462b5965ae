// continuous_batching.hpp: many generations at once on one model, as a
// server runs them.
//
//   xfmr::ContinuousBatcher batcher(model, be, {.slots = 8, .context = 1024});
//   std::jthread front([&] {  // requests come from another thread (a server's connections)
//     const auto id = batcher.submit({.prompt = ids, .max_tokens = 64,
//                                     .on_token = [&](std::int32_t t) { ...; return true; },
//                                     .on_finish = [&](const xfmr::BatchResult& r) { ... }});
//   });
//   batcher.run(stop_source.get_token());  // the engine: on the thread that loaded the model (below)
//
// Up to `slots` sequences decode together. Each owns one row of a cache
// pool made once (slots x context positions a layer), so a token's step
// allocates nothing. A step is ragged (layers/kv_cache.hpp): every
// decoding sequence feeds its newest token, and the prompts being read
// feed up to `prefill_chunk` of their ids between them, in the same
// products, so a weight is streamed once for all of them. A request waits
// in the queue (at most `queue`) until a slot is free and takes it at the
// next step; one that ends, or is cancelled, frees its slot at once.
//
// Prompts share what the cache holds (prompt caching): a slot keeps the
// ids whose keys and values it holds after its request ends, and a new
// request reads only the part of its prompt past the longest prefix any
// slot holds: in its own slot (a chat's next turn, whose prompt is the
// last one's with the answer and a new message), or copied from another
// slot's rows (copy_prefix). A request whose prompt another slot is still
// reading (n choices of one prompt, sent at once) waits for that read and
// copies it. BatchResult::cached_tokens counts the ids not read again.
//
// Speculative decoding (BatchOptions::speculation): a decoding slot feeds,
// after its newest token, drafts of the tokens to come; the step returns
// logits for each of those rows, and each row draws as a step of its own
// would, while the draws equal the drafts. Greedy or sampled, the tokens
// are those of plain decoding (one draw of the slot's Rng a token either
// way); only the steps are fewer. The drafts come from one of:
// - prompt lookup (`lookup`): the tokens that followed the latest earlier
//   occurrence of the text's last ids (the prompt's and the answer's: an
//   answer that copies its input);
// - a draft model (`draft`): a smaller model of the same tokenizer, given
//   to the constructor, draws them greedily (draft_model.hpp: a ragged
//   step of its own a draft, from a cache pool of its own that follows the
//   slots' texts and shares their prompts' prefixes). A greedy draft accepted
//   while the model's draw equals it is the standard acceptance rule for a
//   draft distribution that puts all its mass on one token (accepted with
//   the model's probability of it, else a draw from the rest), so under
//   sampling too the tokens keep plain decoding's distribution; here they
//   are plain decoding's, bit for bit.
//
// LoRA adapters loaded beside the model (models/lora.hpp, ids k > 0): a
// request's `adapter` is the one its rows take, in a step with other
// sequences' adapters or none (each row selects its own); a prompt shares
// cached rows only with prompts of its adapter.
//
// Each sequence draws from its own Sampler and Rng(seed), from the logits
// of its own last position: it gets the tokens Generator (generate.hpp)
// gives it alone, whatever else is in the batch (test_continuous_batching),
// up to the rounding of a product over more rows. The context is fixed: a
// prompt and its max_tokens must fit in it together (no sliding window).
//
// Open a WeightCopies scope (weight_copies.hpp) for the batcher's life: the
// steps read the weights' decoding copies (bf16's, int8's, float32's panels).
//
// Threads: submit, cancel, close and stats from any thread; step and run on
// one (the engine's), which also runs every request's callbacks, so they
// must be quick (a server's push the token to its connection's queue).
// Make the engine's thread the one that loaded the model (xfmr-serve runs
// it on its main thread): libgomp keeps a team of threads for each thread
// that starts parallel regions, and with more threads in teams than cores
// it stops spinning between regions, so that every product's fork waits
// for a sleeping thread to wake. On the 2-core VM of BENCHMARKS.md an
// engine thread of its own took 1.8x as long a step.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/batch_request.hpp"
#include "xfmr/infer/draft_model.hpp"
#include "xfmr/infer/prompt_lookup.hpp"
#include "xfmr/infer/sampling.hpp"
#include "xfmr/layers/kv_cache.hpp"

namespace xfmr {

template <class Model, class Backend>
class ContinuousBatcher {
  using Clock = std::chrono::steady_clock;
  // Whether the model takes LoRA adapters a row (LanguageModel's select_adapters).
  static constexpr bool kAdapters = requires(Model& m, std::span<const int> rows) { m.select_adapters(rows); };

 public:
  // draft, draft_be: the draft model of speculation.draft, on a backend
  // object of its own (its weights' decoding copies); its ids the model's.
  ContinuousBatcher(Model& model, Backend& be, BatchOptions opts, Model* draft = nullptr, Backend* draft_be = nullptr)
      : model_(model), be_(be), opts_(opts) {
    const int max_t = model_.max_t();
    if (opts_.context == 0) opts_.context = max_t;
    require(opts_.slots >= 1 && opts_.slots <= 4096, "slots ", opts_.slots, " outside [1, 4096]");
    require(opts_.context >= 2 && opts_.context <= max_t, "context ", opts_.context, " outside [2, ", max_t,
            "], the model's");
    require(opts_.prefill_chunk >= 1, "prefill chunk ", opts_.prefill_chunk, " must be >= 1");
    require(opts_.queue >= 0, "queue bound ", opts_.queue, " must be >= 0");
    const Speculation& sp = opts_.speculation;
    require(sp.lookup >= 0 && sp.lookup <= 16, "lookup ", sp.lookup, " drafts outside [0, 16]");
    require(sp.draft >= 0 && sp.draft <= 16, "draft ", sp.draft, " tokens outside [0, 16]");
    require(sp.lookup == 0 || sp.draft == 0, "speculative decoding takes its drafts from one source: lookup ",
            sp.lookup, " or draft ", sp.draft);
    require(sp.draft == 0 || (draft && draft_be), "draft ", sp.draft, " tokens a step need a draft model");
    model_.set_training(false);
    model_.start_cache(cache_, opts_.slots, opts_.context);
    if (sp.draft > 0) draft_.emplace(*draft, *draft_be, opts_.slots, opts_.context, opts_.prefill_chunk, sp.draft);
    slots_.resize(opts_.slots);
    asks_.resize(slots_.size());
    segments_.reserve(opts_.slots);
    ids_.reserve(std::size_t(opts_.slots) * std::size_t(1 + std::max(sp.lookup, sp.draft)) +
                 std::size_t(opts_.prefill_chunk));
    owners_.reserve(opts_.slots);
  }

  const BatchOptions& options() const { return opts_; }
  int context() const { return opts_.context; }

  // Checks the request (Error naming the field) and queues it; its id.
  // Throws QueueFull when every slot is taken and `queue` requests wait
  // already, Error once closed.
  std::uint64_t submit(BatchRequest r) {
    const int V = model_.vocab();
    require(!r.prompt.empty(), "the prompt is empty (give at least one token)");
    for (std::int32_t id : r.prompt) require(id >= 0 && id < V, "prompt token id ", id, " outside [0, ", V, ")");
    require(r.max_tokens >= 1, "max_tokens ", r.max_tokens, " must be >= 1");
    require(long(r.prompt.size()) + long(r.max_tokens) <= long(opts_.context), "the prompt's ", r.prompt.size(),
            " tokens and max_tokens ", r.max_tokens, " exceed the context of ", opts_.context, " tokens");
    require(r.vocabulary >= 0 && r.vocabulary <= V, "vocabulary ", r.vocabulary, " outside [0, ", V, "]");
    require(r.adapter >= 0, "adapter ", r.adapter, " is negative");
    require(r.adapter == 0 || kAdapters, "adapter ", r.adapter, ": this model takes no LoRA adapters");
    require(r.top_logprobs >= -1 && r.top_logprobs <= 20, "top_logprobs ", r.top_logprobs, " outside [0, 20]");
    r.sampling.validate();
    std::lock_guard lock(mutex_);
    require(!closed_, "the server is shutting down");
    // A free slot takes a request at the next step; past those, `queue` wait.
    if (int(waiting_.size()) >= opts_.queue + (opts_.slots - busy_))
      throw QueueFull(detail::concat(opts_.slots, " slots are busy and ", waiting_.size() - (opts_.slots - busy_),
                                     " requests wait, the queue's bound"));
    const std::uint64_t id = next_id_++;
    waiting_.push_back({id, std::move(r)});
    ++stats_.requests;
    work_.notify_one();
    return id;
  }

  // Runs task on the engine's thread before the next step: what must not
  // run beside a step (another forward of the model: an embedding). Any
  // thread; an Error once closed.
  void post(std::function<void()> task) {
    std::lock_guard lock(mutex_);
    require(!closed_, "the server is shutting down");
    tasks_.push_back(std::move(task));
    work_.notify_one();
  }

  // Ends request `id` at the next step (reason cancelled); any thread. An id
  // that has finished is ignored.
  void cancel(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    cancels_.push_back(id);
    work_.notify_one();
  }
  void cancel_all() {
    std::lock_guard lock(mutex_);
    cancel_all_ = true;
    work_.notify_one();
  }
  // Refuses every later submit (a server shutting down); those queued and
  // running go on.
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    work_.notify_one();
  }

  BatchStats stats() const {
    std::lock_guard lock(mutex_);
    BatchStats s = stats_;
    s.queued = int(waiting_.size());
    s.busy_slots = busy_;
    s.slots = opts_.slots;
    return s;
  }
  // Each slot's state, as of the last step.
  std::vector<SlotState> slot_states() const {
    std::lock_guard lock(mutex_);
    return slot_states_;
  }
  // Nothing queued and no slot busy.
  bool idle() const {
    std::lock_guard lock(mutex_);
    return waiting_.empty() && busy_ == 0;
  }

  // One step on the calling thread: takes in cancellations and waiting
  // requests, then runs the ragged step of every busy slot. False when
  // there was nothing to run.
  bool step() {
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard lock(mutex_);
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    admit();
    make_drafts();
    build_step();
    if (segments_.empty()) return !tasks.empty();
    const auto t0 = Clock::now();
    std::span<const typename Backend::Scalar> logits;
    try {
      // Each row takes its sequence's adapter (LinearAdapters::select); none is chosen between steps.
      struct Select {
        Model& m;
        bool on;
        Select(Model& model, bool any, std::span<const int> rows) : m(model), on(any) {
          if constexpr (kAdapters)
            if (on) m.select_adapters(rows);
        }
        ~Select() {
          if constexpr (kAdapters)
            if (on) m.select_adapters({});
        }
      } select(model_, adapters_, row_adapters_);
      const auto out = model_.forward_cached(be_, ids_, segments_, cache_);
      logits = be_.host_view(out, staging_);
    } catch (const std::exception& e) {
      // A step that cannot run ends every sequence in it, never leaving a
      // slot stuck; what their caches hold is not trusted.
      for (int s : owners_) {
        finish(s, FinishReason::error, e.what());
        slots_[s].held.clear();
      }
      publish();
      return true;
    }
    const std::size_t V = std::size_t(model_.vocab());
    std::uint64_t drawn_tokens = 0, read_tokens = 0, drafted = 0, accepted = 0;
    std::size_t fed_ids = 0, output = 0;
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const int s = owners_[i];
      Slot& slot = slots_[s];
      const StepSegment& seg = segments_[i];
      const auto fed = ids_.begin() + std::ptrdiff_t(fed_ids);
      fed_ids += std::size_t(seg.rows);
      const std::size_t first = output;
      output += std::size_t(seg.outputs);
      if (slot.fed < slot.prompt_size()) {  // reading the prompt
        slot.position += seg.rows;
        slot.held.insert(slot.held.end(), fed, fed + seg.rows);
        slot.fed += seg.rows;
        read_tokens += seg.rows;
        if (slot.fed < slot.prompt_size()) continue;  // more of the prompt to read
        draw(s, logits.subspan(first * V, V), drawn_tokens);
        continue;
      }
      // Decoding: the newest token, then the step's drafts.
      // Each output row draws the next token as a step of its own would;
      // while a draw equals the draft the next row was fed, that row's
      // input was right and it draws too. The rows past the first wrong
      // draft are forgotten (their positions are written again).
      drafted += std::size_t(seg.rows - 1);
      for (int j = 0; j < seg.outputs; ++j) {
        ++slot.position;
        slot.held.push_back(fed[j]);
        const std::int32_t drew = draw(s, logits.subspan((first + std::size_t(j)) * V, V), drawn_tokens);
        if (!slot.busy || drew < 0 || j + 1 >= seg.outputs || drew != fed[j + 1]) break;
        ++accepted;
      }
    }
    publish();
    std::lock_guard lock(mutex_);
    stats_.generated_tokens += drawn_tokens;
    stats_.prompt_tokens += read_tokens;
    stats_.drafted_tokens += drafted;
    stats_.accepted_tokens += accepted;
    ++stats_.steps;
    stats_.busy_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    return true;
  }

  // Steps until stop is requested, waiting for work when there is none.
  // After the stop request it refuses new requests (close) and returns once
  // those it holds have finished; cancel_all() from another thread bounds
  // that wait.
  void run(std::stop_token stop) {
    while (true) {
      if (stop.stop_requested()) close();
      if (step()) continue;
      std::unique_lock lock(mutex_);
      if (closed_ && waiting_.empty() && busy_ == 0 && tasks_.empty()) return;
      work_.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return !waiting_.empty() || !cancels_.empty() || !tasks_.empty() || cancel_all_ || stop.stop_requested();
      });
    }
  }

 private:
  struct Waiting {
    std::uint64_t id;
    BatchRequest req;
  };
  struct Slot {
    bool busy = false, cancelled = false;
    std::uint64_t id = 0;
    BatchRequest req;
    std::optional<Sampler> sampler;
    Rng rng;
    int fed = 0;        // prompt ids read (or taken from the cache)
    int position = 0;   // positions in the cache
    int generated = 0;  // tokens drawn
    int cached = 0;     // prompt ids taken from the cache
    std::int32_t next = 0;
    // The ids whose keys and values the slot's cache rows hold, in order;
    // kept after the request ends, for the next prompt that begins so.
    std::vector<std::int32_t> held;
    int held_adapter = 0;              // the adapter whose rows those are (BatchRequest::adapter)
    std::vector<std::int32_t> drafts;  // this step's
    std::uint64_t last_used = 0;  // the step it last took a request (free slots: the oldest goes first)
    Clock::time_point admitted{}, first_token{};
    int prompt_size() const { return int(req.prompt.size()); }
  };

  // Cancellations first (a waiting request is answered at once), then the
  // queue into free slots, oldest first.
  void admit() {
    std::vector<Waiting> dropped;
    {
      std::lock_guard lock(mutex_);
      if (cancel_all_) {
        for (auto& w : waiting_) dropped.push_back(std::move(w));
        waiting_.clear();
        for (auto& s : slots_)
          if (s.busy) s.cancelled = true;
        cancel_all_ = false;
      }
      for (std::uint64_t id : cancels_) {
        const auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& x) { return x.id == id; });
        if (w != waiting_.end()) {
          dropped.push_back(std::move(*w));
          waiting_.erase(w);
        }
        for (auto& s : slots_)
          if (s.busy && s.id == id) s.cancelled = true;
      }
      cancels_.clear();
    }
    for (auto& w : dropped) {
      count(FinishReason::cancelled);
      if (w.req.on_finish) w.req.on_finish({FinishReason::cancelled, int(w.req.prompt.size()), 0, {}});
    }
    for (int s = 0; s < int(slots_.size()); ++s)
      if (slots_[s].busy && slots_[s].cancelled) finish(s, FinishReason::cancelled);
    std::lock_guard lock(mutex_);
    for (auto w = waiting_.begin(); w != waiting_.end() && busy_ < int(slots_.size());) {
      const auto [slot, from, reuse] = place(w->req.prompt, w->req.adapter);
      if (slot < 0) {
        ++w;  // another slot is reading its prompt's prefix: it waits for that
        continue;
      }
      Slot& x = slots_[slot];
      if (from != slot) {
        cache_.copy_prefix(be_, from, slot, reuse);
        x.held.assign(slots_[from].held.begin(), slots_[from].held.begin() + reuse);
        if (draft_) draft_->share(from, slot, x.held);  // the draft's rows of that prefix too
      }
      x.held.resize(std::size_t(reuse));
      x.held_adapter = w->req.adapter;
      x.busy = true, x.cancelled = false;
      x.id = w->id;
      x.req = std::move(w->req);
      x.sampler.emplace(x.req.sampling);
      x.rng = Rng(x.req.seed);
      x.fed = x.position = x.cached = reuse;
      x.generated = 0;
      x.last_used = ++uses_;
      x.admitted = Clock::now();
      stats_.cached_tokens += std::uint64_t(reuse);
      ++busy_;
      w = waiting_.erase(w);
    }
  }

  // Where a prompt goes: {slot, the slot whose rows it copies (itself: none
  // to copy), the prompt ids reused}; slot -1 when it should wait, a busy
  // slot reading a longer prefix of it than any cache holds. At least the
  // prompt's last id is read (its logits draw the first token).
  struct Place {
    int slot, from, reuse;
  };
  Place place(const std::vector<std::int32_t>& prompt, int adapter) const {
    const auto common = [&](const std::vector<std::int32_t>& held, int held_adapter) {
      if (held_adapter != adapter) return 0;  // another adapter's keys and values
      const std::size_t n = std::min(held.size(), prompt.size() - 1);
      return int(std::mismatch(held.begin(), held.begin() + std::ptrdiff_t(n), prompt.begin()).first - held.begin());
    };
    int own = -1, own_reuse = -1, from = -1, reuse = 0, oldest = -1, reading = 0;
    for (int s = 0; s < int(slots_.size()); ++s) {
      const Slot& x = slots_[s];
      const int n = common(x.held, x.held_adapter);
      if (n > reuse) from = s, reuse = n;
      if (x.busy && x.fed < x.prompt_size()) reading = std::max(reading, common(x.req.prompt, x.req.adapter));
      if (x.busy) continue;
      if (n > own_reuse) own = s, own_reuse = n;
      if (oldest < 0 || x.last_used < slots_[oldest].last_used) oldest = s;
    }
    if (reading > reuse) return {-1, -1, 0};
    if (reuse == 0) return {oldest, oldest, 0};  // nothing shared: the cache used longest ago goes
    if (own_reuse == reuse) return {own, own, reuse};
    // The rows are a busy slot's: copied to the free slot used longest ago.
    return {oldest, from, reuse};
  }

  // The slots' states for slot_states(), once a step has changed them.
  void publish() {
    std::lock_guard lock(mutex_);
    slot_states_.resize(slots_.size());
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const Slot& x = slots_[s];
      slot_states_[s] = {x.busy,
                         x.id,
                         x.busy ? x.prompt_size() : slot_states_[s].prompt_tokens,
                         x.busy ? x.cached : slot_states_[s].cached_tokens,
                         x.busy ? x.generated : slot_states_[s].generated_tokens,
                         int(x.held.size())};
    }
  }

  // Slot s draws its next token from `logits` (a row of the model's
  // vocabulary): through its constraint, sampler, logprobs and callbacks,
  // finishing it at a stop or its length. The id, or -1 when it failed.
  std::int32_t draw(int s, std::span<const typename Backend::Scalar> logits, std::uint64_t& drawn_tokens) {
    Slot& slot = slots_[s];
    const std::size_t drawn = std::size_t(slot.req.vocabulary > 0 ? slot.req.vocabulary : int(logits.size()));
    std::span<const typename Backend::Scalar> row = logits.first(drawn);
    std::int32_t next = 0;
    try {
      if (slot.req.constraint) {  // the ids it does not allow get the lowest logit
        require(slot.req.constraint->allowed(mask_, slot.req.max_tokens - slot.generated - 1),
                "structured output: no token keeps the text valid");
        masked_.assign(row.begin(), row.end());
        for (std::size_t j = 0; j < masked_.size(); ++j)
          if (j >= mask_.size() || !mask_[j])
            masked_[j] = static_cast<typename Backend::Scalar>(std::numeric_limits<float>::lowest());
        row = masked_;
      }
      next = (*slot.sampler)(row, slot.rng);
      if (slot.req.constraint) slot.req.constraint->accept(next);
    } catch (const std::exception& e) {
      finish(s, FinishReason::error, e.what());
      return -1;
    }
    ++slot.generated, ++drawn_tokens;
    if (slot.generated == 1) slot.first_token = Clock::now();
    slot.next = next;
    if (slot.req.top_logprobs >= 0 && slot.req.on_logprobs)
      slot.req.on_logprobs(token_logprobs(row, next, slot.req.top_logprobs, slot.req.sampling.temperature));
    const bool more = slot.req.on_token ? slot.req.on_token(next) : true;
    const bool stop = std::find(slot.req.stop_ids.begin(), slot.req.stop_ids.end(), next) != slot.req.stop_ids.end();
    if (!more || stop) finish(s, FinishReason::stop);
    else if (slot.generated >= slot.req.max_tokens || slot.position >= opts_.context) finish(s, FinishReason::length);
    return next;
  }

  // Drafts a decoding slot may feed this step: while the tokens and the
  // positions left hold them; none under a constraint, whose next ids
  // depend on the ones drawn.
  int draft_room(const Slot& slot, int most) const {
    if (slot.req.constraint) return 0;
    return std::max(0, std::min({most, slot.req.max_tokens - slot.generated - 1, opts_.context - slot.position - 1}));
  }

  // Each decoding slot's drafts for this step (Slot::drafts).
  void make_drafts() {
    for (Slot& slot : slots_) {
      slot.drafts.clear();
      if (slot.busy && slot.fed >= slot.prompt_size() && opts_.speculation.lookup > 0)
        slot.drafts = prompt_lookup_drafts(slot.held, slot.next, draft_room(slot, opts_.speculation.lookup));
    }
    if (!draft_) return;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const Slot& slot = slots_[s];
      const bool decoding = slot.busy && slot.fed >= slot.prompt_size();
      asks_[s] = {slot.busy,
                  decoding,
                  slot.held,
                  slot.next,
                  decoding ? draft_room(slot, opts_.speculation.draft) : 0,
                  slot.req.vocabulary > 0 ? slot.req.vocabulary : model_.vocab(),
                  &slots_[s].drafts};
    }
    try {
      draft_->draw(asks_);
    } catch (const std::exception& e) {
      // As a failed step of the model's: its sequences end, their rows untrusted.
      for (int s : draft_->stepped()) {
        finish(s, FinishReason::error, e.what());
        slots_[s].held.clear();
        slots_[s].drafts.clear();
        draft_->forget(s);
      }
    }
  }

  // The step's segments: each decoding slot's newest token, then the
  // prompts being read, in slot order, up to prefill_chunk ids in all.
  void build_step() {
    segments_.clear(), ids_.clear(), owners_.clear(), row_adapters_.clear();
    for (int s = 0; s < int(slots_.size()); ++s) {
      const Slot& slot = slots_[s];
      if (!slot.busy || slot.fed < slot.prompt_size()) continue;
      const auto& d = slot.drafts;
      segments_.push_back({s, slot.position, 1 + int(d.size()), 1 + int(d.size())});
      ids_.push_back(slot.next);
      ids_.insert(ids_.end(), d.begin(), d.end());
      owners_.push_back(s);
      row_adapters_.insert(row_adapters_.end(), 1 + d.size(), slot.req.adapter);
    }
    int budget = opts_.prefill_chunk;
    for (int s = 0; s < int(slots_.size()) && budget > 0; ++s) {
      const Slot& slot = slots_[s];
      if (!slot.busy || slot.fed >= slot.prompt_size()) continue;
      const int n = std::min(budget, slot.prompt_size() - slot.fed);
      segments_.push_back({s, slot.position, n});
      ids_.insert(ids_.end(), slot.req.prompt.begin() + slot.fed, slot.req.prompt.begin() + slot.fed + n);
      owners_.push_back(s);
      row_adapters_.insert(row_adapters_.end(), std::size_t(n), slot.req.adapter);
      budget -= n;
    }
    adapters_ = std::any_of(row_adapters_.begin(), row_adapters_.end(), [](int a) { return a != 0; });
  }

  void finish(int s, FinishReason reason, std::string error = {}) {
    Slot& slot = slots_[s];
    if (!slot.busy) return;
    const auto now = Clock::now();
    const auto first = slot.generated > 0 ? slot.first_token : now;
    const BatchResult result{reason,
                             slot.prompt_size(),
                             slot.generated,
                             slot.cached,
                             std::move(error),
                             std::chrono::duration<double>(first - slot.admitted).count(),
                             std::chrono::duration<double>(now - first).count()};
    {
      std::lock_guard lock(mutex_);
      if (std::size_t(s) < slot_states_.size())
        slot_states_[std::size_t(s)] = {false, slot.id, slot.prompt_size(), slot.cached, slot.generated,
                                        int(slot.held.size())};
    }
    auto on_finish = std::move(slot.req.on_finish);
    slot.busy = false;
    slot.req = {};
    {
      std::lock_guard lock(mutex_);
      --busy_;
    }
    count(reason);
    if (on_finish) on_finish(result);
  }
  void count(FinishReason reason) {
    std::lock_guard lock(mutex_);
    ++stats_.finished;
    if (reason == FinishReason::cancelled) ++stats_.cancelled;
    if (reason == FinishReason::error) ++stats_.failed;
  }

  Model& model_;
  Backend& be_;
  BatchOptions opts_;
  DecodingCache<Backend> cache_;
  std::optional<DraftModel<Model, Backend>> draft_;  // speculation.draft's
  std::vector<typename DraftModel<Model, Backend>::Ask> asks_;  // a draw's, a slot each
  std::vector<Slot> slots_;
  std::vector<StepSegment> segments_;
  std::vector<std::int32_t> ids_;
  std::vector<int> owners_;  // the slot of each segment
  std::vector<int> row_adapters_;  // each row's adapter (BatchRequest::adapter)
  bool adapters_ = false;          // whether any row of the step takes one
  std::vector<typename Backend::Scalar> staging_;
  std::vector<std::uint8_t> mask_;                 // a constraint's allowed ids
  std::vector<typename Backend::Scalar> masked_;  // a row of logits with the others at the lowest

  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable work_;
  std::deque<Waiting> waiting_;
  std::vector<std::uint64_t> cancels_;
  std::vector<std::function<void()>> tasks_;
  bool cancel_all_ = false, closed_ = false;
  int busy_ = 0;
  std::uint64_t next_id_ = 1;
  std::uint64_t uses_ = 0;  // requests placed in slots
  BatchStats stats_;
  std::vector<SlotState> slot_states_;
};

}  // namespace xfmr
