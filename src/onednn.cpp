// onednn.cpp: what xfmr runs on oneDNN, when it is built with it
// (XFMR_WITH_DNNL, private to xfmr_core); the only file that includes it:
// bf16::gemm (backend/bf16.hpp) on oneDNN's matmul, and the float products
// CpuBackend hands to a BLAS on its sgemm (detail::onednn_sgemm,
// backend/cpu/gemm.hpp).
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu/onednn_sgemm.hpp"

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <map>
#include <vector>

#include "xfmr/core/error.hpp"

#ifdef XFMR_WITH_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace xfmr::detail {

bool onednn_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc) {
#ifdef XFMR_WITH_DNNL
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success;
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta,
      (void)C, (void)ldc;
  return false;
#endif
}

bool onednn_sgemm_available() {
#ifdef XFMR_WITH_DNNL
  return true;
#else
  return false;
#endif
}

}  // namespace xfmr::detail

namespace xfmr::bf16 {

std::string unavailable_reason() {
#ifdef XFMR_WITH_DNNL
  return "";
#else
  return "xfmr was built without oneDNN (Debian's libdnnl-dev; CMake's XFMR_DNNL)";
#endif
}

bool native() {
#ifdef XFMR_WITH_DNNL
  static const bool bf16_isa = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  return bf16_isa;
#else
  return false;
#endif
}

bool available() { return unavailable_reason().empty(); }

#ifdef XFMR_WITH_DNNL
namespace {

// A product's shape: one oneDNN primitive each (made once, then reused).
struct Shape {
  bool ta, tb;
  int M, N, K, lda, ldb, ldc;
  float alpha, beta;
  auto operator<=>(const Shape&) const = default;
};

// Per thread: DataParallel's shards multiply at once, each on its thread.
struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Shape, dnnl::matmul> products;
  std::map<std::array<int, 3>, dnnl::reorder> roundings;  // {rows, cols, ld}: float32 to bfloat16
  std::vector<std::uint16_t> a, b;  // the operands, rounded
  std::vector<float> fa, fb;         // ... and widened back to float32, without AVX512-BF16
};

Context& context() {
  thread_local Context c;
  return c;
}

// rows x cols of x (leading dimension ld) into out, rounded to bfloat16 and
// widened back to float32 (or widened from bits, when given), packed
// (leading dimension cols: a block of a wider matrix's columns takes the
// block's room alone).
void rounded_floats(int rows, int cols, const float* x, const std::uint16_t* bits, int ld, std::vector<float>& out) {
  out.resize(std::size_t(rows) * std::size_t(cols));
  float* o = out.data();
#pragma omp parallel for schedule(static) if (long(rows) * cols > 65536)
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = std::size_t(r) * ld + c;
      o[std::size_t(r) * cols + c] = bits ? to_float(bits[i]) : round(x[i]);
    }
}

dnnl::memory::desc matrix(int rows, int cols, bool transposed, int ld, dnnl::memory::data_type type);

// rows x cols of x (leading dimension ld) into out, rounded to nearest
// even, packed (leading dimension cols): by oneDNN's reorder (its
// conversion instruction, on the native path's processors), each product's
// operands every call.
void round_matrix(Context& ctx, int rows, int cols, const float* x, int ld, std::vector<std::uint16_t>& out) {
  out.resize(std::size_t(rows) * std::size_t(cols));
  using dt = dnnl::memory::data_type;
  const auto from = matrix(rows, cols, false, ld, dt::f32), to = matrix(rows, cols, false, cols, dt::bf16);
  auto it = ctx.roundings.find({rows, cols, ld});
  if (it == ctx.roundings.end())
    it = ctx.roundings.emplace(std::array<int, 3>{rows, cols, ld}, dnnl::reorder(dnnl::reorder::primitive_desc(
                                                                       ctx.engine, from, ctx.engine, to))).first;
  dnnl::memory src(from, ctx.engine, const_cast<float*>(x)), dst(to, ctx.engine, out.data());
  it->second.execute(ctx.stream, src, dst);
}

