// runtime.cu: devices, memory, error checking and the backend's context.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common.cuh"

namespace xfmr::cuda {

namespace detail {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    xfmr::detail::fail("CUDA error in ", what, ": ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  }
}
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    xfmr::detail::fail("cuBLAS error in ", what, ": ", cublasGetStatusString(status), " (status ", int(status), ")");
}
UploadStaging::~UploadStaging() {
  auto free_slot = [](Slot& s) {
    if (s.copied) {
      cudaEventSynchronize(s.copied);
      cudaEventDestroy(s.copied);
    }
    if (s.host) cudaFreeHost(s.host);
  };
  for (Slot& s : slots_) free_slot(s);
  for (Slot& s : step_slots_) free_slot(s);
}

void UploadStaging::fit(Slot& s, std::size_t bytes) {
  if (s.bytes >= bytes) return;
  if (s.host) check(cudaFreeHost(s.host), "upload (cudaFreeHost)");
  s.host = nullptr;
  s.bytes = 0;
  const std::size_t want = std::max<std::size_t>(bytes, 4096);
  check(cudaHostAlloc(&s.host, want, cudaHostAllocDefault), "upload (cudaHostAlloc)");
  s.bytes = want;
}

void UploadStaging::upload(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (recording()) {
    if (next_step_slot_ == step_slots_.size()) step_slots_.emplace_back();
    Slot& s = step_slots_[next_step_slot_++];
    fit(s, bytes);  // the step waited for its previous replay: nothing reads the slot now
    std::memcpy(s.host, host_src, bytes);
    const void* host = s.host;
    enqueue([&](Signature& sig) { sig.add_all(std::uint8_t(1), device_dst, host, bytes); },
            [=] {
              check(cudaMemcpyAsync(device_dst, host, bytes, cudaMemcpyHostToDevice, stream()),
                    "upload (cudaMemcpyAsync)");
            });
    return;
  }
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  if (s.copied)
    check(cudaEventSynchronize(s.copied), "upload (waiting for a staging slot)");
  else
    check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "upload (cudaEventCreate)");
  fit(s, bytes);
  std::memcpy(s.host, host_src, bytes);
  check(cudaMemcpyAsync(device_dst, s.host, bytes, cudaMemcpyHostToDevice, stream()), "upload (cudaMemcpyAsync)");
  check(cudaEventRecord(s.copied, stream()), "upload (cudaEventRecord)");
}

// ---- graph steps ------------------------------------------------------------

namespace {
thread_local StepRecorder* active_recorder = nullptr;
}

StepRecorder* recording() { return active_recorder; }

void record(const std::function<void(Signature&)>& sign, std::function<void()> op) {
  active_recorder->record(sign, std::move(op));
}

void flush_recorded() {
  if (StepRecorder* r = active_recorder) r->flush();
}

StepGraphs::~StepGraphs() {
  for (Segment& s : segments)
    if (s.exec) cudaGraphExecDestroy(s.exec);
}

StepRecorder::~StepRecorder() {
  if (launched_) cudaEventDestroy(launched_);
}

void StepRecorder::begin(StepGraphs& graphs) {
  require(!active_recorder, "CudaBackend::graph_step: graph steps do not nest");
  if (!launched_)
    check(cudaEventCreateWithFlags(&launched_, cudaEventDisableTiming), "graph step (cudaEventCreate)");
  else
    check(cudaEventSynchronize(launched_), "graph step (waiting for the previous step's graphs)");
  graphs_ = &graphs;
  segment_ = 0;
  pending_.clear();
  pending_signature_.clear();
  active_recorder = this;
}

void StepRecorder::record(const std::function<void(Signature&)>& sign, std::function<void()> op) {
  sign(pending_signature_);
  pending_.push_back(std::move(op));
}

