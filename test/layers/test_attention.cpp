#include <cmath>

#include "support/configs.hpp"
#include "support/gradcheck.hpp"
#include "xfmr/layers/attention.hpp"

BOOST_AUTO_TEST_SUITE(test_attention)

using namespace xfmr;
using namespace xfmr::test;

namespace {

// With dropout > 0 the probabilities are dropped; the call counter restarts
// before every forward, so that every evaluation of the loss sees one mask.
template <class Cfg>
void check_self(const char* name, Shape bt, bool causal, const std::vector<std::uint8_t>& pad, float dropout = 0.0f) {
  constexpr int D = Cfg::D_MODEL;
  Rng rng(3);
  Be be;
  SelfAttention<Cfg, Be> attn(rng);
  attn.set_dropout(dropout, 77);
  const AttentionMask mask{causal, pad.empty() ? nullptr : pad.data()};
  GradCase c;
  c.name = name;
  c.input("x", bt.rows() * D, rng);
  c.output(bt.rows() * D, rng);
  c.forward = [&] {
    attn.dropout().set_calls(2);
    attn.forward(be, crows_of<D>(c.x[0]), rows_of<D>(c.y), bt, mask);
  };
  c.backward = [&] { attn.backward(be, crows_of<D>(c.dy), rows_of<D>(c.dx[0])); };
  c.visit = [&](const ParamFn& f) { attn.visit(f); };
  check_case(c);
}

template <class Cfg>
void check_cross(const char* name, Shape q, Shape kv, const std::vector<std::uint8_t>& pad, float dropout = 0.0f) {
  constexpr int D = Cfg::D_MODEL;
  Rng rng(4);
  Be be;
  CrossAttention<Cfg, Be> attn(rng);
  attn.set_dropout(dropout, 78);
  const AttentionMask mask{false, pad.empty() ? nullptr : pad.data()};
  GradCase c;
  c.name = name;
  c.input("x_q", q.rows() * D, rng);
  c.input("x_kv", kv.rows() * D, rng);
  c.output(q.rows() * D, rng);
  c.forward = [&] {
    attn.dropout().set_calls(2);
    attn.forward(be, crows_of<D>(c.x[0]), crows_of<D>(c.x[1]), rows_of<D>(c.y), q, kv, mask);
  };
  c.backward = [&] {
    attn.backward(be, crows_of<D>(c.dy), rows_of<D>(c.dx[0]), rows_of<D>(c.dx[1]));
  };
  c.visit = [&](const ParamFn& f) { attn.visit(f); };
  check_case(c);
}

// Straightforward per-element attention, for comparing the fused backend op:
// q (rows, H*QK), k (rows, KVH*QK), v (rows, KVH*V), query head h reading
// key/value head h / (H / KVH).
void naive_attention(const AttentionDims& a, const Vec& q, const Vec& k, const Vec& v, const AttentionMask& mask,
                     Vec& y, Vec& probs) {
  const int ldq = a.H * a.QK_DIM, ldk = a.kv_heads() * a.QK_DIM, ldkv = a.kv_heads() * a.V_DIM, ldy = a.H * a.V_DIM;
  y.assign(std::size_t(a.B) * a.Tq * ldy, 0.0);
  probs.assign(std::size_t(a.B) * a.H * a.Tq * a.Tk, 0.0);
  for (int b = 0; b < a.B; ++b)
    for (int h = 0; h < a.H; ++h)
      for (int i = 0; i < a.Tq; ++i) {
        const int g = h / (a.H / a.kv_heads());
        std::vector<double> s(a.Tk, -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < a.Tk; ++j) {
          if (!mask.allowed(b, i, j, a.Tq, a.Tk)) continue;
          double dot = 0;
          for (int d = 0; d < a.QK_DIM; ++d)
            dot += q[(b * a.Tq + i) * ldq + h * a.QK_DIM + d] * k[(b * a.Tk + j) * ldk + g * a.QK_DIM + d];
          s[j] = dot / std::sqrt(double(a.QK_DIM));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < a.Tk; ++j) sum += std::isinf(s[j]) ? 0 : std::exp(s[j] - mx);
        for (int j = 0; j < a.Tk; ++j) {
          const double p = std::isinf(s[j]) ? 0 : std::exp(s[j] - mx) / sum;
          probs[((b * a.H + h) * a.Tq + i) * a.Tk + j] = p;
          for (int d = 0; d < a.V_DIM; ++d)
            y[(b * a.Tq + i) * ldy + h * a.V_DIM + d] += p * v[(b * a.Tk + j) * ldkv + g * a.V_DIM + d];
        }
      }
}

}  // namespace

