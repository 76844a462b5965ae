// report.hpp: what a training run shows and leaves behind: the progress
// line, the CSV log of every step, and the HTML report with the loss
// curves. TrainingLoop (training_loop.hpp) keeps them; a program of one's
// own may use them alone. Compiled once (src/training_run.cpp).
#pragma once

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "xfmr/text/text.hpp"  // html_escape

namespace xfmr {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// v with `digits` decimals ("-" when it is not a finite number, or
// negative: a loss never measured), for reports.
std::string fixed(double v, int digits);
// v in the stream's default notation (six significant digits): 0.001, 5e-05.
std::string number(double v);
// "m:ss" or "h:mm:ss" ("?" for a time not known).
std::string format_duration(double seconds);

// Writes text atomically (temporary file + rename): a failed write never
// leaves a half-written file in place of an old one.
void write_text_atomic(const std::filesystem::path& path, const std::string& text);

// A progress bar on a terminal; plain lines every twentieth of the run
// otherwise. Ranks other than 0 of a distributed run report nothing.
class Progress {
 public:
  Progress(long first, long total, long tokens_per_step);
  void update(long step, double loss);  // after step `step` (0-based) of `total`
  // Call before printing a line of one's own, so it does not land mid-bar.
  void clear_line();
  double tokens_per_second() const { return tokens_per_s_; }
  double elapsed() const { return seconds_since(t0_); }

 private:
  long first_, total_, tokens_per_step_;
  bool tty_;
  long every_;
  Clock::time_point t0_;
  bool dirty_ = false;
  bool quiet_ = false;
  double tokens_per_s_ = 0;
};

// One point on the loss curves.
struct LossPoint {
  long step;
  double train, val;  // val < 0 when there is none
};

// The CSV log: step,lr,batch_loss and, at evaluations, train/val estimates.
class CsvLog {
 public:
  explicit CsvLog(std::filesystem::path path);
  void batch(long step, double lr, double loss);
  void eval(long step, double lr, double train, double val);
  void save() const;  // nothing without a path

 private:
  std::filesystem::path path_;
  std::ostringstream text_;
};

// A self-contained HTML page: a summary table and an SVG chart of the batch
// loss (thin) and the evaluation losses (train, val). Nothing without a path.
void write_html_report(const std::filesystem::path& path, const std::string& title,
                       const std::vector<std::pair<std::string, std::string>>& summary,
                       const std::vector<std::pair<long, double>>& batch_loss, const std::vector<LossPoint>& evals);

}  // namespace xfmr
