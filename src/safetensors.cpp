// safetensors.cpp: the safetensors reader and writer (see safetensors.hpp).
#include "xfmr/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "json_bounds.hpp"
#include "file_writes.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/half.hpp"
#include "xfmr/text/text.hpp"

namespace xfmr {

namespace {

using nlohmann::json;

// The reference loader's limit on the JSON header.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeEntry {
  DType type;
  const char* name;
  std::size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2}, {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::BOOL, "BOOL", 1},
};

bool dtype_from_name(const std::string& s, DType& out) {
  for (const auto& e : kDTypes)
    if (s == e.name) {
      out = e.type;
      return true;
    }
  return false;
}

// a * b, or false when it would overflow size_t.
bool checked_mul(std::size_t a, std::size_t b, std::size_t& out) {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a) return false;
  out = a * b;
  return true;
}

std::uint64_t read_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

template <class T>
T load_as(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.name;
  return "?";
}

std::size_t dtype_size(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.size;
  return 0;
}

std::size_t TensorInfo::elements() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// ---- reading ---------------------------------------------------------------

namespace detail {
// The bytes of a file: held (parse) or mapped read-only and private (load).
struct FileBytes {
  std::vector<std::byte> held;
  void* map = nullptr;
  std::size_t mapped = 0;
  FileBytes() = default;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes() {
    if (map) ::munmap(map, mapped);
  }
  std::span<const std::byte> bytes() const {
    return map ? std::span<const std::byte>(static_cast<const std::byte*>(map), mapped) : std::span<const std::byte>(held);
  }
};
}  // namespace detail

SafeTensors SafeTensors::parse(std::vector<std::byte> bytes, std::string source) {
  auto file = std::make_shared<detail::FileBytes>();
  file->held = std::move(bytes);
  return parse_bytes(std::move(file), std::move(source));
}

