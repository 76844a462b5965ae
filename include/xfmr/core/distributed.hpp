// distributed.hpp: data-parallel training across processes, on MPI.
//
// ProcessGroup::world() is every process `mpirun -np N` started
// (MPI_COMM_WORLD), or this process alone: when it was not started by
// mpirun (no OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment) or xfmr
// was built without MPI (src/distributed.cpp; CMake's XFMR_MPI). MPI is
// initialised on the first call and finalised at exit; no header includes
// mpi.h.
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
// and a run repeats bit for bit at the same N. The halves are there alone
// too (reduce_scatter_sum, all_gather), for ZeRO-1's sharded optimizer.
//
// Failures: abort_on_error() ends every rank (MPI_Abort) after this rank has
// said what went wrong, so that a rank that throws never leaves the others
// waiting in a collective; mpirun also ends the job when a rank dies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xfmr {

class ProcessGroup {
 public:
  // Every process mpirun started, or this one alone.
  static ProcessGroup& world();
  // Whether world() has been asked for and holds more than one rank.
  static bool distributed();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank among the ranks on its machine (the GPU it takes: one a rank).
  int local_rank() const { return local_rank_; }
  bool root() const { return rank_ == 0; }

  // v summed element-wise over the ranks, in place (see the header comment);
  // T is float, double or std::int64_t.
  template <class T>
  void all_reduce_sum(std::span<T> v);
  template <class T>
  T sum(T x) {
    all_reduce_sum(std::span<T>(&x, 1));
    return x;
  }

  // The two halves of all_reduce_sum, for ZeRO-1 (TrainerOptions::zero),
  // over a buffer cut into one part a rank: rank r's part is [bounds[r],
  // bounds[r + 1]) (N + 1 bounds, 0 first, v.size() last, none decreasing).
  // reduce_scatter_sum leaves this rank's part of v summed over the ranks
  // (the rest of v as it was); all_gather copies every rank's part of v to
  // every rank. Each element is summed in rank order whatever the parts, so
  // one after the other they are all_reduce_sum, bit for bit.
  template <class T>
  void reduce_scatter_sum(std::span<T> v, std::span<const std::size_t> bounds);
  template <class T>
  void all_gather(std::span<T> v, std::span<const std::size_t> bounds);

  // Every rank's `value`, in rank order, on every rank.
  std::vector<std::string> all_gather(const std::string& value);

  // Fails on every rank when `value` differs between ranks, naming the
  // first rank whose value differs from rank 0's and both values.
  void require_same(const std::string& what, const std::string& value);

  // After this rank has printed its error: ends every rank of the job.
  void abort_on_error();

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ~ProcessGroup();

 private:
  ProcessGroup();
  std::vector<std::size_t> even_bounds(std::size_t n) const;  // parts of n elements as even as can be
  bool initialised_ = false;  // by us, so finalised by us
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::vector<std::byte> recv_;  // reduce_scatter_sum's, kept (no page faults a call)
};

// The sequences [first, second) of a batch of n that this rank trains on:
// DataParallel's split (over min(N, n) ranks: ranks past n have none of a
// short batch), so that N ranks of one shard take the shards, and draw the
// dropout masks, one process of N shards takes.
std::pair<int, int> rank_rows(const ProcessGroup& group, int n);

}  // namespace xfmr
