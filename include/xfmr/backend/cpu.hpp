// cpu.hpp: CpuBackend<Scalar>, the backend operations (see backend.hpp) on the
// host with Eigen maps and OpenMP. Header-only; float for training, double for
// gradient checks.
//
// Threading is one level only. Every operation splits its rows, columns or
// (batch, head) pairs over the OpenMP threads with detail::parallel_ranges,
// serial code inside; GEMMs do the same with one libxsmm kernel or
// single-threaded BLAS call per thread, larger ones use OpenBLAS's (or
// Eigen's) own OpenMP parallelism (cpu_gemm.hpp says which shape goes where).
// Below a small amount of work an operation runs inline, without entering
// the OpenMP runtime at all: a fork costs more than it saves. Reductions
// across rows run in a fixed order (split over columns, never over the rows
// being summed), so results are bitwise reproducible for a given thread
// count. The thresholds and the threading helper are in cpu_parallel.hpp,
// the per-row attention kernels in cpu_rows.hpp.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cpu_attention.hpp"
#include "xfmr/backend/cpu_flash_attention.hpp"
#include "xfmr/backend/cpu_bf16.hpp"
#include "xfmr/backend/cpu_gemm.hpp"
#include "xfmr/backend/cpu_parallel.hpp"
#include "xfmr/backend/cpu_rows.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr {

struct CpuOptions {
  // bf16 mixed precision (float only): every matrix product rounds its
  // operands to bfloat16 and sums in float32 (bf16.hpp; needs
  // bf16::available()), attention's score and context products included
  // (cpu_attention.hpp; its row-by-row kernels for a few query rows, as in
  // decoding, stay float32); the weights, the activations between products
  // and every other operation stay float32.
  bool bf16 = false;
};