BOOST_AUTO_TEST_CASE(self_attention_gradients_unmasked) { check_self<TinyPre>("SelfAttention", {2, 5}, false, {}); }

BOOST_AUTO_TEST_CASE(self_attention_gradients_causal) {
  check_self<TinyPre>("SelfAttention causal", {2, 5}, true, {});
}

BOOST_AUTO_TEST_CASE(self_attention_gradients_padded) {
  // Sequence 1 has two padded positions.
  check_self<TinyPost>("SelfAttention key padding", {2, 5}, false, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1});
}

BOOST_AUTO_TEST_CASE(self_attention_gradients_causal_and_padded) {
  check_self<TinyPre>("SelfAttention causal + padding", {2, 4}, true, {0, 0, 0, 1, 0, 0, 1, 1});
}

BOOST_AUTO_TEST_CASE(self_attention_gradients_split_head_sizes) {
  check_self<TinySplitHeads>("SelfAttention QK 3 / V 5", {2, 4}, true, {});
}

// Rotary positions: queries and keys turned after the projection, their
// gradients turned back (short sequences and the GEMM path's length).
struct LongRope : TinyPre {
  static constexpr int MAX_T = kCpuRowQueries + 3;
  using Positions = Rope;
};
BOOST_AUTO_TEST_CASE(self_attention_gradients_rotary) {
  check_self<TinyRope>("SelfAttention rotary, causal + padding", {2, 4}, true, {0, 0, 0, 1, 0, 0, 1, 1});
  check_self<TinyRope>("SelfAttention rotary, full length", {2, 6}, false, {});
  check_self<LongRope>("SelfAttention rotary, GEMM length", {1, LongRope::MAX_T}, true, {});
}

// Grouped-query attention: the gradients of the shared key/value heads add
// over their query heads (row kernels, GEMM path, with dropout, rotary, and
// cross-attention).
struct LongGqa : TinyGqa {
  static constexpr int MAX_T = kCpuRowQueries + 3;
};
struct TinyMqaRope : TinyGqa {
  static constexpr int N_KV_HEADS = 1;
  using Positions = Rope;
};
BOOST_AUTO_TEST_CASE(grouped_query_attention_gradients) {
  check_self<TinyGqa>("SelfAttention 4 query / 2 key-value heads, causal + padding", {2, 4}, true,
                      {0, 0, 0, 1, 0, 0, 1, 1});
  check_self<LongGqa>("SelfAttention 4 / 2 heads, GEMM length", {1, LongGqa::MAX_T}, true, {});
  check_self<TinyGqa>("SelfAttention 4 / 2 heads, dropout 0.3", {2, 5}, false, {}, 0.3f);
  check_self<TinyMqaRope>("SelfAttention 4 / 1 heads (multi-query), rotary", {2, 6}, true, {});
  check_cross<TinyGqa>("CrossAttention 4 / 2 heads, padded", {2, 4}, {2, 3}, {0, 0, 0, 0, 1, 1});
}

BOOST_AUTO_TEST_CASE(self_attention_gradients_wide_heads) {
  check_self<TinyWideHeads>("SelfAttention wide heads", {2, 4}, false, {0, 0, 0, 0, 0, 0, 0, 1});
}

