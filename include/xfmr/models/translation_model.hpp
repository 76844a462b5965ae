// translation_model.hpp: TranslationModel<Backend>, a Seq2Seq whose
// architecture is chosen at run time (a preset of TranslatorPresets, or any
// PresetInfo whose parts a compiled family has; both sides of one
// architecture), as LanguageModel is a Decoder's (language_model.hpp): the
// same members and the same numbers, bit for bit, behind a virtual
// interface. The families' Seq2Seq models are compiled once in the library
// (src/translation_models.cpp, and src/cuda/translation_models.cpp for CUDA).
//
//   auto model = xfmr::make_translation_model<Be>(xfmr::TranslatorPresets::info("multi30k"), V_src, V_tgt, seed);
//   const auto hyps = xfmr::translate(*model, be, sources, pad, {.beam = 4, .max_len = 63}, 32);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>

#include "xfmr/core/params.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/models/virtual_model.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

template <class Backend>
class TranslationModel : public VirtualModel<Backend> {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;
  using DecodeState = Seq2SeqDecodeState<Backend>;

  virtual const PresetInfo& preset() const = 0;  // both sides' parts, sizes and knobs
  virtual int source_vocab() const = 0;
  virtual int vocab() const = 0;  // the target's
  virtual const Seq2SeqOptions& options() const = 0;
  virtual std::size_t parameter_count() const = 0;
  // A model of the same architecture, vocabularies, options and seed (its
  // dropout layers' streams): a replica for DataParallel's shards.
  virtual std::unique_ptr<TranslationModel> clone() const = 0;

  // Seq2Seq's: teacher-forced logits (B*T, vocab); backward accumulates
  // every parameter gradient; encode, then decode through a DecodeState
  // (beam_search.hpp, infer/translate.hpp).
  virtual std::span<const A> forward(Backend& be, std::span<const std::int32_t> src, Shape src_shape,
                                     const std::uint8_t* src_padding, std::span<const std::int32_t> tgt,
                                     Shape tgt_shape, const std::uint8_t* tgt_padding = nullptr) = 0;
  virtual void backward(Backend& be, std::span<const A> dlogits) = 0;
  virtual void encode(Backend& be, std::span<const std::int32_t> src, Shape src_shape,
                      const std::uint8_t* src_padding = nullptr) = 0;
  virtual void start_decoding(Backend& be, DecodeState& st, int beams = 1) = 0;
  virtual std::span<const A> decode(Backend& be, std::span<const std::int32_t> ids, DecodeState& st) = 0;
  virtual void set_training(bool on) = 0;
  virtual void set_recompute(Recompute r) = 0;
  virtual Recompute recompute() const = 0;
  // The cross-attention probabilities of decoder layer `layer` (B, heads,
  // T, S) from the next forward on, materialised (not tiled) while kept.
  virtual void keep_cross_attention(int layer, bool on) = 0;
  virtual std::span<const S> cross_attention(int layer) = 0;
};

// The Seq2Seq of configuration Cfg on both sides (a family's: Dynamic
// sizes) as a TranslationModel.
template <BlockConfig Cfg, class Backend>
class TypedTranslationModel final : public TranslationModel<Backend> {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;
  using DecodeState = Seq2SeqDecodeState<Backend>;

  TypedTranslationModel(const PresetInfo& arch, int src_vocab, int tgt_vocab, std::uint64_t seed,
                        const Seq2SeqOptions& opts)
      : info_(checked_parts<Cfg>(arch)), model_(info_.dims(), info_.dims(), src_vocab, tgt_vocab, seed, opts),
        count_(xfmr::parameter_count(model_)), seed_(seed) {}

  const PresetInfo& preset() const override { return info_; }
  int source_vocab() const override { return model_.source_vocab(); }
  int vocab() const override { return model_.vocab(); }
  const Seq2SeqOptions& options() const override { return model_.options(); }
  std::size_t parameter_count() const override { return count_; }
  std::unique_ptr<TranslationModel<Backend>> clone() const override {
    return std::make_unique<TypedTranslationModel>(info_, model_.source_vocab(), model_.vocab(), seed_, model_.options());
  }

