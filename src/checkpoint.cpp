// checkpoint.cpp: atomic checkpoint directories (see checkpoint.hpp).
#include "xfmr/io/checkpoint.hpp"

#include "xfmr/backend/bf16.hpp"
#include "xfmr/core/q4.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "json_bounds.hpp"
#include "xfmr/core/int8.hpp"
#include "file_writes.hpp"

namespace xfmr {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTrainerStateFormat = "xfmr-trainer";

// A file a checkpoint carries beside its own: its tokenizer's, or (a LoRA
// run's) the peft adapter directory's two files.
bool is_carried_file(const std::string& name) {
  return is_tokenizer_file_name(name) || name == "adapter_config.json" || name == "adapter_model.safetensors";
}
// One of the three files a checkpoint directory holds, or one it carries.
bool is_checkpoint_file(const std::string& name) {
  return name == kModelFile || name == kOptimizerFile || name == kTrainerStateFile || is_carried_file(name);
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

bool is_checkpoint(const fs::path& target) {
  const fs::path dir = detail::as_target(target);
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kModelFile, ec) &&
         fs::is_regular_file(dir / kTrainerStateFile, ec);
}

TrainerState read_trainer_state(const fs::path& dir) {
  require(is_checkpoint(dir), dir.string(), ": not a checkpoint directory (expected ", kModelFile, " and ",
          kTrainerStateFile, ")");
  const fs::path path = dir / kTrainerStateFile;
  constexpr std::uintmax_t kMaxBytes = 64u << 20;  // a few KiB in practice
  const std::uintmax_t bytes = fs::file_size(path);
  require(bytes <= kMaxBytes, path.string(), ": ", bytes, " bytes exceeds the limit of ", kMaxBytes);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_trainer_state(ss.str(), path.string());
}

std::string trainer_state_json(const TrainerState& state) {
  const nlohmann::json j = {{"format", kTrainerStateFormat},
                            {"version", 1},
                            {"step", state.step},
                            {"data_rng", std::to_string(state.data_rng)},  // all 64 bits, whatever reads it
                            {"dropout_calls", state.dropout_calls}};
  return j.dump(2) + "\n";
}

TrainerState parse_trainer_state(std::string_view text, const std::string& source) {
  detail::check_json_depth(text, source);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    detail::fail(source, ": not valid JSON: ", e.what());
  }
  require(j.is_object() && j.value("format", nlohmann::json()) == kTrainerStateFormat, source,
          ": not an xfmr trainer state (format \"", kTrainerStateFormat, "\")");
  auto field = [&](const char* key) -> const nlohmann::json& {
    require(j.contains(key), source, ": no '", key, "'");
    return j.at(key);
  };
  require(detail::json_integer(field("version"), 1, 1, source + ": version") == 1, source, ": unknown version");
  TrainerState st;
  st.step = long(detail::json_integer(field("step"), 0, INT64_MAX, source + ": step"));
  const nlohmann::json& rng = field("data_rng");
  require(rng.is_string(), source, ": data_rng is not a string");
  st.data_rng = parse_integer<std::uint64_t>(rng.get<std::string>(), source + ": data_rng");
  const nlohmann::json& calls = field("dropout_calls");
  require(calls.is_array(), source, ": dropout_calls is not an array");
  for (const nlohmann::json& c : calls) {
    require(c.is_number_unsigned(), source, ": dropout_calls holds ", c.dump(), ", not a count");
    st.dropout_calls.push_back(c.get<std::uint64_t>());
  }
  return st;
}

Metadata read_checkpoint_metadata(const fs::path& dir) {
  require(is_checkpoint(dir), dir.string(), ": not a checkpoint directory (expected ", kModelFile, " and ",
          kTrainerStateFile, ")");
  return SafeTensors::read_metadata(dir / kModelFile);
}

