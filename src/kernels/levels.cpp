// levels.cpp: the one place that decides which level's kernels run
// (backend/cpu/kernels.hpp): the processor's features from cpuid, the
// XFMR_CPU_LEVEL override, and the tables. Compiled with the library's own
// flags, as it runs before anything is known about the processor.
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/levels.hpp"
#include "xfmr/core/error.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#define XFMR_X86 1
#endif

namespace xfmr {
namespace {

struct Features {
  bool v3 = false;    // x86-64-v3: AVX, AVX2, FMA, F16C, BMI1, BMI2, LZCNT, MOVBE, and the OS saves the YMM state
  bool v4 = false;    // x86-64-v4: v3 and AVX-512 F, BW, CD, DQ, VL, and the OS saves the ZMM state
  bool vnni = false;  // AVX-512 VNNI
};

Features cpu_features() {
  Features f;
#ifdef XFMR_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned c1 = c;
  const auto bit = [](unsigned reg, int i) { return (reg >> i & 1u) != 0; };
  if (!bit(c1, 27) || !bit(c1, 28)) return f;  // OSXSAVE, AVX
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm = (xcr0_lo & 0x6u) == 0x6u, zmm = (xcr0_lo & 0xE6u) == 0xE6u;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const unsigned b7 = b, c7 = c;
  const bool lzcnt = __get_cpuid(0x80000001u, &a, &b, &c, &d) && bit(c, 5);
  f.v3 = ymm && bit(c1, 12) && bit(c1, 29) && bit(c1, 22) && bit(b7, 5) && bit(b7, 3) && bit(b7, 8) && lzcnt;
  f.v4 = f.v3 && zmm && bit(b7, 16) && bit(b7, 17) && bit(b7, 28) && bit(b7, 30) && bit(b7, 31);
  f.vnni = f.v4 && bit(c7, 11);
#endif
  return f;
}

const Features& features() {
  static const Features f = cpu_features();
  return f;
}

bool runs(CpuLevel level) {
  switch (level) {
    case CpuLevel::portable: return true;
    case CpuLevel::avx2: return features().v3;
    case CpuLevel::avx512: return features().v4;
  }
  return false;
}

// Each level's table is built the first time that level is asked for, and
// only then: building one runs code compiled for its level (the ops tables'
// initialisers use its instructions), which a lesser CPU cannot execute.
const detail::CpuKernels& table(CpuLevel level) {
  const auto with_ops = [](detail::CpuKernels k, const detail::CpuOps<float>* ops) {
    k.ops = ops;
    return k;
  };
#ifdef XFMR_X86
  const auto avx2 = [&]() -> const detail::CpuKernels& {
    static const detail::CpuKernels k = with_ops(detail::avx2::kernels(), detail::avx2_ops());
    return k;
  };
  if (level == CpuLevel::avx512) {
    static const detail::CpuKernels avx512 = [&] {
      detail::CpuKernels k = with_ops(detail::avx512::kernels(), detail::avx512_ops());
      k.int8_product_rows = features().vnni ? detail::avx512_vnni::int8_product_rows : avx2().int8_product_rows;
      k.int8_blocked = features().vnni;
      k.int8_isa = features().vnni ? "VNNI" : avx2().int8_isa;
      k.q4_product_rows = features().vnni ? detail::avx512_vnni::q4_product_rows : avx2().q4_product_rows;
      k.q4_isa = features().vnni ? "VNNI" : avx2().q4_isa;
      return k;
    }();
    return avx512;
  }
  if (level == CpuLevel::avx2) return avx2();
#endif
  static const detail::CpuKernels portable = with_ops(detail::portable::kernels(), detail::portable_ops());
  return portable;
}

constexpr CpuLevel kLevels[] = {CpuLevel::portable, CpuLevel::avx2, CpuLevel::avx512};
constexpr const char* kOverride = "XFMR_CPU_LEVEL";

enum class Choice { best, environment, program };
struct InUse {
  std::atomic<const detail::CpuKernels*> kernels{nullptr};
  std::atomic<Choice> choice{Choice::best};
};
InUse& in_use() {
  static InUse state;
  return state;
}

void require_runs(CpuLevel level, std::string_view asked_by) {
  require(runs(level), asked_by, cpu_level_name(level), ": this CPU lacks it (the best level it runs is ",
          cpu_level_name(best_cpu_level()), ")");
}

// The level XFMR_CPU_LEVEL names, or the best one when it is unset or empty.
const detail::CpuKernels& first_choice() {
  const char* forced = std::getenv(kOverride);
  if (!forced || !*forced) return table(best_cpu_level());
  for (CpuLevel level : kLevels)
    if (std::string_view(forced) == cpu_level_name(level)) {
      require_runs(level, std::string(kOverride) + "=");
      in_use().choice = Choice::environment;
      return table(level);
    }
  throw Error(std::string(kOverride) + "=" + forced + ": not a CPU level (portable, avx2, avx512)");
}

}  // namespace

const char* cpu_level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::portable: return "portable";
    case CpuLevel::avx2: return "avx2";
    case CpuLevel::avx512: return "avx512";
  }
  return "?";
}

CpuLevel best_cpu_level() {
  CpuLevel best = CpuLevel::portable;
  for (CpuLevel level : kLevels)
    if (runs(level)) best = level;
  return best;
}

std::vector<CpuLevel> supported_cpu_levels() {
  std::vector<CpuLevel> levels;
  for (CpuLevel level : kLevels)
    if (runs(level)) levels.push_back(level);
  return levels;
}

CpuLevel cpu_level() { return detail::cpu_kernels().level; }

std::string cpu_level_description() {
  const detail::CpuKernels& k = detail::cpu_kernels();
  std::string line = cpu_level_name(k.level);
  const Choice choice = in_use().choice;
  if (choice != Choice::best)
    line += std::string(" (") + (choice == Choice::environment ? kOverride : "set_cpu_level") + "; the CPU runs " +
            cpu_level_name(best_cpu_level()) + ")";
  return line + ", int8 through " + k.int8_isa;
}

void set_cpu_level(CpuLevel level) {
  require_runs(level, "CPU level ");
  in_use().kernels = &table(level);
  in_use().choice = Choice::program;
}

namespace detail {

const CpuKernels& cpu_kernels() {
  InUse& state = in_use();
  if (const CpuKernels* k = state.kernels.load(std::memory_order_acquire)) return *k;
  static const CpuKernels* const first = &first_choice();  // once, whichever thread comes first
  const CpuKernels* expected = nullptr;
  state.kernels.compare_exchange_strong(expected, first);
  return *state.kernels.load(std::memory_order_acquire);
}

const CpuOps<float>& float_ops() { return *cpu_kernels().ops; }

}  // namespace detail
}  // namespace xfmr