dnnl::memory::desc matrix(int rows, int cols, bool transposed, int ld, dnnl::memory::data_type type) {
  // Logical (rows, cols); stored row-major with leading dimension ld, or
  // transposed (cols, rows) so.
  return dnnl::memory::desc({rows, cols}, type,
                            transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

dnnl::matmul make_product(const Shape& s, const dnnl::engine& engine) {
  using dt = dnnl::memory::data_type;
  const auto a = matrix(s.M, s.K, s.ta, s.lda, dt::bf16), b = matrix(s.K, s.N, s.tb, s.ldb, dt::bf16),
             c = matrix(s.M, s.N, false, s.ldc, dt::f32);
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(s.beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine));
}

}  // namespace
#endif

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, const std::uint16_t* B_bits) {
  require(available(), "bf16 products: ", unavailable_reason());
  require(M >= 0 && N >= 0 && K >= 0, "bf16 gemm: negative shape (", M, ", ", N, ", ", K, ")");
  if (M == 0 || N == 0) return;
#ifdef XFMR_WITH_DNNL
  // A large A operand (the output head's input gradient: the logits'
  // gradient, rows x vocabulary) is rounded and multiplied a block of rows
  // at a time, so that its rounded copy stays at most 2^23 values (16 MB;
  // 32 MB widened to float32 without AVX512-BF16).
  constexpr long kRoundedA = 1L << 23;
  if (M > 1 && K > 0 && long(M) * K > kRoundedA) {
    const int block = int(std::max(1L, kRoundedA / K));
    for (int r = 0; r < M; r += block) {
      const int m = std::min(block, M - r);
      gemm(ta, tb, m, N, K, alpha, ta ? A + r : A + std::size_t(r) * lda, lda, B, ldb, beta, C + std::size_t(r) * ldc,
           ldc, B_bits);
    }
    return;
  }
  Context& ctx = context();
  if (K == 0) {  // C = beta C
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) C[std::size_t(r) * ldc + c] = beta == 0.0f ? 0.0f : beta * C[std::size_t(r) * ldc + c];
    return;
  }
  if (!native()) {
    // Products of bfloat16 values are exact in float32 (8 significant bits
    // times 8): float32's sgemm on the rounded operands gives bf16 products,
    // their sums in float32 (in its order). A large B (a weight: 262 MB
    // widened for TinyLlama's head) is widened a block of 2^21 values (8
    // MB) at a time: of its rows, summed into C, when K is the longer side
    // (A's columns then widened a block each), else of its columns (A
    // widened once for them all).
    constexpr long kWidenedB = 1L << 21;
    if (long(N) * K > kWidenedB && K > N) {
      const int block = int(std::max(1L, kWidenedB / N));
      for (int k = 0; k < K; k += block) {
        const std::size_t at_a = ta ? std::size_t(k) * lda : std::size_t(k), at_b = tb ? std::size_t(k) : std::size_t(k) * ldb;
        gemm(ta, tb, M, N, std::min(block, K - k), alpha, A + at_a, lda, B ? B + at_b : nullptr, ldb,
             k == 0 ? beta : 1.0f, C, ldc, B_bits ? B_bits + at_b : nullptr);
      }
      return;
    }
    rounded_floats(ta ? K : M, ta ? M : K, A, nullptr, lda, ctx.fa);
    const int block = long(N) * K > kWidenedB ? int(std::max(1L, kWidenedB / K)) : N;
    for (int c = 0; c < N; c += block) {
      const int n = std::min(block, N - c);
      const std::size_t at = tb ? std::size_t(c) * ldb : std::size_t(c);
      rounded_floats(tb ? n : K, tb ? K : n, B ? B + at : nullptr, B_bits ? B_bits + at : nullptr, ldb, ctx.fb);
      require(detail::onednn_sgemm(ta, tb, M, n, K, alpha, ctx.fa.data(), ta ? M : K, ctx.fb.data(), tb ? K : n, beta,
                                   C + c, ldc),
              "bf16 products: oneDNN's sgemm failed on a ", M, " x ", n, " x ", K, " product");
    }
    return;
  }
  // The rounded operands are packed; B's bits, when given, are read in place.
  round_matrix(ctx, ta ? K : M, ta ? M : K, A, lda, ctx.a);
  lda = ta ? M : K;
  if (!B_bits) {
    round_matrix(ctx, tb ? N : K, tb ? K : N, B, ldb, ctx.b);
    B_bits = ctx.b.data();
    ldb = tb ? K : N;
  }
  const Shape shape{ta, tb, M, N, K, lda, ldb, ldc, alpha, beta};
  auto it = ctx.products.find(shape);
  if (it == ctx.products.end()) it = ctx.products.emplace(shape, make_product(shape, ctx.engine)).first;
  using dt = dnnl::memory::data_type;
  dnnl::memory a(matrix(M, K, ta, lda, dt::bf16), ctx.engine, ctx.a.data());
  dnnl::memory b(matrix(K, N, tb, ldb, dt::bf16), ctx.engine, const_cast<std::uint16_t*>(B_bits));
  dnnl::memory c(matrix(M, N, false, ldc, dt::f32), ctx.engine, C);
  it->second.execute(ctx.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  ctx.stream.wait();
#else
  (void)ta, (void)tb, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc, (void)B_bits;
#endif
}

}  // namespace xfmr::bf16