// Past kCpuRowQueries query rows the backend leaves its row kernels for
// per-head GEMMs: the same gradients must come out of that path too.
struct LongPre {
  static constexpr int MAX_T = kCpuRowQueries + 3, D_MODEL = 8, N_HEADS = 2, N_LAYERS = 1, D_FF = 12;
  using Norm = PreNorm;
  using Activation = Gelu;
};

BOOST_AUTO_TEST_CASE(self_attention_gradients_past_the_row_kernels) {
  constexpr int T = LongPre::MAX_T;
  std::vector<std::uint8_t> pad(T, 0);
  pad[T - 1] = pad[T - 2] = 1;
  check_self<LongPre>("SelfAttention causal + padding, GEMM path", {1, T}, true, pad);
}

// Past a tile of keys (cpu/attention_tiled.hpp's kFlashKeys) and of query
// rows: the tiled path's rescaling between key tiles, causal tiles skipped,
// padding and dropout replayed tile by tile.
struct TiledPre {
  static constexpr int MAX_T = detail::kFlashKeys + 5, D_MODEL = 4, N_HEADS = 2, N_LAYERS = 1, D_FF = 8;
  using Norm = PreNorm;
  using Activation = Gelu;
};

BOOST_AUTO_TEST_CASE(self_attention_gradients_across_tiles) {
  constexpr int T = TiledPre::MAX_T;
  std::vector<std::uint8_t> pad(T, 0);
  pad[T - 1] = pad[3] = 1;
  check_self<TiledPre>("SelfAttention tiled, causal + padding", {1, T}, true, pad);
  check_self<TiledPre>("SelfAttention tiled, padding, dropout 0.2", {1, T}, false, pad, 0.2f);
  check_cross<TiledPre>("CrossAttention tiled, Tq 70, Tk 133, padded", {1, 70}, {1, T}, pad, 0.1f);
}

BOOST_AUTO_TEST_CASE(cross_attention_gradients) {
  check_cross<TinyPre>("CrossAttention Tq 3, Tk 5", {2, 3}, {2, 5}, {});
}

BOOST_AUTO_TEST_CASE(cross_attention_gradients_padded_split_heads) {
  check_cross<TinySplitHeads>("CrossAttention padded, QK 3 / V 5", {2, 4}, {2, 3}, {0, 0, 0, 0, 1, 1});
}

// Dropout on the attention probabilities, with a fixed mask: self-attention
// causal and padded (short rows, which leave the row kernels under dropout,
// and the GEMM path's length), cross-attention padded with split heads.
BOOST_AUTO_TEST_CASE(attention_gradients_with_dropout) {
  check_self<TinyPre>("SelfAttention causal + padding, dropout 0.3", {2, 4}, true, {0, 0, 0, 1, 0, 0, 1, 1}, 0.3f);
  check_self<TinyWideHeads>("SelfAttention wide heads, dropout 0.5", {2, 4}, false, {}, 0.5f);
  constexpr int T = LongPre::MAX_T;
  std::vector<std::uint8_t> pad(T, 0);
  pad[T - 1] = 1;
  check_self<LongPre>("SelfAttention causal + padding, GEMM length, dropout 0.2", {1, T}, true, pad, 0.2f);
  check_cross<TinySplitHeads>("CrossAttention padded, QK 3 / V 5, dropout 0.3", {2, 4}, {2, 3}, {0, 0, 0, 0, 1, 1},
                              0.3f);
}

