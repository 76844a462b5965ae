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

#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "xfmr/core/error.hpp"
#include "xfmr/io/safetensors.hpp"

namespace xfmr {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

// Adds every parameter of `model` to `w` under its visit() name.
template <class Model>
void add_parameters(SafeTensorsWriter& w, Model& model) {
  model.visit([&](std::string_view name, auto& value, auto&) {
    using S = std::remove_cvref_t<decltype(value[0])>;
    w.add<S>(std::string(name), value.shape(), std::span<const S>(value.data(), value.size()));
  });
}

// Loads every parameter of `model` from `st`: each name must be present with
// the model's shape, and the file may hold no parameter the model lacks.
template <class Model>
void load_parameters(Model& model, const SafeTensors& st, std::string_view prefix = "") {
  std::set<std::string> used;
  model.visit([&](std::string_view name, auto& value, auto&) {
    using S = std::remove_cvref_t<decltype(value[0])>;
    const std::string key = std::string(prefix) + std::string(name);
    require(st.contains(key), st.source(), ": no tensor '", key, "' (the checkpoint is from a different model?)");
    const auto& info = st.info(key);
    require(info.shape == value.shape(), st.source(), ": tensor '", key, "' has shape ", shape_string(info.shape),
            " but the model expects ", shape_string(value.shape()));
    st.copy_to<S>(key, value.shape(), std::span<S>(value.data(), value.size()));
    used.insert(key);
  });
  for (const auto& n : st.names())
    if (n.starts_with(prefix))
      require(used.count(n) != 0, st.source(), ": tensor '", n, "' matches no parameter of this model");
}

// The optimizer's state tensors, through its visit_state().
template <class Optimizer>
void add_optimizer_state(SafeTensorsWriter& w, Optimizer& opt) {
  opt.visit_state([&](const std::string& name, auto& t) {
    using S = std::remove_cvref_t<decltype(t[0])>;
    w.add<S>(name, t.shape(), std::span<const S>(t.data(), t.size()));
  });
  w.set_metadata("steps", std::to_string(opt.steps()));
}

template <class Optimizer>
void load_optimizer_state(Optimizer& opt, const SafeTensors& st) {
  std::size_t n = 0;
  opt.visit_state([&](const std::string& name, auto& t) {
    using S = std::remove_cvref_t<decltype(t[0])>;
    require(st.contains(name), st.source(), ": no optimizer state '", name, "'");
    st.copy_to<S>(name, t.shape(), std::span<S>(t.data(), t.size()));
    ++n;
  });
  require(n == st.names().size(), st.source(), ": holds ", st.names().size(), " state tensors, the optimizer has ", n);
  const auto it = st.metadata().find("steps");
  require(it != st.metadata().end(), st.source(), ": no step count in the metadata");
  opt.set_steps(std::stoll(it->second));
}

// Writes the three files into `dir` atomically (see above).
void write_checkpoint(const std::filesystem::path& dir, const SafeTensorsWriter& model,
                      const SafeTensorsWriter& optimizer, std::string_view trainer_state_json);

// True when `dir` holds a checkpoint (the three files).
bool is_checkpoint(const std::filesystem::path& dir);

// Reads trainer_state.json of a checkpoint, with a clear error when `dir` is
// not one.
std::string read_trainer_state(const std::filesystem::path& dir);

}  // namespace xfmr
