// gpt2.hpp: GPT-2 checkpoints in the Hugging Face layout, into and out of a
// Decoder with GPT-2's shape.
//
// A Hugging Face GPT-2 directory holds model.safetensors and config.json.
// The tensors are "wte.weight" (vocab, D), "wpe.weight" (n_positions, D),
// per block i "h.<i>.ln_1.*", "h.<i>.attn.c_attn.*", "h.<i>.attn.c_proj.*",
// "h.<i>.ln_2.*", "h.<i>.mlp.c_fc.*", "h.<i>.mlp.c_proj.*", then "ln_f.*";
// every name may carry a "transformer." prefix (as GPT2LMHeadModel saves
// them), and the LM head is wte itself. The linear layers are Conv1D:
// y = x W + b with W stored (in, out), the transpose of xfmr's (out, in).
// The attention mask buffers some files hold ("h.<i>.attn.bias",
// "h.<i>.attn.masked_bias") are skipped; an "lm_head.weight" must equal wte.
//
// Gpt2Config: config.json's fields that fix the shape. read_gpt2_config
//   takes them from the file's metadata ("config", as save_gpt2 writes it)
//   or else from config.json beside the file.
// open_gpt2(path): a checkpoint directory or its .safetensors file, read
//   with its config; kGpt2Options builds the Decoder that load_gpt2 fills.
// load_gpt2(model, st, config): fills a Decoder built with tie_weights and
//   no head bias whose Cfg matches the config (pre-norm, LayerNorm with eps
//   1e-5, GELU with the tanh approximation, learned positions, biases);
//   every mismatch is an xfmr::Error naming the tensor or field and the
//   sizes on both sides.
// save_gpt2(model, dir): a Decoder or a LanguageModel of GPT-2's shape
//   (any size: io/pretrained.hpp picks the preset back) writes dir/model.safetensors (F32, no prefix,
//   metadata "format": "pt" and "config"), dir/config.json and any
//   attached files (the tokenizer), as one new directory swapped in
//   (write_hf_directory); an existing one is replaced only with overwrite.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xfmr/blocks/residual.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/io/safetensors.hpp"
#include "xfmr/io/weight_sources.hpp"
#include "xfmr/layers/activation.hpp"
#include "xfmr/layers/layer_norm.hpp"
#include "xfmr/layers/positional.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/language_model.hpp"

namespace xfmr {

// kGpt2Shaped at run time: whether a preset is GPT-2's block (pre-norm
// LayerNorm, GELU, learned positions, biases, one key/value head a head).
bool gpt2_shaped(const PresetInfo& p);

struct Gpt2Config {
  int vocab_size = 50257, n_positions = 1024, n_embd = 768, n_layer = 12, n_head = 12;
  int n_inner = 0;  // 0: 4 * n_embd, as config.json's null
  double layer_norm_epsilon = 1e-5;
  std::string activation_function = "gelu_new";

  int d_ff() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // config.json's text; `source` names it in errors. Missing fields take
  // GPT-2's defaults, as Hugging Face's GPT2Config does.
  static Gpt2Config from_json(std::string_view text, const std::string& source);
  // config.json as Hugging Face reads it (model_type "gpt2").
  std::string to_json() const;
};

// The architecture of a GPT-2 checkpoint of config c: the GPT family
// (pre-norm LayerNorm, GELU, learned positions) at the config's sizes and epsilon, named after the
// preset of its shape if one has it, else "gpt2".
PresetInfo gpt2_architecture(const Gpt2Config& c);

// The config of the GPT-2 checkpoint `model_file`, already read as `st`.
Gpt2Config read_gpt2_config(const std::filesystem::path& model_file, const SafeTensors& st);

struct Gpt2Checkpoint {
  std::filesystem::path file;  // the model.safetensors read
  SafeTensors tensors;
  Gpt2Config config;
};
// `path`: a directory holding model.safetensors (and config.json), or the
// .safetensors file; one that does not exist is an error naming `what`
// (an option, say) and the path.
Gpt2Checkpoint open_gpt2(const std::filesystem::path& path, const std::string& what = "GPT-2 checkpoint");

// GPT-2's head: tied to the token embedding, without a bias.
inline constexpr DecoderOptions kGpt2Options{.tie_weights = true, .head_bias = false};

namespace detail {
// The Hugging Face name of a Decoder parameter (without prefix), and whether
// its matrix is stored transposed (Conv1D); an error for a parameter GPT-2
// has no counterpart for.
struct Gpt2Tensor {
  std::string name;
  bool transposed = false;
};
Gpt2Tensor gpt2_tensor(std::string_view xfmr_name);
// "transformer." when the file's tensors carry it, else "".
std::string gpt2_prefix(const SafeTensors& st);
// Every tensor of `st` not in `used` is one GPT-2 files may hold beside the
// parameters, or an error naming it.
void gpt2_check_rest(const SafeTensors& st, const std::string& prefix, const std::set<std::string>& used);
template <class S>
void gpt2_add(SafeTensorsWriter& w, const std::string& name, const std::vector<std::int64_t>& shape,
              const std::vector<S>& values, bool transposed);
void gpt2_write(const std::filesystem::path& dir, const SafeTensorsWriter& w, const Gpt2Config& config, bool overwrite,
                std::span<const AttachedFile> attached);

// GPT-2's block: pre-norm LayerNorm, GELU (tanh), learned positions, biases.
// (A Dynamic configuration's sizes and biases are checked at run time, gpt2_check_preset.)
template <class Cfg, class Backend>
inline constexpr bool kGpt2Shaped =
    std::is_same_v<typename Cfg::Norm, PreNorm> && std::is_same_v<typename Cfg::Activation, Gelu> &&
    std::is_same_v<norm_layer_t<Cfg, Cfg::D_MODEL, Backend>, LayerNorm<Cfg::D_MODEL, Backend>> &&
    std::is_same_v<typename positions_tag<Cfg>::type, Learned> &&
    (!is_static_config<Cfg>() ||
     (linear_bias<Cfg>() && qk_head_dim<Cfg>() * Cfg::N_HEADS == Cfg::D_MODEL &&
      v_head_dim<Cfg>() * Cfg::N_HEADS == Cfg::D_MODEL && kv_heads<Cfg>() == Cfg::N_HEADS));

// The config against a model's vocabulary and architecture (sizes and epsilon).
void gpt2_check_config(const Gpt2Config& c, const std::string& source, int vocab, const PresetInfo& p);
void gpt2_check_options(const DecoderOptions& o);
// gpt2_check_preset: gpt2_shaped, or an xfmr::Error naming the preset.
void gpt2_check_preset(const PresetInfo& p);

// The tensor `name` of `st` in xfmr's layout and `shape`, read as needed:
// checked against the shape GPT-2 stores (transposed for Conv1D) now, for
// finite values when read.
std::shared_ptr<const WeightSource> gpt2_source(const SafeTensors& st, const std::string& name,
                                                const std::vector<std::int64_t>& shape, bool transposed);

// Every parameter of `model` from `st`, by its GPT-2 name (the matrices
// of a CPU model deferred to the file: io/weight_sources.hpp).
template <class S, class Model>
void gpt2_fill(Model& model, const SafeTensors& st) {
  const std::string prefix = gpt2_prefix(st);
  std::set<std::string> used;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const auto t = gpt2_tensor(name);
    assign_weights(value, gpt2_source(st, prefix + t.name, value.shape(), t.transposed));
    used.insert(prefix + t.name);
  });
  gpt2_check_rest(st, prefix, used);
}
}  // namespace detail

