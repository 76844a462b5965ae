// positional.hpp: the CPU's learned or sinusoidal position tables and
// rotary positions (layers/positional.hpp; CUDA: cuda/positional.cu).
//
//  add_positions_forward(B, T, D, x, table, y)   y[b,t,:] = x[b,t,:] + table[t,:]
//  add_positions_backward(B, T, D, dy, dtable)   dtable[t,:] += sum_b dy[b,t,:]  (accumulate)
//  rope_forward(B, T, offset, H, hd, table, x, ld)
//      rotary positions, in place: in row b*T + t, head h (columns h*hd..),
//      pair (2i, 2i+1) turns by the angle of position offset + t, pair i:
//      (cos, sin) = table[(offset + t) * hd + 2i, + 1]
//  rope_backward(B, T, offset, H, hd, table, dx, ld)   the transpose (turns back), in place
#pragma once

#include "xfmr/backend/cpu/family.hpp"
#include "xfmr/backend/cpu/parallel.hpp"

namespace xfmr::detail {

template <class S>
class CpuPositional {
 public:
  void add_positions_forward(int B, int T, int D, const S* x, const S* table, S* y) {
    cpu_ops<S>().add_positions_forward(B, T, D, x, table, y);
  }
  void add_positions_backward(int B, int T, int D, const S* dy, S* dtable) {
    cpu_ops<S>().add_positions_backward(B, T, D, dy, dtable);
  }
  void rope_forward(int B, int T, int offset, int H, int hd, const S* table, S* x, int ld) {
    cpu_ops<S>().rope_forward(B, T, offset, H, hd, table, x, ld);
  }
  void rope_backward(int B, int T, int offset, int H, int hd, const S* table, S* dx, int ld) {
    cpu_ops<S>().rope_backward(B, T, offset, H, hd, table, dx, ld);
  }
};

inline namespace XFMR_CPU_OPS_NS {

template <class S>
void add_positions_forward(int B, int T, int D, const S* x, const S* table, S* y) {
  parallel_ranges(long(B) * T, long(B) * T * D > kLightParallelWork, [=](long lo, long hi) {
    for (long i_ = lo; i_ < hi; ++i_) {
      const int b = int(i_ / T), t = int(i_ % T);
      const long off = (long(b) * T + t) * D;
      for (int d = 0; d < D; ++d) y[off + d] = x[off + d] + table[long(t) * D + d];
    }
  });
}

// Parallel over t: each thread owns its table rows; the sum over b is serial.
template <class S>
void add_positions_backward(int B, int T, int D, const S* dy, S* dtable) {
  parallel_ranges(long(T), long(B) * T * D > kParallelWork, [=](long lo, long hi) {
    for (int t = int(lo); t < int(hi); ++t)
      for (int b = 0; b < B; ++b) {
        const S* g = dy + (long(b) * T + t) * D;
        for (int d = 0; d < D; ++d) dtable[long(t) * D + d] += g[d];
      }
  });
}

// Each (2i, 2i+1) pair of each head turned by its angle (sign -1: back).
template <class S>
void rotate_pairs(int B, int T, int offset, int H, int hd, const S* table, S* x, int ld, S sign) {
  parallel_ranges(long(B) * T, long(B) * T * H * hd > kLightParallelWork, [=](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      const S* cs = table + long(offset + int(r % T)) * hd;
      for (int h = 0; h < H; ++h) {
        S* v = x + r * ld + long(h) * hd;
        for (int i = 0; i < hd; i += 2) {
          const S c = cs[i], s = sign * cs[i + 1], x0 = v[i], x1 = v[i + 1];
          v[i] = x0 * c - x1 * s;
          v[i + 1] = x0 * s + x1 * c;
        }
      }
    }
  });
}

template <class S>
void rope_forward(int B, int T, int offset, int H, int hd, const S* table, S* x, int ld) {
  rotate_pairs(B, T, offset, H, hd, table, x, ld, S(1));
}

template <class S>
void rope_backward(int B, int T, int offset, int H, int hd, const S* table, S* dx, int ld) {
  rotate_pairs(B, T, offset, H, hd, table, dx, ld, S(-1));
}

}  // namespace XFMR_CPU_OPS_NS

XFMR_CPU_FAMILY(CpuPositional);

}  // namespace xfmr::detail
