// language_model.hpp: LanguageModel<Backend>, a Decoder whose preset is
// chosen at run time, by name, from LanguageModelPresets (presets.hpp).
//
//   auto model = xfmr::make_language_model<Be>("shakespeare-small", vocab, seed, {.dropout = 0.1});
//   xfmr::AdamW<Be> opt(*model);
//   xfmr::Trainer<xfmr::LanguageModel<Be>, Be> trainer(*model, be, opt, {...},
//       [&] { return xfmr::make_language_model<Be>("shakespeare-small", vocab, seed); });
//
// It is a Decoder<Cfg, Backend> behind a virtual interface: the same
// members (forward, backward, start_cache, forward_cached, visit,
// for_each_dropout, set_training, recompute) and the same numbers, bit for
// bit. The shipped presets' Decoders are compiled once, in the library
// (src/language_models.cpp for CpuBackend<float>, cuda/language_models.cpp
// for CudaBackend), so a program that picks its preset at run time compiles
// none of them itself; the published models' shapes compile in a
// translation unit of their own per family (src/gpt2_models.cpp,
// src/llama_models.cpp), so that no one file is slow to build. A
// configuration of one's own goes in the same way:
// make_decoder_model<MyCfg, Be>(vocab, seed, opts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "xfmr/core/function_ref.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

template <class Backend>
class LanguageModel {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  virtual ~LanguageModel() = default;

  // The preset's name and shape, the vocabulary and the options it was built with.
  virtual const PresetInfo& preset() const = 0;
  virtual int vocab() const = 0;
  int max_t() const { return preset().max_t; }
  virtual const DecoderOptions& options() const = 0;
  // What visit() lists, without visiting it.
  virtual std::size_t parameter_count() const = 0;

  // Decoder's, in order: logits (B*T, vocab) of ids (B*T), valid until the
  // next forward; backward(dlogits) accumulates every parameter gradient;
  // decoding through a cache.
  virtual std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) = 0;
  virtual void backward(Backend& be, std::span<const A> dlogits) = 0;
  virtual void start_cache(DecodingCache<Backend>& cache, int B) = 0;
  virtual std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B,
                                            DecodingCache<Backend>& cache) = 0;

  virtual void set_training(bool on) = 0;
  virtual void set_recompute(Recompute r) = 0;
  virtual Recompute recompute() const = 0;
  // Every attention layer materialises its probabilities (not tiled): the
  // path before tiled attention, for comparison (xfmr-bench).
  virtual void keep_attention_probabilities(bool on) = 0;

  // f(name, value, grad) for every parameter; f(DropoutKeys&) for every
  // dropout layer (models/model.hpp).
  template <class F>
  void visit(F&& f) {
    visit_parameters(FunctionRef<void(std::string_view, Tensor&, Tensor&)>(f));
  }
  template <class F>
  void for_each_dropout(F&& f) {
    visit_dropout(FunctionRef<void(DropoutKeys&)>(f));
  }

 protected:
  virtual void visit_parameters(FunctionRef<void(std::string_view, Tensor&, Tensor&)> f) = 0;
  virtual void visit_dropout(FunctionRef<void(DropoutKeys&)> f) = 0;
};

// The Decoder of configuration Cfg as a LanguageModel.
template <BlockConfig Cfg, class Backend>
class DecoderModel final : public LanguageModel<Backend> {
 public:
  using S = typename Backend::Scalar;
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  DecoderModel(int vocab, std::uint64_t seed, const DecoderOptions& opts = {})
      : model_(vocab, seed, opts), count_(xfmr::parameter_count(model_)) {}

  const PresetInfo& preset() const override { return info_; }
  int vocab() const override { return model_.vocab(); }
  const DecoderOptions& options() const override { return model_.options(); }
  std::size_t parameter_count() const override { return count_; }

  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt) override {
    return model_.forward(be, ids, bt);
  }
  void backward(Backend& be, std::span<const A> dlogits) override { model_.backward(be, dlogits); }
  void start_cache(DecodingCache<Backend>& cache, int B) override { model_.start_cache(cache, B); }
  std::span<const A> forward_cached(Backend& be, std::span<const std::int32_t> ids, int B,
                                    DecodingCache<Backend>& cache) override {
    return model_.forward_cached(be, ids, B, cache);
  }

  void set_training(bool on) override { model_.set_training(on); }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }
  Recompute recompute() const override { return model_.recompute(); }
  void keep_attention_probabilities(bool on) override {
    for (int i = 0; i < Cfg::N_LAYERS; ++i) model_.blocks()[i].attention().keep_probabilities(on);
  }

  // The typed model inside (its blocks, its layers).
  Decoder<Cfg, Backend>& decoder() { return model_; }

 private:
  void visit_parameters(FunctionRef<void(std::string_view, Tensor&, Tensor&)> f) override {
    model_.visit([&](std::string_view name, Tensor& value, Tensor& grad) { f(name, value, grad); });
  }
  void visit_dropout(FunctionRef<void(DropoutKeys&)> f) override {
    model_.for_each_dropout([&](DropoutKeys& d) { f(d); });
  }

  static constexpr PresetInfo info_ = preset_info<Cfg>();
  Decoder<Cfg, Backend> model_;
  std::size_t count_;
};

// A LanguageModel of the preset `preset` (LanguageModelPresets; an unknown
// name is an xfmr::Error listing the choices), vocabulary `vocab`,
// initialised from `seed` as Decoder is. Compiled in the library for
// CpuBackend<float> and, with CUDA, CudaBackend.
template <BlockConfig Cfg, class Backend>
std::unique_ptr<LanguageModel<Backend>> make_decoder_model(int vocab, std::uint64_t seed, const DecoderOptions& opts) {
  return std::make_unique<DecoderModel<Cfg, Backend>>(vocab, seed, opts);
}

template <class Backend>
std::unique_ptr<LanguageModel<Backend>> make_language_model(std::string_view preset, int vocab, std::uint64_t seed,
                                                           const DecoderOptions& opts = {}) {
  return LanguageModelPresets::with(
      preset, [&]<class Cfg>() { return make_decoder_model<Cfg, Backend>(vocab, seed, opts); });
}

template <class S>
class CpuBackend;
extern template std::unique_ptr<LanguageModel<CpuBackend<float>>> make_language_model(std::string_view, int,
                                                                                      std::uint64_t,
                                                                                      const DecoderOptions&);
#ifdef XFMR_WITH_CUDA
template <class A>
class BasicCudaBackend;
struct Bf16;
using CudaBackend = BasicCudaBackend<float>;
using CudaBf16Backend = BasicCudaBackend<Bf16>;
extern template std::unique_ptr<LanguageModel<CudaBackend>> make_language_model(std::string_view, int, std::uint64_t,
                                                                               const DecoderOptions&);
extern template std::unique_ptr<LanguageModel<CudaBf16Backend>> make_language_model(std::string_view, int,
                                                                                   std::uint64_t,
                                                                                   const DecoderOptions&);
#endif

}  // namespace xfmr
