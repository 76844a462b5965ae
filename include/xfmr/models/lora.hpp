// lora.hpp (models): LoRA on a LanguageModel: low-rank adapters
// (layers/lora.hpp) on the projections a target list names, over a frozen
// base, and the adapters as a model of their own for what trains them.
//
//   xfmr::add_lora(*model, {.rank = 16, .alpha = 32}, seed);  // B zero: the model's logits unchanged
//   xfmr::LoraModel<Be> lora(*model);        // the model, its parameters the adapters alone
//   xfmr::AdamW<Be> opt(lora);                // state for the adapters only
//   xfmr::Trainer<xfmr::LanguageModel<Be>, Be> trainer(lora, be, opt, {.split = {.shards = 1}});
//   xfmr::merge_lora(be, *model);             // W += scale B A, adapters dropped: a plain model again
//
// Targets, by the projections of a block: "q", "k", "v" (attention's fused
// qkv, their column ranges) or "qkv" (all of it, GPT-2's c_attn), "o" (the
// attention's output), "gate" and "up" (a gated feed-forward's fc1 halves)
// or "fc1" (all of it, GPT-2's c_fc), "down" (fc2). Scale alpha / rank, or
// alpha / sqrt(rank) with rslora (peft's use_rslora).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {

namespace detail {
// The whole of `text` as a number (false: not one, or more than one).
inline bool read_number(const std::string& text, double& x) {
  std::size_t used = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used > 0 && used == text.size();
}
}  // namespace detail

struct LoraOptions {
  int rank = 16;
  double alpha = 32;
  bool rslora = false;  // scale alpha / sqrt(rank)
  std::vector<std::string> targets = {"q", "k", "v", "o", "gate", "up", "down"};
  double dropout = 0;  // on each adapter's input while training (peft's lora_dropout), in [0, 1)
  double scale() const { return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank); }

  // "r=16,alpha=32,targets=q,k,v,o,gate,up,down[,dropout=0.05][,rslora]" (a program's
  // --lora): the words after targets= up to the next key are targets;
  // what is not given keeps its default. An Error names a bad part.
  static LoraOptions parse(std::string_view spec) {
    LoraOptions o;
    bool in_targets = false;
    std::size_t at = 0;
    while (at <= spec.size()) {
      const std::size_t comma = std::min(spec.find(',', at), spec.size());
      const std::string part(spec.substr(at, comma - at));
      at = comma + 1;
      const std::size_t eq = part.find('=');
      const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
      const auto number = [&](double lo) {
        double x = 0;
        require(detail::read_number(value, x) && x >= lo, "LoRA setting '", part, "': ", key, " must be a number >= ",
                lo);
        return x;
      };
      if (eq == std::string::npos && key == "rslora") {
        o.rslora = true, in_targets = false;
      } else if (eq == std::string::npos && in_targets && !key.empty()) {
        o.targets.push_back(key);
      } else if (key == "r" || key == "rank") {
        const double r = number(1);
        require(r == std::floor(r), "LoRA setting '", part, "': the rank is a whole number");
        o.rank = int(r), in_targets = false;
      } else if (key == "alpha") {
        o.alpha = number(0), in_targets = false;
        require(o.alpha > 0, "LoRA setting '", part, "': alpha must be positive");
      } else if (key == "dropout") {
        o.dropout = number(0), in_targets = false;
        require(o.dropout < 1, "LoRA setting '", part, "': dropout must be below 1");
      } else if (key == "targets") {
        o.targets = {value}, in_targets = true;
      } else {
        detail::fail("LoRA setting '", part, "' is none of r=, alpha=, targets=, dropout=, rslora (\"", spec, "\")");
      }
    }
    return o;
  }
  // The same as parse reads it.
  std::string str() const {
    std::string s = "r=" + std::to_string(rank) + ",alpha=" + format_number(alpha) + ",targets=";
    for (std::size_t i = 0; i < targets.size(); ++i) s += (i ? "," : "") + targets[i];
    if (dropout > 0) s += ",dropout=" + format_number(dropout);
    return rslora ? s + ",rslora" : s;
  }

 private:
  static std::string format_number(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  }
};

// "DIR[:SCALE]" (xfmr-lm sample --lora, xfmr-serve --lora NAME=DIR[:SCALE]):
// a peft adapter directory and the scale to load it at (1 when not given);
// `what` names the setting in an Error.
inline std::pair<std::string, double> adapter_location(const std::string& v, std::string_view what) {
  const std::size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) return {v, 1.0};
  double x = 0;
  require(detail::read_number(v.substr(colon + 1), x), what, " ", v, ": the scale after ':' is not a number");
  return {v.substr(0, colon), x};
}

