// Tiled ("flash") attention on the CPU (cpu/attention_tiled.hpp) against the
// materialised attention of the same backend, in double and float: every mask
// kind (none, causal, key padding, both, a sequence with every key padded),
// query lengths 1 to 1024 across the tile edges, head sizes 32, 64 and 128,
// dropout on and off, grouped key/value heads, cross-attention lengths, bf16
// products; the saved log-sum-exps against the scores' own; and the layers'
// choice of path (tiled past the row kernels, materialised on request).
// Gradient checks in double through the tiled path are in test_attention.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/blocks/residual.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/attention.hpp"

BOOST_AUTO_TEST_SUITE(test_flash_attention)

using namespace xfmr;

namespace {

struct Case {
  int B, H, KVH, Tq, Tk, hd;
  bool causal, padded;
  float dropout;
  std::string name() const {  // (a stream: GCC 12 warns falsely on long std::string sums)
    std::ostringstream o;
    o << "B" << B << " H" << H << "/" << KVH << " Tq" << Tq << " Tk" << Tk << " hd" << hd << (causal ? " causal" : "")
      << (padded ? " padded" : "") << " dropout " << dropout;
    return o.str();
  }
};

template <class S>
std::vector<S> randn(std::size_t n, Rng& rng) {
  std::vector<S> v(n);
  for (auto& x : v) x = S(rng.normal());
  return v;
}

// Largest |a - b| over the largest |b|.
template <class S>
double relative_gap(const std::vector<S>& a, const std::vector<S>& b) {
  double gap = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return gap / scale;
}

// Padding: sequence b pads its last 3b keys (b = 1 pads every key when
// Tk <= 3), and sequence 2, where there is one, pads every key.
std::vector<std::uint8_t> padding(int B, int Tk) {
  std::vector<std::uint8_t> pad(std::size_t(B) * Tk, 0);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < Tk; ++j) pad[std::size_t(b) * Tk + j] = b == 2 || j >= Tk - 3 * b;
  return pad;
}

