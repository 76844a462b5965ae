// attention.hpp: multi-head scaled dot-product attention.
//
//   SelfAttention<Cfg, Backend>   queries, keys and values from one input x,
//                                 through one fused projection "qkv".
//   CrossAttention<Cfg, Backend>  queries from x_q, keys and values from x_kv
//                                 (e.g. an encoder's output), projections "q"
//                                 and fused "kv".
// Both: heads of QK_HEAD_DIM for queries/keys and V_HEAD_DIM for values (each
// D_MODEL / N_HEADS unless the config sets them), optional causal and
// key-padding masks (mask.hpp), output projection "proj" (H*V_HEAD_DIM -> D).
//
// Grouped-query attention: KVH = Cfg::N_KV_HEADS key/value heads (default
// H), key/value head h / (H / KVH) serving query head h; the KV cache holds
// KVH heads.
// Fused projection layout, per row: [q heads | k heads | v heads], head h of q
// at columns [h*QK, (h+1)*QK). Weight shapes follow torch.nn.Linear:
//   qkv.weight (H*QK + KVH*(QK + V), D)   q.weight (H*QK, D)   kv.weight (KVH*(QK + V), D)
//   proj.weight (D, H*V)                  and a bias for each (unless Cfg::BIAS is false).
// Rotary positions (Cfg::Positions = Rope): SelfAttention turns its query and
// key heads by their positions after the projection (and their gradients
// back before it); the cache holds turned keys. CrossAttention does not.
// Dropout on the attention probabilities (PyTorch's MultiheadAttention
// dropout, the seeds' GPT): set_dropout(p, seed); active in training mode
// (dropout().set_training), drawn from dropout()'s keys like a Dropout
// layer's masks. The cached (decoding) forwards never drop.
// Saves: the projections, the attention probabilities (B, H, T_q, T_kv),
// undropped, or where the path is tiled (attention_plan.hpp) each query row's
// log-sum-exp (B, H, T_q) and the mask; and the inputs by pointer.
// Backward: parameter gradients accumulate; input gradients (dx, or dx_q
// and dx_kv) are assigned; the gradients of the context and projections
// are scratch from the backend's workspace (core/workspace.hpp).
#pragma once

#include <optional>
#include <algorithm>
#include <exception>
#include <mutex>
#include <span>
#include <type_traits>
#include <vector>

#include "xfmr/backend/attention_plan.hpp"
#include "xfmr/backend/backend.hpp"
#include "xfmr/core/config.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/mask.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/layers/dropout.hpp"
#include "xfmr/layers/kv_cache.hpp"
#include "xfmr/layers/linear.hpp"
#include "xfmr/layers/positional.hpp"

namespace xfmr {

namespace detail {

// An attention layer's sizes: static where the configuration's are (the
// static_asserts check them), else held at run time from a ModelDims
// (checked there, ModelDims::check).
template <class Cfg>
struct AttentionSizes {
  static constexpr int D_ = Cfg::D_MODEL, QK_ = qk_head_dim<Cfg>(), V_ = v_head_dim<Cfg>();
  static constexpr int H_ = Cfg::N_HEADS, KVH_ = kv_heads<Cfg>();
  static_assert(H_ == Dynamic || D_ == Dynamic || (H_ > 0 && D_ > 0), "D_MODEL and N_HEADS must be positive");
  static_assert(H_ == Dynamic || KVH_ == Dynamic || (KVH_ > 0 && H_ % KVH_ == 0), "N_KV_HEADS must divide N_HEADS");
  static_assert(head_dims_are_explicit<Cfg>() || H_ == Dynamic || D_ == Dynamic || D_ % H_ == 0,
                "D_MODEL must be divisible by N_HEADS (or set QK_HEAD_DIM and V_HEAD_DIM)");
  static_assert(QK_ == Dynamic || V_ == Dynamic || (QK_ > 0 && V_ > 0), "head sizes must be positive");