SafeTensors SafeTensors::parse_bytes(std::shared_ptr<const detail::FileBytes> file, std::string source) {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  SafeTensors st;
  st.source_ = std::move(source);
  const std::string& src = st.source_;
  const std::span<const std::byte> bytes = file->bytes();
  require(bytes.size() >= 8, src, ": file has ", bytes.size(), " bytes, too short for the 8-byte header length");
  const std::uint64_t n = read_u64_le(bytes.data());
  require(n <= kMaxHeaderBytes, src, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  require(n <= bytes.size() - 8, src, ": header length ", n, " runs past the end of the file (",
          bytes.size() - 8, " bytes after the length)");
  const std::string header(reinterpret_cast<const char*>(bytes.data() + 8), static_cast<std::size_t>(n));
  require(!header.empty() && header[0] == '{', src, ": header does not start with '{'");

  // Duplicate keys: nlohmann keeps the last silently, so watch key events.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const json::parser_callback_t watch = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) open_objects.emplace_back();
    else if (ev == json::parse_event_t::object_end) open_objects.pop_back();
    else if (ev == json::parse_event_t::key && !open_objects.empty() && duplicate.empty())
      if (!open_objects.back().insert(parsed.get<std::string>()).second) duplicate = parsed.get<std::string>();
    return true;
  };
  detail::check_json_depth(header, src + ": header");
  json root;
  try {
    root = json::parse(header, watch);
  } catch (const json::exception& e) {
    detail::fail(src, ": header is not valid JSON: ", e.what());
  }
  require(duplicate.empty(), src, ": duplicate key '", duplicate, "' in header");
  require(root.is_object(), src, ": header is not a JSON object");

  struct Placed {
    std::string name;
    std::size_t begin, end;
  };
  std::vector<Placed> placed;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      require(v.is_object(), src, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        require(m.value().is_string(), src, ": __metadata__ value for '", m.key(), "' is not a string");
        st.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    require(v.is_object(), src, ": entry for tensor '", name, "' is not an object");
    require(v.contains("dtype") && v["dtype"].is_string(), src, ": tensor '", name, "' has no dtype string");
    require(v.contains("shape") && v["shape"].is_array(), src, ": tensor '", name, "' has no shape array");
    require(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, src,
            ": tensor '", name, "' needs data_offsets [begin, end]");
    TensorInfo info;
    const std::string dt = v["dtype"].get<std::string>();
    require(dtype_from_name(dt, info.dtype), src, ": tensor '", name, "' has unknown dtype '", dt, "'");
    std::size_t elements = 1;
    for (const json& d : v["shape"]) {
      require(d.is_number_unsigned(), src, ": tensor '", name, "' has a shape entry that is not a non-negative integer: ",
              d.dump());
      const std::uint64_t dim = d.get<std::uint64_t>();
      require(dim <= std::uint64_t(std::numeric_limits<std::int64_t>::max()) && checked_mul(elements, dim, elements),
              src, ": tensor '", name, "' element count overflows");
      info.shape.push_back(static_cast<std::int64_t>(dim));
    }
    for (const json& o : v["data_offsets"])
      require(o.is_number_unsigned(), src, ": tensor '", name, "' has a data offset that is not a non-negative integer: ",
              o.dump());
    info.begin = v["data_offsets"][0].get<std::uint64_t>();
    info.end = v["data_offsets"][1].get<std::uint64_t>();
    require(info.begin <= info.end, src, ": tensor '", name, "' has data_offsets [", info.begin, ", ", info.end,
            "] with begin after end");
    std::size_t nbytes = 0;
    require(checked_mul(elements, dtype_size(info.dtype), nbytes), src, ": tensor '", name, "' byte size overflows");
    require(info.end - info.begin == nbytes, src, ": tensor '", name, "' of dtype ", dt, " and shape ",
            shape_string(info.shape), " needs ", nbytes, " bytes but data_offsets span ", info.end - info.begin);
    placed.push_back({name, info.begin, info.end});
    st.tensors_.emplace(name, std::move(info));
  }

  // Offsets must tile [0, data size) exactly, in some order.
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t expected = 0;
  for (const auto& p : placed) {
    require(p.begin == expected, src, ": tensor '", p.name, "' starts at byte ", p.begin, " but the previous tensor ends at ",
            expected, " (offsets must be contiguous and must not overlap)");
    expected = p.end;
    st.order_.push_back(p.name);
  }
  st.data_start_ = 8 + static_cast<std::size_t>(n);
  const std::size_t data_size = bytes.size() - st.data_start_;
  require(expected == data_size, src, ": tensors end at data byte ", expected, " but the file holds ", data_size,
          " data bytes");
  st.file_ = std::move(file);
  return st;
}

