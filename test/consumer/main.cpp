// Builds a pre-norm decoder-only block, runs it, and round-trips its
// parameters through safetensors: exercises the headers, Eigen, OpenMP and
// the compiled xfmr_core from an outside project. Exits non-zero on failure.
#include <cmath>
#include <cstdio>
#include <xfmr/xfmr.hpp>

struct Tiny {
  static constexpr int MAX_T = 8, D_MODEL = 16, N_HEADS = 2, N_LAYERS = 1, D_FF = 32;
  using Norm = xfmr::PreNorm;
  using Activation = xfmr::Gelu;
};

int main() {
  using Be = xfmr::CpuBackend<float>;
  xfmr::Rng rng(1);
  Be be;
  xfmr::DecoderOnlyBlock<Tiny, Be> block(rng);
  const xfmr::Shape bt{2, 8};
  std::vector<float> x(bt.rows() * 16), y(x.size());
  for (auto& v : x) v = float(rng.uniform(-1, 1));
  block.forward(be, xfmr::ConstRows<float, 16>(x.data(), bt.rows()), xfmr::Rows<float, 16>(y.data(), bt.rows()), bt);
  double sum = 0;
  for (float v : y) sum += std::abs(v);

  xfmr::SafeTensorsWriter w;
  block.visit([&](std::string_view name, auto& value, auto&) {
    w.add<float>(std::string(name), value.shape(), std::span<const float>(value.data(), value.size()));
  });
  const auto st = xfmr::SafeTensors::parse(w.serialize());
  const std::size_t params = xfmr::parameter_count(block);
  std::printf("consumer: %zu tensors, %zu parameters, mean |y| = %.4f\n", st.names().size(), params, sum / y.size());
  return (st.names().size() == 12 && params > 0 && std::isfinite(sum) && sum > 0) ? 0 : 1;
}
