// gradcheck.hpp: the one gradient-check harness every layer, block and model
// test goes through (CpuBackend<double>).
//
// A GradCase wires a layer to plain vectors: inputs x[i] with gradients dx[i],
// an output y, and a fixed random R used as dy, so the scalar checked is
// L = <y, R>. check_case() then verifies, for every input and parameter
// element (or a seeded subset of large tensors):
//   1. central differences: |analytic - numeric| / max(|analytic|, |numeric|, floor) <= tol;
//   2. parameter gradients accumulate: a second backward doubles them;
//   3. input gradients are assigned: prefilling dx with NaN changes nothing.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/params.hpp"
#include "xfmr/core/rng.hpp"
#include "xfmr/core/tensor.hpp"

namespace xfmr::test {

using Be = CpuBackend<double>;
using Vec = std::vector<double>;
using ParamFn = std::function<void(std::string_view, Tensor<double>&, Tensor<double>&)>;

inline Vec random_vector(std::size_t n, Rng& rng, double scale = 1.0) {
  Vec v(n);
  for (auto& e : v) e = scale * rng.uniform(-1.0, 1.0);
  return v;
}

template <int C>
Rows<double, C> rows_of(Vec& v) {
  return {v.data(), static_cast<int>(v.size() / C)};
}
template <int C>
ConstRows<double, C> crows_of(const Vec& v) {
  return {v.data(), static_cast<int>(v.size() / C)};
}

struct GradCase {
  std::string name;
  std::vector<std::string> x_names;
  std::vector<Vec> x, dx;
  Vec y, dy;
  std::function<void()> forward;   // x -> y
  std::function<void()> backward;  // dy -> dx (assigned), parameter grads (+=)
  std::function<void(const ParamFn&)> visit = [](const ParamFn&) {};