Metadata read_checkpoint_metadata(const fs::path& dir, std::string_view format) {
  Metadata md = read_checkpoint_metadata(dir);
  require(md.count("format") && md.at("format") == format, dir.string(), ": not an ", format, " checkpoint");
  return md;
}

const std::string& metadata_value(const Metadata& metadata, const std::string& key, const fs::path& dir) {
  const auto it = metadata.find(key);
  require(it != metadata.end(), dir.string(), ": the checkpoint's metadata has no '", key, "'");
  return it->second;
}

namespace {

// A save creates a hidden directory beside `dir` and renames it in place,
// swapping it with the old one: an immutable or append-only directory
// (chattr +i, +a) refuses that, whether it is `dir` or the one holding it.
// Found before the training, not at its first save. (A file system without
// these flags answers the ioctl with an error: nothing to check there.)
void refuse_fixed_directory(const fs::path& path, const fs::path& dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  int flags = 0;
  const bool known = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
  ::close(fd);
  if (!known || (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL)) == 0) return;
  fail("cannot save the checkpoint ", dir.string(), ": ", path == dir ? "the directory" : "its parent ",
       path == dir ? "" : path.string(), " is ", (flags & FS_IMMUTABLE_FL) ? "immutable (chattr +i)" : "append-only (chattr +a)",
       " and a save renames a new directory in place (`chattr -i -a ", path.string(),
       "` allows it), or choose another --out");
}

}  // namespace

void check_checkpoint_destination(const fs::path& target) {
  const fs::path dir = detail::as_target(target);
  std::error_code ec;
  refuse_fixed_directory(dir.has_parent_path() ? dir.parent_path() : fs::path("."), dir);
  if (!fs::exists(fs::symlink_status(dir, ec))) return;
  // The swap would replace the link, leaving the directory it names stale.
  require(!fs::is_symlink(fs::symlink_status(dir, ec)), "cannot save the checkpoint ", dir.string(),
          ": it is a symbolic link (to ", fs::read_symlink(dir, ec).string(),
          ") and a save replaces the directory whole; name the directory itself");
  require(is_checkpoint(dir), "refusing to write a checkpoint over ", dir.string(),
          ": it exists and is not an xfmr checkpoint");
  // A save replaces the whole directory: anything else in it would be lost.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    require(is_checkpoint_file(name), "refusing to replace the checkpoint ",
            dir.string(), ": it holds ", name, ", which is not part of a checkpoint and a save would delete");
  }
  // ... by swapping a new directory in its place.
  refuse_fixed_directory(dir, dir);
}

int remove_interrupted_saves(const fs::path& target) {
  const fs::path dir = detail::as_target(target);
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const std::string prefix = std::string(".").append(dir.filename().string()).append(".new.");
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != prefix.size() + 6 || !name.starts_with(prefix) || !e.is_directory(ec) || e.is_symlink(ec))
      continue;
    // Only what a save writes: a directory holding checkpoint files and
    // nothing else (the old checkpoint after a swap, or a partial new one).
    bool ours = true;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      ours = ours && f.is_regular_file(ec) && is_checkpoint_file(f.path().filename().string());
    }
    if (ours && fs::remove_all(e.path(), ec) > 0) ++removed;
  }
  return removed;
}

CheckpointLock::CheckpointLock(const fs::path& target) {
  const fs::path dir = detail::as_target(target);
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  path_ = parent / ("." + dir.filename().string() + ".lock");
  std::error_code ec;
  fs::create_directories(parent, ec);
  for (;;) {
    fd_ = system_call([&] { return ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644); }, dir.string(),
                      ": cannot create the lock file ", path_.string());
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char pid[32] = {};
      const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
      ::close(fd_);
      fd_ = -1;
      require(err != EWOULDBLOCK, "another run is writing the checkpoint directory ", dir.string(),
              n > 0 ? " (process " + std::string(pid, std::size_t(n)) + ")" : std::string(),
              "; wait for it to end, or choose another directory");
      detail::fail(dir.string(), ": cannot lock ", path_.string(), ": ", std::strerror(err));
    }
    // The holder before us may have removed the file after we opened it:
    // then our lock is on a name no one else sees; take the new file's.
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev)
      break;
    ::close(fd_);
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

