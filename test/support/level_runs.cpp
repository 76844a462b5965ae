// A suite run again at a forced CPU level (test/CMakeLists.txt's
// name@level, XFMR_CPU_LEVEL) or with bf16 products capped below
// AVX512-BF16 (test_bf16@sgemm, ONEDNN_MAX_CPU_ISA) repeats the plain run
// where that is what the CPU runs anyway (an AVX2-only CPU's best level is
// avx2; without AVX-512 no bf16 product is native): such a run, registered
// with XFMR_TEST_SKIP_REPEAT=1, stops here, and CTest counts it skipped (its
// SKIP_REGULAR_EXPRESSION). Without that variable (a developer's own
// XFMR_CPU_LEVEL) every suite runs.
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>

#include <boost/test/unit_test.hpp>

#include "xfmr/backend/cpu/kernels.hpp"

namespace {

struct SkipRepeatedRuns {
  SkipRepeatedRuns() {
    const char* asked = std::getenv("XFMR_TEST_SKIP_REPEAT");
    if (!asked || std::string_view(asked) != "1") return;
    const xfmr::CpuLevel best = xfmr::best_cpu_level();
    const char* level = std::getenv("XFMR_CPU_LEVEL");
    const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
    if (level && std::string_view(level) == xfmr::cpu_level_name(best))
      stop(std::string("XFMR_CPU_LEVEL=") + level + " is this CPU's best level");
    if (cap && best != xfmr::CpuLevel::avx512)
      stop(std::string("ONEDNN_MAX_CPU_ISA=") + cap + ": this CPU has no AVX-512, so no bf16 product is native");
  }
  [[noreturn]] static void stop(const std::string& why) {
    std::cout << why << ": the run without it covers this one" << std::endl;
    std::exit(0);
  }
};

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(SkipRepeatedRuns);
