// run.hpp: what decides a training run's behaviour around its Trainer,
// checked before any step: the files it writes against those it reads,
// the batch's memory, a built vocabulary's size, the optimisation numbers;
// the agreement of the ranks under mpirun; the settings a language-model
// run saves in its checkpoint and a resumed run must agree with; and
// fingerprints of training data. Compiled once (src/training_run.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/hash.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/core/distributed.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {


// The outputs and placement of a training run: the checkpoint directory,
// the metrics, the log and the report, the shard count of a CPU step, the
// backend and what it computes in.
struct RunOptions {
  std::string out, metrics_json, log_csv, report, backend = "cpu";
  int shards = 0;          // DataParallel shards of a CPU step (0: its default)
  int zero = 0;            // under mpirun, 1: ZeRO-1, the optimizer's state sharded over the ranks
  std::string precision = "fp32";  // or bf16: bf16 matrix products
  std::string recompute = "none";  // or cheap or block: activation recompute (block_stack.hpp)
  bool overwrite = false;  // `out` may replace a checkpoint this run did not resume from
};

// A file or directory a run reads or writes: the option that named it and the path.
struct NamedPath {
  std::string option, path;
};

// True when a and b name one file: two paths to it, a hard link or a
// symbolic link count as the same.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);
// True when `path` lies inside the directory `dir` (which need not exist).
bool inside(const std::filesystem::path& path, const std::filesystem::path& dir);
// The directory `path` will be written in (its parent) exists, or, when
// `created` (a checkpoint directory: a save makes its parents), its nearest
// existing ancestor does; and this process may write there.
void check_writable_directory(const std::string& option, const std::filesystem::path& path, bool created);
// Checks the files a command writes against those it reads, before any work:
// no output may name an input or another output, and none may lie inside
// the checkpoint directory `out` (each save replaces it whole). An output
// that is an existing directory is refused too; one with other hard links
// is warned of on stderr (the write gives its name a new file).
void check_output_paths(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                        const std::string& out = "");
// Checks a RunOptions before any step: the shard count, ZeRO's stage, the
// checkpoint destination (an existing
// checkpoint only with `overwrite`, or when it is `resume`, the one this run
// continues; a directory this process may create or write in; no input
// inside it), and the other outputs against the `inputs`.
void check_run_options(const RunOptions& r, const std::vector<NamedPath>& inputs, const std::string& resume = "");
// Locks the checkpoint directory `out` for this run (io/checkpoint.hpp) and
// removes what interrupted saves of it left, saying so on stderr.
std::unique_ptr<CheckpointLock> lock_checkpoint_directory(const std::string& out);

// Training across processes (mpirun -np N; distributed.hpp): the ranks are
// checked to run the same `arguments` (the command line: the first that
// differs is named), the same `settings` (what a resumed run takes from its
// checkpoint) and the same `data` (its fingerprint). Rank 0 alone writes the
// log, the report and the metrics, so the others' are cleared; every rank
// takes part in saving a checkpoint and rank 0 writes it. `gpu_ranks`: the
// backend may train across processes (the CPU, or CUDA with NCCL). One
// process: nothing to check.
ProcessGroup& join_ranks(RunOptions& r, std::span<const std::string> arguments, std::string_view backend,
                         bool gpu_ranks, const std::string& settings, const std::string& data);

// (check_vocabulary, a vocabulary built from training data: text/text.hpp.)
// The memory a training batch of `batch` sequences of `length` positions
// takes at least, estimated from the model's shape (`p`, `layers` blocks in
// all): per position and block what the backward keeps (about ten rows of
// the model's width and two of the feed-forward's; attention's own, which
// depends on its path, not counted), and the logits (their gradient
// written over them): one block of head_loss's when `head_by_blocks` (a
// language model's training), else the batch's.
// More than the machine's memory is refused, naming `option`: a batch size
// that cannot train fails here, not in the kernel's out-of-memory killer.
void check_batch_memory(const PresetInfo& p, int layers, long batch, long length, long vocab, const std::string& option,
                        bool head_by_blocks = true);
// Sequences a batch; more would overflow the batch's token count and only
// exhaust memory.
inline constexpr int kMaxBatch = 1 << 16;
void check_batch(int batch);
// A finite positive learning rate, a finite clip and weight decay >= 0 (NaN
// and infinity are refused, not saved into a checkpoint that then cannot
// resume).
void check_optimizer_options(double lr, double clip, double weight_decay);

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

// The settings of a language-model run (the optimizer, the batches, the
// split, the seed) that a checkpoint records: a program's own settings
// derive from it with their defaults, write these keys into the
// checkpoint's settings and read them back; on a resume, agree_with asks
// agree(option, same) of each, so that an option given explicitly must
// match the checkpoint's.
struct LmTrainingSettings {
  std::string schedule = "constant";
  int batch = 16, grad_accum = 1;
  double lr = 1e-3, clip = 0.0, weight_decay = 0.01, val_fraction = 0.1;
  float dropout = -1.0f;  // < 0: the preset's
  std::uint64_t seed = 1337;

  void write(nlohmann::json& j) const;
  void read(const nlohmann::json& j);
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
  // The steps a resumed run plans: the checkpoint's (`planned`) unless
  // `given` is (given_explicitly); a schedule other than constant spans the
  // checkpoint's steps, so another count is refused.
  long resumed_steps(long given, bool given_explicitly, const Metadata& checkpoint, const std::string& dir) const;
};

}  // namespace xfmr