CheckpointLock::~CheckpointLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held, so no one locks the removed file unseen
  ::close(fd_);
}

namespace detail {

void write_directory(const fs::path& dir, std::span<const NewFile> files, const char* what) {
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(dir, ec));
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  require(fs::is_directory(parent), dir.string(), ": cannot create the parent directory ", parent.string(),
          ec ? ": " + ec.message() : "");
  std::string tmpl = hidden_temp_template(dir, "new");
  system_call([&] { return ::mkdtemp(tmpl.data()); }, dir.string(), ": cannot create a directory beside it");
  const fs::path tmp = tmpl;
  try {
    // Errors name each file by its final place: the temporary is hidden.
    for (const NewFile& f : files) write_new_file(tmp / f.name, f.bytes, dir / f.name, f.stream);
    ::chmod(tmp.c_str(), 0755);
    fsync_path(tmp, true);
    // One atomic swap when the target exists: the new directory takes the
    // name, the old one the temporary name, and is removed afterwards.
    const int moved = exists ? ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE)
                             : ::rename(tmp.c_str(), dir.c_str());
    if (moved != 0) {
      const int err = errno;  // before anything else can change it
      fail(dir.string(), ": cannot move the new ", what, " in place: ", std::strerror(err));
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fsync_path(parent, true);
  fs::remove_all(tmp, ec);  // the old directory after a swap; nothing otherwise
}

}  // namespace detail

namespace {

void write_checkpoint_files(const fs::path& target, const SafeTensorsWriter& model,
                            const SafeTensorsWriter* optimizer, const TrainerState& trainer_state,
                            std::span<const AttachedFile> attached) {
  const fs::path dir = detail::as_target(target);
  check_checkpoint_destination(dir);
  const std::vector<std::byte> optimizer_bytes = optimizer ? optimizer->serialize() : std::vector<std::byte>();
  const std::string state = trainer_state_json(trainer_state);
  std::vector<detail::NewFile> files = {{kModelFile, {}, [&](int fd) { return model.write_to(fd); }}};
  if (optimizer) files.push_back({kOptimizerFile, optimizer_bytes});
  files.push_back({kTrainerStateFile, std::as_bytes(std::span<const char>(state.data(), state.size()))});
  for (const AttachedFile& a : attached) {
    require(is_carried_file(a.name), "a checkpoint carries no file named ", a.name);
    files.push_back({a.name, a.bytes});
  }
  detail::write_directory(dir, files, "checkpoint");
}

}  // namespace

void write_checkpoint(const fs::path& dir, const SafeTensorsWriter& model, const SafeTensorsWriter& optimizer,
                      const TrainerState& state, std::span<const AttachedFile> attached) {
  write_checkpoint_files(dir, model, &optimizer, state, attached);
}

void write_checkpoint(const fs::path& dir, const SafeTensorsWriter& model, const TrainerState& state,
                      std::span<const AttachedFile> attached) {
  write_checkpoint_files(dir, model, nullptr, state, attached);
}

std::string quantised_weights(const Metadata& metadata) {
  const auto it = metadata.find(kWeightsKey);
  return it != metadata.end() && (it->second == kInt8Weights || it->second == kQ4Weights) ? it->second : "";
}

std::string decoding_precision(std::string_view asked, const Metadata& metadata) {
  if (!asked.empty()) return std::string(asked);
  const std::string quantised = quantised_weights(metadata);
  if (!quantised.empty()) return quantised;
  const auto it = metadata.find(kWeightsKey);
  return it != metadata.end() && it->second == "bf16" ? "bf16" : "fp32";
}