  std::span<const A> forward(Backend& be, std::span<const std::int32_t> src, Shape src_shape,
                             const std::uint8_t* src_padding, std::span<const std::int32_t> tgt, Shape tgt_shape,
                             const std::uint8_t* tgt_padding) override {
    return model_.forward(be, src, src_shape, src_padding, tgt, tgt_shape, tgt_padding);
  }
  void backward(Backend& be, std::span<const A> dlogits) override { model_.backward(be, dlogits); }
  void encode(Backend& be, std::span<const std::int32_t> src, Shape src_shape,
              const std::uint8_t* src_padding) override {
    model_.encode(be, src, src_shape, src_padding);
  }
  void start_decoding(Backend& be, DecodeState& st, int beams) override { model_.start_decoding(be, st, beams); }
  std::span<const A> decode(Backend& be, std::span<const std::int32_t> ids, DecodeState& st) override {
    return model_.decode(be, ids, st);
  }
  void set_training(bool on) override { model_.set_training(on); }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }
  Recompute recompute() const override { return model_.recompute(); }
  void keep_cross_attention(int layer, bool on) override { model_.block(layer).cross_attention().keep_probabilities(on); }
  std::span<const S> cross_attention(int layer) override { return model_.block(layer).cross_attention().probabilities(); }

 private:
  void visit_parameters(typename VirtualModel<Backend>::ParameterVisitor f) override { model_.visit(f); }
  void visit_dropout(typename VirtualModel<Backend>::DropoutVisitor f) override { model_.for_each_dropout(f); }

  PresetInfo info_;
  Seq2Seq<Cfg, Cfg, Backend> model_;
  std::size_t count_;
  std::uint64_t seed_;  // a clone's too: the dropout layers draw their streams from it
};

template <BlockConfig Family, class Backend>
std::unique_ptr<TranslationModel<Backend>> make_translation_family(const PresetInfo& arch, int src_vocab,
                                                                   int tgt_vocab, std::uint64_t seed,
                                                                   const Seq2SeqOptions& opts) {
  return std::make_unique<TypedTranslationModel<Family, Backend>>(arch, src_vocab, tgt_vocab, seed, opts);
}

// The family make_translation_model builds from: every part Dynamic
// (AnyParts), every architecture the layers build.
using TranslationFamilies = std::tuple<AnyParts>;

// A TranslationModel of architecture `arch` (its parts a family's, else an
// xfmr::Error naming them), initialised from `seed` as Seq2Seq is.
template <class Backend>
std::unique_ptr<TranslationModel<Backend>> make_translation_model(const PresetInfo& arch, int src_vocab,
                                                                  int tgt_vocab, std::uint64_t seed,
                                                                  const Seq2SeqOptions& opts = {}) {
  return detail::make_of_family<TranslationFamilies>(arch, [&]<class F>() {
    return make_translation_family<F, Backend>(arch, src_vocab, tgt_vocab, seed, opts);
  });
}

template <class S>
class CpuBackend;
#define XFMR_TRANSLATION_FAMILY(KEYWORDS, F, Be)                                                       \
  KEYWORDS std::unique_ptr<TranslationModel<Be>> make_translation_family<F, Be>(const PresetInfo&, int, int, \
                                                                                std::uint64_t, const Seq2SeqOptions&);
#define XFMR_TRANSLATION_FAMILIES(X, Be) X(AnyParts, Be)
#define XFMR_EXTERN_TRANSLATION(F, Be) XFMR_TRANSLATION_FAMILY(extern template, F, Be)
XFMR_TRANSLATION_FAMILIES(XFMR_EXTERN_TRANSLATION, CpuBackend<float>)
#ifdef XFMR_WITH_CUDA
template <class A>
class BasicCudaBackend;
struct Bf16;
XFMR_TRANSLATION_FAMILIES(XFMR_EXTERN_TRANSLATION, BasicCudaBackend<float>)
XFMR_TRANSLATION_FAMILIES(XFMR_EXTERN_TRANSLATION, BasicCudaBackend<Bf16>)
#endif
#undef XFMR_EXTERN_TRANSLATION

}  // namespace xfmr
