// checkpoint.hpp: saving and restoring training state.
//
// A checkpoint is a directory, one format for every model:
//   model.safetensors      parameters by their PyTorch-style names (F32 for
//                          float models), and in __metadata__ the caller's
//                          Metadata (string keys and values: the preset, the
//                          tokenizer, the run's settings), read back without
//                          the tensors by read_checkpoint_metadata
//   optimizer.safetensors  optimizer moments by "<param>.exp_avg" etc., and
//                          the step count in __metadata__
//   trainer_state.json     TrainerState: the steps taken, the data
//                          generator's state and every dropout layer's call
//                          counter (format "xfmr-trainer", version 1)
//   tokenizer files        a language model's tokenizer, when the caller
//                          attaches it (tokenizer.json, vocab.json +
//                          merges.txt or tokenizer.bin): the checkpoint
//                          then stands alone
//   adapter files          a LoRA run's (model.safetensors then holds the
//                          adapters alone): adapter_config.json and
//                          adapter_model.safetensors, peft's (io/peft.hpp)
// Trainer::save(dir, metadata) writes one and Trainer::resume(dir) continues
// its run bit for bit (train/trainer.hpp).
// An int8 checkpoint (quantise_checkpoint) is for decoding only: its
// model.safetensors holds each two-dimensional parameter as I8 rows "<name>"
// with a F32 scale a row "<name>_scale" (the rest as they were, and
// "weights": "int8" in __metadata__), beside the trainer_state.json of the
// checkpoint it came from and no optimizer state. load_parameters reads it
// into a float model as the dequantised values scale_r q_rk; WeightCopies
// (infer/weight_copies.hpp) hands the rows themselves to a backend in int8
// precision. Training does not resume from it.
// write_checkpoint() builds the new directory beside the target, fsyncs every
// file, then swaps it in with one atomic rename (RENAME_EXCHANGE when the
// target exists), so a crash at any point leaves either the old or the new
// checkpoint whole. It refuses to replace a directory that is not an xfmr
// checkpoint, so it never overwrites unrelated user data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/io/weight_sources.hpp"
#include "xfmr/models/model.hpp"

