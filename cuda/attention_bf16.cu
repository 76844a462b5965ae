// attention_bf16.cu: the tiled attention on the tensor cores, forward and
// backward, for bf16 products (CudaOptions::bf16 with flash_attention;
// attention_tiled.cu's flash_attention_* launch them where bf16_tiles_fit). The
// same functions as flash_rows_*_kernel (the online softmax over key tiles,
// the log-sum-exp saved, the same masks and dropout elements), with every
// product in bf16 summed in float32 (wmma, 16 x 16 x 16). The forward:
//
// A block of 4 warps takes 64 query rows of one (sequence, head), warp w
// rows 16 w to 16 w + 15. Q is rounded to bf16 into shared memory once; for
// each tile of 64 keys up to the last the block's rows can see (causal
// tiles past it are skipped), K and V are rounded into shared memory, each
// warp computes its 16 x 64 scores (float, through shared memory: wmma's
// register layout is not the programmer's), two lanes a row take the
// masked online softmax (32 scores each), round the probabilities to bf16,
// and the warp's P V goes through shared memory into the float output
// accumulator, rescaled row by row. Rows past Tq, keys past Tk and masked
// keys are -inf scores: probability 0. A row that sees no key gets output 0
// and log-sum-exp -inf, as on the CPU.
//
// Shared memory: Q, K, V (bf16, 64 x HD each), the scores (float, 64 x 64),
// the probabilities (bf16, 64 x 64), the output and each tile's P V (float,
// 64 x HD each): 89 KB for heads of 64, 147 KB for 128. The backward is
// below. Error: bf16 operands (Q, K, V, dY and P, dS), float32 sums:
// backend/bf16.hpp's bound on each product. ptxas (sm_90, nvcc 13.0): at
// most 4 bytes spilled for heads of 64; for 128 the forward spills 32 and
// the key kernel (16 accumulator fragments) about 100.
#include <cuda_bf16.h>
#include <mma.h>

#include <type_traits>

#include "attention.cuh"

