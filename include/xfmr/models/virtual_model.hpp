// virtual_model.hpp: VirtualModel<Backend>, what every model behind a
// virtual interface (LanguageModel, ClassifierModel, TranslationModel)
// gives the Trainer, the optimizers and the checkpoints: visit(f) over the
// parameters and for_each_dropout(f) over the dropout layers, as the typed
// models do (the same FunctionRefs), through two virtual functions an
// implementation overrides by handing them to its typed model.
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
};

}  // namespace xfmr
