// The compiled part of train/report.hpp, train/run.hpp and
// train/training_loop.hpp: what a training run shows, checks and loops.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>

#include "xfmr/io/safetensors.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/data_parallel.hpp"
#include "xfmr/train/report.hpp"
#include "xfmr/train/run.hpp"
#include "xfmr/train/training_loop.hpp"

namespace xfmr {

namespace fs = std::filesystem;

// report.hpp ------------------------------------------------------------------

std::string fixed(double v, int digits) {
  if (!std::isfinite(v) || v < 0) return "-";
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  write_file_atomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

Progress::Progress(long first, long total, long tokens_per_step)
    : first_(first), total_(total), tokens_per_step_(tokens_per_step), tty_(::isatty(STDERR_FILENO)),
      every_(std::max(1L, (total - first) / 20)), t0_(Clock::now()),
      quiet_(ProcessGroup::distributed() && !ProcessGroup::world().root()) {}

void Progress::update(long step, double loss) {
  if (quiet_) return;
  const long done = step + 1 - first_;
  const double elapsed = seconds_since(t0_);
  const double tps = done * double(tokens_per_step_) / std::max(elapsed, 1e-9);
  const double eta = elapsed / std::max(1L, done) * double(total_ - step - 1);
  if (tty_) {
    const int width = 30, filled = int(width * double(step + 1) / double(total_));
    std::fprintf(stderr, "\r[%s%s] %ld/%ld  loss %.4f  %.0f tok/s  ETA %s   ", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), step + 1, total_, loss, tps, format_duration(eta).c_str());
    std::fflush(stderr);
    dirty_ = true;
  } else if ((step + 1) % every_ == 0 || step + 1 == total_) {
    std::fprintf(stderr, "step %ld/%ld  loss %.4f  %.0f tok/s  elapsed %s  ETA %s\n", step + 1, total_, loss, tps,
                 format_duration(elapsed).c_str(), format_duration(eta).c_str());
  }
  tokens_per_s_ = tps;
}

void Progress::clear_line() {
  if (tty_ && dirty_) std::fprintf(stderr, "\r%80s\r", "");
  dirty_ = false;
}

CsvLog::CsvLog(fs::path path) : path_(std::move(path)) { text_ << "step,lr,batch_loss,eval_train,eval_val\n"; }
void CsvLog::batch(long step, double lr, double loss) { text_ << step << ',' << lr << ',' << loss << ",,\n"; }
void CsvLog::eval(long step, double lr, double train, double val) {
  text_ << step << ',' << lr << ",," << train << ',' << (val >= 0 ? std::to_string(val) : "") << "\n";
}
void CsvLog::save() const {
  if (!path_.empty()) write_text_atomic(path_, text_.str());
}

void write_html_report(const std::filesystem::path& path, const std::string& title,
                       const std::vector<std::pair<std::string, std::string>>& summary,
                       const std::vector<std::pair<long, double>>& batch_loss, const std::vector<LossPoint>& evals) {
  if (path.empty()) return;
  const double W = 760, H = 360, L = 60, R = 20, T = 20, B = 40;
  long smax = 1;
  double lo = 1e300, hi = -1e300;
  auto see = [&](long s, double v) {
    if (v < 0 || !std::isfinite(v)) return;
    smax = std::max(smax, s);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  };
  for (auto [s, v] : batch_loss) see(s, v);
  for (auto& e : evals) see(e.step, e.train), see(e.step, e.val);
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  auto X = [&](double s) { return L + (W - L - R) * s / double(smax); };
  auto Y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='11'>";
  svg << "<rect width='100%' height='100%' fill='white'/>";
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4.0;
    svg << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(v) << "' y2='" << Y(v) << "' stroke='#ddd'/>";
    svg << "<text x='" << L - 6 << "' y='" << Y(v) + 4 << "' text-anchor='end'>" << std::setprecision(3) << v << "</text>";
  }
  for (int i = 0; i <= 4; ++i) {
    const double s = smax * i / 4.0;
    svg << "<text x='" << X(s) << "' y='" << H - B + 16 << "' text-anchor='middle'>" << long(s) << "</text>";
  }
  svg << "<text x='" << (L + W - R) / 2 << "' y='" << H - 6 << "' text-anchor='middle'>step</text>";
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* color, double width) {
    if (pts.empty()) return;
    svg << "<polyline fill='none' stroke='" << color << "' stroke-width='" << width << "' points='";
    for (auto [s, v] : pts) svg << X(s) << ',' << Y(v) << ' ';
    svg << "'/>";
  };
  std::vector<std::pair<double, double>> b, tr, va;
  const std::size_t stride = std::max<std::size_t>(1, batch_loss.size() / 1500);
  for (std::size_t i = 0; i < batch_loss.size(); i += stride) b.emplace_back(batch_loss[i].first, batch_loss[i].second);
  for (auto& e : evals) {
    tr.emplace_back(e.step, e.train);
    if (e.val >= 0) va.emplace_back(e.step, e.val);
  }
  polyline(b, "#9ecae1", 1);
  polyline(tr, "#08519c", 2);
  polyline(va, "#d94801", 2);
  svg << "<text x='" << W - R - 150 << "' y='" << T + 12 << "' fill='#9ecae1'>batch loss</text>";
  svg << "<text x='" << W - R - 150 << "' y='" << T + 26 << "' fill='#08519c'>train (eval)</text>";
  svg << "<text x='" << W - R - 150 << "' y='" << T + 40 << "' fill='#d94801'>val (eval)</text>";
  svg << "</svg>";
  std::ostringstream html;
  html << "<!doctype html><html><head><meta charset='utf-8'><title>" << html_escape(title)
       << "</title><style>body{font-family:sans-serif;margin:2em}td{padding:2px 12px}</style></head><body><h1>"
       << html_escape(title) << "</h1><table>";
  for (const auto& [k, v] : summary) html << "<tr><td>" << html_escape(k) << "</td><td>" << html_escape(v) << "</td></tr>";
  html << "</table><h2>Loss</h2>" << svg.str() << "</body></html>\n";
  write_text_atomic(path, html.str());
}

