// nccl.cu: CudaBackend::all_reduce_sum, the sum over the ranks of a
// ProcessGroup (one GPU a rank) through NCCL, when CMake found it
// (XFMR_WITH_NCCL, private to this file's target); without NCCL it throws.
#include <cstring>
#include <string>

#include "common.cuh"
#include "xfmr/core/distributed.hpp"

#ifdef XFMR_WITH_NCCL
#include <nccl.h>
#endif

namespace xfmr {

namespace cuda {
bool nccl_available() {
#ifdef XFMR_WITH_NCCL
  return true;
#else
  return false;
#endif
}

namespace detail {
void destroy_nccl([[maybe_unused]] void* comm) noexcept {
#ifdef XFMR_WITH_NCCL
  if (comm) ncclCommDestroy(static_cast<ncclComm_t>(comm));
#endif
}
}  // namespace detail
}  // namespace cuda

#ifdef XFMR_WITH_NCCL
namespace {
void check_nccl(ncclResult_t r, const char* what, const ProcessGroup& group) {
  if (r != ncclSuccess)
    detail::fail(what, " failed on rank ", group.rank(), " of ", group.size(), ": ", ncclGetErrorString(r));
}
}  // namespace
#endif

template <class A>
void BasicCudaBackend<A>::all_reduce_sum(ProcessGroup& group, std::span<const std::span<S>> tensors) {
#ifndef XFMR_WITH_NCCL
  (void)group, (void)tensors;
  detail::fail("GPU ranks sum their gradients through NCCL, and this xfmr was built without it (CMake found no nccl.h "
               "and libnccl beside the CUDA toolkit)");
#else
  if (!ctx_->nccl) {
    ncclUniqueId id{};
    if (group.root()) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", group);
    const std::string root = group.all_gather(std::string(reinterpret_cast<const char*>(&id), sizeof id))[0];
    require(root.size() == sizeof id, "NCCL: rank 0's id is ", root.size(), " bytes, not ", sizeof id);
    std::memcpy(&id, root.data(), sizeof id);
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRank(&comm, group.size(), id, group.rank()), "ncclCommInitRank", group);
    ctx_->nccl = comm;
  }
  const auto comm = static_cast<ncclComm_t>(ctx_->nccl);
  check_nccl(ncclGroupStart(), "ncclGroupStart", group);
  for (const std::span<S>& t : tensors)
    if (!t.empty())
      check_nccl(ncclAllReduce(t.data(), t.data(), t.size(), ncclFloat, ncclSum, comm, cuda::detail::stream()),
                 "ncclAllReduce", group);
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", group);
#endif
}

#define XFMR_INSTANTIATE(A) \
  template void BasicCudaBackend<A>::all_reduce_sum(ProcessGroup&, std::span<const std::span<float>>);
XFMR_CUDA_FOR_EACH_ACTIVATION(XFMR_INSTANTIATE)
#undef XFMR_INSTANTIATE

}  // namespace xfmr