namespace xfmr {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

// The caller's strings a checkpoint carries with its parameters.
using Metadata = std::map<std::string, std::string>;

// What resumes a run besides the parameters and the optimizer's state.
struct TrainerState {
  long step = 0;
  std::uint64_t data_rng = 0;
  std::vector<std::uint64_t> dropout_calls;
};

namespace detail {
// Through host memory, so that tensors of any backend save and load alike.
template <class Tensor>
void add_tensor(SafeTensorsWriter& w, const std::string& name, const Tensor& t) {
  using S = typename Tensor::value_type;
  std::vector<S> host(t.size());
  t.copy_to_host(host.data());
  w.add<S>(name, t.shape(), std::span<const S>(host));
}
template <class Tensor>
void load_tensor(const SafeTensors& st, const std::string& name, Tensor& t) {
  using S = typename Tensor::value_type;
  std::vector<S> host(t.size());
  st.copy_to<S>(name, t.shape(), std::span<S>(host));
  // A NaN or infinite weight or moment would load and run (printing garbage,
  // scoring at chance) and exit 0: refuse it, naming the tensor.
  const auto bad = std::find_if(host.begin(), host.end(), [](S v) { return !std::isfinite(v); });
  if (bad != host.end())
    detail::fail(st.source(), ": tensor '", name, "' holds ", *bad, " at element ", bad - host.begin(),
                 "; a checkpoint's values must be finite");
  t.copy_from_host(host.data());
}
// An I8 tensor "<name>" with its F32 scales "<name>_scale": the model's
// matrix gets scale_r q_rk (the product int8 precision computes with).
template <class Tensor>
void load_int8_tensor(const SafeTensors& st, const std::string& name, Tensor& t) {
  using S = typename Tensor::value_type;
  const std::string scale_name = name + kScaleSuffix;
  const auto& shape = st.info(name).shape;
  require(shape.size() == 2, st.source(), ": int8 tensor '", name, "' has shape ", shape_string(shape),
          "; only matrices are stored as int8");
  require(st.contains(scale_name), st.source(), ": int8 tensor '", name, "' has no scales '", scale_name, "'");
  const TensorInfo& si = st.info(scale_name);
  require(si.dtype == DType::F32 && si.shape == std::vector<std::int64_t>{shape[0]}, st.source(), ": scales '",
          scale_name, "' are ", dtype_name(si.dtype), " ", shape_string(si.shape), "; expected F32 [", shape[0], "]");
  const std::vector<float> scale = st.values<float>(scale_name);
  // What a scale computes must be finite too: scale x 127, the row's
  // largest weight (a scale of 3e38 is finite; its weights are not).
  for (std::size_t r = 0; r < scale.size(); ++r)
    require(std::isfinite(scale[r] * 127.0f) && scale[r] >= 0.0f, st.source(), ": scales '", scale_name, "' hold ",
            scale[r], " at row ", r, "; a scale must not be negative, and scale x 127 (the row's largest weight) ",
            "must be finite (a scale below ", std::numeric_limits<float>::max() / 127.0f, ")");
  const auto q = st.bytes(name);
  const std::size_t cols = std::size_t(shape[1]);
  std::vector<S> host(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    const auto v = static_cast<std::int8_t>(q[i]);
    require(v != -128, st.source(), ": int8 tensor '", name, "' holds -128 at element ", i,
            "; symmetric int8 weights lie in [-127, 127]");
    host[i] = S(scale[i / cols] * float(v));
  }
  t.copy_from_host(host.data());
}
}  // namespace detail

// Adds every parameter of `model` to `w` under its visit() name.
template <class Model>
void add_parameters(SafeTensorsWriter& w, Model& model) {
  static_assert(Parameterized<Model>, "add_parameters: the model must list its parameters with visit(f) "
                                      "(models/model.hpp)");
  model.visit([&](std::string_view name, auto& value, auto&) { detail::add_tensor(w, std::string(name), value); });
}

// Loads every parameter of `model` from `st`: each name must be present with
// the model's shape, and the file may hold no parameter the model lacks. An
// int8 matrix (with its scales) loads as its dequantised values.
template <class Model>
void load_parameters(Model& model, const SafeTensors& st, std::string_view prefix = "") {
  static_assert(Parameterized<Model>, "load_parameters: the model must list its parameters with visit(f) "
                                      "(models/model.hpp)");
  std::set<std::string> used;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const std::string key = std::string(prefix) + std::string(name);
    require(st.contains(key), st.source(), ": no tensor '", key, "' (the checkpoint is from a different model?)");
    const auto& info = st.info(key);
    require(info.shape == value.shape(), st.source(), ": tensor '", key, "' has shape ", shape_string(info.shape),
            " but the model expects ", shape_string(value.shape()));
    if (info.dtype == DType::I8) {
      detail::load_int8_tensor(st, key, value);
      used.insert(key + kScaleSuffix);
    } else {
      detail::load_tensor(st, key, value);
    }
    used.insert(key);
  });
  for (const auto& n : st.names())
    if (n.starts_with(prefix))
      require(used.count(n) != 0, st.source(), ": tensor '", n, "' matches no parameter of this model");
}

// load_parameters for decoding: the same checks, but each matrix of a CPU
// float model deferred to the file (core/tensor.hpp; io/weight_sources.hpp),
// read when first needed, and the vectors read now. An int8 matrix's rows
// and a 4-bit one's panels (a decoding checkpoint's: quantise_model) are
// then read as stored by decoding in that precision (WeightCopies), or as
// their dequantised values otherwise. A tensor that cannot be deferred (a
// GPU's, a double model's) is loaded as load_parameters loads it.
template <class Model>
void defer_parameters(Model& model, const SafeTensors& st) {
  static_assert(Parameterized<Model>, "defer_parameters: the model must list its parameters with visit(f) "
                                      "(models/model.hpp)");
  std::set<std::string> used;
  model.visit([&](std::string_view name, auto& value, auto&) {
    using Tensor = std::remove_cvref_t<decltype(value)>;
    const std::string key(name);
    require(st.contains(key), st.source(), ": no tensor '", key, "' (the checkpoint is from a different model?)");
    const auto& info = st.info(key);
    const bool matrix = value.shape().size() == 2;
    const std::int64_t rows = matrix ? value.dim(0) : std::int64_t(value.size()), cols = matrix ? value.dim(1) : 1;
    if (info.dtype == DType::U8) {
      require(matrix, st.source(), ": tensor '", key, "' is 4-bit, but the model's is ", shape_string(value.shape()),
              "; only matrices are stored in 4 bits");
    } else {
      require(info.shape == value.shape(), st.source(), ": tensor '", key, "' has shape ", shape_string(info.shape),
              " but the model expects ", shape_string(value.shape()));
    }
    used.insert(key);
    if (info.dtype == DType::I8) used.insert(key + kScaleSuffix);
    if (std::is_same_v<Tensor, xfmr::Tensor<float>> || info.dtype == DType::U8)
      assign_weights(value, safetensors_weights(st, {{key}}, rows, cols));
    else if (info.dtype == DType::I8)
      detail::load_int8_tensor(st, key, value);
    else
      detail::load_tensor(st, key, value);
  });
  for (const auto& n : st.names())
    require(used.count(n) != 0, st.source(), ": tensor '", n, "' matches no parameter of this model");
}