// Runs one case both ways; returns the relative gaps of y and of the
// input gradients (dq, dk, dv), and checks the log-sum-exps.
template <class S>
std::pair<double, double> compare(const Case& c, bool bf16 = false) {
  Rng rng(std::uint64_t(c.Tq) * 131 + c.Tk * 7 + c.hd + c.H);
  CpuBackend<S> be(CpuOptions{bf16});
  const AttentionDims a{c.B, c.H, c.Tq, c.Tk, c.hd, c.hd, 0, c.KVH, c.dropout, 0xf1a5bULL};
  const int ldq = c.H * c.hd, ldk = c.KVH * c.hd;
  const auto q = randn<S>(std::size_t(c.B) * c.Tq * ldq, rng);
  const auto k = randn<S>(std::size_t(c.B) * c.Tk * ldk, rng), v = randn<S>(std::size_t(c.B) * c.Tk * ldk, rng);
  const auto dy = randn<S>(std::size_t(c.B) * c.Tq * ldq, rng);
  const auto pad = padding(c.B, c.Tk);
  const AttentionMask mask{c.causal, c.padded ? pad.data() : nullptr};
  std::vector<S> y1(q.size()), y2(q.size()), probs(std::size_t(c.B) * c.H * c.Tq * c.Tk);
  std::vector<S> lse(std::size_t(c.B) * c.H * c.Tq);
  std::vector<S> dq1(q.size()), dk1(k.size()), dv1(v.size()), dq2(q.size()), dk2(k.size()), dv2(v.size());
  be.attention_forward(a, q.data(), ldq, k.data(), ldk, v.data(), ldk, y1.data(), ldq, probs.data(), mask);
  be.attention_backward(a, dy.data(), ldq, q.data(), ldq, k.data(), ldk, v.data(), ldk, probs.data(), dq1.data(),
                        dk1.data(), dv1.data());
  std::fill(dk2.begin(), dk2.end(), S(7));  // assigned, not accumulated
  be.flash_attention_forward(a, q.data(), ldq, k.data(), ldk, v.data(), ldk, y2.data(), ldq, lse.data(), mask);
  be.flash_attention_backward(a, dy.data(), ldq, y2.data(), ldq, q.data(), ldq, k.data(), ldk, v.data(), ldk,
                              lse.data(), mask, dq2.data(), dk2.data(), dv2.data());
  // The log-sum-exps: log sum_j exp(s_ij) over the visible keys, in double.
  const double scale = 1.0 / std::sqrt(double(c.hd));
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.Tq; i += std::max(1, c.Tq / 7)) {
        const int g = h / (c.H / c.KVH);
        double mx = -INFINITY, sum = 0;
        std::vector<double> s;
        for (int j = 0; j < c.Tk; ++j) {
          if (!mask.allowed(b, i, j, c.Tq, c.Tk)) continue;
          double dot = 0;
          for (int d = 0; d < c.hd; ++d)
            dot += double(q[(std::size_t(b) * c.Tq + i) * ldq + h * c.hd + d]) *
                   double(k[(std::size_t(b) * c.Tk + j) * ldk + g * c.hd + d]);
          s.push_back(dot * scale);
          mx = std::max(mx, dot * scale);
        }
        const double got = lse[(std::size_t(b) * c.H + h) * c.Tq + i];
        if (s.empty()) {
          BOOST_TEST((got == -std::numeric_limits<S>::infinity()), c.name() << " row " << i << ": no key, lse " << got);
          continue;
        }
        for (double e : s) sum += std::exp(e - mx);
        const double want = mx + std::log(sum);
        const double tol = bf16 ? 0.05 : std::is_same_v<S, double> ? 1e-12 : 1e-4;
        BOOST_TEST(std::abs(got - want) <= tol * (1 + std::abs(want)),
                   c.name() << " row " << i << ": lse " << got << ", want " << want);
      }
  std::vector<S> g1 = dq1, g2 = dq2;
  g1.insert(g1.end(), dk1.begin(), dk1.end());
  g1.insert(g1.end(), dv1.begin(), dv1.end());
  g2.insert(g2.end(), dk2.begin(), dk2.end());
  g2.insert(g2.end(), dv2.begin(), dv2.end());
  std::size_t not_finite = 0;
  for (const auto& x : y2) not_finite += !std::isfinite(double(x));
  for (const auto& x : g2) not_finite += !std::isfinite(double(x));
  BOOST_TEST(not_finite == 0u, c.name() << ": " << not_finite << " outputs or gradients not finite");
  return {relative_gap(y2, y1), relative_gap(g2, g1)};
}