  explicit AttentionSizes(const ModelDims& d)
      : D(d.d_model, "attention width"), H(d.n_heads), KVH(d.kv_heads()), QK(d.qk_head()), V(d.v_head()),
        MAX_T(d.max_t) {
    check_model_dims<Cfg>(d);
  }
  Dim<D_> D;
  int H, KVH, QK, V, MAX_T;
};

inline void check_attention_shape(Shape s, int rows, int max_t, const char* what) {
  require(s.B > 0 && s.T > 0, what, ": batch ", s.B, " x length ", s.T, " must be positive");
  require(s.T <= max_t, what, ": sequence length ", s.T, " exceeds MAX_T ", max_t);
  require(rows == s.rows(), what, " has ", rows, " rows, expected B*T = ", s.rows());
}

// The dims of a training forward: with a dropout key when keys is active.
inline AttentionDims with_dropout(AttentionDims d, DropoutKeys& keys) {
  if (keys.active()) {
    d.dropout = keys.p();
    d.dropout_key = keys.next_key();
  }
  return d;
}

// Whether a training forward of these dims runs tiled (flash_attention_*:
// log-sum-exps saved, no (Tq, Tk) matrix): attention_plan.hpp decides from
// the backend's kernels; a backend without attention_kernels() materialises.
template <class Backend>
bool tiles_attention(const Backend& be, const AttentionDims& d) {
  if constexpr (requires { be.attention_kernels(); })
    return plan_attention(d, AttentionUse::training, be.attention_kernels()) == AttentionPath::tiled;
  else
    return false;
}

// What a training forward saves for its backward, materialised or tiled:
// the probabilities (B, H, Tq, Tk), undropped, or each query row's
// log-sum-exp (B, H, Tq) with the mask, whose key padding (the caller's)
// must outlive the backward, as the inputs do. keep_probabilities forces
// the materialised path (to read them after a forward).
template <class Backend>
struct SavedAttention {
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  typename Backend::template Buffer<S> saved;
  AttentionMask mask;
  bool tiled = false, keep_probabilities = false;

  void forward(Backend& be, const AttentionDims& d, const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
               A* y, int ldy, const AttentionMask& m) {
    tiled = !keep_probabilities && tiles_attention(be, d);
    mask = m;
    if constexpr (requires { be.attention_kernels(); }) {
      if (tiled) {
        be.flash_attention_forward(d, q, ldq, k, ldk, v, ldv, y, ldy, saved.reserve(std::size_t(d.B) * d.H * d.Tq), m);
        return;
      }
    }
    be.attention_forward(d, q, ldq, k, ldk, v, ldv, y, ldy, saved.reserve(std::size_t(d.B) * d.H * d.Tq * d.Tk), m);
  }
  // A decoding step's forward: always materialised, in room for every key
  // the cache can hold (kv_rows), so that the steps after it allocate nothing.
  void forward_cached(Backend& be, const AttentionDims& d, const A* q, int ldq, const A* k, int ldk, const A* v,
                      int ldv, A* y, int ldy, const AttentionMask& m) {
    tiled = false;
    const std::size_t room = std::size_t(d.B) * d.H * d.Tq * std::max(d.Tk, d.kv_rows());
    be.attention_forward(d, q, ldq, k, ldk, v, ldv, y, ldy, saved.reserve(room), m);
  }
  // Room for a ragged step's probabilities (every segment's), materialised.
  S* reserve_cached(std::size_t room) {
    tiled = false;
    return saved.reserve(room);
  }
  // y, ldy: the forward's output (the tiled backward reads it).
  void backward(Backend& be, const AttentionDims& d, const A* dy, int lddy, const A* y, int ldy, const A* q, int ldq,
                const A* k, int ldk, const A* v, int ldv, A* dq, A* dk, A* dv) {
    if constexpr (requires { be.attention_kernels(); }) {
      if (tiled) {
        be.flash_attention_backward(d, dy, lddy, y, ldy, q, ldq, k, ldk, v, ldv, saved.data(), mask, dq, dk, dv);
        return;
      }
    }
    (void)y, (void)ldy;
    be.attention_backward(d, dy, lddy, q, ldq, k, ldk, v, ldv, saved.data(), dq, dk, dv);
  }
  // The probabilities of the last forward (B, H, Tq, Tk); empty after a tiled one.
  std::span<const S> probabilities(const AttentionDims& d) const {
    if (tiled) return {};
    return {saved.data(), std::size_t(d.B) * d.H * d.Tq * d.Tk};
  }
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(saved, others.saved...);
  }
};

}  // namespace detail

