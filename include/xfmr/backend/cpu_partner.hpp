// cpu_partner.hpp: detail::Partner, one extra thread that takes the second
// half of a single-row product (a decoding step's projections). Such a
// product streams its whole weight matrix from cache for a few hundred
// nanoseconds of work, less than an OpenMP fork costs, but a thread already
// spinning picks up a posted half within a cache line's round trip, and two
// cores stream the weights from two caches.
//
// The partner spins for kPartnerSpin after its last half, then sleeps until
// the next one is posted; while one caller uses it, others do both halves
// themselves. The caller takes back a half the partner has not started
// (asleep, or descheduled by the OS: it shares the cores with the OpenMP
// threads), so a product waits on the partner only while the partner works
// on it, and then yields its core after a while in case they share one.
//
// Whether a handoff pays depends on how far apart the two cores are, which
// a VM can change while it runs: on one 2-vCPU VM the round trip of a cache
// line between the cores moved between 0.07 and 0.6 us, and at 0.4 us the
// partner made shakespeare-small's decoding step 2x slower instead of 10%
// faster. So by default (PartnerPolicy::measured) the caller times every
// product per multiply-add, paired and alone, keeps a running cost of each
// and takes the cheaper; now and then a call goes the other way (explores),
// so the choice follows the machine: after kPartnerExplore calls, and twice
// as many after each exploration that confirms the choice, up to
// kPartnerExploreMax (about 15 ms of shakespeare-small decoding). Waking the
// partner costs tens of microseconds on such a VM, so a steady choice must
// not explore often. A paired call that had to wake the partner
// times the wake-up (a system call), not a handoff: it is not counted, and
// a call soon after, once the partner is up, tries it again.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace xfmr::detail {

inline constexpr auto kPartnerSpin = std::chrono::microseconds(50);
inline constexpr unsigned kPartnerExplore = 256, kPartnerExploreMax = 1u << 14;

// How run_halves splits a product: the cheaper way as measured (default),
// or always or never through the partner (tests, experiments).
enum class PartnerPolicy { measured, always, never };

class Partner {
 public:
  // The process's partner, started on first use.
  static Partner& instance() {
    static Partner partner;
    return partner;
  }

  // half(0) here and half(1) on the partner, or both here when the partner
  // is busy with another caller, has not started on it, or costs more than
  // it saves (see the policy). work: the product's multiply-adds, so that
  // products of different sizes share one cost per multiply-add. Returns
  // when both halves are done.
  template <class F>
  void run_halves(const F& half, long work) {
    if (in_use_.exchange(true, std::memory_order_acquire)) {
      half(0);
      half(1);
      return;
    }
    const bool paired = choose_paired();
    if (paired && policy_.load(std::memory_order_relaxed) == PartnerPolicy::measured &&
        sleeping_.load(std::memory_order_seq_cst)) {
      // Timing this call would time a wake-up (a system call), not a
      // handoff: wake the partner for a later call and run alone, untimed.
      wake();
      retry_ = kPartnerExplore;
      half(0);
      half(1);
    } else {
      const std::uint64_t start = ticks();
      if (paired) {
        run_paired(half);
      } else {
        half(0);
        half(1);
      }
      record(paired, double(ticks() - start) / double(std::max(work, 1L)));
    }
    in_use_.store(false, std::memory_order_release);
  }

  void set_policy(PartnerPolicy p) { policy_.store(p, std::memory_order_relaxed); }

  Partner(const Partner&) = delete;
  Partner& operator=(const Partner&) = delete;
  ~Partner() {
    state_.store(kStop, std::memory_order_seq_cst);
    state_.notify_one();
    thread_.join();
  }

 private:
  static constexpr std::uint32_t kIdle = 0, kPosted = 1, kTaken = 2, kDone = 3, kStop = 4, kWake = 5;

  Partner() : thread_([this] { loop(); }) {}

