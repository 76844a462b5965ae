// schedules.hpp: learning rate as a function of the step (0-based).
//
//   constant   lr
//   cosine     linear warmup from 0 over `warmup` steps, then cosine decay
//              to min_lr at `total`
//   onecycle   torch's OneCycleLR (cosine annealing): from max_lr/div_factor
//              up to max_lr over pct_start*total steps, then down to
//              max_lr/(div_factor*final_div_factor) at total
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "xfmr/core/error.hpp"

namespace xfmr {

struct LrSchedule {
  enum class Kind { Constant, WarmupCosine, OneCycle };
  Kind kind = Kind::Constant;
  double lr = 1e-3;            // the peak (max_lr for OneCycle)
  long total = 1;              // steps the schedule spans
  long warmup = 0;             // WarmupCosine
  double min_lr = 0.0;         // WarmupCosine
  double pct_start = 0.3;      // OneCycle
  double div_factor = 25.0;    // OneCycle
  double final_div_factor = 1e4;

  static LrSchedule parse(const std::string& name, double lr, long total) {
    LrSchedule s;
    s.lr = lr;
    s.total = std::max(1L, total);
    if (name == "constant") {
      s.kind = Kind::Constant;
    } else if (name == "cosine") {
      s.kind = Kind::WarmupCosine;
      s.warmup = std::min(s.total / 10, 1000L);
      s.min_lr = lr / 10;
    } else if (name == "onecycle") {
      s.kind = Kind::OneCycle;
    } else {
      detail::fail("unknown schedule '", name, "' (expected constant, cosine or onecycle)");
    }
    return s;
  }

  double at(long step) const {
    switch (kind) {
      case Kind::Constant:
        return lr;
      case Kind::WarmupCosine: {
        if (step < warmup) return lr * double(step + 1) / double(warmup);
        const double t = std::clamp(double(step - warmup) / double(std::max(1L, total - warmup)), 0.0, 1.0);
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * t));
      }
      case Kind::OneCycle: {
        const double initial = lr / div_factor, final_lr = initial / final_div_factor;
        const double up = pct_start * double(total) - 1.0;  // torch's phase boundary
        const double s = double(std::min(step, total - 1));
        auto anneal = [](double from, double to, double pct) {
          return to + (from - to) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
        };
        if (s <= up) return anneal(initial, lr, up > 0 ? s / up : 1.0);
        return anneal(lr, final_lr, (s - up) / std::max(1.0, double(total) - 1.0 - up));
      }
    }
    return lr;
  }
};

}  // namespace xfmr