void StepRecorder::flush() {
  if (pending_.empty()) return;
  if (segment_ == graphs_->segments.size()) graphs_->segments.emplace_back();
  StepGraphs::Segment& seg = graphs_->segments[segment_++];
  active_recorder = nullptr;  // the closures queue for real from here on
  struct Resume {
    StepRecorder* r;
    ~Resume() { active_recorder = r; }
  } resume{this};
  if (!seg.exec || !(seg.signature == pending_signature_)) {
    if (seg.exec) {
      check(cudaGraphExecDestroy(seg.exec), "graph step (cudaGraphExecDestroy)");
      seg.exec = nullptr;
    }
    check(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "graph step (cudaStreamBeginCapture)");
    cudaGraph_t graph = nullptr;
    try {
      for (auto& op : pending_) op();
    } catch (...) {
      cudaStreamEndCapture(stream(), &graph);  // ends the capture; the graph is discarded
      if (graph) cudaGraphDestroy(graph);
      pending_.clear();
      pending_signature_.clear();
      throw;
    }
    check(cudaStreamEndCapture(stream(), &graph), "graph step (cudaStreamEndCapture)");
    const cudaError_t err = cudaGraphInstantiate(&seg.exec, graph, 0);
    cudaGraphDestroy(graph);
    check(err, "graph step (cudaGraphInstantiate)");
    seg.signature = pending_signature_;
    ++captures_;
  } else {
    ++replays_;
  }
  pending_.clear();
  pending_signature_.clear();
  check(cudaGraphLaunch(seg.exec, stream()), "graph step (cudaGraphLaunch)");
  check(cudaEventRecord(launched_, stream()), "graph step (cudaEventRecord)");
}

void StepRecorder::end() {
  flush();
  active_recorder = nullptr;
  graphs_ = nullptr;
}

void StepRecorder::abort() noexcept {
  pending_.clear();
  pending_signature_.clear();
  active_recorder = nullptr;
  graphs_ = nullptr;
}

}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" / "no device" error
    return 0;
  }
  return n;
}

std::string device_name(int ordinal) {
  const int n = device_count();
  require(ordinal >= 0 && ordinal < n, "CUDA device ", ordinal, " out of range [0, ", n, ")");
  cudaDeviceProp prop{};
  detail::check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  return prop.name;
}

namespace {
// Every live allocation's size, for allocated_bytes() and its peak.
struct Allocations {
  std::mutex lock;
  std::unordered_map<void*, std::size_t> sizes;
  std::size_t live = 0, peak = 0, made = 0;
};
Allocations& allocations() {
  static Allocations a;
  return a;
}
}  // namespace

MemoryUse memory_use() {
  Allocations& a = allocations();
  std::lock_guard guard(a.lock);
  return {a.live, a.peak, a.made};
}
void reset_peak_memory() {
  Allocations& a = allocations();
  std::lock_guard guard(a.lock);
  a.peak = a.live;
}

void* allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    xfmr::detail::fail("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(err));
  }
  Allocations& a = allocations();
  std::lock_guard guard(a.lock);
  a.sizes[p] = bytes;
  a.live += bytes;
  ++a.made;
  a.peak = std::max(a.peak, a.live);
  return p;
}
void release(void* p) noexcept {
  if (!p) return;
  {
    Allocations& a = allocations();
    std::lock_guard guard(a.lock);
    if (const auto it = a.sizes.find(p); it != a.sizes.end()) {
      a.live -= it->second;
      a.sizes.erase(it);
    }
  }
  if (detail::recording()) {
    try {
      detail::flush_recorded();  // recorded work may still use it (a growing buffer's copy, say)
    } catch (...) {
      // the error is the step's: it surfaces at the step's next flush or check
    }
    cudaStreamSynchronize(detail::stream());
  }
  cudaFree(p);  // errors here are reported by the next checked call
}
void upload(void* device_dst, const void* host_src, std::size_t bytes) {
  if (!bytes) return;
  detail::flush_recorded();
  detail::check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, detail::stream()),
                "upload (cudaMemcpyAsync)");
  detail::check(cudaStreamSynchronize(detail::stream()), "upload (cudaStreamSynchronize)");
}
void download(void* host_dst, const void* device_src, std::size_t bytes) {
  if (!bytes) return;
  detail::flush_recorded();
  detail::check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, detail::stream()),
                "download (cudaMemcpyAsync)");
  detail::check(cudaStreamSynchronize(detail::stream()), "download (cudaStreamSynchronize)");
}
void copy_on_device(void* dst, const void* src, std::size_t bytes) {
  if (!bytes || dst == src) return;
  detail::enqueue([&](detail::Signature& s) { s.add_all(std::uint8_t(2), dst, src, bytes); },
                  [=] {
                    detail::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detail::stream()),
                                  "device copy (cudaMemcpyAsync)");
                  });
}
void fill_zero(void* device_dst, std::size_t bytes) {
  if (!bytes) return;
  detail::enqueue([&](detail::Signature& s) { s.add_all(std::uint8_t(3), device_dst, bytes); },
                  [=] { detail::check(cudaMemsetAsync(device_dst, 0, bytes, detail::stream()), "cudaMemsetAsync"); });
}
void synchronize() {
  detail::flush_recorded();
  detail::check(cudaStreamSynchronize(detail::stream()), "cudaStreamSynchronize");
}