std::vector<Case> cases(bool long_ones) {
  std::vector<Case> out;
  for (int T : {1, 5, 63, 64, 65, 127, 129, 200})
    for (int m = 0; m < 4; ++m)
      for (float p : {0.0f, 0.3f}) out.push_back({3, 2, 2, T, T, 32, bool(m & 1), bool(m & 2), p});
  for (int hd : {32, 64, 128}) out.push_back({2, 4, 2, 150, 150, hd, true, true, 0.1f});  // grouped heads
  out.push_back({3, 2, 1, 70, 300, 64, false, true, 0.0f});  // cross-attention, one key/value head
  out.push_back({3, 2, 2, 300, 20, 32, false, true, 0.2f});
  out.push_back({2, 2, 2, 90, 260, 32, true, false, 0.0f});  // causal, fewer queries than keys
  if (long_ones)
    for (int hd : {64, 128}) out.push_back({1, 2, 2, 1024, 1024, hd, true, false, 0.1f});
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(tiled_attention_matches_the_materialised_in_double) {
  for (const Case& c : cases(true)) {
    const auto [y, g] = compare<double>(c);
    BOOST_TEST(y <= 1e-13, c.name() << ": output " << y);
    BOOST_TEST(g <= 1e-12, c.name() << ": gradients " << g);
  }
}

BOOST_AUTO_TEST_CASE(tiled_attention_matches_the_materialised_in_float) {
  for (const Case& c : cases(true)) {
    const auto [y, g] = compare<float>(c);
    BOOST_TEST(y <= 2e-6, c.name() << ": output " << y);
    BOOST_TEST(g <= 2e-5, c.name() << ": gradients " << g);
  }
}

// bf16 products (CpuOptions::bf16): both paths round the same operands
// but not the same partial products (a tile's P against a whole row's), so
// they agree to bf16's precision, not float32's.
BOOST_AUTO_TEST_CASE(tiled_attention_in_bf16) {
  if (!bf16::available()) {
    BOOST_TEST_MESSAGE("skipped: " << bf16::unavailable_reason());
    return;
  }
  // bf16 tiles are 128 x 256 (flash_tile): cases across both edges.
  for (const Case& c : {Case{2, 2, 2, 200, 200, 64, true, true, 0.2f}, Case{1, 2, 1, 300, 130, 32, false, true, 0.0f},
                        Case{1, 2, 2, 300, 520, 64, true, false, 0.1f}}) {
    const auto [y, g] = compare<float>(c, true);
    BOOST_TEST(y <= 4 * std::ldexp(1.0, -8), c.name() << ": output " << y);
    BOOST_TEST(g <= 4 * std::ldexp(1.0, -8), c.name() << ": gradients " << g);
  }
}

struct Long {
  static constexpr int MAX_T = 300, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 1, D_FF = 32;
  using Norm = PreNorm;
  using Activation = Gelu;
};

// The layer tiles past the row kernels (no probabilities kept: memory linear
// in T), materialises on request, and both give the same output and
// gradients; short sequences keep the row kernels' probabilities.
BOOST_AUTO_TEST_CASE(layers_tile_past_the_row_kernels) {
  using Be = CpuBackend<double>;
  constexpr int D = Long::D_MODEL;
  for (int T : {40, 300}) {
    Rng rng(5);
    Be be;
    SelfAttention<Long, Be> attn(rng);
    const Shape bt{2, T};
    std::vector<double> x(std::size_t(bt.rows()) * D), dy(x.size()), y1(x.size()), y2(x.size()), dx1(x.size()),
        dx2(x.size());
    for (auto& e : x) e = rng.normal();
    for (auto& e : dy) e = rng.normal();
    std::vector<std::uint8_t> pad(std::size_t(bt.rows()), 0);
    pad[std::size_t(T) + T - 1] = 1;
    const AttentionMask mask{true, pad.data()};
    std::vector<double> grads1, grads2;
    auto run = [&](bool keep, std::vector<double>& y, std::vector<double>& dx, std::vector<double>& grads) {
      attn.keep_probabilities(keep);
      attn.visit([](auto&&, auto&, auto& g) { g.fill(0.0); });
      attn.forward(be, ConstRows<double, D>(x.data(), bt.rows()), Rows<double, D>(y.data(), bt.rows()), bt, mask);
      BOOST_TEST(attn.probabilities().empty() == (!keep && T > kCpuRowQueries), "T " << T);
      attn.backward(be, ConstRows<double, D>(dy.data(), bt.rows()), Rows<double, D>(dx.data(), bt.rows()));
      attn.visit([&](auto&&, auto&, auto& g) { grads.insert(grads.end(), g.data(), g.data() + g.size()); });
    };
    run(false, y1, dx1, grads1);
    run(true, y2, dx2, grads2);
    BOOST_TEST(relative_gap(y1, y2) <= 1e-13, "T " << T);
    BOOST_TEST(relative_gap(dx1, dx2) <= 1e-12, "T " << T);
    BOOST_TEST(relative_gap(grads1, grads2) <= 1e-12, "T " << T);
    BOOST_TEST(attn.probabilities().size() == std::size_t(2) * 2 * T * T);
  }
}

BOOST_AUTO_TEST_SUITE_END()