namespace {

std::vector<AttachedFile> tokenizer_files_of(const fs::path& dir) {
  std::vector<AttachedFile> attached;  // the tokenizer the checkpoint carries, if any
  for (const auto& e : fs::directory_iterator(detail::as_target(dir)))
    if (is_tokenizer_file_name(e.path().filename().string()))
      attached.push_back({e.path().filename().string(), detail::read_whole_file(e.path())});
  std::sort(attached.begin(), attached.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return attached;
}

// Rows of a matrix read from its source a block at a time into `f(r0, r1, values)`.
template <class F>
void for_each_rows(const WeightSource& source, std::int64_t block, F&& f) {
  std::vector<float> values;
  for (std::int64_t r0 = 0; r0 < source.rows(); r0 += block) {
    const std::int64_t r1 = std::min(source.rows(), r0 + block);
    values.resize(std::size_t((r1 - r0) * source.cols()));
    source.read_rows(r0, r1, values.data());
    f(r0, r1, values.data());
  }
}

}  // namespace

QuantisedCheckpoint write_quantised_checkpoint(const fs::path& to, const std::vector<NamedWeights>& weights,
                                               std::string_view precision, Metadata metadata,
                                               const TrainerState& state, std::span<const AttachedFile> attached) {
  require(precision == kInt8Weights || precision == kQ4Weights, "quantised weights are int8 or q4, not '", precision,
          "'");
  std::error_code ec;
  if (fs::exists(fs::symlink_status(to, ec)))
    require(is_checkpoint(to) && !quantised_weights(read_checkpoint_metadata(to)).empty(), "refusing to replace ",
            to.string(), " with a ", precision, " checkpoint: it exists and is not a quantised one (a float32 "
            "checkpoint would be lost)");
  const bool q4 = precision == kQ4Weights;
  QuantisedCheckpoint report;
  SafeTensorsWriter w;
  for (const NamedWeights& p : weights) {
    const WeightSource* source = p.source.get();
    const std::int64_t rows = source->rows(), cols = source->cols();
    report.float_bytes += std::uintmax_t(rows * cols) * sizeof(float);
    if (p.shape.size() != 2 || rows * cols == 0) {
      w.add_filled(p.name, DType::F32, p.shape, [source](std::span<std::byte> out) {
        const std::vector<float> v = read_all(*source);
        std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
      });
      continue;
    }
    // A 4-bit checkpoint keeps its embedding tables (looked up a row at a
    // time; a tied head's products quantise the table when they first read
    // it) in bfloat16: stored in 4 bits, they cost a character model's
    // validation loss as much again as its 4-bit products (BENCHMARKS.md).
    if (q4 && (p.name.ends_with("tok_emb.weight") || p.name.ends_with("pos_emb.weight"))) {
      w.add_filled(p.name, DType::BF16, p.shape, [source](std::span<std::byte> out) {
        for_each_rows(*source, 256, [&](std::int64_t r0, std::int64_t r1, const float* v) {
          const std::int64_t n = (r1 - r0) * source->cols();
          for (std::int64_t i = 0; i < n; ++i) {
            const std::uint16_t b = bf16::from_float(v[i]);
            std::memcpy(out.data() + 2 * (r0 * source->cols() + i), &b, 2);
          }
        });
      });
      continue;
    }
    ++report.matrices;
    const std::string where = p.name;
    if (q4) {
      w.add_filled(p.name, DType::U8, {detail::q4_panels(rows), detail::q4_blocks(cols), detail::kQ4BlockBytes},
                   [source, cols, where](std::span<std::byte> out) {
                     for_each_rows(*source, detail::kQ4PanelRows, [&](std::int64_t r0, std::int64_t r1, const float* v) {
                       for (std::int64_t i = 0; i < (r1 - r0) * cols; ++i)
                         require(std::fabs(v[i]) <= detail::kQ4MaxWeight, "q4 weights: '", where, "' holds ", v[i],
                                 " in row ", r0 + i / cols, ", past the largest a float16 scale holds (",
                                 detail::kQ4MaxWeight, ")");
                       detail::q4_pack_panel(0, int(r1 - r0), int(cols), v, cols,
                                             out.data() + detail::q4_offset(cols, r0 / detail::kQ4PanelRows, 0));
                     });
                   });
      continue;
    }
    require(cols <= 2147483647 / (255 * 127), "int8 weights: '", p.name, "' has rows of ", cols,
            " values; past ", 2147483647 / (255 * 127), " the products' int32 sums could overflow");
    auto scales = std::make_shared<std::vector<float>>(std::size_t(rows));
    w.add_filled(p.name, DType::I8, p.shape, [source, cols, scales](std::span<std::byte> out) {
      auto* q = reinterpret_cast<std::int8_t*>(out.data());
      for_each_rows(*source, 256, [&](std::int64_t r0, std::int64_t r1, const float* v) {
        for (std::int64_t r = r0; r < r1; ++r)
          (*scales)[std::size_t(r)] = detail::quantise_row_int8(v + (r - r0) * cols, int(cols), q + r * cols);
      });
    });
    w.add_filled(p.name + kScaleSuffix, DType::F32, {rows}, [scales](std::span<std::byte> out) {
      std::memcpy(out.data(), scales->data(), scales->size() * sizeof(float));  // filled with the rows, just before
    });
  }
  metadata[kWeightsKey] = std::string(precision);
  for (const auto& [key, value] : metadata) w.set_metadata(key, value);
  write_checkpoint(to, w, state, attached);
  report.quantised_bytes = fs::file_size(detail::as_target(to) / kModelFile);
  return report;
}

QuantisedCheckpoint quantise_checkpoint(const fs::path& from, const fs::path& to, std::string_view precision) {
  const TrainerState state = read_trainer_state(from);
  const fs::path model_path = from / kModelFile;
  const SafeTensors st = SafeTensors::load(model_path);
  const std::string already = quantised_weights(st.metadata());
  require(already.empty(), from.string(), ": holds ", already, " weights already");
  std::error_code ec;
  require(!fs::equivalent(from, to, ec), "refusing to quantise ", from.string(),
          " into itself: its float32 weights would be lost; choose another directory");
  std::vector<NamedWeights> weights;
  for (const std::string& name : st.names()) {
    const TensorInfo& info = st.info(name);
    require(info.dtype == DType::F32 || info.shape.size() != 2, model_path.string(), ": matrix '", name, "' is ",
            dtype_name(info.dtype), "; quantised weights are made from float32 models");
    require(info.shape.size() != 2 || !st.contains(name + kScaleSuffix), model_path.string(), ": tensor '", name,
            kScaleSuffix, "' would be the scales of '", name, "'");
    const bool matrix = info.shape.size() == 2;
    const std::int64_t rows = matrix ? info.shape[0] : std::int64_t(info.elements()), cols = matrix ? info.shape[1] : 1;
    if (!matrix && (info.dtype == DType::F32 || info.dtype == DType::F64)) {
      weights.push_back({name, info.shape, safetensors_weights(st, {{name}}, rows, cols)});
    } else if (!matrix) {  // kept as it is
      weights.push_back({name, info.shape, nullptr});
    } else {
      weights.push_back({name, info.shape, safetensors_weights(st, {{name}}, rows, cols)});
    }
  }
  // Tensors that are neither float matrices nor float vectors are not the
  // model's parameters: a float checkpoint holds none.
  for (const NamedWeights& p : weights)
    require(p.source != nullptr, model_path.string(), ": tensor '", p.name, "' is not a float parameter");
  QuantisedCheckpoint report =
      write_quantised_checkpoint(to, weights, precision, st.metadata(), state, tokenizer_files_of(from));
  report.float_bytes = fs::file_size(model_path);
  return report;
}

}  // namespace xfmr