// y[i] = x[i] rounded to bfloat16: a Tensor's product copy.
namespace {
__global__ void round_to_bf16_kernel(std::size_t n, const float* x, Bf16* y) {
  for (std::size_t i = detail::first_index(); i < n; i += detail::grid_stride()) y[i] = detail::from_float<Bf16>(x[i]);
}
}  // namespace
void round_to_bf16(std::size_t n, const float* x, Bf16* y) {
  detail::launch("round_to_bf16", elementwise_launch(n), round_to_bf16_kernel, n, x, y);
}

}  // namespace xfmr::cuda

namespace xfmr {

template <class A>
BasicCudaBackend<A>::BasicCudaBackend(CudaOptions opts) : opts_(opts), ctx_(std::make_unique<cuda::Context>()) {
  if (const char* env = std::getenv("XFMR_CUDA_GRAPHS"); env && std::string_view(env) == "0") opts_.graph_steps = false;
  if (const char* env = std::getenv("XFMR_CUDA_FLASH_ATTENTION"); env && std::string_view(env) == "1")
    opts_.flash_attention = true;
  if (const char* env = std::getenv("XFMR_CUDA_FUSED_LOSS"); env && std::string_view(env) == "1")
    opts_.fused_loss = true;
  if (const char* env = std::getenv("XFMR_CUDA_LT_EPILOGUES"); env && std::string_view(env) == "1")
    opts_.lt_epilogues = true;
  if constexpr (kNarrow) {  // bfloat16 activations: every product has bf16 operands
    require(!opts.tf32, "CUDA backend: bf16 storage multiplies in bf16, not TF32");
    opts_.bf16 = true;
  }
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    detail::fail("CUDA backend: no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(err), ")");
  }
  require(opts.device >= 0 && opts.device < n, "CUDA backend: device ", opts.device, " out of range [0, ", n, ")");
  cuda::detail::check(cudaSetDevice(opts.device), "cudaSetDevice");
  cuda::detail::check_cublas(cublasCreate(&ctx_->blas), "cublasCreate");
  require(!(opts.tf32 && opts.bf16), "CUDA backend: TF32 and bf16 products exclude each other");
  // bf16's products name their compute type on each call (linear.cu); the
  // pedantic mode would hold them to it too, but keep FP32's strict.
  cuda::detail::check_cublas(
      cublasSetMathMode(ctx_->blas, opts_.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                               : opts_.bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH),
      "cublasSetMathMode");
  cuda::detail::check_cublas(cublasSetStream(ctx_->blas, cuda::detail::stream()), "cublasSetStream");
  constexpr std::size_t kWorkspace = std::size_t(32) << 20;
  cuda::detail::check_cublas(cublasSetWorkspace(ctx_->blas, ctx_->blas_workspace.reserve(kWorkspace), kWorkspace),
                             "cublasSetWorkspace");
  if (opts_.lt_epilogues) cuda::detail::check_cublas(cublasLtCreate(&ctx_->lt), "cublasLtCreate");
}

