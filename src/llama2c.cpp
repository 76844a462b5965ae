// llama2c.cpp: read_llama2c (io/llama2c.hpp).
#include "xfmr/io/llama2c.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>

namespace xfmr {

namespace {

constexpr std::uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr std::size_t kVersion1Header = 256;
constexpr int kMaxSide = 1 << 20;  // any one size past this is not a model this library builds

std::int32_t int_at(const unsigned char* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The tensors of one layout, in file order: (xfmr-side key, rows, cols),
// each stored row-major as float32. The "qkv" and "fc1" parts are
// assembled after reading.
struct Part {
  std::string key;
  std::int64_t rows, cols;
};

std::vector<Part> layout(const Llama2cConfig& c) {
  const std::int64_t D = c.dim, F = c.hidden_dim, V = std::abs(c.vocab_size);
  const std::int64_t kv = std::int64_t(c.dim) / c.n_heads * c.n_kv_heads;
  auto each = [&](const std::string& what, std::int64_t rows, std::int64_t cols) {
    std::vector<Part> parts;
    for (int i = 0; i < c.n_layers; ++i) parts.push_back({"blocks." + std::to_string(i) + "." + what, rows, cols});
    return parts;
  };
  std::vector<Part> out;
  auto add = [&](std::vector<Part> parts) { out.insert(out.end(), parts.begin(), parts.end()); };
  if (c.version == 0) {
    add({{"tok_emb.weight", V, D}});
    add(each("ln1.weight", 1, D));
    add(each("wq", D, D));
    add(each("wk", kv, D));
    add(each("wv", kv, D));
    add(each("attn.proj.weight", D, D));
    add(each("ln2.weight", 1, D));
    add(each("w1", F, D));
    add(each("ff.fc2.weight", D, F));
    add(each("w3", F, D));
    add({{"ln_f.weight", 1, D}});
    const std::int64_t half = D / c.n_heads / 2;
    add({{"rope.cos", c.seq_len, half}, {"rope.sin", c.seq_len, half}});
  } else {
    add(each("ln1.weight", 1, D));
    add(each("ln2.weight", 1, D));
    add({{"ln_f.weight", 1, D}, {"tok_emb.weight", V, D}});
    add(each("wq", D, D));
    add(each("wk", kv, D));
    add(each("wv", kv, D));
    add(each("attn.proj.weight", D, D));
    add(each("w1", F, D));
    add(each("ff.fc2.weight", D, F));
    add(each("w3", F, D));
  }
  if (!c.shared_classifier) add({{"lm_head.weight", V, D}});
  return out;
}

// `header` names the header read: a legacy one has no magic, so the file
// may not be llama2.c's at all; the message says so.
constexpr const char* kLegacyHeader =
    "llama2.c legacy header (no version-1 magic \"ak42\"; is this a llama2.c .bin file?)";

void check_header(const Llama2cConfig& c, const std::string& source, const std::string& header) {
  auto positive = [&](const char* field, int v) {
    require(v > 0 && v <= kMaxSide, source, ": ", header, " field ", field, " is ", v, " (1..", kMaxSide, ")");
  };
  positive("dim", c.dim);
  positive("hidden_dim", c.hidden_dim);
  positive("n_layers", c.n_layers);
  positive("n_heads", c.n_heads);
  positive("n_kv_heads", c.n_kv_heads);
  positive("vocab_size", std::abs(c.vocab_size));
  positive("seq_len", c.seq_len);
  require(c.dim % c.n_heads == 0 && (c.dim / c.n_heads) % 2 == 0, source, ": ", header, ": dim ", c.dim,
          " is not n_heads ", c.n_heads, " heads of an even width");
  require(c.n_heads % c.n_kv_heads == 0, source, ": ", header, ": n_heads ", c.n_heads,
          " is not a multiple of n_kv_heads ", c.n_kv_heads);
  require(c.n_layers <= 1024, source, ": ", header, ": n_layers ", c.n_layers, " (at most 1024)");
}

}  // namespace

Llama2cCheckpoint read_llama2c(const std::filesystem::path& path) {
  const std::string source = path.string();
  std::error_code ec;
  require(std::filesystem::is_regular_file(path, ec), source, ": no llama2.c checkpoint there");
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  require(!ec, source, ": cannot read its size: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  require(bool(in), source, ": cannot open it");

  Llama2cCheckpoint ck;
  ck.file = path;
  Llama2cConfig& c = ck.config;
  unsigned char head[kVersion1Header] = {};
  const std::size_t first = std::size_t(std::min<std::uintmax_t>(size, kVersion1Header));
  in.read(reinterpret_cast<char*>(head), std::streamsize(first));
  require(first >= 28, source, ": ", size, " bytes is shorter than a llama2.c header (28)");
  std::uint32_t magic;
  std::memcpy(&magic, head, sizeof magic);
  std::size_t offset;
  if (magic == kMagic) {
    require(first >= kVersion1Header, source, ": ", size, " bytes is shorter than a version 1 header (256)");
    c.version = int_at(head + 4);
    require(c.version != 2, source, ": version 2 (int8 Q8_0 groups) is not supported; export float32 (version 0 or 1)");
    require(c.version == 1, source, ": llama2.c version ", c.version, " (0 or 1 supported)");
    const unsigned char* p = head + 8;
    for (int* f : {&c.dim, &c.hidden_dim, &c.n_layers, &c.n_heads, &c.n_kv_heads, &c.vocab_size, &c.seq_len})
      *f = int_at(p), p += 4;
    require(head[36] <= 1, source, ": version 1 shared-classifier flag is ", int(head[36]), " (0 or 1)");
    c.shared_classifier = head[36] == 1;
    require(c.vocab_size > 0, source, ": version 1 header: vocab_size ", c.vocab_size, " is not positive");
    offset = kVersion1Header;
  } else {
    c.version = 0;
    const unsigned char* p = head;
    for (int* f : {&c.dim, &c.hidden_dim, &c.n_layers, &c.n_heads, &c.n_kv_heads, &c.vocab_size, &c.seq_len})
      *f = int_at(p), p += 4;
    require(c.vocab_size != std::numeric_limits<std::int32_t>::min(), source, ": ", kLegacyHeader, ": vocab_size ",
            c.vocab_size, " out of range");
    c.shared_classifier = c.vocab_size > 0;
    offset = 28;
  }
  check_header(c, source, magic == kMagic ? "llama2.c version 1 header" : kLegacyHeader);
  c.vocab_size = std::abs(c.vocab_size);

  const std::vector<Part> parts = layout(c);
  std::uintmax_t floats = 0;
  for (const Part& p : parts) floats += std::uintmax_t(p.rows) * std::uintmax_t(p.cols);
  const std::uintmax_t want = offset + floats * sizeof(float);
  require(size == want, source, ": ", size, " bytes, but a version ", c.version, " checkpoint of this header (dim ",
          c.dim, ", hidden_dim ", c.hidden_dim, ", n_layers ", c.n_layers, ", n_heads ", c.n_heads, ", n_kv_heads ",
          c.n_kv_heads, ", vocab_size ", c.vocab_size, ", seq_len ", c.seq_len,
          c.shared_classifier ? ", shared classifier" : ", own classifier", ") holds ", want);

  in.seekg(std::streamoff(offset));
  std::map<std::string, Llama2cCheckpoint::Tensor> raw;
  for (const Part& p : parts) {
    Llama2cCheckpoint::Tensor t;
    t.shape = p.rows == 1 ? std::vector<std::int64_t>{p.cols} : std::vector<std::int64_t>{p.rows, p.cols};
    t.values.resize(std::size_t(p.rows * p.cols));
    in.read(reinterpret_cast<char*>(t.values.data()), std::streamsize(t.values.size() * sizeof(float)));
    require(bool(in), source, ": reading '", p.key, "' failed");
    if (p.key.rfind("rope.", 0) == 0) continue;  // xfmr computes the rotary tables
    for (float v : t.values) require(std::isfinite(v), source, ": '", p.key, "' holds a value that is not finite");
    raw.emplace(p.key, std::move(t));
  }

  // Fuse what xfmr keeps as one matrix: qkv rows [wq | wk | wv], fc1 rows [w1 | w3].
  auto stack = [&](const std::string& to, std::initializer_list<std::string> from) {
    Llama2cCheckpoint::Tensor t;
    std::int64_t rows = 0, cols = 0;
    for (const std::string& f : from) {
      auto& part = raw.at(f);
      rows += part.shape[0], cols = part.shape[1];
      t.values.insert(t.values.end(), part.values.begin(), part.values.end());
      raw.erase(f);
    }
    t.shape = {rows, cols};
    raw.emplace(to, std::move(t));
  };
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    stack(b + "attn.qkv.weight", {b + "wq", b + "wk", b + "wv"});
    stack(b + "ff.fc1.weight", {b + "w1", b + "w3"});
  }
  ck.tensors = std::move(raw);
  return ck;
}

namespace detail {

void llama2c_check_config(const Llama2cConfig& c, const std::string& source, int vocab, int d, int layers, int heads,
                          int kv_heads, int d_ff) {
  auto same = [&](const char* field, int file, const char* static_name, int model) {
    require(file == model, source, ": the checkpoint's ", field, " is ", file, ", the model's ", static_name, " ", model);
  };
  same("dim", c.dim, "D_MODEL", d);
  same("hidden_dim", c.hidden_dim, "D_FF", d_ff);
  same("n_layers", c.n_layers, "N_LAYERS", layers);
  same("n_heads", c.n_heads, "N_HEADS", heads);
  same("n_kv_heads", c.n_kv_heads, "N_KV_HEADS", kv_heads);
  same("vocab_size", c.vocab_size, "vocabulary", vocab);
}

}  // namespace detail
}  // namespace xfmr
