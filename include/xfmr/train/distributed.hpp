// distributed.hpp: data-parallel training across processes, on MPI.
//
// ProcessGroup::world() is every process `mpirun -np N` started
// (MPI_COMM_WORLD), or this process alone: when it was not started by
// mpirun (no OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment) or xfmr
// was built without MPI (XFMR_WITH_MPI undefined). MPI is initialised on the
// first call and finalised at exit.
//
// A Trainer given a group of N > 1 ranks (TrainerOptions::group) expects
// each rank to pass its own share of the global batch; it weighs every
// shard by its share of the global batch's counted targets and sums the
// gradients and the loss over the ranks, so each rank takes the step one
// process would take on the whole batch, up to the order of the sums.
//
// all_reduce_sum is deterministic and leaves every rank with the same bits:
// rank r sums chunk r of every rank's buffer in rank order (an all-to-all),
// then the reduced chunks are gathered by all (an all-gather). Each rank
// sends and receives 2 (N - 1) / N of the buffer, as a ring all-reduce does,
// and a run repeats bit for bit at the same N.
//
// Failures: abort_on_error() ends every rank (MPI_Abort) after this rank has
// said what went wrong, so that a rank that throws never leaves the others
// waiting in a collective; mpirun also ends the job when a rank dies.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "xfmr/core/error.hpp"

#ifdef XFMR_WITH_MPI
#include <mpi.h>
#endif

namespace xfmr {

class ProcessGroup {
 public:
  // Every process mpirun started, or this one alone.
  static ProcessGroup& world() {
    static ProcessGroup g;
    return g;
  }
  // Whether world() has been asked for and holds more than one rank.
  static bool& distributed() {
    static bool on = false;
    return on;
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }

  // v summed element-wise over the ranks, in place (see the header comment).
  template <class T>
  void all_reduce_sum(std::span<T> v) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>);
    if (size_ == 1 || v.empty()) return;
#ifdef XFMR_WITH_MPI
    const std::size_t n = std::size_t(size_), chunk = (v.size() + n - 1) / n;
    std::vector<T> send(chunk * n, T(0)), recv(chunk * n), mine(chunk, T(0));
    std::copy(v.begin(), v.end(), send.begin());
    check(MPI_Alltoall(send.data(), int(chunk), mpi_type<T>(), recv.data(), int(chunk), mpi_type<T>(), MPI_COMM_WORLD),
          "MPI_Alltoall");
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < chunk; ++i) mine[i] += recv[r * chunk + i];
    check(MPI_Allgather(mine.data(), int(chunk), mpi_type<T>(), send.data(), int(chunk), mpi_type<T>(), MPI_COMM_WORLD),
          "MPI_Allgather");
    std::copy(send.begin(), send.begin() + std::ptrdiff_t(v.size()), v.begin());
#endif
  }
  template <class T>
  T sum(T x) {
    all_reduce_sum(std::span<T>(&x, 1));
    return x;
  }

  // Fails on every rank when `value` differs between ranks, naming the
  // first rank whose value differs from rank 0's and both values.
  void require_same(const std::string& what, const std::string& value) {
    if (size_ == 1) return;
#ifdef XFMR_WITH_MPI
    const int len = int(value.size());
    std::vector<int> lens(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    std::vector<int> offsets(static_cast<std::size_t>(size_), 0);
    for (std::size_t r = 1; r < lens.size(); ++r) offsets[r] = offsets[r - 1] + lens[r - 1];
    std::string all(std::size_t(offsets.back() + lens.back()), '\0');
    check(MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD),
          "MPI_Allgatherv");
    const std::string first = all.substr(0, std::size_t(lens[0]));
    for (int r = 1; r < size_; ++r) {
      const std::string other = all.substr(std::size_t(offsets[std::size_t(r)]), std::size_t(lens[std::size_t(r)]));
      require(other == first, what, " differs between ranks: rank 0 has '", first, "', rank ", r, " has '", other, "'");
    }
#else
    (void)what, (void)value;
#endif
  }

  // After this rank has printed its error: ends every rank of the job.
  void abort_on_error() {
#ifdef XFMR_WITH_MPI
    if (size_ > 1) {
      std::cerr.flush();
      std::cout.flush();
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
  }

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ~ProcessGroup() {
#ifdef XFMR_WITH_MPI
    int finalized = 0;
    if (initialised_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
#endif
  }

 private:
  ProcessGroup() {
#ifdef XFMR_WITH_MPI
    if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE")) return;
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    initialised_ = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    distributed() = size_ > 1;
#endif
  }

#ifdef XFMR_WITH_MPI
  template <class T>
  static MPI_Datatype mpi_type() {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else return MPI_INT64_T;
  }
  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    detail::fail(call, " failed on rank ", rank_, " of ", size_, ": ", std::string(text, std::size_t(len)));
  }
  bool initialised_ = false;
#endif
  int rank_ = 0, size_ = 1;
};

}  // namespace xfmr
