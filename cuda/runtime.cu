// runtime.cu: device discovery for the CUDA backend (see backend/cuda.hpp).
#include <cuda_runtime.h>

#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return 0;
  }
  return n;
}

std::string device_name(int ordinal) {
  const int n = device_count();
  require(ordinal >= 0 && ordinal < n, "CUDA device ", ordinal, " out of range [0, ", n, ")");
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, ordinal);
  require(err == cudaSuccess, "cudaGetDeviceProperties(", ordinal, "): ", cudaGetErrorString(err));
  return prop.name;
}

}  // namespace xfmr::cuda
