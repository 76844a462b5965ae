// The attention planner (backend/attention_plan.hpp): which path each kind of
// call takes on the CPU's kernels and on CUDA's, with and without the tiled
// kernels, and that the CPU backend's entry points follow it.
#include <boost/test/unit_test.hpp>

#include "xfmr/backend/attention_plan.hpp"
#include "xfmr/backend/cpu.hpp"

#include <string>

BOOST_AUTO_TEST_SUITE(test_attention_plan)

using namespace xfmr;

namespace {
AttentionDims dims(int Tq, int Tk, int head = 64, float dropout = 0.0f) {
  AttentionDims d{2, 4, Tq, Tk, head, head};
  d.dropout = dropout;
  return d;
}
std::string path(const AttentionDims& d, AttentionUse use, const AttentionKernels& k) {
  return attention_path_name(plan_attention(d, use, k));
}
}  // namespace

BOOST_AUTO_TEST_CASE(cpu_paths) {
  const AttentionKernels cpu = cpu_attention_kernels();
  constexpr auto train = AttentionUse::training, probs = AttentionUse::probabilities;
  // Up to 64 query rows without dropout: row by row, whatever the use.
  BOOST_TEST(path(dims(32, 32), train, cpu) == "rows");
  BOOST_TEST(path(dims(64, 64), train, cpu) == "rows");
  BOOST_TEST(path(dims(1, 1000), probs, cpu) == "rows");  // a decoding step over a long cache
  // Past 64 rows, or with dropout: tiled in training, per-head GEMMs where
  // the probabilities must be kept (an attention map, a long prompt).
  BOOST_TEST(path(dims(65, 65), train, cpu) == "tiled");
  BOOST_TEST(path(dims(16, 16, 64, 0.1f), train, cpu) == "tiled");
  BOOST_TEST(path(dims(65, 65), probs, cpu) == "heads");
  BOOST_TEST(path(dims(16, 16, 64, 0.1f), probs, cpu) == "heads");
  BOOST_TEST(path(dims(300, 20, 256), train, cpu) == "tiled");  // any head width
}

BOOST_AUTO_TEST_CASE(cuda_paths) {
  constexpr auto train = AttentionUse::training, probs = AttentionUse::probabilities;
  for (bool flash : {false, true}) {
    const AttentionKernels cuda = cuda_attention_kernels(flash);
    BOOST_TEST_CONTEXT("flash_attention " << flash) {
      // The fused row kernels: up to 256 keys and heads of 128, no dropout.
      BOOST_TEST(path(dims(256, 256), train, cuda) == "rows");
      BOOST_TEST(path(dims(1, 256, 128), probs, cuda) == "rows");
      BOOST_TEST(path(dims(1, 257), probs, cuda) == "heads");
      BOOST_TEST(path(dims(100, 100, 256), probs, cuda) == "heads");
      // Past them, training tiles only where the tiled kernels are on (and
      // the heads fit them).
      BOOST_TEST(path(dims(1024, 1024), train, cuda) == std::string(flash ? "tiled" : "heads"));
      BOOST_TEST(path(dims(64, 64, 64, 0.2f), train, cuda) == std::string(flash ? "tiled" : "heads"));
      BOOST_TEST(path(dims(1024, 1024, 256), train, cuda) == "heads");
      BOOST_TEST(path(dims(1024, 1024), probs, cuda) == "heads");
    }
  }
}

// The CPU backend reports its kernels, and a layer's training forward past
// 64 rows keeps log-sum-exps (B, H, Tq), not probabilities: checked in
// test_flash_attention; here the backend's own answer.
BOOST_AUTO_TEST_CASE(cpu_backend_reports_its_kernels) {
  const CpuBackend<double> be;
  const AttentionKernels k = be.attention_kernels();
  BOOST_TEST(k.row_queries == kCpuRowQueries);
  BOOST_TEST(k.tiled);
}

BOOST_AUTO_TEST_SUITE_END()