namespace xfmr::cuda::detail {

namespace {
using namespace nvcuda;

constexpr int kRows = 64, kKeys = 64, kThreads = 128;  // 4 warps of 16 query rows

constexpr unsigned round_up(unsigned bytes) { return (bytes + 127u) / 128u * 128u; }

// Where each array lies in dynamic shared memory (bytes; 128-byte aligned,
// and every 16 x 16 fragment's first element 32-byte aligned, as wmma asks),
// and its leading dimension in elements (a multiple of 8 for bf16 and 4 for
// float, padded against bank conflicts).
template <int HD>
struct Tiles {
  static constexpr int LDH = HD + 8;     // bf16 Q, K, V rows
  static constexpr int LDS = kKeys + 4;  // float scores
  static constexpr int LDP = kKeys + 8;  // bf16 probabilities
  static constexpr int LDO = HD + 4;     // float output and P V
  static constexpr unsigned q = 0;
  static constexpr unsigned k = q + round_up(kRows * LDH * 2);
  static constexpr unsigned v = k + round_up(kKeys * LDH * 2);
  static constexpr unsigned s = v + round_up(kKeys * LDH * 2);
  static constexpr unsigned p = s + round_up(kRows * LDS * 4);
  static constexpr unsigned o = p + round_up(kRows * LDP * 2);
  static constexpr unsigned t = o + round_up(kRows * LDO * 4);
  static constexpr unsigned bytes = t + round_up(kRows * LDO * 4);
};

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// One warp's acc[n] += A (16 x 16 K, bf16, row-major at a) B (16 K x 16 N,
// bf16 at b: row-major, or column-major for a transposed operand), column
// block n of 16, on the tensor cores.
template <int N, int K, class BLayout>
__device__ inline void warp_product_add(const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, int ldb,
                                        Acc (&acc)[N]) {
  constexpr bool b_rows = std::is_same_v<BLayout, wmma::row_major>;
#pragma unroll
  for (int kk = 0; kk < K; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> af;
    wmma::load_matrix_sync(af, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> bf;
      wmma::load_matrix_sync(bf, b_rows ? b + kk * 16 * ldb + n * 16 : b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc[n], af, bf, acc[n]);
    }
  }
}
// The same product into C (16 x 16 N, float, row-major at c): wmma's
// register layout is not the programmer's, so element-wise work reads C
// from shared memory.
template <int N, int K, class BLayout>
__device__ inline void warp_product(const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, int ldb, float* c,
                                    int ldc) {
  Acc acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(acc[n], 0.0f);
  warp_product_add<N, K, BLayout>(a, lda, b, ldb, acc);
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::store_matrix_sync(c + n * 16, acc[n], ldc, wmma::mem_row_major);
}

// The block's (sequence, head, key head, first query row) for blocks over
// (B, H, query tiles of 64).
struct QueryTile {
  int b, h, g, i0;
};
__device__ inline QueryTile query_tile(const KernelDims& a) {
  const int tiles = (a.Tq + kRows - 1) / kRows, bh = int(blockIdx.x / tiles), h = bh % a.H;
  return {bh / a.H, h, a.kv_head(h), int(blockIdx.x % tiles) * kRows};
}

// The shared-memory array at byte offset `at` of the dynamic block.
template <class T>
__device__ inline T* shared_at(unsigned at) {
  extern __shared__ __align__(128) unsigned char smem[];
  return reinterpret_cast<T*>(smem + at);
}

// 64 rows of HD floats from src (ld apart; rows from `valid` on as zeros)
// into bf16 shared memory (LDH apart), the block's threads over the
// elements.
template <int HD, int LDH, class A>
__device__ inline void load_bf16_rows(__nv_bfloat16* dst, const A* src, long ld, int valid) {
  for (int e = threadIdx.x; e < 64 * HD; e += kThreads) {
    const int r = e / HD, c = e % HD;
    dst[r * LDH + c] = __float2bfloat16(r < valid ? to_float(src[long(r) * ld + c]) : 0.0f);
  }
}

template <int HD, class A>
__global__ void __launch_bounds__(kThreads) bf16_tiled_forward_kernel(KernelDims a, float scale, const A* q,
                                                                      int ldq, const A* k, int ldk,
                                                                      const A* v, int ldv, A* y, int ldy,
                                                                      float* lse, DeviceMask mask, float rate,
                                                                      float keep_scale, const std::uint64_t* key_in) {
  using L = Tiles<HD>;
  using bf16 = __nv_bfloat16;
  bf16 *Qs = shared_at<bf16>(L::q), *Ks = shared_at<bf16>(L::k), *Vs = shared_at<bf16>(L::v);
  bf16* Ps = shared_at<bf16>(L::p);
  float *Ss = shared_at<float>(L::s), *Os = shared_at<float>(L::o), *Ts = shared_at<float>(L::t);
  const auto [b, h, g, i0] = query_tile(a);
  const int warp = threadIdx.x / 32;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  const A* qb = q + long(b) * a.Tq * ldq + long(h) * HD;
  const A* kb = k + long(b) * a.KV_ROWS * ldk + long(g) * HD;
  const A* vb = v + long(b) * a.KV_ROWS * ldv + long(g) * HD;

  load_bf16_rows<HD, L::LDH>(Qs, qb + long(i0) * ldq, ldq, a.Tq - i0);
  for (int e = threadIdx.x; e < kRows * HD; e += kThreads) Os[e / HD * L::LDO + e % HD] = 0.0f;
  __syncthreads();

  // This lane's query row (two lanes a row) and its half of the columns.
  const int row = warp * 16 + lane() / 2, half = lane() % 2, i = i0 + row;
  const long r = (long(b) * a.H + h) * a.Tq + i;  // the row in (B, H, Tq): lse, dropout elements
  float* Sw = Ss + warp * 16 * L::LDS;
  float* Tw = Ts + warp * 16 * L::LDO;
  float* srow = Ss + row * L::LDS + half * 32;
  __nv_bfloat16* prow = Ps + row * L::LDP + half * 32;
  float* orow = Os + row * L::LDO + half * (HD / 2);
  const float* trow = Ts + row * L::LDO + half * (HD / 2);
  float m = -INFINITY, l = 0.0f;
  const int end = visible_end(a, mask, min(i0 + kRows, a.Tq) - 1);  // the block's last row sees the most
  for (int j0 = 0; j0 < end; j0 += kKeys) {
    __syncthreads();  // every warp is done with the last tile's K and V
    load_bf16_rows<HD, L::LDH>(Ks, kb + long(j0) * ldk, ldk, a.Tk - j0);
    load_bf16_rows<HD, L::LDH>(Vs, vb + long(j0) * ldv, ldv, a.Tk - j0);
    __syncthreads();

    // The warp's scores: Q (16 x HD) K^T (HD x 64); K row-major is K^T column-major.
    warp_product<kKeys / 16, HD / 16, wmma::col_major>(Qs + warp * 16 * L::LDH, L::LDH, Ks, L::LDH, Sw, L::LDS);
    __syncwarp();

    // The online softmax of the row's 64 scores, 32 a lane.
    float top = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int j = j0 + half * 32 + c;
      const float s = i < a.Tq && j < a.Tk && mask.allowed(b, i, j, a.Tq, a.Tk) ? scale * srow[c] : -INFINITY;
      srow[c] = s;
      top = fmaxf(top, s);
    }
    top = fmaxf(m, fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1)));
    const float rescale = top == -INFINITY ? 1.0f : expf(m - top);  // 0 after a row's first visible key
    float sum = 0.0f;
    for (int c = 0; c < 32; ++c) {
      const float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - top);
      sum += p;
      prow[c] = __float2bfloat16(dropped(p, rate, keep_scale, key, r * a.Tk + j0 + half * 32 + c));
    }
    l = l * rescale + (sum + __shfl_xor_sync(0xffffffffu, sum, 1));
    m = top;
    __syncwarp();

    // The warp's P (16 x 64) V (64 x HD), then O = rescale O + P V row by row.
    warp_product<HD / 16, kKeys / 16, wmma::row_major>(Ps + warp * 16 * L::LDP, L::LDP, Vs, L::LDH, Tw, L::LDO);
    __syncwarp();
    for (int c = 0; c < HD / 2; ++c) orow[c] = orow[c] * rescale + trow[c];
  }

  if (i >= a.Tq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  A* yi = y + (long(b) * a.Tq + i) * ldy + long(h) * HD + half * (HD / 2);
  for (int c = 0; c < HD / 2; ++c) yi[c] = from_float<A>(orow[c] * inv);
  if (half == 0) lse[r] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// A warp's 16 rows of accumulators out: through its rows of shared memory
// (at warp_rows; this lane's row at lane_row), then this lane's half of its
// row, times f, to out where `valid`.
template <int HD, int LDO, class A>
__device__ inline void store_rows(const Acc (&acc)[HD / 16], float* warp_rows, const float* lane_row, int half,
                                  bool valid, A* out, float f) {
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::store_matrix_sync(warp_rows + n * 16, acc[n], LDO, wmma::mem_row_major);
  __syncwarp();
  if (valid)
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c) out[c] = from_float<A>(f * lane_row[c]);
  __syncwarp();  // the rows are read before the next store overwrites them
}

