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
// line between the cores moved between 0.07 and 0.8 us, and at 0.4 us the
// partner made shakespeare-small's decoding step 2x slower instead of 10%
// faster. So by default (PartnerPolicy::measured) the caller times every
// product per multiply-add, paired and alone, keeps a running cost of each
// and goes the cheaper way (PartnerChoice), for each size class of products
// (4x steps): a handoff's fixed cost weighs on small products, so on the
// same cores the translator's 768 x 256 projections gain from the partner
// while shakespeare-small's 192 x 64 ones lose. Now and then the choice
// explores the other way, so that it follows the machine, and it changes
// way only on such a fresh measurement (PartnerChoice says when). Waking
// the partner costs tens of microseconds on such a VM, so a steady choice
// must not explore often; a paired call that finds the partner asleep
// wakes it for the calls to come and runs alone, untimed.
//
// run_lockstep is the other way to share: a whole decoding step in two
// lanes, lane 0 on the caller and lane 1 on the partner, each holding half
// of every layer's products and its own copy of the residual stream. The
// lanes meet after each sublayer to swap their partial sums (Lockstep::
// exchange): one cache line's one-way trip each way, at once, instead of a
// handoff's four per product. The same measured choice, kept for lockstep
// steps on their own, decides paired or alone; alone, the caller runs both
// lanes' shares itself.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "xfmr/backend/cpu_parallel.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr::detail {

inline constexpr auto kPartnerSpin = std::chrono::microseconds(50);
inline constexpr unsigned kPartnerExplore = 256, kPartnerExploreMax = 1u << 14, kPartnerBurst = 32;

// The measured choice of one class of calls (products of one size class, or
// decoding steps): alone or paired, from their times. Used only by the
// caller holding the partner.
//
// The current way keeps a running cost, a mean over about its last 16
// calls, in which a sample counts at most kPartnerOutlier times the cost: a
// call the OS interrupted moves it by at most 1/32; a burst's timed calls
// give the explored way's cost afresh. Calls go the current way,
// which changes only at the end of an exploring burst (kPartnerBurst calls
// the other way), when both costs are fresh, and only to a way cheaper by
// kPartnerMargin: two ways within a few percent of each other would
// otherwise take turns on noise, and each change costs cold caches (a
// core's half of every matrix, or the whole) and wake-ups. Comparing the
// current way with the other's cost from long ago would let a few slow
// calls switch to a dearer way for as long as the next exploration is away
// (up to kPartnerExploreMax calls, about 15 ms of shakespeare-small
// decoding). Bursts come after kPartnerExplore calls of the class, twice
// as many after each that confirms the current way, and at once when the
// current way's cost rises above the other's by the margin (the first
// call of all: the other is unknown). The first half of a burst
// is not timed: the caches hold what the current way reads and would make
// the way explored look dearer than it is.
inline constexpr double kPartnerOutlier = 1.5, kPartnerMargin = 1.08;

struct PartnerChoice {
  double cost[2] = {0, 0};  // [alone, paired]; 0 until timed
  unsigned calls = 0, explore_every = kPartnerExplore;
  unsigned burst = 0;     // exploring calls left
  bool paired = false;    // the current way
  bool explored = false;  // whether the last call chosen was an exploring one
  double burst_sum = 0;   // the burst's timed calls so far (each capped)
  unsigned burst_timed = 0;

