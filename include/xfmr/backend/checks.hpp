// checks.hpp: the host-side checks of what callers hand every backend (token
// ids, targets, rates, shapes), in one place: CpuBackend and CudaBackend
// (cuda/*.cu) call the same functions, so a bad input gets the same
// xfmr::Error, naming the value and the limit, on either. Token ids and
// targets are host memory on every backend (backend.hpp), so these read
// them before any device sees them.
#pragma once

#include <cstdint>

#include "xfmr/backend/backend.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr::detail {

// Every id in [0, V).
inline void check_token_ids(int n, int V, const std::int32_t* ids) {
  for (int i = 0; i < n; ++i)
    require(ids[i] >= 0 && ids[i] < V, "token id ", ids[i], " at position ", i, " out of range [0, ", V, ")");
}

// Every target in [0, V) or the ignore index.
inline void check_targets(int rows, int V, const std::int32_t* targets, int ignore_index) {
  for (int r = 0; r < rows; ++r)
    require(targets[r] == ignore_index || (targets[r] >= 0 && targets[r] < V), "target id ", targets[r], " at row ",
            r, " out of range [0, ", V, ") and not the ignore index ", ignore_index);
}

template <class S>
void check_label_smoothing(S smoothing) {
  require(smoothing >= S(0) && smoothing < S(1), "label smoothing ", smoothing, " outside [0, 1)");
}

inline void check_dropout_rate(float p) { require(p >= 0.0f && p < 1.0f, "dropout probability ", p, " outside [0, 1)"); }

// Key/value heads that divide the query heads.
inline void check_kv_heads(const AttentionDims& a) {
  require(a.kv_heads() > 0 && a.H % a.kv_heads() == 0, "attention: ", a.kv_heads(), " key/value heads do not divide ",
          a.H, " query heads");
}

// attention_backward reads keys and values without a cache's stride.
inline void check_unstrided_keys(const AttentionDims& a) {
  require(a.kv_rows() == a.Tk, "attention backward needs unstrided keys (KV_ROWS ", a.KV_ROWS, ", Tk ", a.Tk, ")");
}

}  // namespace xfmr::detail