// The backward, as flash_rows_backward_*'s (one kernel for dQ and
// D = <dY, Y>, then one for dK and dV, no atomics), with its products on the
// tensor cores: the scores and dP = dY V^T recomputed per tile in bf16,
// P = exp(s - lse) in float32, dS = P (dropped(dP) - D); dS and the dropped
// P rounded to bf16 for dQ += dS K, dK += dS^T Q and dV += P^T dY, which
// accumulate in registers across tiles.
//
// dQ: a block of 4 warps takes 64 query rows of one (sequence, head), as the
// forward; shared memory: Q, dY, K, V (bf16), S and dP (float), dS (bf16),
// the dQ rows (float) on their way out.
template <int HD>
struct BackwardQTiles {
  static constexpr int LDH = HD + 8, LDS = kKeys + 4, LDP = kKeys + 8, LDO = HD + 4;
  static constexpr unsigned q = 0;
  static constexpr unsigned dy = q + round_up(kRows * LDH * 2);
  static constexpr unsigned k = dy + round_up(kRows * LDH * 2);
  static constexpr unsigned v = k + round_up(kKeys * LDH * 2);
  static constexpr unsigned s = v + round_up(kKeys * LDH * 2);
  static constexpr unsigned dp = s + round_up(kRows * LDS * 4);
  static constexpr unsigned ds = dp + round_up(kRows * LDS * 4);
  static constexpr unsigned o = ds + round_up(kRows * LDP * 2);
  static constexpr unsigned bytes = o + round_up(kRows * LDO * 4);
};

