#define BOOST_TEST_MODULE steady_state
// After the first step at a given (B, T), a training step (forward + backward)
// of a block allocates nothing: every buffer is grows-only and was sized by
// the first step. Counted by replacing the global operator new.
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <new>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"

namespace {
std::atomic<long> allocations{0};
}

// GCC 12 flags malloc/free inside replaced operators as mismatched; they are
// paired by construction here.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace xfmr;

struct Cfg {
  static constexpr int MAX_T = 32, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 1, D_FF = 256;
  using Norm = PreNorm;
  using Activation = Gelu;
};
using Be = CpuBackend<float>;

BOOST_AUTO_TEST_CASE(decoder_block_step_allocates_nothing_after_the_first) {
  Rng rng(1);
  Be be;
  DecoderBlock<Cfg, Be> block(rng, 0.1f);
  const Shape tgt{8, 32}, src{8, 24};
  std::vector<float> x(tgt.rows() * 64, 0.5f), mem(src.rows() * 64, -0.25f), y(x.size()), dy(x.size(), 1e-3f),
      dx(x.size()), dmem(mem.size());
  std::vector<std::uint8_t> src_pad(src.rows(), 0);
  src_pad[5] = 1;
  auto step = [&](Shape t) {
    block.forward(be, ConstRows<float, 64>(x.data(), t.rows()), ConstRows<float, 64>(mem.data(), src.rows()),
                  Rows<float, 64>(y.data(), t.rows()), t, src, nullptr, src_pad.data());
    block.backward(be, ConstRows<float, 64>(dy.data(), t.rows()), Rows<float, 64>(dx.data(), t.rows()),
                   Rows<float, 64>(dmem.data(), src.rows()));
  };
  step(tgt);  // sizes every buffer
  const long before = allocations.load();
  for (int i = 0; i < 3; ++i) step(tgt);
  step(Shape{8, 16});  // a shorter batch fits in the same buffers
  const long during = allocations.load() - before;
  BOOST_TEST(during == 0, during << " heap allocations in steady-state steps");
}

BOOST_AUTO_TEST_CASE(the_counter_sees_allocations) {
  // Negative control: the replaced operator new is really in use.
  const long before = allocations.load();
  auto* v = new std::vector<float>(100);
  delete v;
  BOOST_TEST(allocations.load() - before >= 2);
}