namespace detail {
// The adapters a target list puts on one of a block's projections (its
// name's last part: qkv, proj, fc1, fc2): {target, first column, width}.
struct LoraRange {
  std::string target;
  int begin, width;
};
inline std::vector<LoraRange> lora_ranges(std::string_view projection, const ModelDims& d, bool gated,
                                          const std::vector<std::string>& targets) {
  const auto wants = [&](const char* t) { return std::find(targets.begin(), targets.end(), t) != targets.end(); };
  std::vector<LoraRange> out;
  const int q = d.n_heads * d.qk_head(), k = d.kv_heads() * d.qk_head(), v = d.kv_heads() * d.v_head();
  if (projection == "qkv") {
    if (wants("qkv")) out.push_back({"qkv", 0, q + k + v});
    if (wants("q")) out.push_back({"q", 0, q});
    if (wants("k")) out.push_back({"k", q, k});
    if (wants("v")) out.push_back({"v", q + k, v});
  } else if (projection == "proj" && wants("o")) {
    out.push_back({"o", 0, d.d_model});
  } else if (projection == "fc1") {
    if (wants("fc1")) out.push_back({"fc1", 0, gated ? 2 * d.d_ff : d.d_ff});
    if (gated && wants("gate")) out.push_back({"gate", 0, d.d_ff});
    if (gated && wants("up")) out.push_back({"up", d.d_ff, d.d_ff});
  } else if (projection == "fc2" && wants("down")) {
    out.push_back({"down", 0, d.d_model});
  }
  return out;
}
}  // namespace detail

// Adapters on every projection `o.targets` names (each target must name
// one the architecture has; a whole projection and its parts not both),
// A drawn from seed, B zero, and the base frozen. Id 0: the model's own
// adapter (the one that trains); k > 0: the k-th of those loaded beside
// it, decoding only, for the rows that select k (layers/lora.hpp).
template <class Backend>
void add_lora(LanguageModel<Backend>& model, const LoraOptions& o, std::uint64_t seed, int id = 0) {
  static const std::vector<std::string> known = {"q", "k", "v", "qkv", "o", "gate", "up", "fc1", "down"};
  require(!o.targets.empty(), "LoRA: no targets (choose among q, k, v, qkv, o, gate, up, fc1, down)");
  for (const std::string& t : o.targets)
    require(std::find(known.begin(), known.end(), t) != known.end(), "LoRA target '", t,
            "' is not a projection (choose among q, k, v, qkv, o, gate, up, fc1, down)");
  const auto has = [&](const char* t) { return std::find(o.targets.begin(), o.targets.end(), t) != o.targets.end(); };
  require(!(has("qkv") && (has("q") || has("k") || has("v"))), "LoRA targets qkv and q, k or v overlap");
  require(!(has("fc1") && (has("gate") || has("up"))), "LoRA targets fc1 and gate or up overlap");
  require(o.rank >= 1, "LoRA rank ", o.rank, " must be at least 1");
  require(std::isfinite(o.alpha) && o.alpha > 0, "LoRA alpha ", o.alpha, " must be positive");
  require(o.dropout >= 0 && o.dropout < 1, "LoRA dropout ", o.dropout, " outside [0, 1)");
  const ModelDims d = model.dims();
  const bool gated = d.parts.activation == ModelParts::Activation::swiglu ||
                     d.parts.activation == ModelParts::Activation::geglu;
  for (const std::string& t : o.targets)
    require((t != "gate" && t != "up") || gated, "LoRA target '", t, "': the model's feed-forward is not gated (",
            "target fc1)");
  require(id >= 0, "LoRA adapter id ", id, " is negative");
  model.visit_adapters([&](std::string_view name, LinearAdapters<Backend>& adapters, auto&) {
    require(!adapters.has(id), "the model has LoRA adapters ", id == 0 ? "already" : "of id " + std::to_string(id),
            " (", name, ")");
  });
  Rng rng(seed), dropout_seeds(~seed);  // the masks' seeds apart: A is drawn as without dropout
  std::vector<std::string> placed;
  try {
    model.visit_adapters([&](std::string_view name, LinearAdapters<Backend>& adapters, auto&) {
      const std::string_view projection = name.substr(name.rfind('.') + 1);
      const auto ranges = detail::lora_ranges(projection, d, gated, o.targets);
      for (const auto& r : ranges) {
        adapters.add(r.target, r.begin, r.width, o.rank, o.scale(), rng, id);
        placed.push_back(r.target);
      }
      if (id == 0 && !ranges.empty()) adapters.set_dropout(float(o.dropout), dropout_seeds.next_u64());
    });
  } catch (...) {  // none, rather than some
    model.visit_adapters([&](std::string_view, LinearAdapters<Backend>& adapters, auto&) { adapters.clear(id); });
    throw;
  }
  for (const std::string& t : o.targets)
    require(std::find(placed.begin(), placed.end(), t) != placed.end(), "LoRA target '", t,
            "' is no projection of this model");
  model.freeze_base(true);
}