// The backend op under dropout against a plain reference: the saved
// probabilities stay undropped, the output multiplies V by P * keep / (1 - p)
// with keep = dropout_keeps(key, element of (B, H, Tq, Tk), p), and the
// backward replays the same mask (dV = (P * keep / (1 - p))^T dY). A
// different key gives another output (the mask is live).
BOOST_AUTO_TEST_CASE(attention_dropout_drops_probabilities_and_replays_its_mask) {
  Rng rng(12);
  Be be;
  const AttentionMask mask{true, nullptr};
  for (const AttentionDims base : {AttentionDims{2, 3, 5, 5, 4, 4}, AttentionDims{3, 2, 70, 70, 8, 8}}) {
    AttentionDims a = base;
    a.dropout = 0.25f;
    a.dropout_key = 0x5eed0001ULL;
    const int ldq = a.H * a.QK_DIM, ldv = a.H * a.V_DIM;
    const std::size_t n_probs = std::size_t(a.B) * a.H * a.Tq * a.Tk;
    const Vec q = random_vector(a.B * a.Tq * ldq, rng, 2.0), k = random_vector(a.B * a.Tk * ldq, rng, 2.0),
              v = random_vector(a.B * a.Tk * ldv, rng), dy = random_vector(a.B * a.Tq * ldv, rng);
    Vec y(std::size_t(a.B) * a.Tq * ldv), probs(n_probs), y_plain, p_ref;
    be.attention_forward(a, q.data(), ldq, k.data(), ldq, v.data(), ldv, y.data(), ldv, probs.data(), mask);
    naive_attention(base, q, k, v, mask, y_plain, p_ref);
    BOOST_TEST(probs == p_ref, boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());

    // The reference: dropped probabilities times V, and dV from them.
    Vec dropped(n_probs), y_ref(y.size(), 0.0), dv_ref(v.size(), 0.0);
    std::size_t visible = 0, kept = 0;
    for (std::size_t e = 0; e < n_probs; ++e) {
      const bool keep = dropout_keeps(a.dropout_key, e, a.dropout);
      dropped[e] = keep ? p_ref[e] / (1.0 - a.dropout) : 0.0;
      visible += p_ref[e] != 0.0;
      kept += p_ref[e] != 0.0 && keep;
    }
    for (int b = 0; b < a.B; ++b)
      for (int h = 0; h < a.H; ++h)
        for (int i = 0; i < a.Tq; ++i)
          for (int j = 0; j < a.Tk; ++j) {
            const double w = dropped[((std::size_t(b) * a.H + h) * a.Tq + i) * a.Tk + j];
            for (int d = 0; d < a.V_DIM; ++d) {
              const std::size_t yi = (std::size_t(b) * a.Tq + i) * ldv + h * a.V_DIM + d;
              const std::size_t vj = (std::size_t(b) * a.Tk + j) * ldv + h * a.V_DIM + d;
              y_ref[yi] += w * v[vj];
              dv_ref[vj] += w * dy[yi];
            }
          }
    BOOST_TEST(y == y_ref, boost::test_tools::tolerance(1e-9) << boost::test_tools::per_element());
    BOOST_TEST((y != y_plain));
    Vec dq(q.size()), dk(k.size()), dv(v.size());
    be.attention_backward(a, dy.data(), ldv, q.data(), ldq, k.data(), ldq, v.data(), ldv, probs.data(), dq.data(),
                          dk.data(), dv.data());
    BOOST_TEST(dv == dv_ref, boost::test_tools::tolerance(1e-9) << boost::test_tools::per_element());
    if (visible > 10000) {  // the larger case: the share dropped is the rate
      const double rate = 1.0 - double(kept) / double(visible);
      BOOST_TEST(std::abs(rate - 0.25) < 0.01, "dropped " << rate << " of " << visible << " visible probabilities");
    }

    // Another key, another mask.
    AttentionDims other = a;
    other.dropout_key = a.dropout_key + 1;
    Vec y_other(y.size());
    be.attention_forward(other, q.data(), ldq, k.data(), ldq, v.data(), ldv, y_other.data(), ldv, probs.data(), mask);
    BOOST_TEST((y_other != y));
  }
}