template <AttentionConfig Cfg, class Backend>
class SelfAttention {
  using Sz = detail::AttentionSizes<Cfg>;
  static constexpr bool ROPE = rotary_positions<Cfg>();
  static constexpr bool DYNAMIC_ROPE = dynamic_positions<Cfg>();  // rotary when the parts say so
  struct NoRotation {};
  static constexpr int D_ = Sz::D_, MAX_T_ = Cfg::MAX_T;
  // Static widths where every size they derive from is static.
  static constexpr int QKV_ = static_or_dynamic(Sz::H_ * Sz::QK_ + Sz::KVH_ * (Sz::QK_ + Sz::V_),
                                                {Sz::H_, Sz::KVH_, Sz::QK_, Sz::V_});
  static constexpr int CTX_ = static_or_dynamic(Sz::H_ * Sz::V_, {Sz::H_, Sz::V_});

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit SelfAttention(Rng& rng)
    requires(is_static_config<Cfg>())
      : SelfAttention(model_dims<Cfg>(), rng) {}
  // d: the sizes (those Cfg fixes must agree) and the knobs (biases, rotary theta and scaling).
  SelfAttention(const ModelDims& d, Rng& rng)
      : sz_(d),
        H(sz_.H), KV_HEADS(sz_.KVH), QK_HEAD_DIM(sz_.QK), V_HEAD_DIM(sz_.V),
        K_COL(H * QK_HEAD_DIM), V_COL(K_COL + KV_HEADS * QK_HEAD_DIM),
        QKV(V_COL + KV_HEADS * V_HEAD_DIM, "fused projection width"), CTX(H * V_HEAD_DIM, "context width"),
        qkv_(d.d_model, QKV, rng, d.has_qkv_bias()), proj_(CTX, d.d_model, rng, d.bias),
        rope_(make_rope(d)) {}

  // Fused projection columns: H query heads, then KV_HEADS key heads and KV_HEADS value heads.
  int heads() const { return H; }
  int kv_heads() const { return KV_HEADS; }
  int qk_head_dim() const { return QK_HEAD_DIM; }
  int v_head_dim() const { return V_HEAD_DIM; }
  int max_t() const { return sz_.MAX_T; }

  void forward(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, Shape bt, const AttentionMask& mask) {
    detail::check_attention_shape(bt, x.rows, sz_.MAX_T, "self-attention input");
    require_rows(y, x.rows, "self-attention output");
    bt_ = bt;
    dims_ = detail::with_dropout({bt.B, H, bt.T, bt.T, QK_HEAD_DIM, V_HEAD_DIM, 0, KV_HEADS}, drop_);
    const auto qkv = qkv_out_.rows(x.rows, QKV);  // (B*T, QKV)
    const auto ctx = ctx_.rows(x.rows, CTX);      // (B*T, H*V)
    qkv_.forward(be, x, qkv);
    rope_forward(be, bt.B, bt.T, 0, H + KV_HEADS, qkv.data, QKV);  // q and k heads, adjacent
    const A* q = qkv.data;
    attention_.forward(be, dims_, q, QKV, q + K_COL, QKV, q + V_COL, QKV, ctx.data, CTX, mask);
    proj_.forward(be, ctx, y);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx) {
    require_rows(dy, bt_.rows(), "self-attention output gradient");
    auto scratch = be.workspace().frame();
    const auto dctx = scratch.rows(dy.rows, CTX);  // (B*T, H*V)
    const auto dqkv = scratch.rows(dy.rows, QKV);  // (B*T, QKV)
    proj_.backward(be, dy, dctx);
    const A* q = qkv_out_.data();
    A* dq = dqkv.data;
    attention_.backward(be, dims_, dctx.data, CTX, ctx_.data(), CTX, q, QKV, q + K_COL, QKV, q + V_COL, QKV, dq,
                        dq + K_COL, dq + V_COL);
    rope_backward(be, bt_.B, bt_.T, 0, H + KV_HEADS, dq, QKV);
    qkv_.backward(be, dqkv, dx);
  }