template <class A>
void BasicCudaBackend<A>::begin_graph_step(std::string_view key) {
  auto it = ctx_->graphs.find(key);
  if (it == ctx_->graphs.end()) it = ctx_->graphs.try_emplace(std::string(key)).first;
  ctx_->staging.restart_step_slots();
  ctx_->recorder.begin(it->second);
}
template <class A>
void BasicCudaBackend<A>::end_graph_step() {
  try {
    ctx_->recorder.end();
  } catch (...) {
    ctx_->recorder.abort();
    throw;
  }
}
template <class A>
void BasicCudaBackend<A>::abort_graph_step() noexcept {
  ctx_->recorder.abort();
}
template <class A>
auto BasicCudaBackend<A>::graph_stats() const -> GraphStats {
  return {ctx_->recorder.captures(), ctx_->recorder.replays()};
}

template <class A>
BasicCudaBackend<A>::~BasicCudaBackend() {
  if (ctx_ && ctx_->nccl) cuda::detail::destroy_nccl(ctx_->nccl);
  if (ctx_ && ctx_->lt) cublasLtDestroy(ctx_->lt);
  if (ctx_ && ctx_->blas) cublasDestroy(ctx_->blas);
}

template <class A>
std::string BasicCudaBackend<A>::device_name() const {
  return cuda::device_name(opts_.device);
}
template <class A>
void BasicCudaBackend<A>::synchronize() {
  cuda::synchronize();
}

template <class A>
std::span<const float> BasicCudaBackend<A>::host_view(std::span<const S> x, std::vector<float>& staging) {
  staging.resize(x.size());
  cuda::download(staging.data(), x.data(), x.size() * sizeof(float));
  return staging;
}
template <class A>
std::span<const float> BasicCudaBackend<A>::host_view(std::span<const NarrowA> x, std::vector<float>& staging) {
  auto& bits = ctx_->host_narrow;
  bits.resize(x.size());
  cuda::download(bits.data(), x.data(), x.size() * sizeof(Bf16));
  staging.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) staging[i] = bf16::to_float(bits[i].bits);
  return staging;
}

template <class A>
const std::uint8_t* BasicCudaBackend<A>::upload_mask(const std::uint8_t* host, std::size_t n) {
  if (!host) return nullptr;
  std::uint8_t* d = ctx_->mask.reserve(n);
  ctx_->staging.upload(d, host, n);
  return d;
}
template <class A>
const std::int32_t* BasicCudaBackend<A>::upload_ids(const std::int32_t* host, std::size_t n) {
  std::int32_t* d = ctx_->ids.reserve(n);
  ctx_->staging.upload(d, host, n * sizeof(std::int32_t));
  return d;
}

#define XFMR_INSTANTIATE(A)                                                                                 \
  template BasicCudaBackend<A>::BasicCudaBackend(CudaOptions);                                              \
  template BasicCudaBackend<A>::~BasicCudaBackend();                                                        \
  template void BasicCudaBackend<A>::begin_graph_step(std::string_view);                                    \
  template void BasicCudaBackend<A>::end_graph_step();                                                      \
  template void BasicCudaBackend<A>::abort_graph_step() noexcept;                                           \
  template BasicCudaBackend<A>::GraphStats BasicCudaBackend<A>::graph_stats() const;                        \
  template std::string BasicCudaBackend<A>::device_name() const;                                            \
  template void BasicCudaBackend<A>::synchronize();                                                         \
  template std::span<const float> BasicCudaBackend<A>::host_view(std::span<const float>, std::vector<float>&); \
  template const std::uint8_t* BasicCudaBackend<A>::upload_mask(const std::uint8_t*, std::size_t);          \
  template const std::int32_t* BasicCudaBackend<A>::upload_ids(const std::int32_t*, std::size_t);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE
template std::span<const float> BasicCudaBackend<Bf16>::host_view(std::span<const Bf16>, std::vector<float>&);

}  // namespace xfmr
