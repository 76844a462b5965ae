// rng.hpp: deterministic random numbers.
//
// Rng is a small sequential generator (splitmix64 stepping) for
// initialisation and data order; its whole state is one u64, so it
// checkpoints trivially. counter_uniform() is a stateless, counter-based
// draw (a keyed hash of (key, counter)) used by dropout (dropout_keeps), so a mask depends
// only on (seed, call, element index), never on thread count or launch shape.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace xfmr {

namespace detail {
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace detail

// Uniform in [0, 1) from the pair (key, counter); 24 random bits, enough for
// a float comparison against a dropout probability.
constexpr float counter_uniform(std::uint64_t key, std::uint64_t counter) {
  const std::uint64_t h = detail::mix64(key ^ detail::mix64(counter + 0x9e3779b97f4a7c15ULL));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// A seed of its own for one use of a run's seed (`purpose`: any constant
// naming the use, such as the data order), well mixed: seed_for(s, a) and
// seed_for(s, b) start unrelated streams.
constexpr std::uint64_t seed_for(std::uint64_t seed, std::uint64_t purpose) { return detail::mix64(seed ^ purpose); }

// Whether dropout at rate p keeps element i of the mask drawn with key: the
// one rule of every dropout mask (Dropout's, attention's; CPU and CUDA).
constexpr bool dropout_keeps(std::uint64_t key, std::uint64_t i, float p) { return counter_uniform(key, i) >= p; }

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) : state_(seed) {}
  // initialises false: the layers built from this Rng leave their weights
  // unwritten (and unallocated, core/tensor.hpp), for a loader that gives
  // them their values (DecoderOptions::initialise).
  Rng(std::uint64_t seed, bool initialises) : state_(seed), initialises_(initialises) {}
  bool initialises() const { return initialises_; }

  std::uint64_t next_u64() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return detail::mix64(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal by Box-Muller (one draw per call; simple and exact enough).
  double normal() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next_u64() % n; }

  std::uint64_t state() const { return state_; }
  void set_state(std::uint64_t s) { state_ = s; }

 private:
  std::uint64_t state_;
  bool initialises_ = true;
};

}  // namespace xfmr