template <class S>
class CpuBackend {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double>,
                "CpuBackend supports float (training) and double (gradient checks)");

  using MatR = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Strided = Eigen::OuterStride<>;
  using Map = Eigen::Map<MatR, 0, Strided>;
  using CMap = Eigen::Map<const MatR, 0, Strided>;
  using Vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  using Arr = Eigen::Array<S, Eigen::Dynamic, 1>;

 public:
  using Scalar = S;
  using Tensor = xfmr::Tensor<S>;  // parameters and gradients
  template <class T>
  using Buffer = xfmr::Buffer<T>;   // activations and saved state
  static constexpr const char* name = "cpu";

  CpuBackend(CpuOptions opts = {}) : opts_(opts) {
    require(!opts.bf16 || std::is_same_v<S, float>, "bf16 precision runs on the float CPU backend");
    require(!opts.bf16 || bf16::available(), "bf16 precision: ", bf16::unavailable_reason());
  }
  const CpuOptions& options() const { return opts_; }

  // The threads a batch split by sequences can use (DataParallel), and
  // f(i) for every i in [0, n), one a thread where there are threads
  // enough, each i on one thread; operations inside f see an active
  // parallel region and stay on their thread (one level of parallelism).
  int threads() const { return detail::thread_count(); }
  template <class F>
  void for_each_thread(int n, F&& f) {
#ifdef _OPENMP
    if (n > 1 && detail::may_fork()) {
#pragma omp parallel num_threads(n)
      {
        const int t = omp_get_thread_num(), k = omp_get_num_threads();
        for (int i = t; i < n; i += k) f(i);
      }
      return;
    }
#endif
    for (int i = 0; i < n; ++i) f(i);
  }

  // Results for host code (sampling, accuracy): already host memory here.
  std::span<const S> host_view(std::span<const S> x, std::vector<S>&) { return x; }
  // Waits for queued work (a device's); the CPU's is done on return.
  void synchronize() {}

  // ---- dense algebra ------------------------------------------------------

  // Row-major C = alpha op(A) op(B) + beta C (cpu_gemm.hpp; cpu_bf16.hpp in bf16
  // precision).
  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const S* A, int lda, const S* B, int ldb,
            S beta, S* C, int ldc) {
    if constexpr (std::is_same_v<S, float>) {
      if (opts_.bf16) return bf16_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
    detail::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  // ---- bf16 weight copies (decoding; bf16 precision only: cpu_bf16.hpp) ---
  // keep_bf16_copy(w, rows, cols): products whose B is w read its bfloat16
  // copy until drop_bf16_copies(); w must not change meanwhile (use
  // Bf16WeightCopies, infer/bf16_weights.hpp). Without bf16 precision both
  // do nothing.
  void keep_bf16_copy(const S* w, int rows, int cols) {
    if constexpr (std::is_same_v<S, float>) {
      if (opts_.bf16) bf16_.keep_copy(w, rows, cols);
    } else {
      (void)w, (void)rows, (void)cols;
    }
  }
  void drop_bf16_copies() { bf16_.drop_copies(); }
  std::size_t bf16_copy_bytes() const { return bf16_.copy_bytes(); }

  void bias_add(int rows, int n, const S* bias, S* y) {
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (long r = lo; r < hi; ++r) {
        S* yr = y + r * n;
        for (int c = 0; c < n; ++c) yr[c] += bias[c];
      }
    });
  }
  // Split over columns, each summed over the rows in order: the same result
  // on any thread count.
  void bias_grad(int rows, int n, const S* dy, S* dbias) {
    detail::parallel_ranges(long(n), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = 0; r < rows; ++r) {
        const S* g = dy + long(r) * n;
        for (long c = lo; c < hi; ++c) dbias[c] += g[c];
      }
    });
  }

  void add(std::size_t n, const S* a, const S* b, S* y) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) y[i] = a[i] + b[i];
    });
  }
  void add_to(std::size_t n, const S* x, S* y) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) y[i] += x[i];
    });
  }
  void copy(std::size_t n, const S* x, S* y) {
    if (x != y) std::copy(x, x + n, y);
  }

  void add_positions_forward(int B, int T, int D, const S* x, const S* table, S* y) {
    detail::parallel_ranges(long(B) * T, long(B) * T * D > detail::kParallelWork, [=](long lo, long hi) {
      for (long i_ = lo; i_ < hi; ++i_) {
        const int b = int(i_ / T), t = int(i_ % T);
        const long off = (long(b) * T + t) * D;
        for (int d = 0; d < D; ++d) y[off + d] = x[off + d] + table[long(t) * D + d];
      }
    });
  }
  void add_positions_backward(int B, int T, int D, const S* dy, S* dtable) {
    // Parallel over t: each thread owns its table rows; the sum over b is serial.
    detail::parallel_ranges(long(T), long(B) * T * D > detail::kParallelWork, [=](long lo, long hi) {
      for (int t = int(lo); t < int(hi); ++t)
        for (int b = 0; b < B; ++b) {
          const S* g = dy + (long(b) * T + t) * D;
          for (int d = 0; d < D; ++d) dtable[long(t) * D + d] += g[d];
        }
    });
  }

  void rope_forward(int B, int T, int offset, int H, int hd, const S* table, S* x, int ld) {
    detail::rotate_pairs(B, T, offset, H, hd, table, x, ld, S(1));
  }
  void rope_backward(int B, int T, int offset, int H, int hd, const S* table, S* dx, int ld) {
    detail::rotate_pairs(B, T, offset, H, hd, table, dx, ld, S(-1));
  }

  // ---- layer norm ---------------------------------------------------------

  void layer_norm_forward(int rows, int n, const S* x, const S* gamma, const S* beta, S eps, S* y,
                          S* mean, S* rstd) {
    const Eigen::Map<const Vec> g(gamma, n), bt(beta, n);
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r) {
        const Eigen::Map<const Vec> xr(x + long(r) * n, n);
        const S m = xr.mean();
        const S var = (xr.array() - m).square().mean();
        const S rs = S(1) / std::sqrt(var + eps);
        Eigen::Map<Vec>(y + long(r) * n, n) = ((xr.array() - m) * rs * g.array() + bt.array()).matrix();
        mean[r] = m;
        rstd[r] = rs;
      }
    });
  }

  // dgamma/dbeta are reduced first, so dx may alias dy.
  void layer_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* mean,
                           const S* rstd, S* dx, S* dgamma, S* dbeta) {
    // Split over columns, rows added in order: the same sums on any thread count.
    detail::parallel_ranges(long(n), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      const long w = hi - lo;
      Eigen::Map<Vec> dg(dgamma + lo, w), db(dbeta + lo, w);
      for (int r = 0; r < rows; ++r) {
        const Eigen::Map<const Vec> dyr(dy + long(r) * n + lo, w);
        dg.array() += dyr.array() * (Eigen::Map<const Vec>(x + long(r) * n + lo, w).array() - mean[r]) * rstd[r];
        db += dyr;
      }
    }, 16);
    const Eigen::Map<const Vec> g(gamma, n);
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r) {
        const auto xhat = (Eigen::Map<const Vec>(x + long(r) * n, n).array() - mean[r]) * rstd[r];
        const auto dxhat = Eigen::Map<const Vec>(dy + long(r) * n, n).array() * g.array();
        const S mean_dxhat = dxhat.mean();
        const S mean_dxhat_xhat = (dxhat * xhat).mean();
        Eigen::Map<Vec>(dx + long(r) * n, n) = ((dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd[r]).matrix();
      }
    });
  }

  void rms_norm_forward(int rows, int n, const S* x, const S* gamma, S eps, S* y, S* rstd) {
    const Eigen::Map<const Vec> g(gamma, n);
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r) {
        const Eigen::Map<const Vec> xr(x + long(r) * n, n);
        const S rs = S(1) / std::sqrt(xr.array().square().mean() + eps);
        Eigen::Map<Vec>(y + long(r) * n, n) = (xr.array() * rs * g.array()).matrix();
        rstd[r] = rs;
      }
    });
  }

  // dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dy gamma, xhat = x
  // rstd; dgamma is reduced first (over columns, rows in order), so dx may
  // alias dy.
  void rms_norm_backward(int rows, int n, const S* dy, const S* x, const S* gamma, const S* rstd, S* dx, S* dgamma) {
    detail::parallel_ranges(long(n), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      const long w = hi - lo;
      Eigen::Map<Vec> dg(dgamma + lo, w);
      for (int r = 0; r < rows; ++r)
        dg.array() += Eigen::Map<const Vec>(dy + long(r) * n + lo, w).array() *
                      Eigen::Map<const Vec>(x + long(r) * n + lo, w).array() * rstd[r];
    }, 16);
    const Eigen::Map<const Vec> g(gamma, n);
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r) {
        const auto xhat = Eigen::Map<const Vec>(x + long(r) * n, n).array() * rstd[r];
        const auto dxhat = Eigen::Map<const Vec>(dy + long(r) * n, n).array() * g.array();
        const S mean_dxhat_xhat = (dxhat * xhat).mean();
        Eigen::Map<Vec>(dx + long(r) * n, n) = ((dxhat - xhat * mean_dxhat_xhat) * rstd[r]).matrix();
      }
    });
  }

  // ---- softmax ------------------------------------------------------------

  void softmax_forward(int B, int H, int Tq, int Tk, const S* scores, S* probs, const AttentionMask& mask) {
    detail::parallel_ranges(long(B) * H, long(B) * H * Tq * Tk > detail::kParallelWork, [=](long lo, long hi) {
      for (long i_ = lo; i_ < hi; ++i_) {
        const int b = int(i_ / H), h = int(i_ % H);
        const long off = (long(b) * H + h) * Tq * Tk;
        for (int i = 0; i < Tq; ++i)
          detail::masked_softmax_row<S>(b, i, Tq, Tk, scores + off + long(i) * Tk, probs + off + long(i) * Tk, mask);
      }
    });
  }

  void softmax_backward(int rows, int n, const S* probs, const S* dprobs, S* dscores) {
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r)
        detail::softmax_backward_row<S>(n, probs + long(r) * n, dprobs + long(r) * n, dscores + long(r) * n);
    });
  }

  // ---- activations --------------------------------------------------------

  void relu_forward(std::size_t n, const S* x, S* y) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) y[i] = x[i] > S(0) ? x[i] : S(0);
    });
  }
  void relu_backward(std::size_t n, const S* x, const S* dy, S* dx) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) dx[i] = x[i] > S(0) ? dy[i] : S(0);
    });
  }

  // GELU, tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi).
  // Through Eigen arrays: float's tanh vectorises there (a rational
  // approximation, within a few ulp of std::tanh), where std::tanh in a
  // loop is a scalar call per element (a tenth of GPT-2's training step).
  void gelu_forward(std::size_t n, const S* x, S* y) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork / 8, [=](long lo, long hi) {
      const Eigen::Map<const Arr> v(x + lo, hi - lo);
      Eigen::Map<Arr>(y + lo, hi - lo) = S(0.5) * v * (S(1) + (kGeluC * (v + S(0.044715) * v.cube())).tanh());
    });
  }
  void gelu_backward(std::size_t n, const S* x, const S* dy, S* dx) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork / 8, [=](long lo, long hi) {
      constexpr long kChunk = 256;  // tanh's values on the stack, not the heap
      Eigen::Array<S, kChunk, 1> tanhs, exps;
      for (long c = lo; c < hi; c += kChunk) {
        const long m = std::min(kChunk, hi - c);
        const Eigen::Map<const Arr> v(x + c, m), g(dy + c, m);
        auto t = tanhs.head(m);
        auto e = exps.head(m);
        e = kGeluC * (v + S(0.044715) * v.cube());  // u
        t = e.tanh();
        // 1 - tanh(u)^2 as 4 e / (1 + e)^2 with e = exp(-2|u|): the vectorised
        // tanh rounds to +-1 from |u| ~ 8, where 1 - t^2 would lose the tail.
        e = (S(-2) * e.abs()).exp();
        Eigen::Map<Arr>(dx + c, m) =
            g * (S(0.5) * (S(1) + t) +
                 S(0.5) * v * (S(4) * e / (S(1) + e).square()) * (kGeluC * (S(1) + S(3 * 0.044715) * v.square())));
      }
    });
  }

  // SwiGLU over rows of [gate | up]: silu(g) u with silu(g) = g sigmoid(g);
  // backward: dg = dy u s (1 + g (1 - s)), du = dy silu(g), s = sigmoid(g).
  void swiglu_forward(int rows, int n, const S* h, S* y) {
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork / 8, [=](long lo, long hi) {
      for (long r = lo; r < hi; ++r) {
        const Eigen::Map<const Arr> g(h + r * 2 * n, n), u(h + r * 2 * n + n, n);
        Eigen::Map<Arr>(y + r * n, n) = g / (S(1) + (-g).exp()) * u;
      }
    });
  }
  void swiglu_backward(int rows, int n, const S* h, const S* dy, S* dh) {
    detail::parallel_ranges(long(rows), long(rows) * n > detail::kParallelWork / 8, [=](long lo, long hi) {
      for (long r = lo; r < hi; ++r) {
        const Eigen::Map<const Arr> g(h + r * 2 * n, n), u(h + r * 2 * n + n, n), d(dy + r * n, n);
        Eigen::Map<Arr> dg(dh + r * 2 * n, n), du(dh + r * 2 * n + n, n);
        du = S(1) / (S(1) + (-g).exp());  // s, for now
        dg = d * u * du * (S(1) + g * (S(1) - du));
        du = d * g * du;
      }
    });
  }

  // ---- dropout ------------------------------------------------------------

  // Inverted dropout: kept elements are scaled by 1/(1-p). The mask depends
  // only on (key, element index).
  void dropout_forward(std::size_t n, float p, std::uint64_t key, const S* x, S* y, std::uint8_t* keep) {
    detail::check_dropout_rate(p);
    const S scale = S(1) / (S(1) - S(p));
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) {
        keep[i] = dropout_keeps(key, static_cast<std::uint64_t>(i), p) ? 1 : 0;
        y[i] = keep[i] ? x[i] * scale : S(0);
      }
    });
  }
  void dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const S* dy, S* dx) {
    const S scale = S(1) / (S(1) - S(p));
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) dx[i] = keep[i] ? dy[i] * scale : S(0);
    });
  }

  // ---- embeddings ---------------------------------------------------------

  void embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, S* y) {
    detail::check_token_ids(n, V, ids);
    detail::parallel_ranges(long(n), long(n) * D > detail::kParallelWork, [=](long lo, long hi) {
      for (int i = int(lo); i < int(hi); ++i) std::copy_n(table + long(ids[i]) * D, D, y + long(i) * D);
    });
  }
  // Serial: rows sharing an id add into the same table row, in input order.
  void embedding_backward(int n, int D, const std::int32_t* ids, const S* dy, S* dtable) {
    for (int i = 0; i < n; ++i) {
      S* row = dtable + long(ids[i]) * D;
      const S* g = dy + long(i) * D;
      for (int d = 0; d < D; ++d) row[d] += g[d];
    }
  }

  // ---- pooling ----------------------------------------------------------

  // y[b,:] = mean of x[b,t,:] over positions t with exclude[b,t] == 0 (all
  // positions when exclude is null); a sequence with none gives zeros.
  void mean_pool_forward(int B, int T, int D, const S* x, const std::uint8_t* exclude, S* y) {
    detail::parallel_ranges(long(B), long(B) * T * D > detail::kParallelWork, [=](long lo, long hi) {
      for (int b = int(lo); b < int(hi); ++b) {
        Eigen::Map<Vec> yb(y + long(b) * D, D);
        yb.setZero();
        int n = 0;
        for (int t = 0; t < T; ++t)
          if (!exclude || !exclude[long(b) * T + t]) {
            yb += Eigen::Map<const Vec>(x + (long(b) * T + t) * D, D);
            ++n;
          }
        if (n) yb /= S(n);
      }
    });
  }
  // dx assigned: dy[b,:] / count at counted positions, 0 elsewhere.
  void mean_pool_backward(int B, int T, int D, const S* dy, const std::uint8_t* exclude, S* dx) {
    detail::parallel_ranges(long(B), long(B) * T * D > detail::kParallelWork, [=](long lo, long hi) {
      for (int b = int(lo); b < int(hi); ++b) {
        int n = 0;
        for (int t = 0; t < T; ++t) n += !exclude || !exclude[long(b) * T + t];
        for (int t = 0; t < T; ++t) {
          Eigen::Map<Vec> dxt(dx + (long(b) * T + t) * D, D);
          if (!exclude || !exclude[long(b) * T + t])
            dxt = Eigen::Map<const Vec>(dy + long(b) * D, D) / S(n);
          else
            dxt.setZero();
        }
      }
    });
  }

  // ---- loss ---------------------------------------------------------------

  // Softmax cross-entropy against the target distribution
  // (1 - smoothing) * onehot(target) + smoothing / V (torch's label_smoothing),
  // averaged over rows whose target != ignore_index (0 when every row is
  // ignored). Saves probs (rows, V) for the backward pass.
  double cross_entropy_forward(int rows, int V, const S* logits, const std::int32_t* targets, int ignore_index,
                               S* probs, S smoothing = S(0)) {
    detail::check_targets(rows, V, targets, ignore_index);
    detail::check_label_smoothing(smoothing);
    row_loss_.resize(static_cast<std::size_t>(rows));
    double* row_loss = row_loss_.data();
    detail::parallel_ranges(long(rows), long(rows) * V > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r) {
        const Eigen::Map<const Vec> z(logits + long(r) * V, V);
        Eigen::Map<Vec> p(probs + long(r) * V, V);
        const S zmax = z.maxCoeff();
        p = (z.array() - zmax).exp().matrix();
        const S sum = p.sum();
        p /= sum;
        const int t = targets[r];
        if (t == ignore_index) {
          row_loss[r] = 0.0;
          continue;
        }
        const double lse = double(std::log(sum)) + double(zmax);
        row_loss[r] = lse - (1.0 - double(smoothing)) * double(z[t]) - double(smoothing) * double(z.mean());
      }
    });
    double total = 0.0;
    int counted = 0;
    for (int r = 0; r < rows; ++r) {
      total += row_loss_[r];
      counted += targets[r] != ignore_index;
    }
    return counted ? total / counted : 0.0;
  }

  // dlogits assigned: dloss * (probs - target distribution) / counted rows.
  void cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets, int ignore_index,
                              S dloss, S* dlogits, S smoothing = S(0)) {
    int counted = 0;
    for (int r = 0; r < rows; ++r) counted += targets[r] != ignore_index;
    const S scale = counted ? dloss / S(counted) : S(0);
    detail::parallel_ranges(long(rows), long(rows) * V > detail::kParallelWork, [=](long lo, long hi) {
      for (int r = int(lo); r < int(hi); ++r) {
        Eigen::Map<Vec> d(dlogits + long(r) * V, V);
        if (targets[r] == ignore_index) {
          d.setZero();
          continue;
        }
        d = (Eigen::Map<const Vec>(probs + long(r) * V, V).array() - smoothing / S(V)).matrix() * scale;
        d[targets[r]] -= (S(1) - smoothing) * scale;
      }
    });
  }

  // ---- optimisation -----------------------------------------------------

  // Sum of squares, accumulated in double in a fixed order: eight running
  // sums (element i into sum i % 8, which vectorise), then added pairwise.
  // (One running sum waits on each addition's latency: the gradient norm
  // took 4% of shakespeare-small's training step that way, under 1% now.)
  double sum_squares(std::size_t n, const S* x) {
    double acc[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
    for (int j = 0; i < n; ++i, ++j) acc[j] += double(x[i]) * double(x[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  void scale(std::size_t n, S alpha, S* x) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) x[i] *= alpha;
    });
  }

  // One AdamW update (Loshchilov & Hutter; torch.optim.AdamW):
  //   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps),  bc = 1 - beta^step.
  // All tensors in one parallel region: the ranges cut the tensors laid end
  // to end (a value's update reads only its own p, g, m and v).
  void adamw_step(std::span<const AdamWTensor<S>> tensors, S lr, S beta1, S beta2, S eps, S bias_correction1,
                  S bias_correction2) {
    const S step_size = lr / bias_correction1, rbc2 = S(1) / std::sqrt(bias_correction2);
    long total = 0;
    for (const auto& t : tensors) total += static_cast<long>(t.n);
    detail::parallel_ranges(total, total > detail::kParallelWork, [=](long lo, long hi) {
      long start = 0;  // of tensor t in the concatenation
      for (const auto& t : tensors) {
        const long end = start + static_cast<long>(t.n), first = std::max(lo, start), last = std::min(hi, end);
        if (first < last) {
          // Eigen arrays: the square root vectorises whatever -fmath-errno
          // says (std::sqrt in a plain loop stays scalar under GCC's default).
          const long off = first - start, len = last - first;
          Eigen::Map<Arr> pa(t.p + off, len), ma(t.m + off, len), va(t.v + off, len);
          const Eigen::Map<const Arr> ga(t.g + off, len);
          pa -= (lr * t.weight_decay) * pa;
          ma = beta1 * ma + (S(1) - beta1) * ga;
          va = beta2 * va + (S(1) - beta2) * ga * ga;
          pa -= step_size * ma / (va.sqrt() * rbc2 + eps);
        }
        if (end >= hi) break;
        start = end;
      }
    });
  }

  // SGD with momentum (torch.optim.SGD): g' = g + wd p; buf = mu buf + g'; p -= lr buf.
  void sgd_step(std::size_t n, S* p, const S* g, S* buf, S lr, S momentum, S weight_decay) {
    const long ln = static_cast<long>(n);
    detail::parallel_ranges(ln, ln > detail::kParallelWork, [=](long lo, long hi) {
      for (long i = lo; i < hi; ++i) {
        const S d = g[i] + weight_decay * p[i];
        buf[i] = momentum * buf[i] + d;
        p[i] -= lr * buf[i];
      }
    });
  }

  // ---- attention (cpu_attention.hpp) --------------------------------------

  void attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv,
                         S* y, int ldy, S* probs, const AttentionMask& mask) {
    detail::attention_forward(a, q, ldq, k, ldk, v, ldv, y, ldy, probs, mask,
                              attention_tiles(detail::attention_forward_tiles(a)), opts_.bf16);
  }
  void attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* q, int ldq, const S* k, int ldk,
                          const S* v, int ldv, const S* probs, S* dq, S* dk, S* dv) {
    detail::attention_backward(a, dy, ldy, q, ldq, k, ldk, v, ldv, probs, dq, dk, dv,
                               attention_tiles(detail::attention_backward_tiles(a)), opts_.bf16);
  }

  // ---- tiled attention (cpu_flash_attention.hpp) ---------------------------
  // A training forward is tiled wherever the materialised one would take
  // whole-head GEMMs (more than kRowAttentionRows query rows, or dropout):
  // as fast there (BENCHMARKS.md) in memory linear in T; the row-by-row
  // kernels of short sequences and decoding stay.
  bool tiled_attention(const AttentionDims& a) const {
    return a.Tq > detail::kRowAttentionRows || a.dropout > 0.0f;
  }

  void flash_attention_forward(const AttentionDims& a, const S* q, int ldq, const S* k, int ldk, const S* v, int ldv,
                               S* y, int ldy, S* lse, const AttentionMask& mask) {
    detail::flash_attention_forward(a, q, ldq, k, ldk, v, ldv, y, ldy, lse, mask,
                                    attention_tiles(detail::flash_forward_tiles(opts_.bf16)), opts_.bf16);
  }
  void flash_attention_backward(const AttentionDims& a, const S* dy, int ldy, const S* y, int ldo, const S* q, int ldq,
                                const S* k, int ldk, const S* v, int ldv, const S* lse, const AttentionMask& mask,
                                S* dq, S* dk, S* dv) {
    detail::flash_attention_backward(a, dy, ldy, y, ldo, q, ldq, k, ldk, v, ldv, lse, mask, dq, dk, dv,
                                     attention_tiles(detail::flash_backward_tiles(opts_.bf16)), opts_.bf16);
  }

 private:
  static constexpr S kGeluC = S(0.7978845608028654);  // sqrt(2 / pi)

  // per_thread elements for each thread of a parallel region (attention's
  // tiles; none: nullptr). Grows only, so steps of one shape allocate nothing.
  S* attention_tiles(long per_thread) {
    if (per_thread == 0) return nullptr;
    const auto n = static_cast<std::size_t>(detail::thread_count() * per_thread);
    if (scratch_.size() < n) scratch_.resize(n);
    return scratch_.data();
  }

  CpuOptions opts_;
  detail::Bf16Products bf16_;  // products in bf16 precision, and the weight copies they read
  AlignedVector<S> scratch_;    // per-thread tiles for attention (attention_tiles); grows only
  std::vector<double> row_loss_;  // per-row cross-entropy before the ordered sum; grows only
};

static_assert(Backend<CpuBackend<float>>);
static_assert(Backend<CpuBackend<double>>);

}  // namespace xfmr
