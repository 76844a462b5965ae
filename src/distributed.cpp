// distributed.cpp: ProcessGroup (distributed.hpp) on MPI's C API, or one
// process alone when xfmr is built without MPI.
#include "xfmr/core/distributed.hpp"

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

void check(int rc, const char* call, int rank, int size, bool collective = true) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  if (!collective) detail::fail(call, " failed on rank ", rank, " of ", size, ": ", std::string(text, std::size_t(len)));
  // The collectives only fail when the ranks called them differently: with
  // other sizes (MPI_ERR_TRUNCATE) or in another order.
  detail::fail("ranks disagree on a collective call's size or order (", call, " failed on rank ", rank, " of ", size,
               ": ", std::string(text, std::size_t(len)), "); run every rank with the same options and data");
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
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread", 0, 1, false);
  initialised_ = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm node;  // the ranks that share this machine's memory
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type",
        rank_, size_);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);
  world_is_distributed = size_ > 1;
#endif
}

ProcessGroup::~ProcessGroup() {
#ifdef XFMR_WITH_MPI
  int finalized = 0;
  if (initialised_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
#endif
}

std::vector<std::size_t> ProcessGroup::even_bounds(std::size_t n) const {
  std::vector<std::size_t> b(std::size_t(size_) + 1);
  for (std::size_t r = 0; r < b.size(); ++r) b[r] = n * r / std::size_t(size_);
  return b;
}

#ifdef XFMR_WITH_MPI
namespace {
// MPI's int counts and offsets of the parts, checked against the buffer.
void part_counts(std::span<const std::size_t> bounds, std::size_t n, int size, std::vector<int>& counts,
                 std::vector<int>& offsets) {
  require(bounds.size() == std::size_t(size) + 1 && bounds.front() == 0 && bounds.back() == n,
          "ProcessGroup: ", bounds.size(), " part bounds for ", size, " ranks over ", n, " elements");
  require(n <= std::size_t(INT32_MAX), "ProcessGroup: ", n, " elements are over MPI's int counts");
  counts.resize(std::size_t(size));
  offsets.resize(std::size_t(size));
  for (std::size_t r = 0; r < std::size_t(size); ++r) {
    require(bounds[r] <= bounds[r + 1], "ProcessGroup: part bounds decrease at rank ", r);
    counts[r] = int(bounds[r + 1] - bounds[r]);
    offsets[r] = int(bounds[r]);
  }
}
}  // namespace
#endif

template <class T>
void ProcessGroup::reduce_scatter_sum(std::span<T> v, std::span<const std::size_t> bounds) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>);
  if (size_ == 1) return;
#ifdef XFMR_WITH_MPI
  // An all-to-all hands rank r its part of every rank's buffer; r sums them in rank order.
  std::vector<int> counts, offsets;
  part_counts(bounds, v.size(), size_, counts, offsets);
  const std::size_t me = std::size_t(rank_), mine = bounds[me + 1] - bounds[me];
  recv_.resize(std::max(recv_.size(), mine * std::size_t(size_) * sizeof(T)));
  T* recv = reinterpret_cast<T*>(recv_.data());
  const std::vector<int> recv_counts(static_cast<std::size_t>(size_), int(mine));
  std::vector<int> recv_offsets(static_cast<std::size_t>(size_));
  for (std::size_t r = 0; r < recv_offsets.size(); ++r) recv_offsets[r] = int(r * mine);
  check(MPI_Alltoallv(v.data(), counts.data(), offsets.data(), mpi_type<T>(), recv, recv_counts.data(),
                      recv_offsets.data(), mpi_type<T>(), MPI_COMM_WORLD),
        "MPI_Alltoallv", rank_, size_);
  for (std::size_t i = 0; i < mine; ++i) {
    T s = T(0);
    for (std::size_t r = 0; r < std::size_t(size_); ++r) s += recv[r * mine + i];
    v[bounds[me] + i] = s;
  }
#else
  (void)v, (void)bounds;
#endif
}

template <class T>
void ProcessGroup::all_gather(std::span<T> v, std::span<const std::size_t> bounds) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>);
  if (size_ == 1) return;
#ifdef XFMR_WITH_MPI
  std::vector<int> counts, offsets;
  part_counts(bounds, v.size(), size_, counts, offsets);
  check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.data(), counts.data(), offsets.data(), mpi_type<T>(),
                       MPI_COMM_WORLD),
        "MPI_Allgatherv", rank_, size_);
#else
  (void)v, (void)bounds;
#endif
}

template <class T>
void ProcessGroup::all_reduce_sum(std::span<T> v) {
  if (size_ == 1 || v.empty()) return;
  const std::vector<std::size_t> bounds = even_bounds(v.size());
  reduce_scatter_sum(v, std::span<const std::size_t>(bounds));
  all_gather(v, std::span<const std::size_t>(bounds));
}

#define XFMR_PROCESS_GROUP_TYPE(T)                                \
  template void ProcessGroup::all_reduce_sum<T>(std::span<T>);     \
  template void ProcessGroup::reduce_scatter_sum<T>(std::span<T>, std::span<const std::size_t>); \
  template void ProcessGroup::all_gather<T>(std::span<T>, std::span<const std::size_t>);
XFMR_PROCESS_GROUP_TYPE(float)
XFMR_PROCESS_GROUP_TYPE(double)
XFMR_PROCESS_GROUP_TYPE(std::int64_t)
#undef XFMR_PROCESS_GROUP_TYPE

std::vector<std::string> ProcessGroup::all_gather(const std::string& value) {
  if (size_ == 1) return {value};
  std::vector<std::string> out;
#ifdef XFMR_WITH_MPI
  require(value.size() <= std::size_t(INT32_MAX), "ProcessGroup: a string of ", value.size(), " bytes is over MPI's int counts");
  const int len = int(value.size());
  std::vector<int> lens(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_), 0);
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather", rank_, size_);
  long total = 0;
  for (std::size_t r = 0; r < lens.size(); ++r) offsets[r] = int(total), total += lens[r];
  require(total <= INT32_MAX, "ProcessGroup: ", total, " bytes of strings are over MPI's int counts");
  std::string all(std::size_t(total), '\0');
  check(MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD),
        "MPI_Allgatherv", rank_, size_);
  for (std::size_t r = 0; r < lens.size(); ++r) out.push_back(all.substr(std::size_t(offsets[r]), std::size_t(lens[r])));
#endif
  return out;
}

void ProcessGroup::require_same(const std::string& what, const std::string& value) {
  if (size_ == 1) return;
  const std::vector<std::string> all = all_gather(value);
  for (std::size_t r = 1; r < all.size(); ++r)
    require(all[r] == all[0], "ranks disagree on ", what, ": rank 0 has '", all[0], "', rank ", r, " has '", all[r], "'");
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

std::pair<int, int> rank_rows(const ProcessGroup& group, int n) {
  const int k = std::min(group.size(), n), r = group.rank();
  if (r >= k) return {n, n};
  return {int(long(n) * r / k), int(long(n) * (r + 1) / k)};
}

}  // namespace xfmr