SafeTensors SafeTensors::load(const std::filesystem::path& path) {
  std::error_code ec;
  const auto type = std::filesystem::status(path, ec).type();
  require(type == std::filesystem::file_type::not_found || type == std::filesystem::file_type::regular, path.string(),
          ": is not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require(fd >= 0, path.string(), ": cannot open for reading");
  struct stat info {};
  const bool sized = ::fstat(fd, &info) == 0;
  auto file = std::make_shared<detail::FileBytes>();
  if (sized && info.st_size > 0) {
    void* map = ::mmap(nullptr, std::size_t(info.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) file->map = map, file->mapped = std::size_t(info.st_size);
  }
  ::close(fd);
  require(sized, path.string(), ": cannot determine file size");
  require(info.st_size == 0 || file->map, path.string(), ": cannot be mapped into memory");
  return parse_bytes(std::move(file), path.string());
}

void SafeTensors::release(const std::string& name) const {
  const TensorInfo& i = info(name);
  release(name, 0, i.end - i.begin);
}

void SafeTensors::release(const std::string& name, std::size_t from, std::size_t to) const {
  if (!file_->map) return;
  const TensorInfo& i = info(name);
  to = std::min(to, i.end - i.begin);
  if (from >= to) return;
  static const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<std::uintptr_t>(file_->map);
  const std::uintptr_t begin = base + data_start_ + i.begin + from, end = base + data_start_ + i.begin + to;
  const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages only
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

std::map<std::string, std::string> SafeTensors::read_metadata(const std::filesystem::path& path) {
  std::error_code ec;
  require(std::filesystem::is_regular_file(path, ec), path.string(), ": is not a regular file");
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  require(in.good() && !ec, path.string(), ": cannot open for reading");
  std::byte length[8];
  in.read(reinterpret_cast<char*>(length), 8);
  require(in.gcount() == 8, path.string(), ": file has ", in.gcount(), " bytes, too short for the 8-byte header length");
  const std::uint64_t n = read_u64_le(length);
  require(n <= kMaxHeaderBytes && n <= size - 8, path.string(), ": header length ", n,
          " exceeds the limit of ", kMaxHeaderBytes, " bytes or the file");
  std::string header(std::size_t(n), '\0');
  in.read(header.data(), std::streamsize(n));
  require(std::uint64_t(in.gcount()) == n, path.string(), ": short read of the header");
  require(!header.empty() && header[0] == '{', path.string(), ": header does not start with '{'");
  detail::check_json_depth(header, path.string() + ": header");
  json root;
  try {
    root = json::parse(header);
  } catch (const json::exception& e) {
    detail::fail(path.string(), ": header is not valid JSON: ", e.what());
  }
  require(root.is_object(), path.string(), ": header is not a JSON object");
  std::map<std::string, std::string> metadata;
  if (const auto it = root.find("__metadata__"); it != root.end()) {
    require(it->is_object(), path.string(), ": __metadata__ is not an object");
    for (auto m = it->begin(); m != it->end(); ++m) {
      require(m.value().is_string(), path.string(), ": __metadata__ value for '", m.key(), "' is not a string");
      metadata[m.key()] = m.value().get<std::string>();
    }
  }
  return metadata;
}

const TensorInfo& SafeTensors::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  require(it != tensors_.end(), source_, ": no tensor named '", name, "'");
  return it->second;
}

std::span<const std::byte> SafeTensors::bytes(const std::string& name) const {
  const TensorInfo& i = info(name);
  return {file_->bytes().data() + data_start_ + i.begin, i.end - i.begin};
}

template <class T>
  requires std::is_floating_point_v<T>
std::vector<T> SafeTensors::values(const std::string& name) const {
  const TensorInfo& i = info(name);
  const std::byte* p = bytes(name).data();
  const std::size_t n = i.elements();
  std::vector<T> out(n);
  switch (i.dtype) {
    case DType::F64:
      for (std::size_t k = 0; k < n; ++k) out[k] = T(load_as<double>(p + 8 * k));
      break;
    case DType::F32:
      for (std::size_t k = 0; k < n; ++k) out[k] = T(load_as<float>(p + 4 * k));
      break;
    case DType::F16:
      for (std::size_t k = 0; k < n; ++k) out[k] = T(detail::half_to_float(load_as<std::uint16_t>(p + 2 * k)));
      break;
    case DType::BF16:
      for (std::size_t k = 0; k < n; ++k)
        out[k] = T(std::bit_cast<float>(std::uint32_t(load_as<std::uint16_t>(p + 2 * k)) << 16));
      break;
    default:
      detail::fail(source_, ": tensor '", name, "' has dtype ", dtype_name(i.dtype), ", expected a floating dtype");
  }
  return out;
}

std::vector<std::int64_t> SafeTensors::integers(const std::string& name) const {
  const TensorInfo& i = info(name);
  const std::byte* p = bytes(name).data();
  const std::size_t n = i.elements();
  std::vector<std::int64_t> out(n);
  for (std::size_t k = 0; k < n; ++k) {
    switch (i.dtype) {
      case DType::I64: out[k] = load_as<std::int64_t>(p + 8 * k); break;
      case DType::I32: out[k] = load_as<std::int32_t>(p + 4 * k); break;
      case DType::I16: out[k] = load_as<std::int16_t>(p + 2 * k); break;
      case DType::I8: out[k] = load_as<std::int8_t>(p + k); break;
      case DType::U8:
      case DType::BOOL: out[k] = load_as<std::uint8_t>(p + k); break;
      default:
        detail::fail(source_, ": tensor '", name, "' has dtype ", dtype_name(i.dtype), ", expected an integer dtype");
    }
  }
  return out;
}

template <class T>
  requires std::is_floating_point_v<T>
void SafeTensors::copy_to(const std::string& name, const std::vector<std::int64_t>& shape, std::span<T> out) const {
  const TensorInfo& i = info(name);
  require(i.shape == shape, source_, ": tensor '", name, "' has shape ", shape_string(i.shape), ", expected ",
          shape_string(shape));
  require(out.size() == i.elements(), source_, ": tensor '", name, "' has ", i.elements(),
          " elements but the destination holds ", out.size());
  const auto v = values<T>(name);
  std::copy(v.begin(), v.end(), out.begin());
}

template std::vector<float> SafeTensors::values<float>(const std::string&) const;
template std::vector<double> SafeTensors::values<double>(const std::string&) const;
template void SafeTensors::copy_to<float>(const std::string&, const std::vector<std::int64_t>&, std::span<float>) const;
template void SafeTensors::copy_to<double>(const std::string&, const std::vector<std::int64_t>&, std::span<double>) const;

// ---- writing ---------------------------------------------------------------

namespace {
bool well_formed_utf8(std::string_view s) {
  for (std::size_t i = 0, n = 0; i < s.size(); i += n)
    if ((n = utf8_character_size(s, i)) == 0) return false;
  return true;
}
}  // namespace

std::size_t SafeTensorsWriter::checked_bytes(const std::string& name, DType dtype,
                                             const std::vector<std::int64_t>& shape) const {
  require(name != "__metadata__", "a tensor cannot be named __metadata__");
  require(!name.empty(), "a tensor needs a non-empty name");
  require(well_formed_utf8(name), "tensor name '", name, "' is not UTF-8");
  for (const auto& e : entries_) require(e.name != name, "tensor '", name, "' added twice");
  std::size_t n = 1;
  for (auto d : shape) {
    require(d >= 0, "tensor '", name, "' has a negative dimension in shape ", shape_string(shape));
    require(checked_mul(n, static_cast<std::size_t>(d), n), "tensor '", name, "' element count overflows");
  }
  std::size_t nbytes = 0;
  require(checked_mul(n, dtype_size(dtype), nbytes), "tensor '", name, "' byte size overflows");
  return nbytes;
}

void SafeTensorsWriter::add(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data) {
  const std::size_t nbytes = checked_bytes(name, dtype, shape);
  require(data != nullptr || nbytes == 0, "tensor '", name, "' has no data");
  Entry e{name, dtype, std::move(shape), std::vector<std::byte>(nbytes), nbytes, {}};
  if (nbytes) std::memcpy(e.data.data(), data, nbytes);
  entries_.push_back(std::move(e));
}

void SafeTensorsWriter::add_filled(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                                   std::function<void(std::span<std::byte>)> fill) {
  const std::size_t nbytes = checked_bytes(name, dtype, shape);
  require(bool(fill), "tensor '", name, "' has no data");
  entries_.push_back({name, dtype, std::move(shape), {}, nbytes, std::move(fill)});
}

void SafeTensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  require(well_formed_utf8(key), "metadata key '", key, "' is not UTF-8");
  require(well_formed_utf8(value), "metadata value for '", key, "' is not UTF-8");
  metadata_[key] = value;
}

std::string SafeTensorsWriter::header() const {
  // ordered_json keeps insertion order, so the header lists tensors in data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::size_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + text;
}

std::vector<std::byte> SafeTensorsWriter::serialize() const {
  const std::string head = header();
  std::size_t total = head.size();
  for (const auto& e : entries_) total += e.bytes;
  std::vector<std::byte> out(total);
  std::memcpy(out.data(), head.data(), head.size());
  std::size_t at = head.size();
  for (const auto& e : entries_) {
    if (e.fill) e.fill(std::span<std::byte>(out.data() + at, e.bytes));
    else if (e.bytes) std::memcpy(out.data() + at, e.data.data(), e.bytes);
    at += e.bytes;
  }
  return out;
}

int SafeTensorsWriter::write_to(int fd) const {
  const std::string head = header();
  if (const int err = detail::write_all(fd, std::as_bytes(std::span<const char>(head.data(), head.size())))) return err;
  std::vector<std::byte> filled;
  for (const auto& e : entries_) {
    std::span<const std::byte> bytes(e.data);
    if (e.fill) {
      filled.resize(e.bytes);
      e.fill(std::span<std::byte>(filled));
      bytes = filled;
    }
    if (const int err = detail::write_all(fd, bytes)) return err;
  }
  return 0;
}

void SafeTensorsWriter::write(const std::filesystem::path& path) const {
  const auto bytes = serialize();
  write_file_atomic(path, bytes);
}

void write_file_atomic(const std::filesystem::path& target, std::span<const std::byte> bytes) {
  namespace fs = std::filesystem;
  const fs::path path = detail::as_target(target);
  struct stat old {};
  const bool exists = ::stat(path.c_str(), &old) == 0;
  if (exists && !S_ISREG(old.st_mode)) {
    require(!S_ISDIR(old.st_mode), path.string(), ": is a directory, not a file to write");
    // Renaming over a device (as root: /dev/null itself) or a pipe would
    // replace it by a regular file: write through it instead, every write
    // checked. A FIFO gets kFifoWaitSeconds for a reader to open it: one
    // that no process reads is an error, not a wait without end.
    const bool fifo = S_ISFIFO(old.st_mode);
    int fd = -1;
    for (int waited_ms = 0;; waited_ms += 10) {
      fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
      if (fd >= 0 || errno != ENXIO || waited_ms >= kFifoWaitSeconds * 1000) break;
      ::usleep(10000);
    }
    if (fd < 0) {
      const int err = errno;
      detail::fail(path.string(), ": ", err == ENXIO ? "a FIFO that no process opened for reading in " + std::to_string(kFifoWaitSeconds) + " s"
                                                 : std::string(std::strerror(err)));
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int err = detail::write_all(fd, bytes);
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) detail::fail(path.string(), ": ", std::strerror(err));
    return;
  }
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string tmpl = detail::hidden_temp_template(path, "tmp");
  const int fd = system_call([&] { return ::mkstemp(tmpl.data()); }, path.string(), ": cannot create a file in ",
                             dir.string());
  // A replaced file keeps its permissions and, where allowed, its owner.
  int err = ::fchmod(fd, exists ? (old.st_mode & 07777) : 0644) == 0 ? 0 : errno;
  if (exists && err == 0 && (old.st_uid != ::geteuid() || old.st_gid != ::getegid()))
    (void)!::fchown(fd, old.st_uid, old.st_gid);  // only root may give a file away; otherwise it stays ours
  if (err == 0) err = detail::write_all(fd, bytes);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmpl.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmpl.c_str());
    detail::fail(path.string(), ": ", std::strerror(err));
  }
  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool is_tokenizer_file_name(const std::string& name) {
  return name == "tokenizer.json" || name == "tokenizer.bin" || name == "vocab.json" || name == "merges.txt";
}

