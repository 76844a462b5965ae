// language_model.hpp: LanguageModel<Backend>, a Decoder whose architecture
// is chosen at run time: by a preset's name (LanguageModelPresets,
// presets.hpp), or as any PresetInfo (parts, sizes and knobs).
//
//   auto model = xfmr::make_language_model<Be>("shakespeare-small", vocab, seed, {.dropout = 0.1});
//   auto llama = xfmr::make_language_model<Be>(arch, vocab, seed);   // arch: a PresetInfo of any shape
//   xfmr::AdamW<Be> opt(*model);
//   xfmr::Trainer<xfmr::LanguageModel<Be>, Be> trainer(*model, be, opt, {...},
//       [&] { return xfmr::make_language_model<Be>("shakespeare-small", vocab, seed); });
//
// It is a Decoder<Cfg, Backend> behind a virtual interface: the same
// members (forward, backward, forward_to_head, head_loss, start_cache,
// forward_cached, visit, for_each_dropout, set_training, recompute) and the
// same numbers, bit for bit. What make_language_model builds is the Decoder of presets.hpp's
// AnyParts (every size and every part held at run time: the norms' place
// and kind, the activation, the positions), compiled once in the library
// (src/language_models.cpp for CpuBackend<float>,
// src/cuda/language_models.cpp for CUDA), so a program that picks its model
// at run time compiles none itself, and every decoder architecture the
// layers build runs without a recompile, with the bits of the static
// configuration of its parts (test_dynamic). A static configuration of
// one's own goes in the same way: make_decoder_model<MyCfg, Be>(vocab, seed, opts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "xfmr/core/params.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/virtual_model.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

template <class Backend>
class LanguageModel : public VirtualModel<Backend> {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  // The architecture's name, parts, shape and knobs, the vocabulary and the
  // options it was built with.
  virtual const PresetInfo& preset() const = 0;
  ModelDims dims() const { return preset().dims(); }
  virtual int vocab() const = 0;
  int max_t() const { return preset().max_t; }
  virtual const DecoderOptions& options() const = 0;
  // What visit() lists, without visiting it.
  virtual std::size_t parameter_count() const = 0;
  // A model of the same architecture, vocabulary, options and seed (its
  // dropout layers' streams): a replica for DataParallel's shards, which
  // copy the weights in before every use.
  virtual std::unique_ptr<LanguageModel> clone() const = 0;

  // Decoder's, in order: logits (B*T, vocab) of ids (B*T), valid until the
  // next forward; backward(dlogits) accumulates every parameter gradient;
  // decoding through a cache.
  virtual std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) = 0;
  virtual void backward(Backend& be, std::span<const A> dlogits) = 0;
  // Training without the batch's logits: Decoder::forward_to_head, then
  // head_loss (the head and the loss a block of rows at a time, then the backward).
  virtual HeadRows forward_to_head(Backend& be, std::span<const std::int32_t> ids, Shape bt) = 0;
  virtual HeadLoss head_loss(Backend& be, CrossEntropyLoss<Backend>& loss, std::span<const std::int32_t> targets,
                             double scale) = 0;
  // The final hidden states (B*T, d_model): Decoder::hidden.
  virtual std::span<const A> hidden(Backend& be, std::span<const std::int32_t> ids, Shape bt) = 0;
  virtual void start_cache(DecodingCache<Backend>& cache, int B, int capacity = 0) = 0;
  virtual std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B,
                                            DecodingCache<Backend>& cache) = 0;
  // A ragged step (continuous batching): the logits of each segment's last position.
  virtual std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, RaggedStep step,
                                            DecodingCache<Backend>& cache) = 0;

  // f(name, adapters, weight) for each projection of the blocks
  // ("blocks.0.attn.qkv", "blocks.0.ff.fc1", ...: Decoder::visit_linears):
  // LoRA (models/lora.hpp).
  using AdapterVisitor = FunctionRef<void(std::string_view, LinearAdapters<Backend>&, Tensor&)>;
  virtual void visit_adapters(AdapterVisitor f) = 0;
  // Which adapters loaded beside the model (ids k > 0, LinearAdapters::select)
  // the next forwards' rows take: ids[r] for row r (a ragged step's; the
  // span outlives the forward), or one for every row.
  void select_adapters(std::span<const int> ids) {
    visit_adapters([&](std::string_view, LinearAdapters<Backend>& a, Tensor&) { a.select(ids); });
  }
  void select_adapter(int id) {
    visit_adapters([&](std::string_view, LinearAdapters<Backend>& a, Tensor&) { a.select_all(id); });
  }
  // Decoder::freeze_base: backward leaves the base's gradients untouched.
  virtual void freeze_base(bool on) = 0;

  virtual void set_training(bool on) = 0;
  virtual void set_recompute(Recompute r) = 0;
  virtual Recompute recompute() const = 0;
  // Every attention layer materialises its probabilities (not tiled): the
  // path before tiled attention, for comparison (xfmr-bench).
  virtual void keep_attention_probabilities(bool on) = 0;
};

