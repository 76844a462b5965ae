// parallel.hpp: how CpuBackend spends its threads: the work thresholds
// below which an operation stays on one thread, and detail::parallel_ranges,
// the one helper every operation splits its rows, columns or (batch, head)
// pairs with.
#pragma once

#include <algorithm>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace xfmr {

namespace detail {
// Below this many scalar operations a loop runs on one thread.
inline constexpr long kParallelWork = 1L << 12;
// Below this many elements a light pass (an add, a bias, a norm's or an
// embedding's rows, an activation row's quantisation: a few operations an
// element, bound by memory) runs on one thread: a fork and join costs more
// than one thread's pass over 32K floats (128 KiB, in cache). The rows of a
// step of continuous batching (a few hundred to a few thousand elements a
// row) stay on one thread, where each such pass had forked.
inline constexpr long kLightParallelWork = 1L << 15;
// From this many multiply-adds a GEMM goes to BLAS (when built with it).
inline constexpr long kBlasWork = 1L << 16;
inline constexpr int kBlasMinSide = 8;
// Below this many multiply-adds each thread runs BLAS on its own block of C;
// the blocks are multiples of kBlasSplitGrain rows or columns.
inline constexpr long kBlasSplitWork = 1L << 24;
inline constexpr long kBlasSplitGrain = 16;
// With libxsmm, a product whose (K, N) operand takes up to this many bytes
// goes to its kernels, one block of rows or columns per thread, whatever its
// size: they keep that operand in cache across the block's rows without
// packing. Larger operands go to BLAS, which blocks them.
inline constexpr long kSmallGemmPanelBytes = 256L << 10;
// A product with B^T goes to libxsmm from this many rows: its (K, N) operand
// is first transposed on one thread, at about 0.3 ns an element, against
// about 0.01 ns a multiply-add for the product on two cores, so at 256 rows
// the transposition costs a tenth of the product. With fewer rows (a
// recomputed decoding context) OpenBLAS's per-thread packing is cheaper.
inline constexpr int kSmallGemmTransposeRows = 256;
// From this many weights a single-row product goes to BLAS's threaded GEMV;
// y = W x, a decoding step's projection, splits W's rows over the threads
// from kGemvSplitWork weights (512 KiB of floats). Below that the fork and
// join cost about what the second core saves: shakespeare-mid's 2^16-weight
// feed-forward products decoded 5-15% slower split on this VM's far-apart
// cores; shakespeare-large's (from 2^18 weights) 1.7x faster.
inline constexpr long kGemvThreadedWork = 1L << 16;
inline constexpr long kGemvSplitWork = 1L << 17;
// Attention forward forks from this many multiply-adds: cheaper per unit
// than the elements of the other operations (a decoding step's heads stay on
// one thread).
inline constexpr long kAttentionParallelWork = 1L << 15;

inline int thread_count() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
// Runs f(begin, end) over [0, n): split into one contiguous range per
// OpenMP thread (as schedule(static)), with every boundary a multiple of
// `grain`, when `parallel`; else as one call on this thread without entering
// the OpenMP runtime, whose fork costs microseconds: more than a decoding
// step's small operations themselves. f should capture by value ([=]).
template <class F>
void parallel_ranges(long n, bool parallel, F&& f, long grain = 1) {
#ifdef _OPENMP
  if (parallel && n > grain && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      const long t = omp_get_thread_num(), k = omp_get_num_threads(), grains = (n + grain - 1) / grain;
      const long lo = std::min(n, grains * t / k * grain), hi = std::min(n, grains * (t + 1) / k * grain);
      // A private copy of a by-value closure keeps its pointers in
      // registers: through the shared one every access reloads them and the
      // loop does not vectorise.
      std::decay_t<F> local(f);
      if (lo < hi) local(lo, hi);
    }
    return;
  }
#endif
  // The same private copy on one thread: called through the caller's
  // closure, a store through one of its pointers may change the others, so
  // an elementwise loop neither vectorises nor keeps its pointers in
  // registers.
  if (n > 0) {
    std::decay_t<F> local(f);
    local(0L, n);
  }
}

// Whether this thread may hand work to another: more than one thread
// allowed, and not already inside a parallel region.
inline bool may_fork() {
#ifdef _OPENMP
  return omp_get_max_threads() > 1 && !omp_in_parallel();
#else
  return false;
#endif
}

inline int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
}  // namespace detail

// The OpenMP threads the CPU backend splits its work over (OMP_NUM_THREADS).
inline int cpu_threads() { return detail::thread_count(); }

}  // namespace xfmr
