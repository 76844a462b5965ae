// checkpoint.hpp: saving and restoring training state.
//
// A checkpoint is a directory:
//   model.safetensors      parameters by their PyTorch-style names (F32 for
//                          float models), with the config and tokenizer in
//                          __metadata__
//   optimizer.safetensors  optimizer moments by "<param>.exp_avg" etc., and
//                          the step count in __metadata__
//   trainer_state.json     step, RNG state, dropout counters, settings
// write_checkpoint() builds the new directory beside the target, fsyncs every
// file, then swaps it in with one atomic rename (RENAME_EXCHANGE when the
// target exists), so a crash at any point leaves either the old or the new
// checkpoint whole. It refuses to replace a directory that is not an xfmr
// checkpoint, so it never overwrites unrelated user data.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/io/safetensors.hpp"

namespace xfmr {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

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
}  // namespace detail

// Adds every parameter of `model` to `w` under its visit() name.
template <class Model>
void add_parameters(SafeTensorsWriter& w, Model& model) {
  model.visit([&](std::string_view name, auto& value, auto&) { detail::add_tensor(w, std::string(name), value); });
}

// Loads every parameter of `model` from `st`: each name must be present with
// the model's shape, and the file may hold no parameter the model lacks.
template <class Model>
void load_parameters(Model& model, const SafeTensors& st, std::string_view prefix = "") {
  std::set<std::string> used;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const std::string key = std::string(prefix) + std::string(name);
    require(st.contains(key), st.source(), ": no tensor '", key, "' (the checkpoint is from a different model?)");
    const auto& info = st.info(key);
    require(info.shape == value.shape(), st.source(), ": tensor '", key, "' has shape ", shape_string(info.shape),
            " but the model expects ", shape_string(value.shape()));
    detail::load_tensor(st, key, value);
    used.insert(key);
  });
  for (const auto& n : st.names())
    if (n.starts_with(prefix))
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
// (a save replaces the whole directory). Programs check their --out with it
// before the first step, so a refusal costs no training.
void check_checkpoint_destination(const std::filesystem::path& dir);

// Removes what saves of `dir` interrupted by a crash left beside it: the
// hidden directories .<name>.new.XXXXXX that hold checkpoint files and
// nothing else. Returns how many it removed. Call it when no other process
// is writing `dir`.
int remove_interrupted_saves(const std::filesystem::path& dir);

// Writes the three files into `dir` atomically (see above).
void write_checkpoint(const std::filesystem::path& dir, const SafeTensorsWriter& model,
                      const SafeTensorsWriter& optimizer, std::string_view trainer_state_json);

// True when `dir` holds a checkpoint (the three files).
bool is_checkpoint(const std::filesystem::path& dir);

// Reads trainer_state.json of a checkpoint, with a clear error when `dir` is
// not one, when the file exceeds 64 MiB or when its JSON nests deeper than
// 64 levels.
std::string read_trainer_state(const std::filesystem::path& dir);

}  // namespace xfmr