  // Incremental decoding: x holds n new positions of each of B sequences
  // (rows B*n), which follow the cache.length() positions already in the
  // cache; their keys and values are appended and they attend causally to
  // everything cached. Forward only (no backward).
  void forward_cached(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, int B, KvCache<Backend>& cache) {
    require(B > 0 && x.rows % B == 0 && x.rows > 0, "cached attention: ", x.rows, " rows for ", B, " sequences");
    require(cache.batch() == B && cache.k_width() == KV_HEADS * QK_HEAD_DIM && cache.v_width() == KV_HEADS * V_HEAD_DIM,
            "cached attention: the cache was not started for this layer and batch");
    require_rows(y, x.rows, "self-attention output");
    const int n = x.rows / B, t0 = cache.length();
    const auto qkv = qkv_out_.rows(x.rows, QKV);
    const auto ctx = ctx_.rows(x.rows, CTX);
    qkv_.forward(be, x, qkv);
    rope_forward(be, B, n, t0, H + KV_HEADS, qkv.data, QKV);
    cache.append(be, qkv.data, QKV, K_COL, V_COL, n);
    const AttentionDims dims{B, H, n, t0 + n, QK_HEAD_DIM, V_HEAD_DIM, cache.capacity(), KV_HEADS};
    dims_ = dims;
    attention_.forward_cached(be, dims, qkv.data, QKV, cache.keys(), KV_HEADS * QK_HEAD_DIM, cache.values(),
                              KV_HEADS * V_HEAD_DIM, ctx.data, CTX, AttentionMask{true, nullptr});
    proj_.forward(be, ctx, y);
  }
  // A ragged step (kv_cache.hpp): each segment's rows are new positions of
  // the sequence in cache row segment.slot, from segment.start on; they are
  // turned (rotary positions) at those positions, written there, and attend
  // causally to that row's keys. One projection for all the rows (a
  // weight streamed once for every sequence), attention segment by segment,
  // the segments side by side over the threads where the backend has them
  // (for_each_thread; each segment's attention the same operation as
  // alone). A step of eight smollm-135m sequences took 5-6.5 ms instead of
  // 6.5-7 with each segment's heads forking in turn (BENCHMARKS.md).
  void forward_cached(Backend& be, ConstRows<A, D_> x, Rows<A, D_> y, RaggedStep step, KvCache<Backend>& cache) {
    require(cache.k_width() == KV_HEADS * QK_HEAD_DIM && cache.v_width() == KV_HEADS * V_HEAD_DIM,
            "ragged attention: the cache was not started for this layer");
    require_rows(y, x.rows, "self-attention output");
    const auto qkv = qkv_out_.rows(x.rows, QKV);
    const auto ctx = ctx_.rows(x.rows, CTX);
    qkv_.forward(be, x, qkv);
    const int kw = cache.k_width(), vw = cache.v_width(), n = int(step.size());
    // Each segment's first row, and its probabilities' place in the saved
    // buffer (room for every key the cache holds, as forward_cached's; the
    // last segment's first, where probabilities() reads).
    segment_row_.resize(std::size_t(n));
    segment_saved_.resize(std::size_t(n));
    int r = 0;
    std::size_t room = 0;
    for (int i = n - 1; i >= 0; --i) {
      segment_saved_[std::size_t(i)] = room;
      room += std::size_t(H) * step[std::size_t(i)].rows * cache.capacity();
    }
    for (int i = 0; i < n; ++i) {
      const StepSegment& s = step[std::size_t(i)];
      require(s.slot >= 0 && s.slot < cache.batch() && s.rows > 0 && s.start >= 0 &&
                  s.start + s.rows <= cache.capacity() && r + s.rows <= x.rows,
              "ragged attention: a segment of ", s.rows, " rows at position ", s.start, " of slot ", s.slot,
              " outside the cache's ", cache.batch(), " slots of ", cache.capacity(), " positions or the step's ",
              x.rows, " rows");
      A* q = qkv.row(r);
      rope_forward(be, 1, s.rows, s.start, H + KV_HEADS, q, QKV);
      for (int t = 0; t < s.rows; ++t) {
        be.copy(kw, q + std::size_t(t) * QKV + K_COL, cache.k_row(s.slot, s.start + t));
        be.copy(vw, q + std::size_t(t) * QKV + V_COL, cache.v_row(s.slot, s.start + t));
      }
      segment_row_[std::size_t(i)] = r;
      r += s.rows;
    }
    require(r == x.rows, "ragged attention: the segments hold ", r, " rows, the step ", x.rows);
    S* saved = attention_.reserve_cached(room);
    std::exception_ptr error;
    std::mutex error_mutex;
    const auto attend = [&](int i) {
      const StepSegment& s = step[std::size_t(i)];
      const int row = segment_row_[std::size_t(i)];
      try {
        be.attention_forward(segment_dims(s, cache), qkv.row(row), QKV, cache.k_row(s.slot, 0), kw,
                             cache.v_row(s.slot, 0), vw, ctx.row(row), CTX, saved + segment_saved_[std::size_t(i)],
                             AttentionMask{true, nullptr});
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    };
    if constexpr (requires { be.for_each_thread(n, attend); }) {
      const int k = std::min(n, be.threads());
      be.for_each_thread(k, [&](int t) {
        for (int i = t; i < n; i += k) attend(i);
      });
    } else {
      for (int i = 0; i < n; ++i) attend(i);
    }
    if (error) std::rethrow_exception(error);
    if (n > 0) dims_ = segment_dims(step[std::size_t(n - 1)], cache);
    proj_.forward(be, ctx, y);
  }
  // A cache for B sequences of up to `capacity` positions (0: MAX_T, the most).
  void start_cache(KvCache<Backend>& cache, int B, int capacity = 0) const {
    require(capacity >= 0 && capacity <= sz_.MAX_T, "a cache of ", capacity, " positions: outside 1..MAX_T ",
            sz_.MAX_T);
    cache.reset(B, capacity > 0 ? capacity : sz_.MAX_T, KV_HEADS * QK_HEAD_DIM, KV_HEADS * V_HEAD_DIM);
  }

  // f(name, linear) for its projections (LoRA's targets).
  template <class F>
  void visit_linears(F&& f) {
    f("qkv", qkv_);
    f("proj", proj_);
  }
  void visit(ParameterVisitor<Backend> f) {
    qkv_.visit(prefixed("qkv.", f));
    proj_.visit(prefixed("proj.", f));
  }

  // Attention probabilities of the last forward, (B, H, T, T), undropped;
  // empty after a tiled forward (see keep_probabilities).
  std::span<const S> probabilities() const { return attention_.probabilities(dims_); }
  // Materialise the training forward's probabilities (to read them), not tiled.
  void keep_probabilities(bool on) { attention_.keep_probabilities = on; }
  // The dims of the last forward (its dropout rate and key).
  const AttentionDims& last_dims() const { return dims_; }

  void set_dropout(float p, std::uint64_t seed) { drop_ = DropoutKeys(p, seed); }
  DropoutKeys& dropout() { return drop_; }
  // f(keys) for its dropout, when it drops (visit_if_dropping).
  void for_each_dropout(DropoutVisitor f) {
    visit_if_dropping(drop_, f);
    qkv_.for_each_dropout(f);  // LoRA's (layers/lora.hpp)
    proj_.for_each_dropout(f);
  }

  // f(buffer, the same buffer of others...) for what the last forward saved
  // (activation recompute frees or trades it, block_stack.hpp).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(qkv_out_, others.qkv_out_...);
    f(ctx_, others.ctx_...);
    attention_.for_each_saved(f, others.attention_...);
  }