template <int HD, class A>
__global__ void __launch_bounds__(kThreads)
    bf16_tiled_backward_q_kernel(KernelDims a, float scale, const A* dy, int ldy, const A* y, int ldo,
                                 const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
                                 const float* lse, float* dsum, A* dq, DeviceMask mask, float rate,
                                 float keep_scale, const std::uint64_t* key_in) {
  using L = BackwardQTiles<HD>;
  using bf16 = __nv_bfloat16;
  bf16 *Qs = shared_at<bf16>(L::q), *dYs = shared_at<bf16>(L::dy), *Ks = shared_at<bf16>(L::k);
  bf16 *Vs = shared_at<bf16>(L::v), *dSs = shared_at<bf16>(L::ds);
  float *Ss = shared_at<float>(L::s), *dPs = shared_at<float>(L::dp), *Os = shared_at<float>(L::o);
  const auto [b, h, g, i0] = query_tile(a);
  const int warp = threadIdx.x / 32;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  const long row0 = long(b) * a.Tq + i0;  // the tile's first row of Q, dY, Y
  const A* kb = k + long(b) * a.Tk * ldk + long(g) * HD;
  const A* vb = v + long(b) * a.Tk * ldv + long(g) * HD;
  load_bf16_rows<HD, L::LDH>(Qs, q + row0 * ldq + long(h) * HD, ldq, a.Tq - i0);
  load_bf16_rows<HD, L::LDH>(dYs, dy + row0 * ldy + long(h) * HD, ldy, a.Tq - i0);

  const int row = warp * 16 + lane() / 2, half = lane() % 2, i = i0 + row;
  const long r = (long(b) * a.H + h) * a.Tq + i;
  float d = 0.0f;  // D = <dY_i, Y_i>, in float32
  if (i < a.Tq)
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
      d += to_float(dy[(row0 + row) * ldy + long(h) * HD + c]) * to_float(y[(row0 + row) * ldo + long(h) * HD + c]);
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  if (i < a.Tq && half == 0) dsum[r] = d;
  const float lse_r = i < a.Tq ? lse[r] : -INFINITY;
  const float* srow = Ss + row * L::LDS + half * 32;
  const float* dprow = dPs + row * L::LDS + half * 32;
  __nv_bfloat16* dsrow = dSs + row * L::LDP + half * 32;
  Acc acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);

  const int end = visible_end(a, mask, min(i0 + kRows, a.Tq) - 1);
  for (int j0 = 0; j0 < end; j0 += kKeys) {
    __syncthreads();  // every warp is done with the last tile's K and V (and Q, dY are written)
    load_bf16_rows<HD, L::LDH>(Ks, kb + long(j0) * ldk, ldk, a.Tk - j0);
    load_bf16_rows<HD, L::LDH>(Vs, vb + long(j0) * ldv, ldv, a.Tk - j0);
    __syncthreads();
    warp_product<kKeys / 16, HD / 16, wmma::col_major>(Qs + warp * 16 * L::LDH, L::LDH, Ks, L::LDH,
                                                       Ss + warp * 16 * L::LDS, L::LDS);
    warp_product<kKeys / 16, HD / 16, wmma::col_major>(dYs + warp * 16 * L::LDH, L::LDH, Vs, L::LDH,
                                                       dPs + warp * 16 * L::LDS, L::LDS);
    __syncwarp();
    for (int c = 0; c < 32; ++c) {
      const int j = j0 + half * 32 + c;
      float ds = 0.0f;
      if (i < a.Tq && j < a.Tk && mask.allowed(b, i, j, a.Tq, a.Tk)) {
        const float p = recomputed(scale * srow[c], lse_r);
        if (p != 0.0f) ds = p * (dropped(dprow[c], rate, keep_scale, key, r * a.Tk + j) - d);
      }
      dsrow[c] = __float2bfloat16(ds);
    }
    __syncwarp();
    warp_product_add<HD / 16, kKeys / 16, wmma::row_major>(dSs + warp * 16 * L::LDP, L::LDP, Ks, L::LDH, acc);
  }
  store_rows<HD, L::LDO>(acc, Os + warp * 16 * L::LDO, Os + row * L::LDO, half, i < a.Tq,
                         dq + (row0 + row) * ldq + long(h) * HD, scale);
}