// A model with adapters, as the model that trains them: its forward,
// backward and decoding are the model's, its parameters (visit) the
// adapters' A and B alone ("blocks.0.attn.qkv.q.lora_A", ...), so that an
// optimizer, gradient clipping, a Trainer and its checkpoints hold and
// write nothing of the base. It trains as one shard (Trainer's
// split.shards 1, the products threaded): a replica would copy the base.
template <class Backend>
class LoraModel final : public LanguageModel<Backend> {
 public:
  using A = typename Backend::Activation;
  using Base = LanguageModel<Backend>;
  explicit LoraModel(Base& model) : m_(model) {}
  Base& base() { return m_; }

  const PresetInfo& preset() const override { return m_.preset(); }
  int vocab() const override { return m_.vocab(); }
  const DecoderOptions& options() const override { return m_.options(); }
  std::size_t parameter_count() const override {
    std::size_t n = 0;
    const_cast<LoraModel*>(this)->visit([&](std::string_view, auto& value, auto&) { n += value.size(); });
    return n;
  }
  std::unique_ptr<Base> clone() const override {
    detail::fail("a LoRA model trains as one shard (shards 1): a replica would copy its base");
  }
  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return m_.forward(be, ids, bt);
  }
  void backward(Backend& be, std::span<const A> dlogits) override { m_.backward(be, dlogits); }
  HeadRows forward_to_head(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return m_.forward_to_head(be, ids, bt);
  }
  HeadLoss head_loss(Backend& be, CrossEntropyLoss<Backend>& loss, std::span<const std::int32_t> targets,
                     double scale) override {
    return m_.head_loss(be, loss, targets, scale);
  }
  std::span<const A> hidden(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return m_.hidden(be, ids, bt);
  }
  void start_cache(DecodingCache<Backend>& cache, int B, int capacity = 0) override { m_.start_cache(cache, B, capacity); }
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B,
                                    DecodingCache<Backend>& cache) override {
    return m_.forward_cached(be, ids, B, cache);
  }
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, RaggedStep step,
                                    DecodingCache<Backend>& cache) override {
    return m_.forward_cached(be, ids, step, cache);
  }
  void visit_adapters(typename Base::AdapterVisitor f) override { m_.visit_adapters(f); }
  void freeze_base(bool on) override { m_.freeze_base(on); }
  void set_training(bool on) override { m_.set_training(on); }
  void set_recompute(Recompute r) override { m_.set_recompute(r); }
  Recompute recompute() const override { return m_.recompute(); }
  void keep_attention_probabilities(bool on) override { m_.keep_attention_probabilities(on); }

 private:
  void visit_parameters(typename VirtualModel<Backend>::ParameterVisitor f) override {
    m_.visit_adapters([&](std::string_view name, LinearAdapters<Backend>& adapters, auto&) {
      const std::string prefix = std::string(name) + ".";
      adapters.visit(prefixed(prefix, f));
    });
  }
  void visit_dropout(typename VirtualModel<Backend>::DropoutVisitor f) override { m_.for_each_dropout(f); }

  Base& m_;
};

// Folds each adapter into its base weight (W[range] += scale B A), drops
// the adapters and unfreezes the base: the model then gives the adapted
// logits by itself (within rounding), to export or decode as any other.
template <class Backend>
void merge_lora(Backend&, LanguageModel<Backend>& model) {
  using S = typename Backend::Scalar;
  model.visit_adapters([&](std::string_view name, LinearAdapters<Backend>& adapters, auto&) {
    for (const auto& x : adapters.list())
      require(x.id == 0, "merge_lora: ", name, " holds adapter ", x.id, ", loaded beside the model, whose base a "
              "merge would change");
  });
  model.visit_adapters([&](std::string_view, LinearAdapters<Backend>& adapters, auto& weight) {
    if (adapters.empty()) return;
    // On the host, once: any backend's weights and adapters, whatever its products take.
    std::vector<S> w(weight.size());
    weight.copy_to_host(w.data());
    for (auto& x : adapters.list()) {
      const std::size_t in = std::size_t(x.a.dim(1)), r = std::size_t(x.rank);
      std::vector<S> a(x.a.size()), b(x.b.size());
      x.a.copy_to_host(a.data());
      x.b.copy_to_host(b.data());
      for (std::size_t o = 0; o < std::size_t(x.width); ++o)
        for (std::size_t i = 0; i < in; ++i) {
          double d = 0;
          for (std::size_t k = 0; k < r; ++k) d += double(b[o * r + k]) * double(a[k * in + i]);
          S& v = w[(std::size_t(x.begin) + o) * in + i];
          v = S(double(v) + x.scale * d);
        }
    }
    weight.copy_from_host(w.data());
    adapters.clear();
  });
  model.freeze_base(false);
}

// Compiled once in the library (src/peft.cpp) for CpuBackend<float>; other
// backends (double's, for gradient checks) instantiate here.
#define XFMR_LORA(KEYWORDS, Be)                                                      \
  KEYWORDS void add_lora<Be>(LanguageModel<Be>&, const LoraOptions&, std::uint64_t, int); \
  KEYWORDS void merge_lora<Be>(Be&, LanguageModel<Be>&);
XFMR_LORA(extern template, CpuBackend<float>)

}  // namespace xfmr