// The Decoder of configuration Cfg as a LanguageModel: of Cfg's own sizes,
// or (Dynamic) of an architecture's, whose parts must be Cfg's.
template <BlockConfig Cfg, class Backend>
class DecoderModel final : public LanguageModel<Backend> {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  DecoderModel(int vocab, std::uint64_t seed, const DecoderOptions& opts = {})
    requires(is_static_config<Cfg>())
      : DecoderModel(preset_info<Cfg>(), vocab, seed, opts) {}
  DecoderModel(const PresetInfo& arch, int vocab, std::uint64_t seed, const DecoderOptions& opts = {})
      : info_(checked_parts<Cfg>(arch)), model_(info_.dims(), vocab, seed, opts), count_(xfmr::parameter_count(model_)),
        seed_(seed) {}

  const PresetInfo& preset() const override { return info_; }
  int vocab() const override { return model_.vocab(); }
  const DecoderOptions& options() const override { return model_.options(); }
  std::size_t parameter_count() const override { return count_; }
  std::unique_ptr<LanguageModel<Backend>> clone() const override {
    return std::make_unique<DecoderModel>(info_, model_.vocab(), seed_, model_.options());
  }

  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return model_.forward(be, ids, bt);
  }
  void backward(Backend& be, std::span<const A> dlogits) override { model_.backward(be, dlogits); }
  HeadRows forward_to_head(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return model_.forward_to_head(be, ids, bt);
  }
  HeadLoss head_loss(Backend& be, CrossEntropyLoss<Backend>& loss, std::span<const std::int32_t> targets,
                     double scale) override {
    return model_.head_loss(be, loss, targets, scale);
  }
  std::span<const A> hidden(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return model_.hidden(be, ids, bt);
  }
  void start_cache(DecodingCache<Backend>& cache, int B, int capacity = 0) override {
    model_.start_cache(cache, B, capacity);
  }
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B,
                                    DecodingCache<Backend>& cache) override {
    return model_.forward_cached(be, ids, B, cache);
  }
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, RaggedStep step,
                                    DecodingCache<Backend>& cache) override {
    return model_.forward_cached(be, ids, step, cache);
  }

  void visit_adapters(typename LanguageModel<Backend>::AdapterVisitor f) override {
    model_.visit_linears([&](std::string_view name, auto& linear) { f(name, linear.adapters(), linear.weight()); });
  }
  void freeze_base(bool on) override { model_.freeze_base(on); }

  void set_training(bool on) override { model_.set_training(on); }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }
  Recompute recompute() const override { return model_.recompute(); }
  void keep_attention_probabilities(bool on) override {
    for (int i = 0; i < info_.n_layers; ++i) model_.blocks()[i].attention().keep_probabilities(on);
  }

  // The typed model inside (its blocks, its layers).
  Decoder<Cfg, Backend>& decoder() { return model_; }

 private:
  void visit_parameters(typename VirtualModel<Backend>::ParameterVisitor f) override { model_.visit(f); }
  void visit_dropout(typename VirtualModel<Backend>::DropoutVisitor f) override { model_.for_each_dropout(f); }

  PresetInfo info_;
  Decoder<Cfg, Backend> model_;
  std::size_t count_;
  std::uint64_t seed_;  // a clone's too: the dropout layers draw their streams from it
};