// run.hpp ---------------------------------------------------------------------

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

bool inside(const std::filesystem::path& path, const std::filesystem::path& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec), d = fs::weakly_canonical(dir, ec);
  const auto [end, _] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return end == d.end() && p != d;
}

void check_writable_directory(const std::string& option, const std::filesystem::path& path, bool created) {
  std::error_code ec;
  fs::path dir = path.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (created)
    while (!fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  require(fs::is_directory(dir, ec), option, " ", path.string(), ": the directory ", dir.string(),
          fs::exists(dir, ec) ? " is not a directory" : " does not exist");
  system_call([&] { return ::access(dir.c_str(), W_OK | X_OK); }, option, " ", path.string(), ": cannot write in ",
              dir.string());
}

void check_output_paths(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                        const std::string& out) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& o = outputs[i];
    if (o.path.empty()) continue;
    std::error_code ec;
    require(!fs::is_directory(o.path, ec), o.option, " ", o.path, " is a directory; it names a file to write");
    require(fs::status(o.path, ec).type() != fs::file_type::socket, o.option, " ", o.path,
            " is a socket; it names a file to write");
    require(out.empty() || !same_file(o.path, out), o.option, " ", o.path, " names the checkpoint directory --out");
    for (const NamedPath& in : inputs)
      require(in.path.empty() || !same_file(o.path, in.path), "refusing to write ", o.option, " ", o.path,
              ": it is the ", in.option, " input");
    for (std::size_t j = 0; j < i; ++j)
      require(outputs[j].path.empty() || !same_file(o.path, outputs[j].path), o.option, " and ", outputs[j].option,
              " both name ", o.path);
    require(out.empty() || !inside(o.path, out), o.option, " ", o.path, " lies inside the checkpoint directory --out ",
            out, ", which each save replaces");
    check_writable_directory(o.option, o.path, false);
    // Outputs are replaced whole (write_file_atomic): a new file takes the
    // name, and other hard links keep the old one. Said before any work.
    struct stat st {};
    if (::stat(o.path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink > 1)
      std::cerr << "warning: " << o.option << " " << o.path << " has " << st.st_nlink - 1
                << " other hard link(s); writing it gives " << o.path
                << " a new file, and the other names keep the old contents\n";
  }
}

