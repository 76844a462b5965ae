// token_stem.hpp: TokenStem, the input of every sequence model: token
// embedding + positions (learned or sinusoidal),
//   x[b,t] = tok_emb[ids[b,t]] + P[t + offset].
// Parameters "tok_emb.weight", "pos_emb.weight" (learned positions only).
// Backward: parameter gradients accumulate; the input gradient is consumed.
//
// init_gpt2: N(0, std) for matrices (weights and embeddings), zero biases,
// norms left at (1, 0): the GPT-2 / seed initialisation of every model.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "xfmr/core/error.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/embedding.hpp"
#include "xfmr/layers/positional.hpp"

namespace xfmr {

template <class Model>
void init_gpt2(Model& model, Rng& rng, double stddev = 0.02) {
  model.visit([&](std::string_view name, auto& value, auto&) {
    using S = typename std::remove_cvref_t<decltype(value)>::value_type;
    if (value.shape().size() >= 2) {
      value.generate([&] { return S(stddev * rng.normal()); });
    } else if (name.ends_with("bias") && name.find("ln") == std::string_view::npos) {
      value.zero();
    }
  });
}

template <class Cfg, class Backend>
class TokenStem {
 public:
  static constexpr int D = Cfg::D_MODEL;  // or Dynamic
  using A = typename Backend::Activation;

  // share: another stem's token embedding to use instead of an own one.
  TokenStem(int vocab, Rng& rng, Embedding<D, Backend>* share = nullptr)
    requires(is_static_config<Cfg>())
      : TokenStem(model_dims<Cfg>(), vocab, rng, share) {}
  TokenStem(const ModelDims& d, int vocab, Rng& rng, Embedding<D, Backend>* share = nullptr)
      : max_t_(d.max_t),
        tok_emb_(vocab, d.d_model, rng, share),
        pos_(make_positions<PositionsFor<Cfg, Backend>>(d, rng)) {}

  // offset: position of each sequence's first id (incremental decoding).
  void forward(Backend& be, std::span<const std::int32_t> ids, Rows<A, D> x, Shape bt, int offset = 0) {
    require(static_cast<long>(ids.size()) == long(bt.B) * bt.T, "got ", ids.size(), " token ids, expected B*T = ",
            long(bt.B) * bt.T);
    if (offset == 0) require(bt.T <= max_t_, "sequence length ", bt.T, " exceeds MAX_T ", max_t_);
    tok_emb_.forward(be, ids, x);
    pos_.forward(be, x, x, bt, offset);
  }

  // dx is consumed (overwritten) on the way to the embedding gradient.
  void backward(Backend& be, Rows<A, D> dx) {
    pos_.backward(be, dx, dx);
    tok_emb_.backward(be, dx);
  }

  void visit(ParameterVisitor<Backend> f) {
    tok_emb_.visit(prefixed("tok_emb.", f));
    pos_.visit(prefixed("pos_emb.", f));
  }

  Embedding<D, Backend>& token_embedding() { return tok_emb_; }
  int vocab() const { return tok_emb_.vocab(); }

 private:
  int max_t_;
  Embedding<D, Backend> tok_emb_;
  PositionsFor<Cfg, Backend> pos_;
};

}  // namespace xfmr