// A LanguageModel of a static configuration of one's own.
template <BlockConfig Cfg, class Backend>
std::unique_ptr<LanguageModel<Backend>> make_decoder_model(int vocab, std::uint64_t seed, const DecoderOptions& opts) {
  return std::make_unique<DecoderModel<Cfg, Backend>>(vocab, seed, opts);
}

// The Dynamic family's Decoder for an architecture of its parts.
template <BlockConfig Family, class Backend>
std::unique_ptr<LanguageModel<Backend>> make_family_model(const PresetInfo& arch, int vocab, std::uint64_t seed,
                                                          const DecoderOptions& opts) {
  return std::make_unique<DecoderModel<Family, Backend>>(arch, vocab, seed, opts);
}

// The model make_language_model builds: every part Dynamic (families::Any).
using LanguageModelFamilies = std::tuple<families::Any>;

// A LanguageModel of architecture `arch` (any shape and parts; a part the
// layers lack is an xfmr::Error naming it), vocabulary `vocab`, initialised
// from `seed` as Decoder is: the same bits as the static configuration of
// that shape and those parts. Compiled in the library for CpuBackend<float>
// and, with CUDA, the CUDA backends.
template <class Backend>
std::unique_ptr<LanguageModel<Backend>> make_language_model(const PresetInfo& arch, int vocab, std::uint64_t seed,
                                                           const DecoderOptions& opts = {}) {
  return detail::make_of_family<LanguageModelFamilies>(
      arch, [&]<class F>() { return make_family_model<F, Backend>(arch, vocab, seed, opts); });
}

// The preset `preset` (LanguageModelPresets; an unknown name is an
// xfmr::Error naming the choices).
template <class Backend>
std::unique_ptr<LanguageModel<Backend>> make_language_model(std::string_view preset, int vocab, std::uint64_t seed,
                                                           const DecoderOptions& opts = {}) {
  return make_language_model<Backend>(LanguageModelPresets::info(preset), vocab, seed, opts);
}

template <class S>
class CpuBackend;
#define XFMR_LANGUAGE_MODEL_FAMILY(KEYWORDS, F, Be)                                                       \
  KEYWORDS std::unique_ptr<LanguageModel<Be>> make_family_model<families::F, Be>(const PresetInfo&, int, \
                                                                                 std::uint64_t, const DecoderOptions&);
#define XFMR_LANGUAGE_MODEL_FAMILIES(X) X(Any)
#define XFMR_EXTERN_CPU_FAMILY(F) XFMR_LANGUAGE_MODEL_FAMILY(extern template, F, CpuBackend<float>)
XFMR_LANGUAGE_MODEL_FAMILIES(XFMR_EXTERN_CPU_FAMILY)
#undef XFMR_EXTERN_CPU_FAMILY
#ifdef XFMR_WITH_CUDA
template <class A>
class BasicCudaBackend;
struct Bf16;
using CudaBackend = BasicCudaBackend<float>;
using CudaBf16Backend = BasicCudaBackend<Bf16>;
#define XFMR_EXTERN_CUDA_FAMILY(F)                            \
  XFMR_LANGUAGE_MODEL_FAMILY(extern template, F, CudaBackend) \
  XFMR_LANGUAGE_MODEL_FAMILY(extern template, F, CudaBf16Backend)
XFMR_LANGUAGE_MODEL_FAMILIES(XFMR_EXTERN_CUDA_FAMILY)
#undef XFMR_EXTERN_CUDA_FAMILY
#endif

}  // namespace xfmr
