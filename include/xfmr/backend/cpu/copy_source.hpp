// copy_source.hpp: reading a decoding copy's matrix from its WeightSource
// (core/weight_source.hpp), a chunk of rows at a time over the threads, for
// the copies of cpu/float_panels.hpp, bf16_products.hpp, int8_products.hpp
// and q4_products.hpp.
#pragma once

#include <exception>
#include <memory>
#include <vector>

#include "xfmr/backend/cpu/parallel.hpp"
#include "xfmr/core/weight_source.hpp"

namespace xfmr::detail {

// The memory of a decoding copy: anonymous pages, not zeroed here (the
// copy's packing writes each once), given back whole when dropped; page
// aligned. (Transparent huge pages made a TinyLlama's first token 1.5 to
// 4x slower here: the kernel zeroes each 2 MiB page as it faults.)
struct LargeBufferFree {
  std::size_t bytes = 0;
  void operator()(std::byte* p) const;
};
using LargeBuffer = std::unique_ptr<std::byte[], LargeBufferFree>;
LargeBuffer allocate_large(std::size_t bytes);

// f(r0, r1, values) for the rows of `source` in chunks of `chunk` rows (the
// last may be short), the chunks split over the threads: values the rows
// as float32, cols() apart (where they lie in memory so, there; else read
// through read_rows, and the pages read given back, release_rows). An error reading is rethrown on the caller's
// thread once every thread is done (none leaves an OpenMP region).
template <class F>
void for_each_row_chunk(const WeightSource& source, long chunk, F f) {
  const long rows = long(source.rows()), cols = long(source.cols());
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(thread_count()));
  std::exception_ptr* error = errors.data();
  const WeightSource* src = &source;
  parallel_ranges(
      rows, rows * cols > kParallelWork,
      [=](long lo, long hi) {
        try {
          std::vector<float> values;
          long kept = lo;  // rows read whose pages are not given back yet: a few MiB at a time (each a syscall)
          for (long r0 = lo; r0 < hi; r0 += chunk) {
            const long r1 = r0 + chunk < hi ? r0 + chunk : hi;
            if (const float* in_memory = src->rows_in_memory(r0, r1)) {
              f(r0, r1, in_memory);
              continue;
            }
            values.resize(std::size_t((r1 - r0) * cols));
            src->read_rows(r0, r1, values.data());
            f(r0, r1, static_cast<const float*>(values.data()));
            if ((r1 - kept) * cols >= (1L << 21) || r1 == hi) {
              src->release_rows(kept, r1);
              kept = r1;
            }
          }
        } catch (...) {
          error[thread_index()] = std::current_exception();
        }
      },
      chunk);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace xfmr::detail
