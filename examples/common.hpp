// common.hpp: what the example programs share of being programs: options
// and their help, commands, error reporting. What decides a run's behaviour
// is the library's (train/run.hpp, train/training_loop.hpp, train/report.hpp).
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
#include "xfmr/infer/engine.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/train/stop_signals.hpp"
#include "xfmr/train/report.hpp"
#include "xfmr/train/run.hpp"
#include "xfmr/train/trainer.hpp"
#include "xfmr/train/training_loop.hpp"

namespace xfmr::examples {

// A program built to fuzz its command line (test/fuzz: XFMR_FUZZ_CLI) stops
// once its options are checked: the work that follows is not run.
#ifdef XFMR_FUZZ_CLI
inline constexpr bool kFuzzingCommandLine = true;
#else
inline constexpr bool kFuzzingCommandLine = false;
#endif

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
    "cuda: bf16 tensor-core products, without weight copies so far); int8 (CPU): every weight matrix quantised "
    "once, a float32 scale a row (a quarter of the bytes), activations quantised a row at a time, sums in int32; "
    "or q4 (CPU): 4-bit weights in blocks of 32 with a float16 scale each, activations int8 a block at a time. "
    "Default: a quantised checkpoint's precision, else fp32";

// The precision a decoding command runs in: --precision when given, else
// a quantised checkpoint's (int8, q4: its weights as they were saved) and
// fp32 for the others.
inline std::string decoding_precision(const boost::program_options::variables_map& vm, const std::string& precision,
                                      const Metadata& checkpoint) {
  return xfmr::decoding_precision(vm.count("precision") && !vm["precision"].defaulted() ? precision : "", checkpoint);
}

// A language model's decoding options as Engine (infer/engine.hpp) takes
// them: --backend, --precision when given (else Engine decides), --tokenizer.
inline EngineOptions engine_options(const boost::program_options::variables_map& vm, const std::string& backend,
                                    const std::string& precision, const std::string& tokenizer) {
  return {.backend = backend,
          .precision = vm.count("precision") && !vm["precision"].defaulted() ? precision : std::string(),
          .tokenizer = tokenizer,
          .backend_option = "--backend",
          .precision_option = "--precision",
          .tokenizer_option = "--tokenizer"};
}

// xfmr::check_backend for a decoding command once decoding_precision has
// chosen: a precision the checkpoint chose is named as the checkpoint's.
inline void check_decoding_backend(const boost::program_options::variables_map& vm, const std::string& backend,
                                   const std::string& precision) {
  const bool given = vm.count("precision") && !vm["precision"].defaulted();
  check_backend(backend, precision, "--backend",
                given || !is_decoding_precision(precision) ? "--precision"
                                                          : "precision (the checkpoint's " + precision + " weights)");
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

// Training across processes: xfmr::join_ranks (train/run.hpp) on this
// command line, GPU ranks when xfmr has NCCL.
inline ProcessGroup& join_ranks(RunOptions& r, std::string_view backend, const std::string& settings,
                                const std::string& data) {
  bool nccl = false;
#ifdef XFMR_WITH_CUDA
  nccl = cuda::nccl_available();
#endif
  return join_ranks(r, command_line(), backend, nccl, settings, data);
}

// xfmr::check_run_options and the precision and backend names (lora: a LoRA run's, its frozen base's
// precision: any, make_frozen_base_backend's), then --out locked for this run (rank 0 alone under mpirun) and
// what interrupted saves of it left removed.
[[nodiscard]] inline std::unique_ptr<CheckpointLock> start_run(const RunOptions& r, const std::vector<NamedPath>& inputs,
                                                               const std::string& resume = "", bool lora = false) {
  check_run_options(r, inputs, resume);
  if (lora) check_precision_name(r.precision, "--precision");
  else check_training_precision(r.precision, "--precision");
  check_backend(r.backend, r.precision, "--backend", "--precision");
#ifndef XFMR_FUZZ_CLI  // (a fuzzed --out may name any directory: the lock would create its parents)
  if (!r.out.empty() && ProcessGroup::world().root()) return lock_checkpoint_directory(r.out);
#endif
  return nullptr;
}

// What a quantisation wrote, as a program says it.
inline void print_quantised(const char* program, const QuantisedCheckpoint& q, const std::string& precision,
                            const std::string& out) {
  std::cout << program << ": " << q.matrices << " weight matrices as " << precision << " in " << out << ": "
            << std::fixed << std::setprecision(2) << double(q.float_bytes) / 1e6 << " MB -> "
            << double(q.quantised_bytes) / 1e6 << " MB (" << std::setprecision(1)
            << 100.0 * double(q.quantised_bytes) / double(q.float_bytes) << "%)\n";
}

// `program quantise --checkpoint DIR --out DIR8 [--precision int8|q4]`:
// io/checkpoint.hpp's quantise_checkpoint on a checkpoint of this
// program's (`format` in its metadata), with a line saying what it wrote.
inline int run_quantise(const char* program, const char* format, int argc, char** argv) {
  namespace po = boost::program_options;
  std::string checkpoint, out, precision = "int8";
  po::options_description opts(std::string(program) + " quantise: a checkpoint for decoding (every weight matrix "
                               "int8 with a scale a row, or 4-bit in blocks of 32 with a scale each)");
  opts.add_options()("help", "show this help")("checkpoint", po::value(&checkpoint), "float32 checkpoint (required)")
      ("out", po::value(&out), "directory of the quantised checkpoint (required; replaces only a quantised checkpoint)")
      ("precision", po::value(&precision)->default_value(precision), "int8 or q4");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!checkpoint.empty() && !out.empty(), "--checkpoint DIR and --out DIR are required");
  require(is_decoding_precision(precision), "--precision '", precision, "': a checkpoint is quantised to int8 or q4");
  (void)read_checkpoint_metadata(checkpoint, format);
  check_writable_directory("--out", out, true);
#ifdef XFMR_FUZZ_CLI  // the work stops here, as in dispatch_backend
  return 0;
#endif
  const CheckpointLock lock(out);
  print_quantised(program, quantise_checkpoint(checkpoint, out, precision), precision, out);
  return 0;
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

// A dropout rate given on the command line: in [0, 1), never silently
// replaced by the preset's (as a negative or NaN rate was).
inline void check_dropout_options(const boost::program_options::variables_map& vm, float dropout,
                                  float attention_dropout) {
  if (vm.count("dropout"))
    require(dropout >= 0.0f && dropout < 1.0f, "--dropout ", dropout, " outside [0, 1)");
  require(attention_dropout >= 0.0f && attention_dropout < 1.0f, "--attention-dropout ", attention_dropout,
          " outside [0, 1)");
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