// dK and dV: a block of 4 warps takes 64 key rows of one (sequence, key
// head), warp w keys 16 w to 16 w + 15, and walks the query heads sharing
// it and their query tiles that see its keys; each warp computes its keys'
// S^T = K Q^T and dP^T = V dY^T. Shared memory: K, V, Q, dY (bf16), each
// query row's lse and D, S^T and dP^T (float), P^T and dS^T (bf16), the
// rows on their way out (float).
template <int HD>
struct BackwardKvTiles {
  static constexpr int LDH = HD + 8, LDS = kRows + 4, LDP = kRows + 8, LDO = HD + 4;
  static constexpr unsigned k = 0;
  static constexpr unsigned v = k + round_up(kKeys * LDH * 2);
  static constexpr unsigned q = v + round_up(kKeys * LDH * 2);
  static constexpr unsigned dy = q + round_up(kRows * LDH * 2);
  static constexpr unsigned rows = dy + round_up(kRows * LDH * 2);  // lse, then D
  static constexpr unsigned s = rows + round_up(2 * kRows * 4);
  static constexpr unsigned dp = s + round_up(kKeys * LDS * 4);
  static constexpr unsigned p = dp + round_up(kKeys * LDS * 4);
  static constexpr unsigned ds = p + round_up(kKeys * LDP * 2);
  static constexpr unsigned o = ds + round_up(kKeys * LDP * 2);
  static constexpr unsigned bytes = o + round_up(kKeys * LDO * 4);
};