// The optimizer's state tensors, through its visit_state().
template <class Optimizer>
void add_optimizer_state(SafeTensorsWriter& w, Optimizer& opt) {
  opt.visit_state([&](const std::string& name, auto& t) { detail::add_tensor(w, name, t); });
  w.set_metadata("steps", std::to_string(opt.steps()));
}

template <class Optimizer>
void load_optimizer_state(Optimizer& opt, const SafeTensors& st) {
  std::size_t n = 0;
  opt.visit_state([&](const std::string& name, auto& t) {
    require(st.contains(name), st.source(), ": no optimizer state '", name, "'");
    detail::load_tensor(st, name, t);
    ++n;
  });
  require(n == st.names().size(), st.source(), ": holds ", st.names().size(), " state tensors, the optimizer has ", n);
  const long long steps = parse_integer<long long>(st.metadata("steps"), st.source() + ": optimizer step count");
  require(steps >= 0, st.source(), ": optimizer step count ", steps, " is negative");
  opt.set_steps(steps);
}

// Refuses (xfmr::Error) a `dir` that write_checkpoint would refuse: one that
// exists and is not a checkpoint, or a checkpoint holding other files too
// (a save replaces the whole directory), or one the swap cannot move
// (immutable or append-only). Programs check their --out with it
// before the first step, so a refusal costs no training.
void check_checkpoint_destination(const std::filesystem::path& dir);

// Removes what saves of `dir` interrupted by a crash left beside it: the
// hidden directories .<name>.new.XXXXXX that hold checkpoint files and
// nothing else. Returns how many it removed. Call it when no other process
// is writing `dir`.
int remove_interrupted_saves(const std::filesystem::path& dir);

// One writer per checkpoint directory: while a CheckpointLock on `dir`
// lives, another (in this process or any other on the machine) throws an
// xfmr::Error naming the process that holds it. The lock is an flock(2) on
// a hidden file beside `dir` (.<name>.lock: the directory itself is swapped
// at every save), removed when the lock is released; a process that dies
// releases it with its descriptors.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::filesystem::path& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Writes the three files into `dir` atomically (see above), and the
// `attached` ones (a language model's tokenizer, under its canonical names:
// the checkpoint then loads, resumes and exports with nothing beside it; a
// LoRA run's peft adapter files).
void write_checkpoint(const std::filesystem::path& dir, const SafeTensorsWriter& model,
                      const SafeTensorsWriter& optimizer, const TrainerState& state,
                      std::span<const AttachedFile> attached = {});
// The same without optimizer state: a checkpoint for decoding (int8).
void write_checkpoint(const std::filesystem::path& dir, const SafeTensorsWriter& model, const TrainerState& state,
                      std::span<const AttachedFile> attached = {});