 private:
  using Rotary = RotaryPositions<MAX_T_, Sz::QK_, Backend>;
  using Rotation = std::conditional_t<ROPE, Rotary, std::conditional_t<DYNAMIC_ROPE, std::optional<Rotary>, NoRotation>>;
  // The rotary turns of the queries' and keys' heads, where the configuration (or its parts) has them.
  template <class... Args>
  void rope_forward(Args&&... args) {
    if constexpr (ROPE) rope_.forward(std::forward<Args>(args)...);
    else if constexpr (DYNAMIC_ROPE)
      if (rope_) rope_->forward(std::forward<Args>(args)...);
  }
  template <class... Args>
  void rope_backward(Args&&... args) {
    if constexpr (ROPE) rope_.backward(std::forward<Args>(args)...);
    else if constexpr (DYNAMIC_ROPE)
      if (rope_) rope_->backward(std::forward<Args>(args)...);
  }
  // A ragged step's segment's attention, alone in its batch.
  AttentionDims segment_dims(const StepSegment& s, const KvCache<Backend>& cache) const {
    return {1, H, s.rows, s.start + s.rows, QK_HEAD_DIM, V_HEAD_DIM, cache.capacity(), KV_HEADS};
  }
  static Rotation make_rope(const ModelDims& d) {
    if constexpr (ROPE) return Rotation(d.max_t, d.qk_head(), d.rope_theta, d.rope_scaling);
    else if constexpr (DYNAMIC_ROPE) {
      if (!d.parts.rope()) return std::nullopt;
      return Rotation(std::in_place, d.max_t, d.qk_head(), d.rope_theta, d.rope_scaling);
    }
    else return {};
  }

