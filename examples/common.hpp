// common.hpp: what the example programs share: error reporting, progress
// display, the CSV log, the HTML report and small file helpers.
#pragma once

#include <unistd.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "xfmr/backend/factory.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/train/losses.hpp"
#include "xfmr/train/distributed.hpp"
#include "xfmr/train/stop_signals.hpp"
#include "xfmr/train/trainer.hpp"

namespace xfmr::examples {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Writes text atomically (temporary file + rename): a failed write never
// leaves a half-written file in place of an old one.
inline void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  write_file_atomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

// Parses argv into vm; prints the options and returns false on --help.
// What no option of these programs means is refused here, for every option
// at once: a word that is no option's value (`--data a.txt b.txt`), a
// negative number for an integer option (counts, sizes, steps, seeds: an
// unsigned one would wrap to 2^64 - 1), and NaN or infinity for a real one.
// Each option's own range is its command's to check.
// The arguments parse_options last read (join_ranks compares them).
inline std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

inline bool parse_options(int argc, char** argv, const boost::program_options::options_description& opts,
                          boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  command_line().assign(argv, argv + argc);
  const po::parsed_options parsed = po::command_line_parser(argc, argv).options(opts).run();
  for (const po::option& o : parsed.options)
    require(o.position_key < 0 && !o.unregistered, "unexpected argument '",
            o.original_tokens.empty() ? std::string() : o.original_tokens.back(),
            "': every value follows its option (quote a value with spaces; see --help)");
  po::store(parsed, vm);
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return false;
  }
  for (const po::option& o : parsed.options) {
    const boost::any& v = vm[o.string_key].value();
    const std::string text = o.value.empty() ? std::string() : o.value.back();
    const bool integer = v.type() == typeid(int) || v.type() == typeid(long) || v.type() == typeid(long long) ||
                         v.type() == typeid(unsigned) || v.type() == typeid(unsigned long) ||
                         v.type() == typeid(unsigned long long);
    require(!integer || !text.starts_with('-'), "--", o.string_key, " ", text,
            " is negative (counts, sizes, steps and seeds are 0 or more)");
    const double real = v.type() == typeid(double) ? boost::any_cast<double>(v)
                        : v.type() == typeid(float) ? double(boost::any_cast<float>(v))
                                                     : 0.0;
    require(std::isfinite(real), "--", o.string_key, " ", text, " is not a finite number");
  }
  po::notify(vm);
  return true;
}

// The message of a Program_options error. Boost fills a message's
// %placeholders% in a loop that never ends when a value it substitutes holds
// the placeholder itself (`--%canonical_option%` hung, found by fuzzing), so
// the values are given a fullwidth percent sign first.
class OptionError : public boost::program_options::error_with_option_name {
 public:
  explicit OptionError(const error_with_option_name& e) : error_with_option_name(e) {
    for (auto& [key, value] : m_substitutions)
      for (std::size_t at = value.find('%'); at != std::string::npos; at = value.find('%', at + 3))
        value.replace(at, 1, "\uFF05");
  }
};

// Runs a program's command, turning every error into one line on stderr and
// exit status 1 (2 for a usage error). Under mpirun with several ranks the
// line names the rank, and the job ends (ProcessGroup::abort_on_error) so
// that no other rank waits for this one.
template <class Run>
int run_command(const char* program, Run&& run) {
  const auto attempt = [&]() -> int {
    // Under mpirun: MPI starts here, and ranks other than 0 print nothing to stdout.
    if (ProcessGroup& pg = ProcessGroup::world(); !pg.root()) std::cout.setstate(std::ios::badbit);
    const std::string who = ProcessGroup::distributed()
                                ? std::string(program) + " (rank " + std::to_string(ProcessGroup::world().rank()) + ")"
                                : std::string(program);
    std::string message;  // written whole, so that the lines of several ranks do not interleave
    try {
      return run();
    } catch (const Error& e) {
      message = "\n" + who + ": error: " + e.what();
    } catch (const boost::program_options::error_with_option_name& e) {
      message = who + ": " + OptionError(e).what() + " (see --help)";
    } catch (const boost::program_options::error& e) {
      message = who + ": " + e.what() + " (see --help)";
    } catch (const nlohmann::json::exception& e) {
      message = who + ": error: malformed checkpoint state: " + e.what();
    } catch (const std::bad_alloc&) {
      message = "\n" + who + ": error: out of memory (a size in the input or the options is too large)";
    } catch (const std::exception& e) {  // a library's own exception: still one line and status 1, never an abort
      message = "\n" + who + ": error: " + e.what();
    }
    std::cerr << message + "\n" << std::flush;
    return 1;
  };
  const int status = attempt();
  if (status != 0 && ProcessGroup::distributed()) ProcessGroup::world().abort_on_error();
  return status;
}