// Evaluation mode turns attention dropout off: the layer's output is the
// plain attention's, bit for bit; training mode draws a new mask per call.
BOOST_AUTO_TEST_CASE(attention_dropout_is_off_in_evaluation_and_fresh_per_call) {
  constexpr int D = TinyPre::D_MODEL;
  Be be;
  Rng r1(5), r2(5), data(6);
  SelfAttention<TinyPre, Be> plain(r1), dropped(r2);
  dropped.set_dropout(0.4f, 9);
  const Shape bt{2, 6};
  const Vec x = random_vector(bt.rows() * D, data);
  Vec y_plain(x.size()), y_eval(x.size()), y1(x.size()), y2(x.size());
  const AttentionMask mask{true, nullptr};
  plain.forward(be, crows_of<D>(x), rows_of<D>(y_plain), bt, mask);
  dropped.forward(be, crows_of<D>(x), rows_of<D>(y1), bt, mask);
  dropped.forward(be, crows_of<D>(x), rows_of<D>(y2), bt, mask);
  BOOST_TEST(dropped.dropout().calls() == 2u);
  BOOST_TEST((y1 != y_plain));
  BOOST_TEST((y1 != y2));
  dropped.dropout().set_training(false);
  dropped.forward(be, crows_of<D>(x), rows_of<D>(y_eval), bt, mask);
  BOOST_TEST(dropped.dropout().calls() == 2u);
  BOOST_TEST(dropped.last_dims().dropout == 0.0f);
  BOOST_TEST(y_eval == y_plain, boost::test_tools::per_element());
  BOOST_CHECK_THROW(dropped.set_dropout(1.0f, 1), Error);
}