  Sz sz_;
  int H, KV_HEADS, QK_HEAD_DIM, V_HEAD_DIM, K_COL, V_COL;
  Dim<QKV_> QKV;
  Dim<CTX_> CTX;
  Linear<D_, QKV_, Backend> qkv_;
  Linear<CTX_, D_, Backend> proj_;
  [[no_unique_address]] Rotation rope_;
  DropoutKeys drop_{0.0f, 0};
  Shape bt_;
  AttentionDims dims_;
  detail::SavedAttention<Backend> attention_;
  Buffer<A> qkv_out_, ctx_;  // (B*T, QKV), (B*T, CTX)
  std::vector<int> segment_row_;             // a ragged step's segments' first rows
  std::vector<std::size_t> segment_saved_;   // and their probabilities' offsets in the saved buffer
};

template <AttentionConfig Cfg, class Backend>
class CrossAttention {
  using Sz = detail::AttentionSizes<Cfg>;
  static constexpr int D_ = Sz::D_;
  static constexpr int QW_ = static_or_dynamic(Sz::H_ * Sz::QK_, {Sz::H_, Sz::QK_});
  static constexpr int KVW_ = static_or_dynamic(Sz::KVH_ * (Sz::QK_ + Sz::V_), {Sz::KVH_, Sz::QK_, Sz::V_});
  static constexpr int CTX_ = static_or_dynamic(Sz::H_ * Sz::V_, {Sz::H_, Sz::V_});

 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;

  explicit CrossAttention(Rng& rng)
    requires(is_static_config<Cfg>())
      : CrossAttention(model_dims<Cfg>(), rng) {}
  CrossAttention(const ModelDims& d, Rng& rng)
      : sz_(d), H(sz_.H), KV_HEADS(sz_.KVH), QK_HEAD_DIM(sz_.QK), V_HEAD_DIM(sz_.V),
        V_COL(KV_HEADS * QK_HEAD_DIM), QW(H * QK_HEAD_DIM, "query width"),
        KVW(V_COL + KV_HEADS * V_HEAD_DIM, "key/value width"), CTX(H * V_HEAD_DIM, "context width"),
        q_(d.d_model, QW, rng, d.has_qkv_bias()), kv_(d.d_model, KVW, rng, d.has_qkv_bias()),
        proj_(CTX, d.d_model, rng, d.bias) {}

  // The width of project_memory's rows (kv's: KV_HEADS key heads, then KV_HEADS value heads).
  int memory_width() const { return KVW; }

  // x_q: (B*T_q, D) queries; x_kv: (B*T_kv, D) keys/values; mask.key_padding
  // is (B, T_kv). A causal mask is allowed but unusual here.
  void forward(Backend& be, ConstRows<A, D_> x_q, ConstRows<A, D_> x_kv, Rows<A, D_> y, Shape q_shape, Shape kv_shape,
               const AttentionMask& mask) {
    detail::check_attention_shape(q_shape, x_q.rows, sz_.MAX_T, "cross-attention query input");
    detail::check_attention_shape(kv_shape, x_kv.rows, sz_.MAX_T, "cross-attention key/value input");
    require(q_shape.B == kv_shape.B, "cross-attention batch sizes differ: queries ", q_shape.B, ", keys ", kv_shape.B);
    require_rows(y, x_q.rows, "cross-attention output");
    q_shape_ = q_shape;
    kv_shape_ = kv_shape;
    dims_ = detail::with_dropout({q_shape.B, H, q_shape.T, kv_shape.T, QK_HEAD_DIM, V_HEAD_DIM, 0, KV_HEADS}, drop_);
    const auto q = q_out_.rows(x_q.rows, QW);     // (B*Tq, H*QK)
    const auto kv = kv_out_.rows(x_kv.rows, KVW); // (B*Tk, KVW)
    const auto ctx = ctx_.rows(x_q.rows, CTX);    // (B*Tq, H*V)
    q_.forward(be, x_q, q);
    kv_.forward(be, x_kv, kv);
    attention_.forward(be, dims_, q.data, QW, kv.data, KVW, kv.data + V_COL, KVW, ctx.data, CTX, mask);
    proj_.forward(be, ctx, y);
  }