// main() of a program of commands, `program COMMAND [options]`: the named
// command runs (through run_command) with the arguments from the command
// on; none, or --help, prints the usage line; an unknown one is named.
struct Command {
  std::string_view name;
  std::function<int(int, char**)> run;
};
inline int run_commands(const char* program, int argc, char** argv, std::initializer_list<Command> commands) {
  std::string names;
  for (const Command& c : commands) (names += names.empty() ? "" : "|") += c.name;
  const auto usage = [&] { std::cerr << "usage: " << argv[0] << " " << names << " [options]   (--help on each)\n"; };
  if (argc < 2) return usage(), 2;
  const std::string_view command = argv[1];
  if (command == "--help" || command == "-h") return usage(), 0;
  return run_command(program, [&] {
    for (const Command& c : commands)
      if (command == c.name) return c.run(argc - 1, argv + 1);
    std::cerr << program << ": unknown command '" << command << "' (" << names << ")\n";
    return 2;
  });
}

// v with `digits` decimals ("-" when it is not a finite number, or
// negative: a loss never measured), for reports.
inline std::string fixed(double v, int digits) {
  if (!std::isfinite(v) || v < 0) return "-";
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

// v in the stream's default notation (six significant digits): 0.001, 5e-05.
inline std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

inline std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

// A progress bar on a terminal; plain lines every `every` steps otherwise.
class Progress {
 public:
  // Ranks other than 0 of a distributed run report nothing.
  Progress(long first, long total, long tokens_per_step)
      : first_(first), total_(total), tokens_per_step_(tokens_per_step), tty_(::isatty(STDERR_FILENO)),
        every_(std::max(1L, (total - first) / 20)), t0_(Clock::now()),
        quiet_(ProcessGroup::distributed() && !ProcessGroup::world().root()) {}

  void update(long step, double loss) {
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
  // Call before printing a line of one's own, so it does not land mid-bar.
  void clear_line() {
    if (tty_ && dirty_) std::fprintf(stderr, "\r%80s\r", "");
    dirty_ = false;
  }
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

// Warns, once, when the Trainer finds the loss far above its start.
inline void warn_if_diverging(const StepResult& r, double first_loss, Progress& progress) {
  if (!r.diverging || (ProcessGroup::distributed() && !ProcessGroup::world().root())) return;
  progress.clear_line();
  std::cerr << "warning: the loss has grown from " << first_loss << " to " << r.loss << " by step " << r.step
            << ": training is diverging; the learning rate (" << r.lr << " at this step) is likely too high\n";
}

// One point on the loss curves.
struct LossPoint {
  long step;
  double train, val;  // val < 0 when there is none
};

// The CSV log: step,lr,batch_loss and, at evaluations, train/val estimates.
class CsvLog {
 public:
  explicit CsvLog(const std::filesystem::path& path) : path_(path) { text_ << "step,lr,batch_loss,eval_train,eval_val\n"; }
  void batch(long step, double lr, double loss) { text_ << step << ',' << lr << ',' << loss << ",,\n"; }
  void eval(long step, double lr, double train, double val) {
    text_ << step << ',' << lr << ",," << train << ',' << (val >= 0 ? std::to_string(val) : "") << "\n";
  }
  void save() const {
    if (!path_.empty()) write_text_atomic(path_, text_.str());
  }

 private:
  std::filesystem::path path_;
  std::ostringstream text_;
};

inline std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A self-contained HTML page: a summary table and an SVG chart of the batch
// loss (thin) and the evaluation losses (train, val).
inline void write_html_report(const std::filesystem::path& path, const std::string& title,
                              const std::vector<std::pair<std::string, std::string>>& summary,
                              const std::vector<std::pair<long, double>>& batch_loss,
                              const std::vector<LossPoint>& evals) {
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

// What every training program writes and runs on: its outputs, the shard
// count of a CPU step and the backend. A program's arguments derive from
// it; add_run_options declares the options once, with one help text.
struct RunOptions {
  std::string out, metrics_json, log_csv, report, backend = "cpu";
  int shards = 0;          // DataParallel shards of a CPU step (0: its default)
  int zero = 0;            // under mpirun, 1: ZeRO-1, the optimizer's state sharded over the ranks
  std::string precision = "fp32";  // or bf16: bf16 matrix products
  std::string recompute = "none";  // or cheap or block: activation recompute (block_stack.hpp)
  bool overwrite = false;  // --out may replace a checkpoint this run did not resume from
};

inline constexpr const char* kBackendHelp =
    "cpu, cuda (an NVIDIA GPU; needs xfmr built with CUDA), cuda-tf32 (the same with TF32 tensor-core GEMMs) or "
    "cuda-bf16 (activations stored in bfloat16, bf16 products, float32 weights)";
// --recompute (every training program and the bench): block_stack.hpp's modes.
inline constexpr const char* kRecomputeHelp =
    "activation recompute: none; cheap (the norms' and the activation's outputs computed again in the backward, "
    "a little more compute for less memory); or block (each block frees its activations after its forward and runs "
    "that forward again before its backward: one block's activation memory instead of every block's, for about a "
    "third more compute). The gradients are the same bit for bit";
// --model's help: the presets of `Presets` (presets.hpp), the list --model accepts.
template <class Presets>
std::string preset_help() {
  return "preset: " + Presets::list();
}
// --precision of the inference commands (sample, translate, eval).
inline constexpr const char* kDecodePrecisionHelp =
    "fp32; bf16: the products read bfloat16 copies of the weights (half the bytes they stream) and round "
    "their other operand so, summing in float32 (CPU with AVX512-BF16, elsewhere float32 with a notice; --backend "
    "cuda: bf16 tensor-core products, without weight copies so far); or int8 (CPU): every weight matrix quantised "
    "once, a float32 scale a row (a quarter of the bytes), activations and sums float32";

// The precision a decoding command runs in: --precision when given, else
// int8 for an int8 checkpoint (its weights as they were saved) and fp32
// for the others.
inline std::string decoding_precision(const boost::program_options::variables_map& vm, const std::string& precision,
                                      const Metadata& checkpoint) {
  if (vm.count("precision") && !vm["precision"].defaulted()) return precision;
  return is_int8_checkpoint(checkpoint) ? kInt8Weights : precision;
}

// --out, --metrics-json (what goes in it: `metrics`), --log-csv and
// --report (default files <program>_log.csv and <program>_report.html),
// --shards, --backend.
inline void add_run_options(boost::program_options::options_description& opts, RunOptions& r, const std::string& program,
                            const char* out_help, const char* metrics) {
  namespace po = boost::program_options;
  opts.add_options()
      ("out", po::value(&r.out), out_help)
      ("overwrite", po::bool_switch(&r.overwrite), "let --out replace an existing checkpoint (without it, only --resume's own)")
      ("metrics-json", po::value(&r.metrics_json), (std::string("write ") + metrics + " here").c_str())
      ("log-csv", po::value(&r.log_csv)->default_value(program + "_log.csv"), "per-step CSV log")
      ("report", po::value(&r.report)->default_value(program + "_report.html"), "HTML report with the loss curves")
      ("shards", po::value(&r.shards)->default_value(r.shards),
       "CPU: split each batch over this many model replicas, one a thread (0: one per thread, or 1 for models over "
       "64 MiB of parameters; 1: one model, each operation threaded instead). Results depend on it in the last bits "
       "and in dropout's masks")
      ("precision", po::value(&r.precision)->default_value(r.precision),
       "fp32, or bf16: matrix products on bfloat16 operands summed in float32, the rest in float32 (CPU with "
       "AVX512-BF16, elsewhere float32 with a notice; --backend cuda: tensor cores)")
      ("recompute", po::value(&r.recompute)->default_value(r.recompute), kRecomputeHelp)
      ("zero", po::value(&r.zero)->default_value(r.zero),
       "under mpirun: 1 shards AdamW's moments over the ranks (ZeRO-1; the same weights), 0 keeps them whole")
      ("backend", po::value(&r.backend)->default_value(r.backend), kBackendHelp);
}

// FNV-1a of s, continuing from h: a fingerprint of training data.
inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

inline std::string hex(std::uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Training across processes (mpirun -np N; train/distributed.hpp): the
// ranks, checked at start-up to run the same `settings` on the same `data`
// (what differs is named). Rank 0 alone writes the log, the report and the
// metrics; every rank takes part in saving a checkpoint (ZeRO-1 gathers the
// optimizer's state there) and rank 0 writes it. One process: nothing to do.
inline ProcessGroup& join_ranks(RunOptions& r, std::string_view backend, const std::string& settings,
                                const std::string& data) {
  ProcessGroup& group = ProcessGroup::world();
  if (group.size() > 1) {
    bool nccl = false;
#ifdef XFMR_WITH_CUDA
    nccl = cuda::nccl_available();
#endif
    require(backend == "cpu" || (backend == "cuda" && nccl), "training across processes runs on the CPU backend, or on "
            "GPUs (one a rank) with an xfmr built with NCCL; not on ", backend, " here");
    // Every option (any of them may shape a collective call: --eval-batches
    // sets how many evaluations sum their losses), then what a resumed run
    // takes from its checkpoint, then the data.
    std::string line;
    for (const std::string& arg : command_line()) line += arg + '\n';
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

// The sequences [first, second) of a batch of n that this rank trains on:
// DataParallel's split (over min(N, n) ranks: ranks past n have none of a
// short batch), so that N ranks of one shard take the shards, and draw the
// dropout masks, one process of N shards takes.
inline std::pair<int, int> rank_rows(const ProcessGroup& group, int n) {
  const int k = std::min(group.size(), n), r = group.rank();
  if (r >= k) return {n, n};
  return {int(long(n) * r / k), int(long(n) * (r + 1) / k)};
}
// A file or directory named on the command line: the option and the path.
struct NamedPath {
  std::string option, path;
};

// True when a and b name one file: two paths to it, a hard link or a
// symbolic link count as the same.
inline bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// True when `path` lies inside the directory `dir` (which need not exist).
inline bool inside(const std::filesystem::path& path, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec), d = fs::weakly_canonical(dir, ec);
  const auto [end, _] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return end == d.end() && p != d;
}

// The directory `path` will be written in (its parent) exists, or, when
// `created` (a checkpoint directory: a save makes its parents), its nearest
// existing ancestor does; and this process may write there.
inline void check_writable_directory(const std::string& option, const std::filesystem::path& path, bool created) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = path.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  if (created)
    while (!fs::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path()) dir = dir.parent_path();
  require(fs::is_directory(dir, ec), option, " ", path.string(), ": the directory ", dir.string(),
          fs::exists(dir, ec) ? " is not a directory" : " does not exist");
  require(::access(dir.c_str(), W_OK | X_OK) == 0, option, " ", path.string(), ": cannot write in ", dir.string(),
          ": ", std::strerror(errno));
}

// Checks the files a command writes against those it reads, before any work:
// no output may name an input or another output, and none may lie inside
// the checkpoint directory `out` (each save replaces it whole). An output
// that is an existing directory is refused too.
inline void check_output_paths(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                               const std::string& out = "") {
  namespace fs = std::filesystem;
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
  }
}

// Checks what add_run_options parsed, before any step: the shard count, the
// checkpoint destination (an existing checkpoint only with --overwrite, or
// when it is `resume`, the one this run continues; a directory this process
// may create or write in), and the other outputs against the `inputs` (see
// check_output_paths). Locks --out for this run (the lock returned; rank 0
// alone under mpirun) and then removes what interrupted saves of it left.
[[nodiscard]] inline std::unique_ptr<CheckpointLock> check_run_options(const RunOptions& r,
                                                                       const std::vector<NamedPath>& inputs,
                                                                       const std::string& resume = "") {
  require(r.shards >= 0 && r.shards <= kMaxShards, "--shards ", r.shards, " outside 0..", kMaxShards,
          " (0: one per thread)");
  require(r.zero == 0 || r.zero == 1, "--zero ", r.zero, " is not 0 or 1 (ZeRO stage 1 is the one there is)");
  check_training_precision(r.precision, "--precision");
  check_backend_name(r.backend, "--backend");
  std::vector<NamedPath> files = inputs;
  if (!resume.empty()) {
    files.push_back({"--resume", resume});
    require(!is_int8_checkpoint(read_checkpoint_metadata(resume)), "--resume ", resume,
            " holds int8 weights for decoding; resume from the float32 checkpoint they were made from");
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
  std::unique_ptr<CheckpointLock> lock;
#ifndef XFMR_FUZZ_CLI  // (a fuzzed --out may name any directory: the lock would create its parents)
  if (!r.out.empty() && ProcessGroup::world().root()) {
    lock = std::make_unique<CheckpointLock>(r.out);
    if (const int n = remove_interrupted_saves(r.out))
      std::cerr << "removed " << n << " director" << (n == 1 ? "y" : "ies") << " left beside " << r.out
                << " by interrupted saves\n";
  }
#endif
  return lock;
}

// `program quantise --checkpoint DIR --out DIR8`: io/checkpoint.hpp's
// quantise_checkpoint on a checkpoint of this program's (`format` in its
// metadata), with a line saying what it wrote.
inline int run_quantise(const char* program, const char* format, int argc, char** argv) {
  namespace po = boost::program_options;
  std::string checkpoint, out;
  po::options_description opts(std::string(program) +
                               " quantise: an int8 checkpoint for decoding (every weight matrix int8, a scale a row)");
  opts.add_options()("help", "show this help")("checkpoint", po::value(&checkpoint), "float32 checkpoint (required)")
      ("out", po::value(&out), "directory of the int8 checkpoint (required; replaces only an int8 checkpoint)");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!checkpoint.empty() && !out.empty(), "--checkpoint DIR and --out DIR are required");
  const Metadata md = read_checkpoint_metadata(checkpoint);
  require(md.count("format") && md.at("format") == format, checkpoint, ": not an ", format, " checkpoint");
  check_writable_directory("--out", out, true);
#ifdef XFMR_FUZZ_CLI  // the work stops here, as in dispatch_backend
  return 0;
#endif
  const CheckpointLock lock(out);
  const QuantisedCheckpoint q = quantise_checkpoint(checkpoint, out);
  std::cout << program << ": " << q.matrices << " weight matrices as int8 in " << out << ": " << std::fixed
            << std::setprecision(2) << double(q.float_bytes) / 1e6 << " MB -> " << double(q.int8_bytes) / 1e6
            << " MB (" << std::setprecision(1) << 100.0 * double(q.int8_bytes) / double(q.float_bytes) << "%)\n";
  return 0;
}

// An integer in a checkpoint's JSON, within [lo, hi]: a float, a string or a
// value out of range is an Error naming the key (nlohmann-json's conversion
// of 1e100 to an int is undefined behaviour).
template <class T>
T json_integer(const nlohmann::json& j, const char* key, T lo = std::numeric_limits<T>::min(),
               T hi = std::numeric_limits<T>::max()) {
  const nlohmann::json& v = j.at(key);
  require(v.is_number_integer(), "checkpoint value '", key, "' is ", v.is_number() ? v.dump() : v.type_name(),
          ", not an integer");
  const bool in_range = v.is_number_unsigned()
                            ? std::cmp_less_equal(v.get<std::uint64_t>(), hi)
                            : std::cmp_greater_equal(v.get<std::int64_t>(), lo) && std::cmp_less_equal(v.get<std::int64_t>(), hi);
  require(in_range, "checkpoint value '", key, "' ", v.dump(), " outside [", +lo, ", ", +hi, "]");
  return v.get<T>();
}

// --resume: a run's setting comes from the checkpoint's settings (`saved`,
// JSON); given explicitly on the command line it must agree, or the error
// names the option.
template <class T>
void take_saved(const boost::program_options::variables_map& vm, const nlohmann::json& saved, const char* option,
                const char* key, T& value, const std::string& checkpoint) {
  T s;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) s = json_integer<T>(saved, key);
  else s = saved.at(key).get<T>();
  require(!vm.count(option) || vm[option].defaulted() || value == s, "--", option, " differs from the checkpoint in ",
          checkpoint);
  value = s;
}

// --stop-after, when given: a step of the plan (0 would stop before the first).
inline void check_stop_after(const boost::program_options::variables_map& vm, long stop_after) {
  require(!vm.count("stop-after") || stop_after >= 1, "--stop-after ", stop_after,
          " must be a step of the plan, 1 or more");
}

// The most tokens a vocabulary built from training data may hold (an
// embedding row each), and the check of one: more than its `specials` (a
// vocabulary of specials alone reads every word as <unk>), at most
// kMaxVocabulary, and an embedding that trains (its weights, gradients and
// AdamW's two moments: 16 bytes a parameter) in half the machine's memory.
// `what` names the vocabulary and its file, `options` what makes it smaller.
inline constexpr std::size_t kMaxVocabulary = std::size_t(1) << 20;
inline void check_vocabulary(std::size_t size, std::size_t specials, int d_model, const std::string& what,
                             const std::string& options) {
  require(size > specials, what, " holds only its ", specials, " special tokens: every word would read as <unk> (",
          options, " keeps too few words)");
  require(size <= kMaxVocabulary, what, " has ", size, " tokens, over the limit of ", kMaxVocabulary, " (", options,
          ")");
  const double bytes = 16.0 * double(size) * d_model;
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  require(memory <= 0 || bytes <= memory / 2, what, " has ", size, " tokens, whose embedding of width ", d_model,
          " would take ", std::lround(bytes / 1e9), " GB to train, more than half this machine's ",
          std::lround(memory / 1e9), " GB (", options, ")");
}

// The memory a training batch of `batch` sequences of `length` positions
// takes at least, estimated from the model's shape (`p`, `layers` blocks in
// all): per position and block what the backward keeps (about ten rows of
// the model's width and two of the feed-forward's; attention's own, which
// depends on its path, not counted), and the logits with their gradient.
// More than the machine's memory is refused, naming `option`: a batch size
// that cannot train fails here, not in the kernel's out-of-memory killer.
inline void check_batch_memory(const PresetInfo& p, int layers, long batch, long length, long vocab,
                               const std::string& option) {
  const double per_position = 4.0 * (double(layers) * (10.0 * p.d_model + 2.0 * p.d_ff) + 2.0 * double(vocab));
  const double bytes = per_position * double(batch) * double(length);
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  require(memory <= 0 || bytes <= memory, option, ": a batch of ", batch, " sequences of ", length,
          " positions would keep at least ", std::lround(bytes / 1e9), " GB of activations, more than this "
          "machine's ", std::lround(memory / 1e9), " GB");
}

// Sequences a batch; more would overflow the batch's token count and only
// exhaust memory.
inline constexpr int kMaxBatch = 1 << 16;
inline void check_batch(int batch) { require(batch >= 1 && batch <= kMaxBatch, "--batch ", batch, " outside 1..", kMaxBatch); }

// The optimisation numbers every training program takes: a finite positive
// learning rate, a finite clip and weight decay >= 0 (NaN and infinity are
// refused, not saved into a checkpoint that then cannot resume).
inline void check_optimizer_options(double lr, double clip, double weight_decay) {
  require(std::isfinite(lr) && lr > 0, "--lr ", lr, " must be a positive finite number");
  require(std::isfinite(clip) && clip >= 0, "--clip ", clip, " must be a finite number >= 0 (0: no clipping)");
  require(std::isfinite(weight_decay) && weight_decay >= 0, "--weight-decay ", weight_decay,
          " must be a finite number >= 0");
}
// A dropout rate given on the command line: in [0, 1), never silently
// replaced by the preset's (as a negative or NaN rate was).
inline void check_dropout_options(const boost::program_options::variables_map& vm, float dropout,
                                  float attention_dropout) {
  if (vm.count("dropout"))
    require(dropout >= 0.0f && dropout < 1.0f, "--dropout ", dropout, " outside [0, 1)");
  require(attention_dropout >= 0.0f && attention_dropout < 1.0f, "--attention-dropout ", attention_dropout,
          " outside [0, 1)");
}

// The settings of a language-model run that xfmr-charlm and xfmr-lm share
// (the optimizer, the batches, the split, the seed): each program's
// RunSettings derives from it with its own defaults, writes these keys into
// the checkpoint's settings and reads them back, and on --resume asks
// agree(option, same) of each, so that an option given explicitly must
// match the checkpoint's.
struct LmTrainingSettings {
  std::string schedule = "constant";
  int batch = 16, grad_accum = 1;
  double lr = 1e-3, clip = 0.0, weight_decay = 0.01, val_fraction = 0.1;
  float dropout = -1.0f;  // < 0: the preset's
  std::uint64_t seed = 1337;

  void write(nlohmann::json& j) const {
    j.update({{"schedule", schedule}, {"batch", batch}, {"grad_accum", grad_accum}, {"lr", lr}, {"clip", clip},
              {"weight_decay", weight_decay}, {"val_fraction", val_fraction}, {"dropout", dropout}, {"seed", seed}});
  }
  void read(const nlohmann::json& j) {
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
  template <class Agree>
  void agree_with(const LmTrainingSettings& saved, Agree&& agree) const {
    agree("batch", batch == saved.batch);
    agree("grad-accum", grad_accum == saved.grad_accum);
    agree("lr", lr == saved.lr);
    agree("schedule", schedule == saved.schedule);
    agree("weight-decay", weight_decay == saved.weight_decay);
    agree("clip", clip == saved.clip);
    agree("dropout", dropout == saved.dropout);
    agree("val-fraction", val_fraction == saved.val_fraction);
    agree("seed", seed == saved.seed);
  }
};

// The steps a resumed run plans: the checkpoint's unless --steps is given.
// A schedule other than constant spans the checkpoint's steps, so another
// --steps is refused (it would bend the schedule under the resumed run); a
// constant rate may train on past them.
inline long resumed_steps(const boost::program_options::variables_map& vm, long given, const Metadata& checkpoint,
                          const std::string& dir, const std::string& schedule) {
  const long planned = parse_integer<long>(metadata_value(checkpoint, "steps", dir), dir + ": steps");
  require(planned >= 1, dir, ": steps ", planned, " is not positive");
  if (vm["steps"].defaulted()) return planned;
  require(given == planned || schedule == "constant", "--steps ", given, " differs from the ", planned,
          " that the checkpoint's ", schedule, " schedule spans; resume with --steps ", planned,
          " (only a constant schedule may change it)");
  return given;
}

// Their options, with each program's help for --lr (its AdamW) and
// --dropout (its default).
inline void add_lm_training_options(boost::program_options::options_description& opts, LmTrainingSettings& s,
                                    const char* lr_help, const char* dropout_help) {
  namespace po = boost::program_options;
  opts.add_options()
      ("batch", po::value(&s.batch)->default_value(s.batch), "sequences per batch")
      ("grad-accum", po::value(&s.grad_accum)->default_value(s.grad_accum), "micro-batches per step")
      ("lr", po::value(&s.lr)->default_value(s.lr), lr_help)
      ("schedule", po::value(&s.schedule)->default_value(s.schedule), "constant, cosine (warmup + cosine) or onecycle")
      ("weight-decay", po::value(&s.weight_decay)->default_value(s.weight_decay), "AdamW weight decay (matrices only)")
      ("clip", po::value(&s.clip)->default_value(s.clip), "global gradient-norm clip (0 = off)")
      ("dropout", po::value(&s.dropout), dropout_help)
      ("val-fraction", po::value(&s.val_fraction)->default_value(s.val_fraction), "share of the data held out")
      ("seed", po::value(&s.seed)->default_value(s.seed), "seed for initialisation, data order and dropout");
}

// --backend: xfmr::with_backend (backend/factory.hpp) under the option's
// name. A program built to fuzz its command line (test/fuzz: XFMR_FUZZ_CLI)
// stops here: everything up to here (options, checkpoint state, output
// paths) ran; the work that follows is neither run nor compiled.
template <class F>
void dispatch_backend(const std::string& name, F&& f) {
  check_backend_name(name, "--backend");
#ifdef XFMR_FUZZ_CLI
  (void)f;
#else
  with_backend(name, std::forward<F>(f));
#endif
}

}  // namespace xfmr::examples
