// cpu.hpp: CpuBackend<Scalar>, the backend operations on the host with Eigen
// and OpenMP: float for training, double for gradient checks.
//
// Its operations come in families, one a file in backend/cpu/ named after
// the layer it serves (and its CUDA file, cuda/<family>.cu), each file
// stating its operations' contracts: linear, residual, positional,
// layer_norm, rms_norm, activation, dropout, embedding, classifier, losses,
// optimizers, attention (family.hpp says how they are put together). The
// classes are compiled once, in src/cpu_backend_float.cpp and
// src/cpu_backend_double.cpp; the operations they call once a CPU level
// (float) and once for double (cpu/ops.hpp).
//
// Threading is one level only. Every operation splits its rows, columns or
// (batch, head) pairs over the OpenMP threads with detail::parallel_ranges,
// serial code inside; GEMMs do the same with one libxsmm kernel or
// single-threaded BLAS call per thread, larger ones use OpenBLAS's (or
// Eigen's) own OpenMP parallelism (cpu/gemm.hpp says which shape goes where).
// Below a small amount of work an operation runs inline, without entering
// the OpenMP runtime at all: a fork costs more than it saves. Reductions
// across rows run in a fixed order (split over columns, never over the rows
// being summed), so results are bitwise reproducible for a given thread
// count. The thresholds and the threading helper are in cpu/parallel.hpp.
#pragma once

#include <span>
#include <type_traits>
#include <vector>

#include "xfmr/backend/backend.hpp"
#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu/activation.hpp"
#include "xfmr/backend/cpu/attention.hpp"
#include "xfmr/backend/cpu/classifier.hpp"
#include "xfmr/backend/cpu/dropout.hpp"
#include "xfmr/backend/cpu/embedding.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/backend/cpu/layer_norm.hpp"
#include "xfmr/backend/cpu/linear.hpp"
#include "xfmr/backend/cpu/losses.hpp"
#include "xfmr/backend/cpu/ops.hpp"
#include "xfmr/backend/cpu/optimizers.hpp"
#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/backend/cpu/positional.hpp"
#include "xfmr/backend/cpu/residual.hpp"
#include "xfmr/backend/cpu/rms_norm.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/core/workspace.hpp"

namespace xfmr {

template <class S>
class CpuBackend : public detail::CpuLinear<S>,
                   public detail::CpuResidual<S>,
                   public detail::CpuPositional<S>,
                   public detail::CpuLayerNorm<S>,
                   public detail::CpuRmsNorm<S>,
                   public detail::CpuActivation<S>,
                   public detail::CpuDropout<S>,
                   public detail::CpuEmbedding<S>,
                   public detail::CpuClassifier<S>,
                   public detail::CpuLosses<S>,
                   public detail::CpuOptimizers<S>,
                   public detail::CpuAttention<S> {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double>,
                "CpuBackend supports float (training) and double (gradient checks)");

 public:
  using Scalar = S;
  using Activation = S;            // backend.hpp
  using Tensor = xfmr::Tensor<S>;  // parameters and gradients
  template <class T>
  using Buffer = xfmr::Buffer<T>;   // activations and saved state
  static constexpr const char* name = "cpu";

  // bf16 precision needs float and bf16::available(); xfmr::Error otherwise,
  // and for an XFMR_CPU_LEVEL the CPU does not run (cpu/kernels.hpp: the
  // kernels' level is settled here, before any parallel region reads it).
  CpuBackend(CpuOptions opts = {});
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

