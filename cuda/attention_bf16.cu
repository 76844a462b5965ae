// attention_bf16.cu: the tiled attention's forward on the tensor cores, for
// bf16 products (CudaOptions::bf16 with flash_attention; attention.cu's
// flash_attention_forward launches it where bf16_tiles_fit). The same
// function as flash_rows_forward_kernel (the online softmax over key
// tiles, the log-sum-exp saved, the same masks and dropout elements), with
// Q K^T and P V as bf16 products summed in float32 (wmma, 16 x 16 x 16):
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
// 64 x HD each): 89 KB for heads of 64, 147 KB for 128.
// Error: bf16 operands (Q, K, V and P), float32 sums: backend/bf16.hpp's
// bound on each product.
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

// One warp's C (16 x 16 N, float, row-major at c) = A (16 x 16 K, bf16,
// row-major at a) B (16 K x 16 N, bf16 at b: row-major, or column-major for
// a transposed operand), on the tensor cores, C through shared memory.
template <int N, int K, class BLayout>
__device__ inline void warp_product(const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, int ldb, float* c,
                                    int ldc) {
  constexpr bool b_rows = std::is_same_v<BLayout, wmma::row_major>;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < K; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> af;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> bf;
      wmma::load_matrix_sync(af, a + kk * 16, lda);
      wmma::load_matrix_sync(bf, b_rows ? b + kk * 16 * ldb + n * 16 : b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc, af, bf, acc);
    }
    wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads) bf16_tiled_forward_kernel(KernelDims a, float scale, const float* q,
                                                                      int ldq, const float* k, int ldk,
                                                                      const float* v, int ldv, float* y, int ldy,
                                                                      float* lse, DeviceMask mask, float rate,
                                                                      float keep_scale, const std::uint64_t* key_in) {
  using L = Tiles<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  auto* Qs = reinterpret_cast<__nv_bfloat16*>(smem + L::q);
  auto* Ks = reinterpret_cast<__nv_bfloat16*>(smem + L::k);
  auto* Vs = reinterpret_cast<__nv_bfloat16*>(smem + L::v);
  auto* Ps = reinterpret_cast<__nv_bfloat16*>(smem + L::p);
  auto* Ss = reinterpret_cast<float*>(smem + L::s);
  auto* Os = reinterpret_cast<float*>(smem + L::o);
  auto* Ts = reinterpret_cast<float*>(smem + L::t);

  const int tiles = (a.Tq + kRows - 1) / kRows;
  const int bh = int(blockIdx.x / tiles), b = bh / a.H, h = bh % a.H, g = a.kv_head(h);
  const int i0 = int(blockIdx.x % tiles) * kRows, warp = threadIdx.x / 32;
  const std::uint64_t key = rate > 0.0f ? *key_in : 0;
  const float* qb = q + long(b) * a.Tq * ldq + long(h) * HD;
  const float* kb = k + long(b) * a.KV_ROWS * ldk + long(g) * HD;
  const float* vb = v + long(b) * a.KV_ROWS * ldv + long(g) * HD;

  for (int e = threadIdx.x; e < kRows * HD; e += kThreads) {
    const int r = e / HD, c = e % HD;
    Qs[r * L::LDH + c] = __float2bfloat16(i0 + r < a.Tq ? qb[long(i0 + r) * ldq + c] : 0.0f);
    Os[r * L::LDO + c] = 0.0f;
  }

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
    for (int e = threadIdx.x; e < kKeys * HD; e += kThreads) {
      const int jr = e / HD, c = e % HD;
      const bool in = j0 + jr < a.Tk;
      Ks[jr * L::LDH + c] = __float2bfloat16(in ? kb[long(j0 + jr) * ldk + c] : 0.0f);
      Vs[jr * L::LDH + c] = __float2bfloat16(in ? vb[long(j0 + jr) * ldv + c] : 0.0f);
    }
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
  float* yi = y + (long(b) * a.Tq + i) * ldy + long(h) * HD + half * (HD / 2);
  for (int c = 0; c < HD / 2; ++c) yi[c] = orow[c] * inv;
  if (half == 0) lse[r] = l > 0.0f ? m + logf(l) : -INFINITY;
}

template <int HD>
void launch_tiles(const KernelDims& a, float scale, const float* q, int ldq, const float* k, int ldk, const float* v,
                  int ldv, float* y, int ldy, float* lse, DeviceMask mask, float rate, float keep_scale,
                  const std::uint64_t* key) {
  static const bool raised = [] {  // past 48 KiB of shared memory, once per kernel
    check(cudaFuncSetAttribute(bf16_tiled_forward_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(Tiles<HD>::bytes)),
          "bf16 tiled attention (cudaFuncSetAttribute)");
    return true;
  }();
  (void)raised;
  const long blocks = long(a.B) * a.H * ((a.Tq + kRows - 1) / kRows);
  launch("bf16 tiled attention forward", dim3(unsigned(blocks)), dim3(kThreads), Tiles<HD>::bytes,
         bf16_tiled_forward_kernel<HD>, a, scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask, rate, keep_scale, key);
}

}  // namespace

void bf16_tiled_attention_forward(const KernelDims& a, float scale, const float* q, int ldq, const float* k, int ldk,
                                  const float* v, int ldv, float* y, int ldy, float* lse, DeviceMask mask, float rate,
                                  float keep_scale, const std::uint64_t* key) {
  if (a.QK_DIM == 64)
    launch_tiles<64>(a, scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask, rate, keep_scale, key);
  else
    launch_tiles<128>(a, scale, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask, rate, keep_scale, key);
}

}  // namespace xfmr::cuda::detail
