// generate.hpp: text generation from a prompt, for any causal model
// (Decoder, LanguageModel: models/model.hpp's CausalModel).
//
//   xfmr::Rng rng(seed);
//   const auto ids = xfmr::generate(model, be, prompt_ids,
//                                   {.sampling = {.temperature = 0.8, .top_k = 20}, .max_tokens = 500}, rng,
//                                   [&](std::int32_t id) { std::cout << tok.token(id) << std::flush; });
//
// Each token is drawn from the logits of the newest position (sampling.hpp:
// greedy at temperature 0, else temperature, top-k, top-p), with the model
// in evaluation mode (no dropout). Through the KV cache a token costs one
// position of work; when the cache holds max_t() positions, decoding
// starts again from the last max_t() / 2 tokens. With use_cache false
// every token re-reads the last max_t() tokens (the reference path; the
// two agree token for token while the context fits). A prompt longer than
// max_t() is read from its last max_t() tokens; an empty one is an error.
// stop: generation ends after this token (it is the last returned);
// restart: this token begins a fresh context, as every row of a names
// model's training begins with one. on_token(id) sees each token as it is
// drawn (streaming); returning false from it ends generation there. In bf16
// or int8 precision the weights are read from bfloat16 or int8 copies
// (WeightCopies: made for the call, unless a scope the caller opened holds
// them already). In float32 the faster decoding panels are read only in a
// scope the caller opened (a program decoding many times opens one).
// The model is left in evaluation mode. A Generator keeps the cache and
// buffers for its next call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/infer/sampling.hpp"
#include "xfmr/layers/kv_cache.hpp"
#include "xfmr/models/model.hpp"

namespace xfmr {

struct GenerateOptions {
  SamplingOptions sampling{};
  int max_tokens = 100;
  std::optional<std::int32_t> stop = std::nullopt;     // ends generation after it
  std::optional<std::int32_t> restart = std::nullopt;  // starts a fresh context
  bool use_cache = true;                // false: recompute the context for every token
  // The ids drawn are below it (0: the model's whole vocabulary): a
  // tokenizer's size when the model's vocabulary is padded past it
  // (ModelTokenizer::check_fits), whose padding ids decode to nothing.
  int vocabulary = 0;
};

// Generation for one model, keeping its cache and buffers from call to call
// (a server's loop, a benchmark). Past a call's start (its lists reserved,
// the sampler's sized), a token's step allocates nothing, up to
// kReservedTokens tokens a call (test_steady_state counts).
inline constexpr int kReservedTokens = 1 << 16;
template <class Model, class Backend>
class Generator {
  static_assert(CausalModel<Model, Backend>, "generate: the model must provide forward, start_cache, "
                                             "forward_cached, vocab() and max_t() (models/model.hpp's CausalModel)");

 public:
  Generator(Model& model, Backend& be) : model_(model), be_(be) {}

  // The tokens generated after `prompt` (at most opts.max_tokens).
  template <class OnToken>
  std::vector<std::int32_t> operator()(std::vector<std::int32_t> prompt, const GenerateOptions& opts, Rng& rng,
                                       OnToken&& on_token) {
    require(!prompt.empty(), "generate: the prompt is empty (give at least one token)");
    require(opts.max_tokens >= 0, "generate: max_tokens ", opts.max_tokens, " is negative");
    Sampler sampler(opts.sampling);
    model_.set_training(false);
    const WeightCopies weight_copies(be_, model_, {.panels = false});  // a scope for the call: no panels
    const int V = model_.vocab(), max_t = model_.max_t();
    require(opts.vocabulary >= 0 && opts.vocabulary <= V, "generate: vocabulary ", opts.vocabulary, " outside [0, ", V,
            "], the model's");
    const std::size_t drawn = std::size_t(opts.vocabulary > 0 ? opts.vocabulary : V);
    std::vector<std::int32_t>& context = prompt;
    // Room for what the loop keeps (the context within 2 max_t + 1, the
    // tokens out up to a bound), so that a token's step allocates nothing.
    context.reserve(2 * std::size_t(max_t) + 1);
    std::span<const typename Backend::Scalar> last;  // logits of the newest position, on the host
    // The cache holds what this call can decode (the prompt and the tokens
    // asked for) when that is less than max_t: a model of a long context
    // (Llama 3's 131072) decoding a few tokens allocates for those.
    const long wanted = long(context.size()) + long(opts.max_tokens);
    const int capacity = wanted < long(max_t) ? int(std::max(wanted, 1L)) : max_t;
    auto start = [&] {
      if constexpr (requires { model_.start_cache(cache_, 1, capacity); }) model_.start_cache(cache_, 1, capacity);
      else model_.start_cache(cache_, 1);
    };
    auto encode_window = [&](int keep) {
      const std::span<const std::int32_t> window(context.data() + context.size() - keep, keep);
      const auto logits = opts.use_cache ? (start(), model_.forward_cached(be_, window, 1, cache_))
                                         : model_.forward(be_, window, Shape{1, keep});
      last = be_.host_view(logits.subspan(std::size_t(keep - 1) * V, V), staging_);
    };
    encode_window(std::min<int>(static_cast<int>(context.size()), max_t));
    std::vector<std::int32_t> out;
    out.reserve(std::size_t(std::min(opts.max_tokens, kReservedTokens)));
    for (int i = 0; i < opts.max_tokens; ++i) {
      const std::int32_t next = sampler(last.first(drawn), rng);
      const bool restart = opts.restart && next == *opts.restart;
      if (restart) context.clear();
      // Only the last max_t tokens are ever read again: the context stays
      // within twice that, however many tokens are asked for.
      if (context.size() >= 2 * std::size_t(max_t)) context.erase(context.begin(), context.end() - max_t);
      context.push_back(next);
      out.push_back(next);
      bool more = true;
      if constexpr (std::is_invocable_r_v<bool, OnToken&, std::int32_t>) more = on_token(next);
      else on_token(next);
      if (!more || (opts.stop && next == *opts.stop) || i + 1 == opts.max_tokens) break;
      const int size = static_cast<int>(context.size());
      if (!opts.use_cache) encode_window(std::min(size, max_t));
      else if (restart) encode_window(1);
      else if (cache_.length() == max_t) encode_window(std::min(size, max_t / 2));
      else
        last = be_.host_view(model_.forward_cached(be_, std::span<const std::int32_t>(&context.back(), 1), 1, cache_),
                             staging_);
    }
    return out;
  }
  std::vector<std::int32_t> operator()(std::vector<std::int32_t> prompt, const GenerateOptions& opts, Rng& rng) {
    return (*this)(std::move(prompt), opts, rng, [](std::int32_t) {});
  }

 private:
  Model& model_;
  Backend& be_;
  DecodingCache<Backend> cache_;
  std::vector<typename Backend::Scalar> staging_;
};

// One generation: Generator(model, be)(prompt, opts, rng, on_token).
template <class Model, class Backend, class OnToken>
std::vector<std::int32_t> generate(Model& model, Backend& be, std::vector<std::int32_t> prompt,
                                   const GenerateOptions& opts, Rng& rng, OnToken&& on_token) {
  return Generator<Model, Backend>(model, be)(std::move(prompt), opts, rng, std::forward<OnToken>(on_token));
}
template <class Model, class Backend>
std::vector<std::int32_t> generate(Model& model, Backend& be, std::vector<std::int32_t> prompt,
                                   const GenerateOptions& opts, Rng& rng) {
  return Generator<Model, Backend>(model, be)(std::move(prompt), opts, rng);
}

}  // namespace xfmr