template <class Cfg, class Backend>
void load_gpt2(Decoder<Cfg, Backend>& model, const SafeTensors& st, const Gpt2Config& config) {
  static_assert(detail::kGpt2Shaped<Cfg, Backend>,
                "GPT-2 needs a pre-norm LayerNorm Decoder with Gelu, learned positions and biases");
  const PresetInfo p = preset_info<Cfg>(model.dims());
  detail::gpt2_check_preset(p);
  detail::gpt2_check_options(model.options());
  detail::gpt2_check_config(config, st.source(), model.vocab(), p);
  detail::gpt2_fill<typename Backend::Scalar>(model, st);
}

// The same into a LanguageModel (a preset chosen at run time, built with
// kGpt2Options: make_language_model<Be>("gpt2-small", config.vocab_size, 0, kGpt2Options)).
template <class Backend>
void load_gpt2(LanguageModel<Backend>& model, const SafeTensors& st, const Gpt2Config& config) {
  const PresetInfo& p = model.preset();
  detail::gpt2_check_preset(p);
  detail::gpt2_check_options(model.options());
  detail::gpt2_check_config(config, st.source(), model.vocab(), p);
  detail::gpt2_fill<typename Backend::Scalar>(model, st);
}

// The config of a GPT-2-shaped model of preset `p` and vocabulary `vocab`.
Gpt2Config gpt2_config_of(const PresetInfo& p, int vocab);

namespace detail {
template <class Model>
void gpt2_save(Model& model, const PresetInfo& p, const std::filesystem::path& dir, bool overwrite,
               std::span<const AttachedFile> attached) {
  using S = typename std::remove_cvref_t<decltype(model)>::S;
  gpt2_check_preset(p);
  gpt2_check_options(model.options());
  SafeTensorsWriter w;
  model.visit([&](std::string_view name, auto& value, auto&) {
    const auto t = gpt2_tensor(name);
    std::vector<S> host(value.size());
    value.copy_to_host(host.data());
    gpt2_add(w, t.name, value.shape(), host, t.transposed);
  });
  gpt2_write(dir, w, gpt2_config_of(p, model.vocab()), overwrite, attached);
}
}  // namespace detail

template <class Cfg, class Backend>
void save_gpt2(Decoder<Cfg, Backend>& model, const std::filesystem::path& dir, bool overwrite = false,
               std::span<const AttachedFile> attached = {}) {
  static_assert(detail::kGpt2Shaped<Cfg, Backend>,
                "GPT-2 needs a pre-norm LayerNorm Decoder with Gelu, learned positions and biases");
  detail::gpt2_save(model, preset_info<Cfg>(model.dims()), dir, overwrite, attached);
}

template <class Backend>
void save_gpt2(LanguageModel<Backend>& model, const std::filesystem::path& dir, bool overwrite = false,
               std::span<const AttachedFile> attached = {}) {
  detail::gpt2_save(model, model.preset(), dir, overwrite, attached);
}

}  // namespace xfmr