  void backward(Backend& be, ConstRows<A, D_> dy, Rows<A, D_> dx_q, Rows<A, D_> dx_kv) {
    require_rows(dy, q_shape_.rows(), "cross-attention output gradient");
    auto scratch = be.workspace().frame();
    const auto dctx = scratch.rows(dy.rows, CTX);         // (B*Tq, H*V)
    const auto dq = scratch.rows(dy.rows, QW);            // (B*Tq, H*QK)
    const auto dkv = scratch.rows(kv_shape_.rows(), KVW); // (B*Tk, KVW)
    proj_.backward(be, dy, dctx);
    const A* kv = kv_out_.data();
    attention_.backward(be, dims_, dctx.data, CTX, ctx_.data(), CTX, q_out_.data(), QW, kv, KVW, kv + V_COL, KVW,
                        dq.data, dkv.data, dkv.data + V_COL);
    q_.backward(be, dq, dx_q);
    kv_.backward(be, dkv, dx_kv);
  }

  // Decoding: the memory's keys and values are computed once per source
  // (memory_kv: (B*S, H*(QK+V)), the fused kv projection of memory), then
  // every step attends to them. Forward only.
  void project_memory(Backend& be, ConstRows<A, D_> memory, Rows<A, KVW_> memory_kv) {
    kv_.forward(be, memory, memory_kv);
  }
  void forward_cached(Backend& be, ConstRows<A, D_> x_q, Rows<A, D_> y, int B, const A* memory_kv, int src_len,
                      const std::uint8_t* src_padding) {
    require(B > 0 && x_q.rows % B == 0, "cached cross-attention: ", x_q.rows, " rows for ", B, " sequences");
    require_rows(y, x_q.rows, "cross-attention output");
    const int n = x_q.rows / B;
    const auto q = q_out_.rows(x_q.rows, QW);
    const auto ctx = ctx_.rows(x_q.rows, CTX);
    q_.forward(be, x_q, q);
    dims_ = AttentionDims{B, H, n, src_len, QK_HEAD_DIM, V_HEAD_DIM, 0, KV_HEADS};
    attention_.forward_cached(be, dims_, q.data, QW, memory_kv, KVW, memory_kv + V_COL, KVW, ctx.data, CTX,
                              AttentionMask{false, src_padding});
    q_shape_ = Shape{B, n};
    kv_shape_ = Shape{B, src_len};
    proj_.forward(be, ctx, y);
  }

  void visit(ParameterVisitor<Backend> f) {
    q_.visit(prefixed("q.", f));
    kv_.visit(prefixed("kv.", f));
    proj_.visit(prefixed("proj.", f));
  }

  // Attention probabilities of the last forward, (B, H, T_q, T_kv), undropped;
  // empty after a tiled forward (see keep_probabilities).
  std::span<const S> probabilities() const { return attention_.probabilities(dims_); }
  // Materialise the training forward's probabilities (to read them), not tiled.
  void keep_probabilities(bool on) { attention_.keep_probabilities = on; }
  // The dims of the last forward (its dropout rate and key).
  const AttentionDims& last_dims() const { return dims_; }

  void set_dropout(float p, std::uint64_t seed) { drop_ = DropoutKeys(p, seed); }
  DropoutKeys& dropout() { return drop_; }
  // f(keys) for its dropout, when it drops (visit_if_dropping).
  void for_each_dropout(DropoutVisitor f) {
    visit_if_dropping(drop_, f);
  }

  // f(buffer, the same buffer of others...) for what the last forward saved
  // (activation recompute frees or trades it, block_stack.hpp).
  template <class F, class... Same>
  void for_each_saved(F&& f, Same&... others) {
    f(q_out_, others.q_out_...);
    f(kv_out_, others.kv_out_...);
    f(ctx_, others.ctx_...);
    attention_.for_each_saved(f, others.attention_...);
  }

 private:
  Sz sz_;
  int H, KV_HEADS, QK_HEAD_DIM, V_HEAD_DIM, V_COL;
  Dim<QW_> QW;
  Dim<KVW_> KVW;
  Dim<CTX_> CTX;
  Linear<D_, QW_, Backend> q_;
  Linear<D_, KVW_, Backend> kv_;
  Linear<CTX_, D_, Backend> proj_;
  DropoutKeys drop_{0.0f, 0};
  Shape q_shape_, kv_shape_;
  AttentionDims dims_;
  detail::SavedAttention<Backend> attention_;
  Buffer<A> q_out_, kv_out_, ctx_;  // (B*Tq, QW), (B*Tk, KVW), (B*Tq, CTX)
};

}  // namespace xfmr
