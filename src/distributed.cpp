// distributed.cpp: ProcessGroup (distributed.hpp) on MPI's C API, or one
// process alone when xfmr is built without MPI.
#include "xfmr/train/distributed.hpp"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <type_traits>
#include <vector>

#include "xfmr/core/error.hpp"

#ifdef XFMR_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C API alone
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace xfmr {

namespace {
bool world_is_distributed = false;

#ifdef XFMR_WITH_MPI
template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else return MPI_INT64_T;
}

void check(int rc, const char* call, int rank, int size) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  detail::fail(call, " failed on rank ", rank, " of ", size, ": ", std::string(text, std::size_t(len)));
}
#endif
}  // namespace

ProcessGroup& ProcessGroup::world() {
  static ProcessGroup g;
  return g;
}

bool ProcessGroup::distributed() { return world_is_distributed; }

ProcessGroup::ProcessGroup() {
#ifdef XFMR_WITH_MPI
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE")) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread", 0, 1);
  initialised_ = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  world_is_distributed = size_ > 1;
#endif
}

ProcessGroup::~ProcessGroup() {
#ifdef XFMR_WITH_MPI
  int finalized = 0;
  if (initialised_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
#endif
}

template <class T>
void ProcessGroup::all_reduce_sum(std::span<T> v) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>);
  if (size_ == 1 || v.empty()) return;
#ifdef XFMR_WITH_MPI
  const std::size_t n = std::size_t(size_), chunk = (v.size() + n - 1) / n;
  require(chunk <= std::size_t(INT32_MAX), "all-reduce of ", v.size(), " elements: chunks over MPI's int count");
  for (auto* b : {&send_, &recv_}) b->resize(std::max(b->size(), chunk * n * sizeof(T)));
  mine_.resize(std::max(mine_.size(), chunk * sizeof(T)));
  T* send = reinterpret_cast<T*>(send_.data());
  T* recv = reinterpret_cast<T*>(recv_.data());
  T* mine = reinterpret_cast<T*>(mine_.data());
  std::copy(v.begin(), v.end(), send);
  std::fill(send + v.size(), send + chunk * n, T(0));
  check(MPI_Alltoall(send, int(chunk), mpi_type<T>(), recv, int(chunk), mpi_type<T>(), MPI_COMM_WORLD), "MPI_Alltoall",
        rank_, size_);
  std::fill(mine, mine + chunk, T(0));
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < chunk; ++i) mine[i] += recv[r * chunk + i];
  check(MPI_Allgather(mine, int(chunk), mpi_type<T>(), send, int(chunk), mpi_type<T>(), MPI_COMM_WORLD), "MPI_Allgather",
        rank_, size_);
  std::copy(send, send + v.size(), v.begin());
#endif
}
template void ProcessGroup::all_reduce_sum<float>(std::span<float>);
template void ProcessGroup::all_reduce_sum<double>(std::span<double>);
template void ProcessGroup::all_reduce_sum<std::int64_t>(std::span<std::int64_t>);

void ProcessGroup::require_same(const std::string& what, const std::string& value) {
  if (size_ == 1) return;
#ifdef XFMR_WITH_MPI
  const int len = int(value.size());
  std::vector<int> lens(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_), 0);
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather", rank_, size_);
  for (std::size_t r = 1; r < lens.size(); ++r) offsets[r] = offsets[r - 1] + lens[r - 1];
  std::string all(std::size_t(offsets.back() + lens.back()), '\0');
  check(MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD),
        "MPI_Allgatherv", rank_, size_);
  const std::string first = all.substr(0, std::size_t(lens[0]));
  for (int r = 1; r < size_; ++r) {
    const std::string other = all.substr(std::size_t(offsets[std::size_t(r)]), std::size_t(lens[std::size_t(r)]));
    require(other == first, "ranks disagree on ", what, ": rank 0 has '", first, "', rank ", r, " has '", other, "'");
  }
#else
  (void)what, (void)value;
#endif
}

void ProcessGroup::abort_on_error() {
#ifdef XFMR_WITH_MPI
  if (size_ > 1) {
    std::cerr.flush();
    std::cout.flush();
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#endif
}

}  // namespace xfmr
