// runtime.cu: devices, memory, error checking and the backend's context.
#include <algorithm>
#include <cstring>
#include <string>

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
  for (Slot& s : slots_) {
    if (s.copied) {
      cudaEventSynchronize(s.copied);
      cudaEventDestroy(s.copied);
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

void UploadStaging::upload(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  if (s.copied)
    check(cudaEventSynchronize(s.copied), "upload (waiting for a staging slot)");
  else
    check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "upload (cudaEventCreate)");
  if (s.bytes < bytes) {
    if (s.host) check(cudaFreeHost(s.host), "upload (cudaFreeHost)");
    s.host = nullptr;
    s.bytes = 0;
    const std::size_t want = std::max<std::size_t>(bytes, 4096);
    check(cudaHostAlloc(&s.host, want, cudaHostAllocDefault), "upload (cudaHostAlloc)");
    s.bytes = want;
  }
  std::memcpy(s.host, host_src, bytes);
  check(cudaMemcpyAsync(device_dst, s.host, bytes, cudaMemcpyHostToDevice, 0), "upload (cudaMemcpyAsync)");
  check(cudaEventRecord(s.copied, 0), "upload (cudaEventRecord)");
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

void* allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    xfmr::detail::fail("cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(err));
  }
  return p;
}
void release(void* p) noexcept {
  if (p) cudaFree(p);  // errors here are reported by the next checked call
}
void upload(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes) detail::check(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), "upload (cudaMemcpy)");
}
void download(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes) detail::check(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost), "download (cudaMemcpy)");
}
void copy_on_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes && dst != src)
    detail::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0), "device copy (cudaMemcpyAsync)");
}
void fill_zero(void* device_dst, std::size_t bytes) {
  if (bytes) detail::check(cudaMemsetAsync(device_dst, 0, bytes, 0), "cudaMemsetAsync");
}
void synchronize() { detail::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace xfmr::cuda

namespace xfmr {

CudaBackend::CudaBackend(CudaOptions opts) : opts_(opts), ctx_(std::make_unique<Context>()) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    detail::fail("CUDA backend: no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(err), ")");
  }
  require(opts.device >= 0 && opts.device < n, "CUDA backend: device ", opts.device, " out of range [0, ", n, ")");
  cuda::detail::check(cudaSetDevice(opts.device), "cudaSetDevice");
  cuda::detail::check_cublas(cublasCreate(&ctx_->blas), "cublasCreate");
  cuda::detail::check_cublas(
      cublasSetMathMode(ctx_->blas, opts.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
}

CudaBackend::~CudaBackend() {
  if (ctx_ && ctx_->blas) cublasDestroy(ctx_->blas);
}

std::string CudaBackend::device_name() const { return cuda::device_name(opts_.device); }
void CudaBackend::synchronize() { cuda::synchronize(); }

std::span<const float> CudaBackend::host_view(std::span<const float> x, std::vector<float>& staging) {
  staging.resize(x.size());
  cuda::download(staging.data(), x.data(), x.size() * sizeof(float));
  return staging;
}

const std::uint8_t* CudaBackend::upload_mask(const std::uint8_t* host, std::size_t n) {
  if (!host) return nullptr;
  std::uint8_t* d = ctx_->mask.reserve(n);
  ctx_->staging.upload(d, host, n);
  return d;
}
const std::int32_t* CudaBackend::upload_ids(const std::int32_t* host, std::size_t n) {
  std::int32_t* d = ctx_->ids.reserve(n);
  ctx_->staging.upload(d, host, n * sizeof(std::int32_t));
  return d;
}

}  // namespace xfmr
