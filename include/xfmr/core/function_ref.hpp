// function_ref.hpp: FunctionRef<R(A...)>, a non-owning reference to a
// callable: what a virtual function takes where a template would take the
// callable itself (LanguageModel's visit). It allocates nothing; the callable
// must outlive the call.
#pragma once

#include <type_traits>
#include <utility>

namespace xfmr {

template <class Signature>
class FunctionRef;

template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, A...>)
  FunctionRef(F&& f)  // NOLINT: converts implicitly, as a callable parameter would
      : object_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...);
        }) {}

  R operator()(A... a) const { return call_(object_, std::forward<A>(a)...); }

 private:
  void* object_;
  R (*call_)(void*, A...);
};

}  // namespace xfmr