  // A cheap clock on the caller's core: the time-stamp counter, which runs at
  // a constant rate on the x86-64 processors that have AVX2 and later.
  static std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    return std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
  }

  // Called by the caller holding in_use_, as is record(): no other thread
  // touches these members. A cost of 0 is unknown, so each way is tried once
  // before they are compared.
  bool choose_paired() {
    switch (policy_.load(std::memory_order_relaxed)) {
      case PartnerPolicy::always: return true;
      case PartnerPolicy::never: return false;
      case PartnerPolicy::measured: break;
    }
    // After a wake-up, the first of the next kPartnerExplore calls that
    // finds the partner up explores it (if none does, the next exploring
    // call wakes it again).
    if (retry_ > 0) {
      --retry_;
      if (!sleeping_.load(std::memory_order_relaxed)) {
        retry_ = 0;
        explored_ = true;
        return true;
      }
    }
    explored_ = ++calls_ >= explore_every_;
    if (explored_) calls_ = 0;
    const bool paired_cheaper = cost_[1] <= cost_[0];
    return explored_ ? !paired_cheaper : paired_cheaper;
  }
  // A running mean over about the last 8 calls of one way, where an exploring
  // call (rare, and maybe after the machine changed) counts for half; a
  // sample counts at most 4 times the mean, so that one call the OS
  // interrupted does not swing the choice for long.
  void record(bool paired, double cost) {
    double& mean = cost_[paired];
    mean = mean == 0 ? cost : mean + (std::min(cost, 4 * mean) - mean) / (explored_ ? 2 : 8);
    if (explored_) {
      const bool confirmed = paired ? cost_[1] > cost_[0] : cost_[0] >= cost_[1];
      explore_every_ = confirmed ? std::min(2 * explore_every_, kPartnerExploreMax) : kPartnerExplore;
    }
  }

  // Posts half(1), runs half(0), then takes half(1) back or waits for it.
  template <class F>
  void run_paired(const F& half) {
    job_ = [](const void* f) { (*static_cast<const F*>(f))(1); };
    arg_ = &half;
    state_.store(kPosted, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) state_.notify_one();
    half(0);
    std::uint32_t posted = kPosted;
    if (state_.compare_exchange_strong(posted, kIdle, std::memory_order_acq_rel)) {
      half(1);  // the partner never started it: take it back
    } else {
      for (int spins = 0; state_.load(std::memory_order_acquire) != kDone; ++spins) {
        if (spins < 4096) pause();
        else std::this_thread::yield();
      }
      state_.store(kIdle, std::memory_order_relaxed);
    }
  }

  // Wakes a sleeping partner with nothing to do, so that it spins, ready
  // for the next half. kWake stays until the partner sees it (a post taken
  // back before the partner is up would leave it asleep); a post replaces
  // it, which wakes the partner just as well.
  void wake() {
    std::uint32_t idle = kIdle;
    if (state_.compare_exchange_strong(idle, kWake, std::memory_order_seq_cst)) state_.notify_one();
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  void loop() {
    using clock = std::chrono::steady_clock;
    auto last = clock::now();
    for (std::uint32_t spins = 0;; ++spins) {
      std::uint32_t s = state_.load(std::memory_order_acquire);
      if (s == kStop) return;
      if (s == kPosted && state_.compare_exchange_strong(s, kTaken, std::memory_order_acq_rel)) {
        job_(arg_);
        state_.store(kDone, std::memory_order_release);
        last = clock::now();
        spins = 0;
        continue;
      }
      if (s == kWake && state_.compare_exchange_strong(s, kIdle, std::memory_order_acq_rel)) {
        last = clock::now();  // woken for a half to come: spin from now
        spins = 0;
        continue;
      }
      pause();
      if ((spins & 1023) == 1023 && clock::now() - last > kPartnerSpin) {
        // Sleep until something is posted (or kWake). A post between the
        // flag and the wait is seen by the wait, which returns at once when
        // state_ is no longer idle; a post after it sees the flag and wakes
        // this thread.
        sleeping_.store(true, std::memory_order_seq_cst);
        state_.wait(kIdle, std::memory_order_seq_cst);
        sleeping_.store(false, std::memory_order_seq_cst);
        last = clock::now();
      }
    }
  }

  std::atomic<std::uint32_t> state_{kIdle};
  std::atomic<bool> in_use_{false}, sleeping_{false};
  std::atomic<PartnerPolicy> policy_{PartnerPolicy::measured};
  unsigned calls_ = 0, explore_every_ = kPartnerExplore;
  unsigned retry_ = 0;  // calls left to try a woken partner
  bool explored_ = false;
  double cost_[2] = {0, 0};  // ticks per multiply-add: [alone, paired]
  void (*job_)(const void*) = nullptr;  // written before kPosted is published
  const void* arg_ = nullptr;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace xfmr::detail