void check_run_options(const RunOptions& r, const std::vector<NamedPath>& inputs, const std::string& resume) {
  require(r.shards >= 0 && r.shards <= kMaxShards, "--shards ", r.shards, " outside 0..", kMaxShards,
          " (0: one per thread)");
  require(r.zero == 0 || r.zero == 1, "--zero ", r.zero, " is not 0 or 1 (ZeRO stage 1 is the one there is)");
  std::vector<NamedPath> files = inputs;
  if (!resume.empty()) {
    files.push_back({"--resume", resume});
    const std::string quantised = quantised_weights(read_checkpoint_metadata(resume));
    require(quantised.empty(), "--resume ", resume, " holds ", quantised,
            " weights for decoding; resume from the float32 checkpoint they were made from");
  }
  if (!r.out.empty()) {
    check_checkpoint_destination(r.out);  // before any training, not at the first save
    check_writable_directory("--out", r.out, true);
    require(!is_checkpoint(r.out) || r.overwrite || (!resume.empty() && same_file(r.out, resume)), "--out ", r.out,
            " holds a checkpoint already: pass --overwrite to replace it",
            resume.empty() ? "" : " (this run resumes another)", ", or choose another directory");
    for (const NamedPath& in : files)
      require(in.path.empty() || !inside(in.path, r.out), "the ", in.option, " input ", in.path,
              " lies inside --out ", r.out, ", which each save replaces");
    for (const NamedPath& in : inputs)
      require(in.path.empty() || !same_file(r.out, in.path), "refusing to write --out ", r.out, ": it is the ",
              in.option, " input");
  }
  check_output_paths({{"--metrics-json", r.metrics_json}, {"--log-csv", r.log_csv}, {"--report", r.report}}, files,
                     r.out);
}

std::unique_ptr<CheckpointLock> lock_checkpoint_directory(const std::string& out) {
  auto lock = std::make_unique<CheckpointLock>(out);
  if (const int n = remove_interrupted_saves(out))
    std::cerr << "removed " << n << " director" << (n == 1 ? "y" : "ies") << " left beside " << out
              << " by interrupted saves\n";
  return lock;
}

ProcessGroup& join_ranks(RunOptions& r, std::span<const std::string> arguments, std::string_view backend,
                         bool gpu_ranks, const std::string& settings, const std::string& data) {
  ProcessGroup& group = ProcessGroup::world();
  if (group.size() > 1) {
    require(backend == "cpu" || (backend == "cuda" && gpu_ranks), "training across processes runs on the CPU backend, or on "
            "GPUs (one a rank) with an xfmr built with NCCL; not on ", backend, " here");
    // Every option (any of them may shape a collective call: --eval-batches
    // sets how many evaluations sum their losses), then what a resumed run
    // takes from its checkpoint, then the data.
    std::string line;
    for (const std::string& arg : arguments) line += arg + '\n';
    const std::vector<std::string> lines = group.all_gather(line);
    for (std::size_t k = 1; k < lines.size(); ++k) {
      if (lines[k] == lines[0]) continue;
      const auto split = [](const std::string& l) {
        std::vector<std::string> words;
        for (std::size_t i = 0, j; i < l.size(); i = j + 1) words.push_back(l.substr(i, (j = l.find('\n', i)) - i));
        return words;
      };
      const std::vector<std::string> a = split(lines[0]), b = split(lines[k]);
      std::size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      const auto shown = [&](const std::vector<std::string>& w) {
        if (i >= w.size()) return std::string("nothing more");
        if (w[i].starts_with("--"))  // an option: with its value
          return i + 1 < w.size() && !w[i + 1].starts_with("--") ? w[i] + " " + w[i + 1] : w[i];
        return i > 0 && w[i - 1].starts_with("--") ? w[i - 1] + " " + w[i] : w[i];  // a value: with its option
      };
      fail("ranks disagree on the options: at argument ", i + 1, " rank 0 has '", shown(a), "', rank ", k, " has '",
           shown(b), "'; run every rank with the same command line");
    }
    group.require_same("the settings", settings);
    group.require_same("the training data", data);
    if (!group.root()) r.log_csv.clear(), r.report.clear(), r.metrics_json.clear();
  }
  return group;
}

void check_batch_memory(const PresetInfo& p, int layers, long batch, long length, long vocab,
                        const std::string& option, bool head_by_blocks) {
  const double per_position = 4.0 * double(layers) * (10.0 * p.d_model + 2.0 * p.d_ff);
  const long rows = head_by_blocks ? std::min(batch * length, long(head_block_rows(int(vocab), 4))) : batch * length;
  const double logits = 4.0 * double(vocab) * double(rows);
  const double bytes = per_position * double(batch) * double(length) + logits;
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  require(memory <= 0 || bytes <= memory, option, ": a batch of ", batch, " sequences of ", length,
          " positions would keep at least ", std::lround(bytes / 1e9), " GB of activations, more than this "
          "machine's ", std::lround(memory / 1e9), " GB");
}