// Both CPU paths: row by row (Tq <= 4, fixed 16-wide heads or any size) and
// per-head GEMMs (longer query blocks); queries that end a longer key sequence
// (a cache) with the causal mask aligned to its end.
BOOST_AUTO_TEST_CASE(backend_attention_matches_naive_with_masks) {
  Rng rng(9);
  Be be;
  // The last three: grouped-query attention (two key/value heads for four
  // query heads, one for four), row by row and per-head GEMMs.
  const AttentionDims cases[] = {{2, 3, 4, 4, 5, 5},        {2, 3, 1, 5, 5, 5},          {2, 2, 3, 6, 3, 4},
                                 {2, 2, 1, 7, 16, 16},      {2, 2, 6, 7, 16, 16},        {2, 3, 6, 6, 5, 5},
                                 {2, 4, 3, 6, 3, 4, 0, 2},  {2, 4, 70, 70, 4, 4, 0, 1}, {2, 4, 1, 7, 16, 16, 0, 2}};
  for (const AttentionDims& a : cases) {
    const int ldq = a.H * a.QK_DIM, ldk = a.kv_heads() * a.QK_DIM, ldkv = a.kv_heads() * a.V_DIM;
    const int ldv = a.H * a.V_DIM;  // the output's
    const Vec q = random_vector(a.B * a.Tq * ldq, rng, 2.0), k = random_vector(a.B * a.Tk * ldk, rng, 2.0),
              v = random_vector(a.B * a.Tk * ldkv, rng);
    std::vector<std::uint8_t> pad(std::size_t(a.B) * a.Tk, 0);
    for (int j = 1; j < a.Tk; ++j) pad[a.Tk + j] = 1;  // sequence 1: only key 0 left
    pad[a.Tk - 2] = 1;                                 // sequence 0: one padded key
    for (bool causal : {false, true}) {
      BOOST_TEST_CONTEXT("Tq " << a.Tq << ", Tk " << a.Tk << ", QK " << a.QK_DIM << ", key/value heads "
                                << a.kv_heads() << ", causal " << causal) {
        const AttentionMask mask{causal, pad.data()};
        Vec y(std::size_t(a.B) * a.Tq * ldv), probs(std::size_t(a.B) * a.H * a.Tq * a.Tk), y_ref, p_ref;
        be.attention_forward(a, q.data(), ldq, k.data(), ldk, v.data(), ldkv, y.data(), ldv, probs.data(), mask);
        naive_attention(a, q, k, v, mask, y_ref, p_ref);
        BOOST_TEST(y == y_ref, boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
        BOOST_TEST(probs == p_ref, boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
        // Masked keys get exactly zero probability.
        for (int h = 0; h < a.H; ++h)
          for (int i = 0; i < a.Tq; ++i) {
            BOOST_TEST(probs[((0 * a.H + h) * a.Tq + i) * a.Tk + a.Tk - 2] == 0.0);
            for (int j = 1; j < a.Tk; ++j) BOOST_TEST(probs[((1 * a.H + h) * a.Tq + i) * a.Tk + j] == 0.0);
          }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(fully_masked_rows_give_zeros_not_nan) {
  Be be;
  Rng rng(10);
  const AttentionDims a{1, 1, 2, 3, 2, 2};
  const Vec q = random_vector(4, rng), k = random_vector(6, rng), v = random_vector(6, rng);
  const std::vector<std::uint8_t> pad = {1, 1, 1};
  Vec y(4), probs(6);
  be.attention_forward(a, q.data(), 2, k.data(), 2, v.data(), 2, y.data(), 2, probs.data(), AttentionMask{false, pad.data()});
  for (double e : y) BOOST_TEST(e == 0.0);
  for (double e : probs) BOOST_TEST(e == 0.0);
}

BOOST_AUTO_TEST_CASE(causal_probabilities_are_lower_triangular) {
  Rng rng(11);
  CpuBackend<float> be;
  SelfAttention<TinyPre, CpuBackend<float>> attn(rng);
  const Shape bt{1, 6};
  std::vector<float> x(6 * 8), y(6 * 8);
  for (auto& e : x) e = float(rng.uniform(-1, 1));
  attn.forward(be, ConstRows<float, 8>(x.data(), 6), Rows<float, 8>(y.data(), 6), bt, AttentionMask{true, nullptr});
  const auto p = attn.probabilities();
  BOOST_TEST(p.size() == 2u * 36u);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 6; ++i) {
      float sum = 0;
      for (int j = 0; j < 6; ++j) {
        sum += p[(h * 6 + i) * 6 + j];
        if (j > i) BOOST_TEST(p[(h * 6 + i) * 6 + j] == 0.0f);
      }
      BOOST_TEST(std::abs(sum - 1.0f) < 1e-5f);
    }
}

BOOST_AUTO_TEST_CASE(attention_parameter_names_and_shapes) {
  Rng rng(1);
  SelfAttention<TinySplitHeads, Be> self(rng);
  CrossAttention<TinySplitHeads, Be> cross(rng);
  std::vector<std::string> got;
  auto record = [&](std::string_view n, auto& v, auto&) { got.push_back(std::string(n) + shape_string(v.shape())); };
  self.visit(record);
  cross.visit(record);
  const std::vector<std::string> want = {
      "qkv.weight(22, 8)", "qkv.bias(22)", "proj.weight(8, 10)", "proj.bias(8)",  // H*(2*3+5) = 22, H*5 = 10
      "q.weight(6, 8)",    "q.bias(6)",    "kv.weight(16, 8)",   "kv.bias(16)",
      "proj.weight(8, 10)", "proj.bias(8)"};
  BOOST_TEST(got == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(attention_rejects_bad_shapes) {
  Rng rng(12);
  CpuBackend<float> be;
  SelfAttention<TinyPre, CpuBackend<float>> self(rng);
  CrossAttention<TinyPre, CpuBackend<float>> cross(rng);
  std::vector<float> x(8 * 8), y(8 * 8);
  try {
    self.forward(be, ConstRows<float, 8>(x.data(), 8), Rows<float, 8>(y.data(), 8), Shape{1, 8}, {});
    BOOST_FAIL("T = 8 > MAX_T = 6 accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "self-attention input: sequence length 8 exceeds MAX_T 6");
  }
  BOOST_CHECK_THROW(self.forward(be, ConstRows<float, 8>(x.data(), 8), Rows<float, 8>(y.data(), 8), Shape{2, 3}, {}),
                    Error);
  BOOST_CHECK_THROW(cross.forward(be, ConstRows<float, 8>(x.data(), 4), ConstRows<float, 8>(x.data(), 6),
                                  Rows<float, 8>(y.data(), 4), Shape{2, 2}, Shape{3, 2}, {}),
                    Error);  // batch sizes differ
}

BOOST_AUTO_TEST_SUITE_END()