template <int HD, class A>
__global__ void __launch_bounds__(kThreads)
    bf16_tiled_backward_kv_kernel(KernelDims a, float scale, const A* dy, int ldy, const A* q, int ldq,
                                  const A* k, int ldk, const A* v, int ldv, const float* lse,
                                  const float* dsum, A* dk, A* dv, DeviceMask mask, float rate,
                                  float keep_scale, const std::uint64_t* key_in) {
  using L = BackwardKvTiles<HD>;
  using bf16 = __nv_bfloat16;
  bf16 *Ks = shared_at<bf16>(L::k), *Vs = shared_at<bf16>(L::v), *Qs = shared_at<bf16>(L::q);
  bf16 *dYs = shared_at<bf16>(L::dy), *Pt = shared_at<bf16>(L::p), *dSt = shared_at<bf16>(L::ds);
  float *lse_s = shared_at<float>(L::rows), *d_s = lse_s + kRows;
  float *St = shared_at<float>(L::s), *dPt = shared_at<float>(L::dp), *Os = shared_at<float>(L::o);

  const int tiles = (a.Tk + kKeys - 1) / kKeys, group = a.H / a.KV_H;
  const int bg = int(blockIdx.x / tiles), b = bg / a.KV_H, g = bg % a.KV_H;
  const int j0 = int(blockIdx.x % tiles) * kKeys, warp = threadIdx.x / 32;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  load_bf16_rows<HD, L::LDH>(Ks, k + (long(b) * a.Tk + j0) * ldk + long(g) * HD, ldk, a.Tk - j0);
  load_bf16_rows<HD, L::LDH>(Vs, v + (long(b) * a.Tk + j0) * ldv + long(g) * HD, ldv, a.Tk - j0);

  const int kr = warp * 16 + lane() / 2, half = lane() % 2, j = j0 + kr;  // this lane pair's key
  const float* srow = St + kr * L::LDS + half * 32;
  const float* dprow = dPt + kr * L::LDS + half * 32;
  __nv_bfloat16* prow = Pt + kr * L::LDP + half * 32;
  __nv_bfloat16* dsrow = dSt + kr * L::LDP + half * 32;
  Acc dka[HD / 16], dva[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(dka[n], 0.0f), wmma::fill_fragment(dva[n], 0.0f);

  const int first = mask.causal ? max(0, j0 - (a.Tk - a.Tq)) : 0;  // the first query row that sees key j0
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const long rh = (long(b) * a.H + h) * a.Tq;  // (b, h)'s rows in (B, H, Tq)
    for (int i0 = first / kRows * kRows; i0 < a.Tq; i0 += kRows) {
      __syncthreads();  // every warp is done with the last tile's Q, dY, lse and D (and K, V are written)
      const long row0 = long(b) * a.Tq + i0;
      load_bf16_rows<HD, L::LDH>(Qs, q + row0 * ldq + long(h) * HD, ldq, a.Tq - i0);
      load_bf16_rows<HD, L::LDH>(dYs, dy + row0 * ldy + long(h) * HD, ldy, a.Tq - i0);
      for (int t = threadIdx.x; t < kRows; t += kThreads) {
        lse_s[t] = i0 + t < a.Tq ? lse[rh + i0 + t] : -INFINITY;
        d_s[t] = i0 + t < a.Tq ? dsum[rh + i0 + t] : 0.0f;
      }
      __syncthreads();
      warp_product<kRows / 16, HD / 16, wmma::col_major>(Ks + warp * 16 * L::LDH, L::LDH, Qs, L::LDH,
                                                         St + warp * 16 * L::LDS, L::LDS);
      warp_product<kRows / 16, HD / 16, wmma::col_major>(Vs + warp * 16 * L::LDH, L::LDH, dYs, L::LDH,
                                                         dPt + warp * 16 * L::LDS, L::LDS);
      __syncwarp();
      for (int c = 0; c < 32; ++c) {
        const int qi = half * 32 + c, i = i0 + qi;
        float pd = 0.0f, ds = 0.0f;
        if (i < a.Tq && j < a.Tk && mask.allowed(b, i, j, a.Tq, a.Tk)) {
          const float p = recomputed(scale * srow[c], lse_s[qi]);
          if (p != 0.0f) {
            const long e = (rh + i) * a.Tk + j;
            pd = dropped(p, rate, keep_scale, key, e);
            ds = p * (dropped(dprow[c], rate, keep_scale, key, e) - d_s[qi]);
          }
        }
        prow[c] = __float2bfloat16(pd);
        dsrow[c] = __float2bfloat16(ds);
      }
      __syncwarp();
      warp_product_add<HD / 16, kRows / 16, wmma::row_major>(Pt + warp * 16 * L::LDP, L::LDP, dYs, L::LDH, dva);
      warp_product_add<HD / 16, kRows / 16, wmma::row_major>(dSt + warp * 16 * L::LDP, L::LDP, Qs, L::LDH, dka);
    }
  }
  // dK = scale dS^T Q and dV = P^T dY, assigned (keys past Tk are not rows).
  store_rows<HD, L::LDO>(dka, Os + warp * 16 * L::LDO, Os + kr * L::LDO, half, j < a.Tk,
                         dk + (long(b) * a.Tk + j) * ldk + long(g) * HD, scale);
  store_rows<HD, L::LDO>(dva, Os + warp * 16 * L::LDO, Os + kr * L::LDO, half, j < a.Tk,
                         dv + (long(b) * a.Tk + j) * ldv + long(g) * HD, 1.0f);
}

// Raises a kernel's shared-memory limit (past 48 KiB) once, then launches
// it on `blocks` blocks of 4 warps.
constexpr unsigned kSharedLimit = 227 * 1024;  // a Hopper block's dynamic shared memory, at most
static_assert(Tiles<128>::bytes <= kSharedLimit && BackwardQTiles<128>::bytes <= kSharedLimit &&
              BackwardKvTiles<128>::bytes <= kSharedLimit);

