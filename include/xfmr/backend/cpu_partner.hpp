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
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace xfmr::detail {

inline constexpr auto kPartnerSpin = std::chrono::microseconds(50);

class Partner {
 public:
  // The process's partner, started on first use.
  static Partner& instance() {
    static Partner partner;
    return partner;
  }

  // half(0) here and half(1) on the partner, or both here when the partner
  // is busy with another caller or has not started on it. Returns when both
  // are done.
  template <class F>
  void run_halves(const F& half) {
    if (in_use_.exchange(true, std::memory_order_acquire)) {
      half(0);
      half(1);
      return;
    }
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
    in_use_.store(false, std::memory_order_release);
  }

  Partner(const Partner&) = delete;
  Partner& operator=(const Partner&) = delete;
  ~Partner() {
    state_.store(kStop, std::memory_order_seq_cst);
    state_.notify_one();
    thread_.join();
  }

 private:
  static constexpr std::uint32_t kIdle = 0, kPosted = 1, kTaken = 2, kDone = 3, kStop = 4;

  Partner() : thread_([this] { loop(); }) {}

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
      pause();
      if ((spins & 1023) == 1023 && clock::now() - last > kPartnerSpin) {
        // Sleep until something is posted. A post between the flag and the
        // wait is seen by the wait, which returns at once when state_ is no
        // longer idle; a post after it sees the flag and wakes this thread.
        sleeping_.store(true, std::memory_order_seq_cst);
        state_.wait(kIdle, std::memory_order_seq_cst);
        sleeping_.store(false, std::memory_order_seq_cst);
        last = clock::now();
      }
    }
  }

  std::atomic<std::uint32_t> state_{kIdle};
  std::atomic<bool> in_use_{false}, sleeping_{false};
  void (*job_)(const void*) = nullptr;  // written before kPosted is published
  const void* arg_ = nullptr;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace xfmr::detail
