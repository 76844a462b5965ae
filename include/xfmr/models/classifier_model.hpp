// classifier_model.hpp: ClassifierModel<Backend>, a Classifier whose
// architecture is chosen at run time (a preset of ClassifierPresets, or any
// PresetInfo whose parts a compiled family has), as LanguageModel is a
// Decoder's (language_model.hpp): the same members and the same numbers,
// bit for bit, behind a virtual interface. The families' Classifiers are
// compiled once in the library (src/classifier_models.cpp, and
// src/cuda/classifier_models.cpp for CUDA), so a program that picks its model
// at run time compiles none of its own.
//
//   auto model = xfmr::make_classifier<Be>(xfmr::ClassifierPresets::info("sst2"), vocab, classes, seed);
//   xfmr::Trainer<xfmr::ClassifierModel<Be>, Be> trainer(*model, be, opt, {...});
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "xfmr/core/params.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/virtual_model.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

template <class Backend>
class ClassifierModel : public VirtualModel<Backend> {
 public:
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  virtual const PresetInfo& preset() const = 0;  // name, parts, sizes and knobs
  virtual int vocab() const = 0;
  virtual int classes() const = 0;
  virtual const ClassifierOptions& options() const = 0;
  virtual std::size_t parameter_count() const = 0;
  // A model of the same architecture, vocabulary, classes, options and
  // seed (its dropout layers' streams): a replica for DataParallel's shards.
  virtual std::unique_ptr<ClassifierModel> clone() const = 0;

  // Classifier's: logits (B, classes) of ids (B*T) with their key padding;
  // backward(dlogits) accumulates every parameter gradient.
  virtual std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt,
                                     const std::uint8_t* key_padding = nullptr) = 0;
  virtual void backward(Backend& be, std::span<const A> dlogits) = 0;
  virtual void set_training(bool on) = 0;
  virtual void set_recompute(Recompute r) = 0;
  virtual Recompute recompute() const = 0;
};

// The Classifier of configuration Cfg (a family's: Dynamic sizes) as a ClassifierModel.
template <BlockConfig Cfg, class Backend>
class TypedClassifierModel final : public ClassifierModel<Backend> {
 public:
  using A = typename Backend::Activation;
  using Tensor = typename Backend::Tensor;

  TypedClassifierModel(const PresetInfo& arch, int vocab, int classes, std::uint64_t seed,
                       const ClassifierOptions& opts)
      : info_(checked_parts<Cfg>(arch)), model_(info_.dims(), vocab, classes, seed, opts),
        count_(xfmr::parameter_count(model_)), seed_(seed) {}

  const PresetInfo& preset() const override { return info_; }
  int vocab() const override { return model_.vocab(); }
  int classes() const override { return model_.classes(); }
  const ClassifierOptions& options() const override { return model_.options(); }
  std::size_t parameter_count() const override { return count_; }
  std::unique_ptr<ClassifierModel<Backend>> clone() const override {
    return std::make_unique<TypedClassifierModel>(info_, model_.vocab(), model_.classes(), seed_, model_.options());
  }

  std::span<const A> forward(Backend& be, std::span<const std::int32_t> ids, Shape bt,
                             const std::uint8_t* key_padding) override {
    return model_.forward(be, ids, bt, key_padding);
  }
  void backward(Backend& be, std::span<const A> dlogits) override { model_.backward(be, dlogits); }
  void set_training(bool on) override { model_.set_training(on); }
  void set_recompute(Recompute r) override { model_.set_recompute(r); }
  Recompute recompute() const override { return model_.recompute(); }

 private:
  void visit_parameters(typename VirtualModel<Backend>::ParameterVisitor f) override { model_.visit(f); }
  void visit_dropout(typename VirtualModel<Backend>::DropoutVisitor f) override { model_.for_each_dropout(f); }

  PresetInfo info_;
  Classifier<Cfg, Backend> model_;
  std::size_t count_;
  std::uint64_t seed_;  // a clone's too: the dropout layers draw their streams from it
};

template <BlockConfig Family, class Backend>
std::unique_ptr<ClassifierModel<Backend>> make_classifier_family(const PresetInfo& arch, int vocab, int classes,
                                                                 std::uint64_t seed, const ClassifierOptions& opts) {
  return std::make_unique<TypedClassifierModel<Family, Backend>>(arch, vocab, classes, seed, opts);
}

// The family make_classifier builds from: every part Dynamic (AnyParts),
// every architecture the layers build.
using ClassifierFamilies = std::tuple<AnyParts>;

// A ClassifierModel of architecture `arch` (its parts a family's, else an
// xfmr::Error naming them) with `classes` classes, initialised from `seed`
// as Classifier is.
template <class Backend>
std::unique_ptr<ClassifierModel<Backend>> make_classifier(const PresetInfo& arch, int vocab, int classes,
                                                          std::uint64_t seed, const ClassifierOptions& opts = {}) {
  return detail::make_of_family<ClassifierFamilies>(arch, [&]<class F>() {
    return make_classifier_family<F, Backend>(arch, vocab, classes, seed, opts);
  });
}

template <class S>
class CpuBackend;
#define XFMR_CLASSIFIER_FAMILY(KEYWORDS, F, Be)                                                          \
  KEYWORDS std::unique_ptr<ClassifierModel<Be>> make_classifier_family<F, Be>(const PresetInfo&, int, int, \
                                                                              std::uint64_t, const ClassifierOptions&);
#define XFMR_CLASSIFIER_FAMILIES(X, Be) X(AnyParts, Be)
#define XFMR_EXTERN_CLASSIFIER(F, Be) XFMR_CLASSIFIER_FAMILY(extern template, F, Be)
XFMR_CLASSIFIER_FAMILIES(XFMR_EXTERN_CLASSIFIER, CpuBackend<float>)
#ifdef XFMR_WITH_CUDA
template <class A>
class BasicCudaBackend;
struct Bf16;
XFMR_CLASSIFIER_FAMILIES(XFMR_EXTERN_CLASSIFIER, BasicCudaBackend<float>)
XFMR_CLASSIFIER_FAMILIES(XFMR_EXTERN_CLASSIFIER, BasicCudaBackend<Bf16>)
#endif
#undef XFMR_EXTERN_CLASSIFIER

}  // namespace xfmr