void write_hf_directory(const std::filesystem::path& target, const SafeTensorsWriter& tensors,
                        const std::string& config_json, bool overwrite, std::span<const AttachedFile> attached) {
  namespace fs = std::filesystem;
  const fs::path dir = detail::as_target(target);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec))) {
    require(!fs::is_symlink(fs::symlink_status(dir, ec)), dir.string(), ": a symbolic link (to ",
            fs::read_symlink(dir, ec).string(), "); an export replaces a directory whole, so name the directory itself");
    require(fs::is_directory(fs::symlink_status(dir, ec)), dir.string(), ": exists and is not a directory");
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      require(overwrite, dir.string(), " exists already and holds ", name, "; replacing it needs overwrite");
      // An export replaces the whole directory: anything else in it would be lost.
      require(name == "model.safetensors" || name == "config.json" || is_tokenizer_file_name(name),
              "refusing to replace ", dir.string(), ": it holds ", name,
              ", which is not part of an export and replacing the directory would delete");
    }
  }
  SafeTensorsWriter w = tensors;
  w.set_metadata("format", "pt");
  const std::vector<std::byte> model = w.serialize();
  std::vector<detail::NewFile> files = {{"model.safetensors", model},
                                        {"config.json", std::as_bytes(std::span(config_json.data(), config_json.size()))}};
  for (const AttachedFile& a : attached) {
    require(is_tokenizer_file_name(a.name), "an export carries no file named ", a.name);
    files.push_back({a.name, a.bytes});
  }
  detail::write_directory(dir, files, "export");
}

}  // namespace xfmr