  bool choose_paired() {
    if (burst == 0 && ++calls >= explore_every) {
      calls = 0;
      burst = kPartnerBurst;
      burst_sum = 0, burst_timed = 0;
    }
    explored = burst > 0;
    if (explored) {
      --burst;
      return !paired;
    }
    return paired;
  }
  // The time of the last call chosen, which went `was_paired`. A burst's
  // timed calls give the explored way's cost on their own: their mean.
  void record(bool was_paired, double sample) {
    const auto capped = [](double s, double mean) { return mean == 0 ? s : std::min(s, kPartnerOutlier * mean); };
    if (explored) {
      if (burst >= kPartnerBurst / 2) return;
      burst_sum += capped(sample, burst_timed ? burst_sum / burst_timed : 0);
      ++burst_timed;
      if (burst == 0) {
        cost[was_paired] = burst_sum / burst_timed;
        const bool cheaper = kPartnerMargin * cost[!paired] < cost[paired];
        explore_every = cheaper ? kPartnerExplore : std::min(2 * explore_every, kPartnerExploreMax);
        if (cheaper) paired = !paired;
      }
      return;
    }
    double& mean = cost[was_paired];
    mean += (capped(sample, mean) - mean) / (mean == 0 ? 1 : 16);
    if (cost[paired] > kPartnerMargin * cost[!paired]) calls = explore_every;  // explore at the next call
  }
};

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
  // it saves (see the policy). work: the product's multiply-adds; products
  // within a factor of 4 of each other share one choice. Returns when both
  // halves are done.
  template <class F>
  void run_halves(const F& half, long work) {
    if (in_use_.exchange(true, std::memory_order_acquire)) {
      half(0);
      half(1);
      return;
    }
    const PartnerPolicy policy = policy_.load(std::memory_order_relaxed);
    PartnerChoice& choice = choices_[size_class(work)];
    const bool paired = policy == PartnerPolicy::always ||
                        (policy == PartnerPolicy::measured && choice.choose_paired());
    if (paired && policy == PartnerPolicy::measured && sleeping_.load(std::memory_order_seq_cst)) {
      // Timing this call would time a wake-up (a system call), not a
      // handoff: wake the partner for the calls to come and run alone,
      // untimed.
      wake();
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
      choice.record(paired, double(ticks() - start) / double(std::max(work, 1L)));
    }
    in_use_.store(false, std::memory_order_release);
  }

  void set_policy(PartnerPolicy p) { policy_.store(p, std::memory_order_relaxed); }
  // How many lockstep steps ran with the partner on lane 1 (tests).
  std::uint64_t lockstep_pairs() const { return lockstep_pairs_.load(std::memory_order_relaxed); }

  // What the lanes of a lockstep step share: whether the partner runs lane
  // 1, and the mailboxes through which they exchange partial sums.
  class Lockstep {
   public:
    // Asked by lane 0 before its first exchange: whether the partner runs
    // lane 1. If the partner has not taken lane 1 by then, lane 0 takes it
    // back, runs both lanes' shares itself from here on, and exchanges
    // nothing (under PartnerPolicy::always it waits for the partner
    // instead). The answer is settled by the first call. Lane 1 runs only
    // on the partner: always paired.
    bool paired(int lane) {
      if (lane == 1) return true;
      if (!settled_) {
        std::uint32_t posted = kPosted;
        if (wait_) {
          spin_until([&] { return partner_->state_.load(std::memory_order_acquire) != kPosted; });
          paired_ = true;
        } else {
          paired_ = !(partner_ && partner_->state_.compare_exchange_strong(posted, kIdle, std::memory_order_acq_rel));
        }
        settled_ = true;
      }
      return paired_;
    }
    // Publishes this lane's `bytes` at mine and returns the other lane's,
    // from the same meeting (after the other lane published them). Only
    // when paired. The mailboxes alternate between two sets, so a lane may
    // publish the next meeting's values while the other still reads this
    // meeting's.
    const void* exchange(int lane, const void* mine, std::size_t bytes) {
      Partner& p = *partner_;
      const std::uint64_t n = p.published_[lane].value.load(std::memory_order_relaxed) + 1;
      std::memcpy(p.mailbox(n, lane), mine, bytes);
      p.published_[lane].value.store(n, std::memory_order_release);
      spin_until([&] { return p.published_[1 - lane].value.load(std::memory_order_acquire) >= n; });
      return p.mailbox(n, 1 - lane);
    }

   private:
    friend class Partner;
    explicit Lockstep(Partner* partner, bool wait = false) : partner_(partner), settled_(!partner), wait_(wait) {}
    Partner* partner_;  // null: alone from the start
    bool settled_, wait_, paired_ = false;
  };

  // step(0, lockstep) here and step(1, lockstep) on the partner, or both
  // lanes' work in step(0, ...) alone (the partner is busy, asleep, not
  // fast enough to take lane 1, or the measured choice says alone). The
  // lanes exchange up to `bytes` at a time. Returns when both are done.
  // step must reach an exchange (or ask paired(0)) at least once and must
  // not throw.
  template <class F>
  void run_lockstep(const F& step, std::size_t bytes) {
    if (!may_fork() || in_use_.exchange(true, std::memory_order_acquire)) {
      Lockstep alone(nullptr);
      step(0, alone);
      return;
    }
    const PartnerPolicy policy = policy_.load(std::memory_order_relaxed);
    const bool paired = policy == PartnerPolicy::always ||
                        (policy == PartnerPolicy::measured && lockstep_choice_.choose_paired());
    if (paired && policy == PartnerPolicy::measured && sleeping_.load(std::memory_order_seq_cst)) {
      wake();  // as in run_halves: time handoffs, not wake-ups
      Lockstep alone(nullptr);
      step(0, alone);
    } else {
      const std::uint64_t start = ticks();
      if (paired) {
        mail_stride_ = (bytes + 63) / 64 * 64;
        if (mail_.size() < 4 * mail_stride_) mail_.resize(4 * mail_stride_);
        Lockstep mine(this, policy == PartnerPolicy::always);
        const auto far = [this, &step] {
          Lockstep theirs(this);  // on the partner's stack, away from the caller's lines
          step(1, theirs);
        };
        post(far);
        step(0, mine);
        if (mine.paired(0)) {
          wait_done();
          lockstep_pairs_.fetch_add(1, std::memory_order_relaxed);
        }
      } else {
        Lockstep alone(nullptr);
        step(0, alone);
      }
      lockstep_choice_.record(paired, double(ticks() - start));
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

  // Size classes of 4x in multiply-adds from kGemvPartnerWork-sized products
  // (8192: qkv of a 64-wide model) up; larger ones share the last class.
  static constexpr int kSizeClasses = 6;
  static int size_class(long work) {
    int c = 0;
    for (long w = work >> 13; w >= 4 && c < kSizeClasses - 1; w >>= 2) ++c;
    return c;
  }

  // Posts half(1), runs half(0), then takes half(1) back or waits for it.
  template <class F>
  void run_paired(const F& half) {
    const auto far = [&] { half(1); };
    post(far);
    half(0);
    std::uint32_t posted = kPosted;
    if (state_.compare_exchange_strong(posted, kIdle, std::memory_order_acq_rel)) half(1);  // never started: take it back
    else wait_done();
  }

  // Posts job() for the partner (waking it if asleep).
  template <class G>
  void post(const G& job) {
    job_ = [](const void* g) { (*static_cast<const G*>(g))(); };
    arg_ = &job;
    state_.store(kPosted, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) state_.notify_one();
  }
  // Waits for the partner to finish the job it took, then leaves it idle.
  void wait_done() {
    spin_until([&] { return state_.load(std::memory_order_acquire) == kDone; });
    state_.store(kIdle, std::memory_order_relaxed);
  }

  // Lockstep mailboxes: meeting n's values of lane l.
  unsigned char* mailbox(std::uint64_t n, int lane) { return mail_.data() + ((n & 1) * 2 + lane) * mail_stride_; }

  // Wakes a sleeping partner with nothing to do, so that it spins, ready
  // for the next half. kWake stays until the partner sees it (a post taken
  // back before the partner is up would leave it asleep); a post replaces
  // it, which wakes the partner just as well.
  void wake() {
    std::uint32_t idle = kIdle;
    if (state_.compare_exchange_strong(idle, kWake, std::memory_order_seq_cst)) state_.notify_one();
  }

  // Spins until done() holds, then yields the core between checks: the
  // thread waited for may share this core (descheduled by the OS).
  template <class Done>
  static void spin_until(const Done& done) {
    for (int spins = 0; !done(); ++spins) {
      if (spins < 4096) pause();
      else std::this_thread::yield();
    }
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
  PartnerChoice choices_[kSizeClasses];
  PartnerChoice lockstep_choice_;  // per step: ticks paired against alone
  std::atomic<std::uint64_t> lockstep_pairs_{0};
  struct alignas(64) Published {
    std::atomic<std::uint64_t> value{0};  // the last meeting this lane published
  };
  Published published_[2];
  AlignedVector<unsigned char> mail_;  // [2 sets][2 lanes][mail_stride_ bytes]
  std::size_t mail_stride_ = 0;
  void (*job_)(const void*) = nullptr;  // written before kPosted is published
  const void* arg_ = nullptr;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace xfmr::detail
