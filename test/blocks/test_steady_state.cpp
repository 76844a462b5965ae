// After the first step at a given (B, T), a training step (forward + backward)
// of a block, and of a model with its loss and AdamW, allocates nothing:
// every buffer is grows-only and was sized by the first step; nor does a
// decoding step through the KV cache, nor a Trainer step. Counted by
// replacing the global operator new, the aligned forms (every tensor and
// buffer) included, for all of tests_numerics: the count only ever
// increments. Under AddressSanitizer the operators stay the sanitizer's (it
// checks new against delete for every suite) and this suite is skipped.
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <new>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/blocks/decoder_block.hpp"
#include "xfmr/blocks/encoder_block.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/layers/kv_cache.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define XFMR_STEADY_STATE_COUNTS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XFMR_STEADY_STATE_COUNTS 0
#endif
#endif
#ifndef XFMR_STEADY_STATE_COUNTS
#define XFMR_STEADY_STATE_COUNTS 1
#endif

namespace steady_state {
std::atomic<long> allocations{0};
}

#if XFMR_STEADY_STATE_COUNTS
// GCC 12 flags malloc/free inside replaced operators as mismatched; they are
// paired by construction here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  ++steady_state::allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void* operator new(std::size_t n, std::align_val_t a) {
  ++steady_state::allocations;
  const std::size_t align = std::size_t(a), size = (n + align - 1) / align * align;
  if (void* p = std::aligned_alloc(align, size ? size : align)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

BOOST_AUTO_TEST_SUITE(test_steady_state,
                      *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                        boost::test_tools::assertion_result counts(XFMR_STEADY_STATE_COUNTS != 0);
                        counts.message() << "operator new is AddressSanitizer's in this build";
                        return counts;
                      }))

using namespace xfmr;
using steady_state::allocations;

namespace {

struct Cfg {
  static constexpr int MAX_T = 32, D_MODEL = 64, N_HEADS = 4, N_LAYERS = 1, D_FF = 256;
  using Norm = PreNorm;
  using Activation = Gelu;
};
using Be = CpuBackend<float>;
struct Longer : Cfg {
  static constexpr int MAX_T = 128, N_LAYERS = 2;
};

}  // namespace

BOOST_AUTO_TEST_CASE(decoder_block_step_allocates_nothing_after_the_first) {
  Rng rng(1);
  Be be;
  DecoderBlock<Cfg, Be> warm(rng, 0.1f), block(rng, 0.1f);
  const Shape tgt{8, 32}, src{8, 24};
  std::vector<float> x(tgt.rows() * 64, 0.5f), mem(src.rows() * 64, -0.25f), y(x.size()), dy(x.size(), 1e-3f),
      dx(x.size()), dmem(mem.size());
  std::vector<std::uint8_t> src_pad(src.rows(), 0);
  src_pad[5] = 1;
  // The GEMM library makes its kernels for a kind of product once a process
  // (oneDNN's JIT): a first block goes through both shapes before the
  // counted one starts, so what is counted is the block's own memory.
  auto step_of = [&](DecoderBlock<Cfg, Be>& b, Shape t) {
    b.forward(be, ConstRows<float, 64>(x.data(), t.rows()), ConstRows<float, 64>(mem.data(), src.rows()),
              Rows<float, 64>(y.data(), t.rows()), t, src, nullptr, src_pad.data());
    b.backward(be, ConstRows<float, 64>(dy.data(), t.rows()), Rows<float, 64>(dx.data(), t.rows()),
               Rows<float, 64>(dmem.data(), src.rows()));
  };
  step_of(warm, tgt);
  step_of(warm, Shape{8, 16});
  auto step = [&](Shape t) { step_of(block, t); };
  step(tgt);  // sizes every buffer
  const long before = allocations.load();
  for (int i = 0; i < 3; ++i) step(tgt);
  step(Shape{8, 16});  // a shorter batch fits in the same buffers
  const long during = allocations.load() - before;
  BOOST_TEST(during == 0, during << " heap allocations in steady-state steps");
}

