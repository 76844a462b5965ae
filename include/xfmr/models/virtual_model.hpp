// virtual_model.hpp: VirtualModel<Backend>, what every model behind a
// virtual interface (LanguageModel, ClassifierModel, TranslationModel)
// gives the Trainer, the optimizers and the checkpoints: visit(f) over the
// parameters and for_each_dropout(f) over the dropout layers, as the typed
// models' templates do, through two virtual functions an implementation
// overrides with its typed model (visit_of, dropout_of).
#pragma once

#include <string_view>

#include "xfmr/core/params.hpp"
#include "xfmr/layers/dropout.hpp"

namespace xfmr {

template <class Backend>
class VirtualModel {
 public:
  using Tensor = typename Backend::Tensor;
  using ParameterVisitor = xfmr::ParameterVisitor<Backend>;
  using DropoutVisitor = xfmr::DropoutVisitor;

  virtual ~VirtualModel() = default;

  // f(name, value, grad) for every parameter; f(DropoutKeys&) for every
  // dropout layer (models/model.hpp).
  template <class F>
  void visit(F&& f) {
    visit_parameters(ParameterVisitor(f));
  }
  template <class F>
  void for_each_dropout(F&& f) {
    visit_dropout(DropoutVisitor(f));
  }

 protected:
  virtual void visit_parameters(ParameterVisitor f) = 0;
  virtual void visit_dropout(DropoutVisitor f) = 0;
  // An implementation's overrides, given its typed model.
  template <class M>
  static void visit_of(M& m, ParameterVisitor f) {
    m.visit(f);
  }
  template <class M>
  static void dropout_of(M& m, DropoutVisitor f) {
    m.for_each_dropout(f);
  }
};

}  // namespace xfmr