// What a quantisation wrote.
struct QuantisedCheckpoint {
  int matrices = 0;                  // parameters stored as int8 or 4-bit
  std::uintmax_t float_bytes = 0;    // the parameters' values in float32
  std::uintmax_t quantised_bytes = 0;  // model.safetensors written
};
// A parameter a decoding checkpoint is written from: its name, the model's
// shape of it, and where its values are.
struct NamedWeights {
  std::string name;
  std::vector<std::int64_t> shape;
  std::shared_ptr<const WeightSource> source;
};
// Writes into `to` a checkpoint for decoding in `precision` ("int8" or
// "q4"): every matrix of `weights` quantised as that precision's products
// quantise it (int8: I8 rows "<name>" and a F32 scale a row
// "<name>_scale", core/int8.hpp; q4: core/q4.hpp's panels, U8 of shape
// (panels, blocks, 288), which decoding reads in place, but the embedding
// tables "*tok_emb.weight" and "*pos_emb.weight" BF16), every vector F32;
// `metadata` with "weights": the precision; the trainer state `state` and
// the `attached` files. One matrix is in memory at a time, read from its
// source. Refuses a `to` that exists and is not a decoding checkpoint (a
// float32 one would be lost).
QuantisedCheckpoint write_quantised_checkpoint(const std::filesystem::path& to, const std::vector<NamedWeights>& weights,
                                               std::string_view precision, Metadata metadata,
                                               const TrainerState& state, std::span<const AttachedFile> attached);
// The decoding checkpoint in `precision` of the float checkpoint `from`
// (any program's: its tensors, metadata, trainer state and tokenizer), so
// that decoding from it reads exactly the weights decoding from `from` in
// that precision would. Refuses a `from` that is quantised already, `to`
// the same directory as `from`, and what write_quantised_checkpoint refuses.
QuantisedCheckpoint quantise_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to,
                                        std::string_view precision = "int8");
// The same for any model (a published one load_model read, its matrices
// deferred to its file): its parameters by their names, `metadata` (what
// makes it loadable: a language model's architecture, vocabulary, tying,
// tokenizer) and its `attached` tokenizer.
template <class Model>
QuantisedCheckpoint quantise_model(Model& model, const std::filesystem::path& to, std::string_view precision,
                                   Metadata metadata, std::span<const AttachedFile> attached = {}) {
  std::vector<NamedWeights> weights;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const bool matrix = value.shape().size() == 2;
    const std::int64_t rows = matrix ? value.dim(0) : std::int64_t(value.size()), cols = matrix ? value.dim(1) : 1;
    std::shared_ptr<const WeightSource> source;
    if constexpr (requires { value.deferred(); })
      if (value.deferred()) source = value.source();
    if (!source) {  // values in memory (a GPU's brought to the host)
      using S = typename std::remove_cvref_t<decltype(value)>::value_type;
      std::vector<S> host(value.size());
      value.copy_to_host(host.data());
      source = std::make_shared<HeldWeights>(std::vector<float>(host.begin(), host.end()), rows, cols);
    }
    weights.push_back({std::string(name), value.shape(), std::move(source)});
  });
  return write_quantised_checkpoint(to, weights, precision, std::move(metadata), TrainerState{}, attached);
}
// The precision of a decoding checkpoint's weights ("int8", "q4"), from its
// metadata, or "" for a float one.
std::string quantised_weights(const Metadata& metadata);
// The precision a model decodes in: `asked` when not empty, else its
// weights' as the metadata "weights" gives it (a quantised checkpoint's
// int8 or q4, as they were saved; a GGUF file's, io/gguf_model.hpp's
// gguf_precision, bf16 too), else fp32.
std::string decoding_precision(std::string_view asked, const Metadata& metadata);
// True when `dir` holds a checkpoint (the three files).
bool is_checkpoint(const std::filesystem::path& dir);

// trainer_state.json of the checkpoint `dir`, checked: an xfmr::Error names
// the directory when it is not a checkpoint, and the file and the field when
// the file is malformed (not JSON, over 64 MiB or nested past 64 levels, a
// missing or mistyped field, a negative step).
TrainerState read_trainer_state(const std::filesystem::path& dir);
// The JSON write_checkpoint writes for `state`, and its reading (`source`
// names the text in errors).
std::string trainer_state_json(const TrainerState& state);
TrainerState parse_trainer_state(std::string_view json, const std::string& source);

// The Metadata of the checkpoint `dir` (its model.safetensors' __metadata__),
// read from the file's header alone; with `format`, one whose "format" is
// that (the program's name that wrote it), else an error: "DIR: not an
// xfmr-lm checkpoint".
Metadata read_checkpoint_metadata(const std::filesystem::path& dir);
Metadata read_checkpoint_metadata(const std::filesystem::path& dir, std::string_view format);
// The value of `key` in `metadata`, or an xfmr::Error naming the checkpoint
// `dir` and the key.
const std::string& metadata_value(const Metadata& metadata, const std::string& key,
                                  const std::filesystem::path& dir);

}  // namespace xfmr
