// cuda.hpp: the CUDA side of the backend seam. Declarations only; the
// definitions live in cuda/*.cu (no Eigen there) and are compiled into
// xfmr_cuda whenever CMake finds a CUDA compiler, which then defines
// XFMR_WITH_CUDA for users of xfmr::xfmr. Including this header without
// XFMR_WITH_CUDA declares nothing.
#pragma once

#ifdef XFMR_WITH_CUDA

#include <string>

namespace xfmr::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device
// (never an error, so callers can skip GPU work cleanly).
int device_count();

// The device's name, e.g. "NVIDIA H100 80GB HBM3". Throws xfmr::Error naming
// the ordinal and the device count when the ordinal is out of range.
std::string device_name(int ordinal);

}  // namespace xfmr::cuda

#endif  // XFMR_WITH_CUDA
