// dynamic_vs_static: the speed a Dynamic model pays against the static type
// of the same shape and parts (docs/DESIGN.md, "Static or Dynamic sizes"),
// side by side in one run: a preset's static DecoderModel and the model of
// every size and part Dynamic (make_language_model: AnyParts), their
// Trainer steps (forward, backward, AdamW, the batch split over the cores)
// or their cached decoding steps timed in alternating rounds, the median of
// each. Built on demand (not by the tests):
//
//   cmake --build build/release --target xfmr-dynamic-vs-static
//   build/release/benchmark/xfmr-dynamic-vs-static [rounds]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/train/trainer.hpp"

using namespace xfmr;
using Be = CpuBackend<float>;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Static configurations of the presets timed (presets.hpp holds them as
// values; static_of checks that the two agree).
template <int T, int D, int H, int L, int FF, class Act>
struct GptShape {
  static constexpr int MAX_T = T, D_MODEL = D, N_HEADS = H, N_LAYERS = L, D_FF = FF;
  using Norm = PreNorm;
  using Activation = Act;
  using Positions = Learned;
};
using ShakespeareSmall = GptShape<32, 64, 4, 4, 256, Relu>;
using ShakespeareMid = GptShape<128, 128, 4, 4, 512, Relu>;
using ShakespeareLarge = GptShape<256, 384, 6, 6, 1536, Relu>;
using Gpt2Small = GptShape<1024, 768, 12, 12, 3072, Gelu>;
template <class Cfg>
void check_static(const char* name) {
  require(preset_info<Cfg>().dims() == LanguageModelPresets::info(name).dims(), "the static ", name,
          " is not the preset's architecture");
}

// Seconds a training step takes, `steps` steps a sample.
struct Stepper {
  Stepper(std::unique_ptr<LanguageModel<Be>> m, Be& be, int batch, int length, const std::vector<std::int32_t>& text)
      : model(std::move(m)), opt(*model), trainer(*model, be, opt, {.data_seed = 1}), B(batch), T(length),
        batches(text, batch, length),
        x(B * T), y(B * T) {}
  double time(int steps) {
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i)
      trainer.step(
          [&](int) {
            batches.sample(trainer.data_rng(), x.data(), y.data());
            return BatchTargets{B, y};
          },
          [&](const Shard& s, LanguageModel<Be>& m, Be& b) {
            return m.forward(b, std::span(x).subspan(s.begin * T, s.size() * T), {s.size(), T});
          });
    return std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  }
  std::unique_ptr<LanguageModel<Be>> model;
  AdamW<Be> opt;
  Trainer<LanguageModel<Be>, Be> trainer;
  int B, T;
  LmBatcher batches;
  std::vector<std::int32_t> x, y;
};

template <class Cfg>
void training(const char* name, int B, int steps, int rounds) {
  Be be;
  const int V = 65, T = Cfg::MAX_T;
  std::vector<std::int32_t> text(20000);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = std::int32_t((i * 7 + i / 13) % V);
  check_static<Cfg>(name);
  Stepper fixed(make_decoder_model<Cfg, Be>(V, 1, {}), be, B, T, text);
  Stepper dynamic(make_language_model<Be>(name, V, 1), be, B, T, text);
  fixed.time(2), dynamic.time(2);  // warm: buffers, the BLAS's threads
  std::vector<double> a, b;
  for (int r = 0; r < rounds; ++r) {
    a.push_back(fixed.time(steps));
    b.push_back(dynamic.time(steps));
  }
  const double s = median(a), d = median(b);
  std::printf("%-18s train B%-3d T%-4d  static %8.2f ms  Dynamic %8.2f ms  Dynamic/static %.3f\n", name, B, T,
              s * 1e3, d * 1e3, d / s);
}

void decoding(int tokens, int rounds) {
  Be be;
  const int V = 50257;
  check_static<Gpt2Small>("gpt2-small");
  auto fixed = make_decoder_model<Gpt2Small, Be>(V, 1, {.tie_weights = true, .head_bias = false});
  auto dynamic = make_language_model<Be>("gpt2-small", V, 1, {.tie_weights = true, .head_bias = false});
  fixed->set_training(false), dynamic->set_training(false);
  auto time = [&](LanguageModel<Be>& m) {
    DecodingCache<Be> cache;
    m.start_cache(cache, 1);
    std::int32_t id = 464;
    const auto t0 = Clock::now();
    for (int i = 0; i < tokens; ++i) {
      const auto logits = m.forward_cached(be, std::span<const std::int32_t>(&id, 1), 1, cache);
      id = std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    return std::chrono::duration<double>(Clock::now() - t0).count() / tokens;
  };
  time(*fixed), time(*dynamic);
  std::vector<double> a, b;
  for (int r = 0; r < rounds; ++r) {
    a.push_back(time(*fixed));
    b.push_back(time(*dynamic));
  }
  const double s = median(a), d = median(b);
  std::printf("%-18s decode %d tokens    static %8.2f ms  Dynamic %8.2f ms  Dynamic/static %.3f  (a token)\n",
              "gpt2-small", tokens, s * 1e3, d * 1e3, d / s);
}

}  // namespace

int main(int argc, char** argv) try {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  require(rounds > 0, "rounds ", rounds, " must be positive");
  training<ShakespeareSmall>("shakespeare-small", 64, 20, rounds);
  training<ShakespeareMid>("shakespeare-mid", 16, 4, rounds);
  training<ShakespeareLarge>("shakespeare-large", 8, 1, rounds);
  decoding(64, rounds);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "xfmr-dynamic-vs-static: %s\n", e.what());
  return 1;
}
