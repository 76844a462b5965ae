// batch_request.hpp: what a ContinuousBatcher (continuous_batching.hpp)
// takes and gives: a request with its callbacks, its result, the batcher's
// options, its counts and its slots' states.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/infer/sampling.hpp"
#include "xfmr/infer/token_constraint.hpp"

namespace xfmr {

enum class FinishReason { stop, length, cancelled, error };
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

struct BatchResult {
  FinishReason reason = FinishReason::length;
  int prompt_tokens = 0, completion_tokens = 0;
  int cached_tokens = 0;  // prompt ids whose keys and values came from the cache, not read again
  std::string error{};    // reason error: what the model's step threw
  // From taking a slot to the first token drawn (reading the prompt), and
  // from there to the end (llama-server's `timings`).
  double prompt_seconds = 0, generation_seconds = 0;
};

struct BatchRequest {
  std::vector<std::int32_t> prompt{};  // at least one id, below the model's vocabulary
  SamplingOptions sampling{};
  int max_tokens = 16;                 // prompt + max_tokens <= the batcher's context
  std::vector<std::int32_t> stop_ids{};  // generation ends after any of them (the last token given)
  int vocabulary = 0;                  // ids drawn below it (0: the model's), as GenerateOptions'
  std::uint64_t seed = 0;
  int adapter = 0;  // the LoRA adapter loaded beside the model its rows take (LinearAdapters' id; 0: none)
  // >= 0: on_logprobs gets each drawn token's log-probability and the
  // top_logprobs likeliest ids' (token_logprobs, sampling.hpp), before on_token.
  int top_logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs{};
  // Draws only the ids it allows (structured output); it sees each id drawn.
  std::shared_ptr<TokenConstraint> constraint{};
  // On the engine's thread: each token as it is drawn; returning false ends
  // the generation there with reason stop (the caller saw a stop string).
  std::function<bool(std::int32_t)> on_token{};
  // On the engine's thread, once, last.
  std::function<void(const BatchResult&)> on_finish{};
};

// The queue is full (a server's 503): try again later.
class QueueFull : public Error {
 public:
  using Error::Error;
};

// Speculative decoding (continuous_batching.hpp): a decoding slot feeds,
// after its newest token, up to this many drafts a step, from one source.
struct Speculation {
  int lookup = 0;  // by prompt lookup (prompt_lookup.hpp)
  int draft = 0;   // by the draft model's greedy tokens (the batcher's draft)
};

struct BatchOptions {
  int slots = 8;            // sequences decoded together
  int context = 0;          // positions a slot holds (0: the model's max_t)
  int prefill_chunk = 128;  // prompt ids read in one step, over all the prompts being read
  int queue = 64;           // requests waiting for a slot when every slot is busy, at most
  Speculation speculation{};
};

// A slot's state (xfmr-serve's GET /slots).
struct SlotState {
  bool busy = false;
  std::uint64_t request = 0;  // the request it decodes (busy) or decoded last
  int prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  int held_tokens = 0;  // positions whose keys and values it holds (for the next prompt's prefix)
};

// Counts since the batcher started, and its state now.
struct BatchStats {
  std::uint64_t requests = 0, finished = 0, cancelled = 0, failed = 0;
  std::uint64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  std::uint64_t cached_tokens = 0;  // prompt ids taken from the cache instead of read
  std::uint64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative drafts fed, and those drawn as drafted
  double busy_seconds = 0;  // time spent in steps
  int queued = 0, busy_slots = 0, slots = 0;
};

}  // namespace xfmr
