// parity.hpp: what test_cuda_parity's two files share: random inputs,
// device copies, the tolerance check and model tensor comparisons.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/rng.hpp"

namespace xfmr::test::parity {

using Cpu = CpuBackend<float>;
using Gpu = CudaBackend;
using F = std::vector<float>;

inline F randn(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  F v(n);
  for (auto& x : v) x = float(scale * r.normal());
  return v;
}

inline std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& i : ids) i = static_cast<std::int32_t>(r.below(vocab));
  return ids;
}

// A device copy of host data, and back.
template <class T>
struct Dev {
  cuda::DeviceArray<T> a;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) { cuda::upload(a.reserve(n), h.data(), n * sizeof(T)); }
  explicit Dev(std::size_t size) : n(size) { a.reserve(n); }
  T* p() { return a.data(); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cuda::download(h.data(), a.data(), n * sizeof(T));
    return h;
  }
};
using DevF = Dev<float>;

inline void expect_close(const F& cpu, const F& gpu, const std::string& what, double rtol = 1e-5, double atol = 1e-6) {
  BOOST_REQUIRE_EQUAL(cpu.size(), gpu.size());
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    BOOST_REQUIRE_MESSAGE(std::isfinite(gpu[i]), what << ": element " << i << " is " << gpu[i] << " on the GPU");
    const double excess = std::abs(double(cpu[i]) - double(gpu[i])) - (atol + rtol * std::abs(double(cpu[i])));
    if (excess > worst) worst = excess, at = i;
  }
  BOOST_TEST(worst == 0.0, what << ": element " << at << " of " << cpu.size() << ": cpu " << cpu[at] << ", gpu "
                                << gpu[at] << " (rtol " << rtol << ", atol " << atol << ")");
}

// ||gpu - cpu|| / ||cpu||, every GPU element finite (NaN never passes).
inline double relative_error(const F& cpu_values, const F& gpu_values, const std::string& what) {
  BOOST_REQUIRE_EQUAL(cpu_values.size(), gpu_values.size());
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < cpu_values.size(); ++i) {
    BOOST_REQUIRE_MESSAGE(std::isfinite(gpu_values[i]), what << ": element " << i << " is " << gpu_values[i]);
    diff += (double(gpu_values[i]) - cpu_values[i]) * (double(gpu_values[i]) - cpu_values[i]);
    norm += double(cpu_values[i]) * cpu_values[i];
  }
  return std::sqrt(diff / norm);
}

// name -> host copy of every parameter value (or gradient) of a model.
template <class Model>
std::map<std::string, F> tensors_of(Model& m, bool grads) {
  std::map<std::string, F> out;
  m.visit([&](std::string_view name, auto& value, auto& grad) {
    auto& t = grads ? grad : value;
    F h(t.size());
    t.copy_to_host(h.data());
    out[std::string(name)] = std::move(h);
  });
  return out;
}

template <class CpuModel, class GpuModel>
void expect_same_tensors(CpuModel& c, GpuModel& g, bool grads, const std::string& what, double rtol, double atol) {
  const auto a = tensors_of(c, grads), b = tensors_of(g, grads);
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (const auto& [name, values] : a) {
    BOOST_REQUIRE_MESSAGE(b.count(name), what << ": the GPU model has no '" << name << "'");
    expect_close(values, b.at(name), what + (grads ? " d" : " ") + name, rtol, atol);
  }
}

template <class Model>
void zero_grads(Model& m) {
  m.visit([](std::string_view, auto&, auto& g) { g.zero(); });
}

struct Backends {
  Cpu cpu;
  Gpu gpu;
};


}  // namespace xfmr::test::parity