template <auto kernel, class... Args>
void launch_tiles(const char* what, unsigned bytes, long blocks, Args... args) {
  static const bool raised = [&] {  // once per kernel: one instantiation each
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what);
    return true;
  }();
  (void)raised;
  launch(what, dim3(unsigned(blocks)), dim3(kThreads), bytes, kernel, args...);
}

template <int HD, class A>
void forward_tiles(const KernelDims& a, float scale, const A* q, int ldq, const A* k, int ldk, const A* v,
                   int ldv, A* y, int ldy, float* lse, DeviceMask mask, float rate, float keep_scale,
                   const std::uint64_t* key) {
  launch_tiles<bf16_tiled_forward_kernel<HD, A>>("bf16 tiled attention forward", Tiles<HD>::bytes,
                                              long(a.B) * a.H * ((a.Tq + kRows - 1) / kRows), a, scale, q, ldq, k,
                                              ldk, v, ldv, y, ldy, lse, mask, rate, keep_scale, key);
}

template <int HD, class A>
void backward_tiles(const KernelDims& a, float scale, const A* dy, int ldy, const A* y, int ldo,
                    const A* q, int ldq, const A* k, int ldk, const A* v, int ldv, const float* lse,
                    float* dsum, A* dq, A* dk, A* dv, DeviceMask mask, float rate, float keep_scale,
                    const std::uint64_t* key) {
  const long query_tiles = long(a.B) * a.H * ((a.Tq + kRows - 1) / kRows);
  const long key_tiles = long(a.B) * a.KV_H * ((a.Tk + kKeys - 1) / kKeys);
  launch_tiles<bf16_tiled_backward_q_kernel<HD, A>>("bf16 tiled attention backward (queries)",
                                                 BackwardQTiles<HD>::bytes, query_tiles, a, scale, dy, ldy, y, ldo, q,
                                                 ldq, k, ldk, v, ldv, lse, dsum, dq, mask, rate, keep_scale, key);
  launch_tiles<bf16_tiled_backward_kv_kernel<HD, A>>("bf16 tiled attention backward (keys)", BackwardKvTiles<HD>::bytes,
                                                  key_tiles, a, scale, dy, ldy, q, ldq, k, ldk, v, ldv, lse,
                                                  static_cast<const float*>(dsum), dk, dv, mask, rate, keep_scale,
                                                  key);
}

}  // namespace

template <class A>
void bf16_tiled_attention_forward(const KernelDims& a, float scale, const A* q, int ldq, const A* k, int ldk,
                                  const A* v, int ldv, A* y, int ldy, float* lse, DeviceMask mask, float rate,
                                  float keep_scale, const std::uint64_t* key) {
  if (a.QK_DIM == 64)
    forward_tiles<64>(a, scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask, rate, keep_scale, key);
  else
    forward_tiles<128>(a, scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask, rate, keep_scale, key);
}

template <class A>
void bf16_tiled_attention_backward(const KernelDims& a, float scale, const A* dy, int ldy, const A* y, int ldo,
                                   const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
                                   const float* lse, float* dsum, A* dq, A* dk, A* dv, DeviceMask mask,
                                   float rate, float keep_scale, const std::uint64_t* key) {
  if (a.QK_DIM == 64)
    backward_tiles<64>(a, scale, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, dsum, dq, dk, dv, mask, rate,
                       keep_scale, key);
  else
    backward_tiles<128>(a, scale, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, dsum, dq, dk, dv, mask, rate,
                        keep_scale, key);
}

#define XFMR_INSTANTIATE(A)                                                                                     \
  template void bf16_tiled_attention_forward(const KernelDims&, float, const A*, int, const A*, int, const A*, int, \
                                             A*, int, float*, DeviceMask, float, float, const std::uint64_t*);     \
  template void bf16_tiled_attention_backward(const KernelDims&, float, const A*, int, const A*, int, const A*,    \
                                              int, const A*, int, const A*, int, const float*, float*, A*, A*, A*, \
                                              DeviceMask, float, float, const std::uint64_t*);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr::cuda::detail