void check_batch(int batch) { require(batch >= 1 && batch <= kMaxBatch, "--batch ", batch, " outside 1..", kMaxBatch); }

void check_optimizer_options(double lr, double clip, double weight_decay) {
  require(std::isfinite(lr) && lr > 0, "--lr ", lr, " must be a positive finite number");
  require(std::isfinite(clip) && clip >= 0, "--clip ", clip, " must be a finite number >= 0 (0: no clipping)");
  require(std::isfinite(weight_decay) && weight_decay >= 0, "--weight-decay ", weight_decay,
          " must be a finite number >= 0");
}

void LmTrainingSettings::write(nlohmann::json& j) const {
  j.update({{"schedule", schedule}, {"batch", batch}, {"grad_accum", grad_accum}, {"lr", lr}, {"clip", clip},
            {"weight_decay", weight_decay}, {"val_fraction", val_fraction}, {"dropout", dropout}, {"seed", seed}});
}

void LmTrainingSettings::read(const nlohmann::json& j) {
  schedule = j.at("schedule");
  batch = json_integer<int>(j, "batch");
  grad_accum = json_integer<int>(j, "grad_accum");
  lr = j.at("lr");
  clip = j.at("clip");
  weight_decay = j.at("weight_decay");
  val_fraction = j.at("val_fraction");
  dropout = j.at("dropout");
  seed = json_integer<std::uint64_t>(j, "seed");
}

long LmTrainingSettings::resumed_steps(long given, bool given_explicitly, const Metadata& checkpoint,
                                       const std::string& dir) const {
  const long planned = parse_integer<long>(metadata_value(checkpoint, "steps", dir), dir + ": steps");
  require(planned >= 1, dir, ": steps ", planned, " is not positive");
  if (!given_explicitly) return planned;
  require(given == planned || schedule == "constant", "--steps ", given, " differs from the ", planned,
          " that the checkpoint's ", schedule, " schedule spans; resume with --steps ", planned,
          " (only a constant schedule may change it)");
  return given;
}

// training_loop.hpp -----------------------------------------------------------

TrainingOutcome TrainingLoop::run(long start, ProcessGroup& group, FunctionRef<StepResult(long)> step,
                                  FunctionRef<Evaluation(const StepResult&)> evaluate, FunctionRef<void()> save) {
  const bool root = !ProcessGroup::distributed() || ProcessGroup::world().root();
  TrainingOutcome o;
  o.start = start;
  CsvLog csv(plan_.log_csv);
  Progress progress(start, plan_.total, plan_.tokens_per_step);
  long stop = plan_.stop_after > 0 ? std::min(plan_.stop_after, plan_.total) : plan_.total;
  long k = start;
  for (; k < stop; ++k) {
    const StepResult r = step(k);
    o.batch_losses.emplace_back(k + 1, r.loss);
    csv.batch(k + 1, r.lr, r.loss);
    progress.update(k, r.loss);
    if (r.diverging && root) {
      progress.clear_line();
      std::cerr << "warning: the loss has grown from " << r.first_loss << " to " << r.loss << " by step " << r.step
                << ": training is diverging; the learning rate (" << r.lr << " at this step) is likely too high\n";
    }
    if (signals_.requested(group)) stop = k + 1;  // saved as at stop_after, without an evaluation
    if ((k + 1) % plan_.eval_every == 0 || k + 1 == stop) {
      // An evaluation that interrupted() cut short is not kept.
      const Evaluation e = signals_.stopped() ? Evaluation{} : evaluate(r);
      progress.clear_line();
      if (signals_.requested(group)) {
        stop = k + 1;
        std::cout << "step " << k + 1 << ": stopped by a signal; not evaluated" << std::endl;
      } else {
        o.last = e;
        std::cout << "step " << k + 1 << o.last.line << std::endl;
        o.evals.push_back({k + 1, o.last.train, o.last.val});
        csv.eval(k + 1, r.lr, o.last.train, o.last.val);
      }
      save();
    }
  }
  o.stop = k;
  signals_.release();
  progress.clear_line();
  o.wall_s = progress.elapsed();
  o.tokens_per_s = progress.tokens_per_second();
  if (start == plan_.total) std::cout << "already at step " << start << "; nothing to train\n";
  csv.save();
  return o;
}

}  // namespace xfmr