  // The fused products (contract: cpu/linear.hpp), as their parts in turn.
  void linear_forward(int rows, int in, int out, const S* x, const S* w, const S* bias, S* y) {
    this->gemm(false, true, rows, out, in, S(1), x, in, w, in, S(0), y, out);
    if (bias) this->bias_add(rows, out, bias, y);
  }
  void linear_gelu_forward(int rows, int in, int out, const S* x, const S* w, const S* bias, S* h, S* y) {
    linear_forward(rows, in, out, x, w, bias, h);
    this->gelu_forward(std::size_t(rows) * out, h, y);
  }
  void linear_dgelu_input_grad(int rows, int in, int out, const S* dy, const S* w, const S* h, S* dh) {
    this->gemm(false, false, rows, in, out, S(1), dy, out, w, in, S(0), dh, in);
    this->gelu_backward(std::size_t(rows) * in, h, dh, dh);
  }

  // y[i, :] = table[ids[i], :] (embedding.hpp); a lent deferred table
  // (core/tensor.hpp: a model decoding in a WeightCopies scope) gives its
  // rows from its source, as its values are stored, not from a decoding copy.
  void embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, S* y) {
    if constexpr (std::is_same_v<S, float>) {
      if (const auto source = detail::any_lent() ? detail::lent_source(table) : nullptr) {
        detail::check_token_ids(n, V, ids);
        for (int i = 0; i < n; ++i) source->read_rows(ids[i], ids[i] + 1, y + std::size_t(i) * D);
        source->release();  // the pages read (and the kernel's neighbours of them) not held between lookups
        return;
      }
    }
    detail::CpuEmbedding<S>::embedding_forward(n, V, D, ids, table, y);
  }

  // Results for host code (sampling, accuracy): already host memory here.
  std::span<const S> host_view(std::span<const S> x, std::vector<S>&) { return x; }
  // Waits for queued work (a device's); the CPU's is done on return.
  void synchronize() {}

  // Scratch memory the layers take for the length of a call (core/workspace.hpp).
  Workspace<Buffer<Activation>>& workspace() { return workspace_; }

 private:
  CpuOptions opts_;
  Workspace<Buffer<Activation>> workspace_;
};

template <class S>
CpuBackend<S>::CpuBackend(CpuOptions opts)
    : detail::CpuLinear<S>(opts), detail::CpuAttention<S>(opts), opts_(opts) {
  require(!opts.bf16 || std::is_same_v<S, float>, "bf16 precision runs on the float CPU backend");
  require(!opts.bf16 || bf16::available(), "bf16 precision: ", bf16::unavailable_reason());
  require(!opts.bf16_weights || std::is_same_v<S, float>, "bf16 weights run on the float CPU backend");
  require(!opts.bf16_weights || bf16::available(), "bf16 weights: ", bf16::unavailable_reason());
  require(!opts.int8 || std::is_same_v<S, float>, "int8 precision runs on the float CPU backend");
  require(!opts.q4 || std::is_same_v<S, float>, "4-bit precision runs on the float CPU backend");
  require(int(opts.int8) + int(opts.bf16) + int(opts.bf16_weights) + int(opts.q4) <= 1,
          "one precision at a time: bf16, int8 or 4-bit");
  detail::cpu_kernels();
}

XFMR_CPU_FAMILY(CpuBackend);

// CpuBackend<S> and every family's class, instantiated (inside namespace
// xfmr): once for each scalar type, in src/cpu_backend_float.cpp and
// src/cpu_backend_double.cpp.
#define XFMR_CPU_BACKEND_INSTANTIATE(S)          \
  template class detail::CpuLinear<S>;          \
  template class detail::CpuResidual<S>;        \
  template class detail::CpuPositional<S>;      \
  template class detail::CpuLayerNorm<S>;       \
  template class detail::CpuRmsNorm<S>;         \
  template class detail::CpuActivation<S>;      \
  template class detail::CpuDropout<S>;         \
  template class detail::CpuEmbedding<S>;       \
  template class detail::CpuClassifier<S>;      \
  template class detail::CpuLosses<S>;          \
  template class detail::CpuOptimizers<S>;      \
  template class detail::CpuAttention<S>;       \
  template class CpuBackend<S>

static_assert(Backend<CpuBackend<float>>);
static_assert(Backend<CpuBackend<double>>);

}  // namespace xfmr
