// embedding.hpp: the CPU's token embeddings (layers/embedding.hpp; CUDA:
// cuda/embedding.cu).
//
//  embedding_forward(n, V, D, ids, table, y)   y[i,:] = table[ids[i],:]; checks every id in [0, V)
//  embedding_backward(n, D, ids, dy, dtable)   dtable[ids[i],:] += dy[i,:]  (accumulate, in input order)
#pragma once

#include <algorithm>
#include <cstdint>

#include "xfmr/backend/checks.hpp"
#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuEmbedding {
 public:
  void embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, S* y) {
    check_token_ids(n, V, ids);
    cpu_ops<S>().embedding_forward(n, D, ids, table, y);
  }
  void embedding_backward(int n, int D, const std::int32_t* ids, const S* dy, S* dtable) {
    cpu_ops<S>().embedding_backward(n, D, ids, dy, dtable);
  }
};

inline namespace XFMR_CPU_OPS_NS {

// The ids already checked.
template <class S>
void embedding_forward(int n, int D, const std::int32_t* ids, const S* table, S* y) {
  parallel_ranges(long(n), long(n) * D > kLightParallelWork, [=](long lo, long hi) {
    for (int i = int(lo); i < int(hi); ++i) std::copy_n(table + long(ids[i]) * D, D, y + long(i) * D);
  });
}

// Serial: rows sharing an id add into the same table row, in input order.
template <class S>
void embedding_backward(int n, int D, const std::int32_t* ids, const S* dy, S* dtable) {
  for (int i = 0; i < n; ++i) {
    S* row = dtable + long(ids[i]) * D;
    const S* g = dy + long(i) * D;
    for (int d = 0; d < D; ++d) row[d] += g[d];
  }
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuEmbedding);

}  // namespace xfmr::detail