  // Adds an input of n random elements in [-scale, scale].
  void input(std::string n, std::size_t size, Rng& rng, double scale = 1.0) {
    x_names.push_back(std::move(n));
    x.push_back(random_vector(size, rng, scale));
    dx.emplace_back(size, 0.0);
  }
  void output(std::size_t size, Rng& rng) {
    y.assign(size, 0.0);
    dy = random_vector(size, rng);
  }
};

struct Probe {
  std::string name;
  double* value;
  std::size_t size;
  Vec analytic;
};

struct CheckResult {
  std::size_t checked = 0;
  double worst = 0.0;
  std::string worst_at;
  std::vector<std::string> failures;
  bool ok() const { return failures.empty(); }
};

struct Tolerance {
  double rel = 1e-5;       // the bound on the relative error
  double floor = 1e-4;     // denominators below this count as this (near-zero gradients)
  double eps = 1e-5;       // central-difference step (truncation ~eps^2, rounding ~1e-16/eps)
  std::size_t max_elements = 4096;  // per tensor; larger tensors check a seeded subset
};

inline double relative_error(double a, double n, double floor) {
  return std::abs(a - n) / std::max({std::abs(a), std::abs(n), floor});
}

// Compares each probe's analytic gradient with central differences of loss().
inline CheckResult finite_differences(const std::function<double()>& loss, std::vector<Probe>& probes,
                                      const Tolerance& tol, std::uint64_t seed = 7) {
  CheckResult r;
  Rng pick(seed);
  for (auto& p : probes) {
    std::vector<std::size_t> idx;
    if (p.size <= tol.max_elements) {
      for (std::size_t i = 0; i < p.size; ++i) idx.push_back(i);
    } else {
      for (std::size_t k = 0; k < tol.max_elements; ++k) idx.push_back(pick.below(p.size));
    }
    for (std::size_t i : idx) {
      const double saved = p.value[i];
      p.value[i] = saved + tol.eps;
      const double up = loss();
      p.value[i] = saved - tol.eps;
      const double down = loss();
      p.value[i] = saved;
      const double numeric = (up - down) / (2 * tol.eps);
      const double err = relative_error(p.analytic[i], numeric, tol.floor);
      ++r.checked;
      if (err > r.worst || r.worst_at.empty()) {
        r.worst = std::max(r.worst, err);
        r.worst_at = p.name + "[" + std::to_string(i) + "]";
      }
      if (!(err <= tol.rel) && r.failures.size() < 8)
        r.failures.push_back(p.name + "[" + std::to_string(i) + "]: analytic " + std::to_string(p.analytic[i]) +
                             ", numeric " + std::to_string(numeric) + ", relative error " + std::to_string(err));
    }
  }
  return r;
}

inline double dot(const Vec& a, const Vec& b) {
  long double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<long double>(a[i]) * b[i];
  return static_cast<double>(s);
}

inline std::vector<Probe> probes_of(GradCase& c) {
  std::vector<Probe> probes;
  for (std::size_t i = 0; i < c.x.size(); ++i) probes.push_back({"input " + c.x_names[i], c.x[i].data(), c.x[i].size(), c.dx[i]});
  c.visit([&](std::string_view name, Tensor<double>& v, Tensor<double>& g) {
    probes.push_back({std::string(name), v.data(), v.size(), Vec(g.begin(), g.end())});
  });
  return probes;
}

inline void zero_params(GradCase& c) {
  c.visit([](std::string_view, Tensor<double>&, Tensor<double>& g) { g.zero(); });
}

// Runs forward + backward from zeroed gradients and returns the probes.
inline std::vector<Probe> analytic_gradients(GradCase& c) {
  c.forward();
  zero_params(c);
  for (auto& d : c.dx) std::fill(d.begin(), d.end(), 0.0);
  c.backward();
  return probes_of(c);
}

inline CheckResult numeric_check(GradCase& c, const Tolerance& tol = {}) {
  auto probes = analytic_gradients(c);
  return finite_differences([&] { c.forward(); return dot(c.y, c.dy); }, probes, tol);
}

// The whole battery, as Boost.Test assertions.
inline void check_case(GradCase& c, const Tolerance& tol = {}) {
  const CheckResult r = numeric_check(c, tol);
  std::cout << "gradcheck " << c.name << ": " << r.checked << " elements, worst relative error " << r.worst << " at "
            << r.worst_at << "\n";
  BOOST_TEST(r.checked > 0, c.name << ": nothing was checked");
  BOOST_TEST(r.ok(), c.name << ": " << r.failures.size() << "+ gradient mismatches, first: "
                            << (r.failures.empty() ? "" : r.failures.front()));

  // Parameter gradients accumulate: a second backward adds the same amount.
  const auto once = analytic_gradients(c);
  for (auto& d : c.dx) std::fill(d.begin(), d.end(), std::numeric_limits<double>::quiet_NaN());
  c.backward();
  const auto twice = probes_of(c);
  std::size_t bad_acc = 0, params = 0;
  for (std::size_t p = c.x.size(); p < once.size(); ++p)
    for (std::size_t i = 0; i < once[p].size; ++i, ++params)
      if (std::abs(twice[p].analytic[i] - 2 * once[p].analytic[i]) > 1e-12 * (1 + std::abs(once[p].analytic[i])))
        ++bad_acc;
  BOOST_TEST(bad_acc == 0u, c.name << ": " << bad_acc << " of " << params
                                   << " parameter gradient elements did not accumulate across two backward calls");

  // Input gradients are assigned: the NaN prefill above must be gone.
  std::size_t bad_assign = 0;
  for (std::size_t p = 0; p < c.x.size(); ++p)
    for (std::size_t i = 0; i < c.x[p].size(); ++i)
      if (!(c.dx[p][i] == once[p].analytic[i])) ++bad_assign;
  BOOST_TEST(bad_assign == 0u, c.name << ": " << bad_assign
                                      << " input gradient elements depend on the prior contents of dx");
}

}  // namespace xfmr::test