// A model's training steps 3 to 10 (forward, cross-entropy, backward,
// AdamW) at T = 128, past the rows attention takes row by row, without and
// with dropout, under every recompute mode; then decoding steps through
// the KV cache.
BOOST_AUTO_TEST_CASE(model_steps_and_cached_decoding_allocate_nothing_after_the_first) {
  const int B = 4, T = 128, V = 40;
  std::vector<std::int32_t> ids(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) ids[i] = i % V, targets[i] = (i + 1) % V;
  std::vector<float> dlogits(std::size_t(B) * T * V);
  for (Recompute recompute : {Recompute::none, Recompute::cheap, Recompute::block}) {
    for (float dropout : {0.0f, 0.1f}) {
      BOOST_TEST_CONTEXT("recompute " << recompute_name(recompute) << ", dropout " << dropout) {
        Be be;
        Decoder<Longer, Be> model(V, 3, {.dropout = dropout, .attention_dropout = dropout, .recompute = recompute});
        AdamW<Be> opt(model);
        CrossEntropyLoss<Be> ce;
        long during = 0;
        for (int step = 1; step <= 10; ++step) {
          const long before = allocations.load();
          ce.forward(be, model.forward(be, ids, Shape{B, T}), targets, V);
          ce.backward(be, dlogits);
          model.backward(be, dlogits);
          opt.step(be, 1e-3);
          if (step >= 3) during += allocations.load() - before;
        }
        BOOST_TEST(during == 0, during << " heap allocations in training steps 3 to 10");
        DecodingCache<Be> cache;
        model.set_training(false);
        model.start_cache(cache, 1);
        during = 0;
        for (int step = 1; step <= 10; ++step) {
          const long before = allocations.load();
          const std::int32_t id = step % V;
          model.forward_cached(be, std::span<const std::int32_t>(&id, 1), 1, cache);
          if (step >= 3) during += allocations.load() - before;
        }
        BOOST_TEST(during == 0, during << " heap allocations in decoding steps 3 to 10");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_counter_sees_allocations) {
  // Negative controls: the replaced operator new is really in use, the
  // aligned form too, and a model's step at a longer T than any before
  // (its buffers and the workspace grow) is seen allocating.
  long before = allocations.load();
  auto* v = new std::vector<float>(100);
  delete v;
  BOOST_TEST(allocations.load() - before >= 2);
  before = allocations.load();
  AlignedVector<float> aligned(100);
  BOOST_TEST(allocations.load() - before == 1);
  Be be;
  Decoder<Cfg, Be> model(40, 3, {.recompute = Recompute::block});
  std::vector<std::int32_t> ids(64, 1);
  std::vector<float> dlogits(64 * 40, 1e-3f);
  for (int T : {16, 16, 32}) {
    before = allocations.load();
    model.forward(be, std::span<const std::int32_t>(ids).first(std::size_t(2) * T), Shape{2, T});
    model.backward(be, std::span<const float>(dlogits).first(std::size_t(2) * T * 40));
  }
  BOOST_TEST(allocations.load() - before > 0);
}

// The same through Trainer::step (gradient clipping on; the batch on one
// model, and split over two replicas): steps 3 to 10 allocate nothing.
BOOST_AUTO_TEST_CASE(trainer_steps_allocate_nothing_after_the_first) {
  using Model = Decoder<Longer, Be>;
  const int B = 4, T = 128, V = 40;
  std::vector<std::int32_t> ids(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) ids[i] = i % V, targets[i] = (i + 1) % V;
  for (Recompute recompute : {Recompute::none, Recompute::cheap, Recompute::block}) {
    for (int shards : {1, 2}) {
      BOOST_TEST_CONTEXT("recompute " << recompute_name(recompute) << ", " << shards << " shards") {
        const DecoderOptions opts{.dropout = 0.1f, .recompute = recompute};
        Be be;
        Model model(V, 3, opts);
        AdamW<Be> opt(model);
        Trainer<Model, Be> trainer(model, be, opt, {.clip = 1.0, .split = {.shards = shards}},
                                   [&] { return std::make_unique<Model>(V, 3, opts); });
        const auto forward = [&](const Shard& s, Model& m, Be& b) {
          return m.forward(b, std::span<const std::int32_t>(ids).subspan(std::size_t(s.begin) * T, std::size_t(s.size()) * T),
                           Shape{s.size(), T});
        };
        long during = 0;
        for (int step = 1; step <= 10; ++step) {
          const long before = allocations.load();
          trainer.step([&](int) { return BatchTargets{B, targets}; }, forward);
          if (step >= 3) during += allocations.load() - before;
        }
        BOOST_TEST(during == 0, during << " heap allocations in Trainer steps 3 to 10");
      }
    }
  }
}

// Generation through the KV cache, sampling (top-k, temperature): in a
// Generator's second call, the tokens after the second allocate nothing,
// the context's shifts included (60 tokens of a 32-token model; the first
// call sized the shift's buffers).
BOOST_AUTO_TEST_CASE(generation_allocates_nothing_a_token) {
  Be be;
  Decoder<Cfg, Be> model(40, 3);
  Generator<Decoder<Cfg, Be>, Be> generator(model, be);
  Rng rng(5);
  const GenerateOptions opts{.sampling = {.temperature = 0.8, .top_k = 10}, .max_tokens = 60};
  generator({1, 2, 3}, opts, rng);
  std::vector<long> at;
  at.reserve(100);
  generator({1, 2, 3}, opts, rng, [&](std::int32_t) { at.push_back(allocations.load()); });
  BOOST_TEST_REQUIRE(at.size() == 60u);
  BOOST_TEST(at.back() - at[1] == 0, at.back() - at[1] << " heap allocations in tokens 3 to 60");
}

BOOST_AUTO_TEST_SUITE_END()
