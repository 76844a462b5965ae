// llama2c.hpp: llama2.c's float32 checkpoints (`.bin`, as its export.py
// writes them), into a Llama-shaped Decoder.
//
// Two layouts, little-endian:
//   version 0 (legacy): seven int32 (dim, hidden_dim, n_layers, n_heads,
//     n_kv_heads, vocab_size, seq_len; a negative vocab_size means the
//     classifier is a matrix of its own), then float32 tensors: the token
//     embedding (vocab, dim); each of the attention norms (dim), wq (dim,
//     dim), wk and wv (kv_dim, dim), wo (dim, dim), the feed-forward norms
//     (dim), w1 (hidden, dim), w2 (dim, hidden), w3 (hidden, dim), every
//     layer's in turn; the final norm (dim); the rotary tables (seq_len,
//     head/2, cos then sin: not read, xfmr computes them); the classifier
//     (vocab, dim) when it is not the embedding.
//   version 1: uint32 0x616b3432 ("ak42"), int32 1, the seven int32, a byte
//     1 when the classifier is the embedding, zeros up to 256 bytes; then
//     the attention norms, the feed-forward norms, the final norm, the
//     embedding, every layer's wq, wk, wv, wo, w1, w2, w3 (each for all
//     layers in turn), the classifier when it is its own.
// Version 2 (int8 Q8_0 groups) is refused with a message saying so.
//
// read_llama2c(path): the header, checked (positive sizes, heads dividing
//   dim and each other, the file's length exactly what the header implies)
//   and every tensor under xfmr's Decoder names: "tok_emb.weight",
//   "blocks.<i>.ln1.weight", "blocks.<i>.attn.qkv.weight" (rows [wq | wk |
//   wv]), "blocks.<i>.attn.proj.weight" (wo), "blocks.<i>.ln2.weight",
//   "blocks.<i>.ff.fc1.weight" (rows [w1 | w3]: SwiGLU's [gate | up]),
//   "blocks.<i>.ff.fc2.weight" (w2), "ln_f.weight", and "lm_head.weight"
//   when the classifier is its own.
// load_llama2c(model, checkpoint): fills a Decoder whose configuration is
//   Llama's (pre-norm RMSNorm, SwiGLU, rotary positions, no biases: the
//   head's either) and whose shape is the header's; llama2.c's attention
//   and rotary positions are xfmr's (pairs (2i, 2i+1), base 10000; RMSNorm
//   eps 1e-5). A tied model needs a file whose classifier is the
//   embedding; an untied one takes the embedding as its head when it is.
//   Every mismatch is an xfmr::Error naming the field and both values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/io/llama.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {

struct Llama2cConfig {
  int version = 0;
  int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
};

struct Llama2cCheckpoint {
  std::filesystem::path file;
  Llama2cConfig config;
  struct Tensor {
    std::vector<std::int64_t> shape;
    std::vector<float> values;
  };
  std::map<std::string, Tensor> tensors;  // by xfmr name
};

// The checkpoint at `path`; an error names the path and what is wrong.
Llama2cCheckpoint read_llama2c(const std::filesystem::path& path);

namespace detail {
// The model's shape against the header: an error naming the first field that differs.
void llama2c_check_config(const Llama2cConfig& c, const std::string& source, int vocab, int d, int layers, int heads,
                          int kv_heads, int d_ff);
}  // namespace detail

namespace detail {
template <class Model>
void llama2c_fill(Model& model, const Llama2cCheckpoint& ckpt) {
  using S = typename std::remove_cvref_t<decltype(model)>::S;
  const Llama2cConfig& c = ckpt.config;
  const std::string source = ckpt.file.string();
  require(!model.options().head_bias, source, ": llama2.c's classifier has no bias; build the model with head_bias = false");
  require(c.shared_classifier || !model.options().tie_weights, source,
          ": the classifier is a matrix of its own; build the model with tie_weights = false");
  std::vector<S> host;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const std::string key = name == "lm_head.weight" && c.shared_classifier ? "tok_emb.weight" : std::string(name);
    const auto it = ckpt.tensors.find(key);
    require(it != ckpt.tensors.end(), source, ": no tensor for the model's '", name, "'");
    require(it->second.shape == value.shape(), source, ": '", name, "' is ", shape_string(it->second.shape),
            " in the file, ", shape_string(value.shape()), " in the model");
    host.assign(it->second.values.begin(), it->second.values.end());
    value.copy_from_host(host.data());
  });
}
}  // namespace detail

namespace detail {
// Llama-shaped with llama2.c's knobs (theta 10000, epsilon 1e-5, no scaling,
// no biases), or an xfmr::Error naming the model's.
inline void llama2c_check_architecture(const PresetInfo& p) {
  llama_check_preset(p);
  require(p.rope_theta == 10000.0 && p.norm_eps == 1e-5 && p.rope_scaling.kind == RopeScaling::none && !p.qkv_bias,
          "llama2.c computes with rotary theta 10000, norm epsilon 1e-5, no rope scaling and no q/k/v biases; the "
          "model '", p.name, "' has theta ", p.rope_theta, ", epsilon ", p.norm_eps,
          p.qkv_bias ? " and q/k/v biases" : "");
}
}  // namespace detail

// The architecture of a llama2.c checkpoint of config c: the Llama family
// at its sizes, named after the preset of its shape if one has it.
PresetInfo llama2c_architecture(const Llama2cConfig& c);

template <class Cfg, class Backend>
void load_llama2c(Decoder<Cfg, Backend>& model, const Llama2cCheckpoint& ckpt) {
  static_assert(detail::kLlamaShaped<Cfg, Backend>,
                "llama2.c checkpoints need a Llama-shaped Decoder: pre-norm RmsNorm, SwiGlu, Rope, BIAS = false, "
                "heads D_MODEL / N_HEADS wide");
  const PresetInfo p = preset_info<Cfg>(model.dims());
  detail::llama2c_check_architecture(p);
  detail::llama2c_check_config(ckpt.config, ckpt.file.string(), model.vocab(), p.d_model, p.n_layers, p.n_heads,
                               p.kv_heads(), p.d_ff);
  detail::llama2c_fill(model, ckpt);
}

// The same into a LanguageModel of a Llama-shaped preset (io/pretrained.hpp picks it).
template <class Backend>
void load_llama2c(LanguageModel<Backend>& model, const Llama2cCheckpoint& ckpt) {
  const PresetInfo& p = model.preset();
  detail::llama2c_check_architecture(p);
  detail::llama2c_check_config(ckpt.config, ckpt.file.string(), model.vocab(), p.d_model, p.n_layers, p.n_heads,
                               p.kv_heads(), p.d_ff);
  detail::llama2c_fill(model, ckpt);
}

}  // namespace xfmr
