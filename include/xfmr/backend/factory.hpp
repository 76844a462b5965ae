// factory.hpp: a backend chosen by name at run time, as a program's
// --backend and --precision options name it.
//
//   xfmr::with_backend("cpu", [&]<class Be>() {
//     Be be = xfmr::make_backend<Be>("cpu", "bf16");   // falls back to float32 with a notice where bf16 cannot run
//     std::cout << xfmr::describe(be) << "\n";          // "cpu (bf16 products)"
//     ...
//   });
//
// Names: cpu; cuda (an NVIDIA GPU, strict FP32 products), cuda-tf32 (TF32
// tensor-core products) and cuda-bf16 (CudaBf16Backend: activations stored
// in bfloat16, bf16 products, float32 master weights; its precision is
// bf16), which need an xfmr built with CUDA and, when run, a GPU.
// Precisions: fp32, bf16 (bf16 products: CpuOptions::bf16,
// CudaOptions::bf16), or on the CPU int8 and q4 (int8 and 4-bit weights
// when decoding: CpuOptions::int8, CpuOptions::q4). Under mpirun the ranks of a machine take its GPUs in
// turn. Unknown names are xfmr::Error listing the choices.
#pragma once

#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "xfmr/backend/bf16.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/cuda.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/core/distributed.hpp"

namespace xfmr {

inline constexpr const char* kBackendNames = "cpu, cuda, cuda-tf32 or cuda-bf16";
inline constexpr const char* kPrecisionNames = "fp32, bf16, int8 or q4";

// An unknown name is an xfmr::Error naming `what` (a program's option, say).
inline void check_backend_name(std::string_view name, std::string_view what = "backend") {
  require(name == "cpu" || name == "cuda" || name == "cuda-tf32" || name == "cuda-bf16", "unknown ", what, " '", name,
          "' (expected ", kBackendNames, ")");
}
inline void check_precision_name(std::string_view precision, std::string_view what = "precision") {
  require(precision == "fp32" || precision == "bf16" || precision == "int8" || precision == "q4", "unknown ", what,
          " '", precision, "' (expected ", kPrecisionNames, ")");
}
// int8 and q4 are decoding precisions (weights quantised once, WeightCopies),
// and a LoRA run's frozen base's.
inline bool is_decoding_precision(std::string_view precision) { return precision == "int8" || precision == "q4"; }
// Training refuses them, naming `what`.
inline void check_training_precision(std::string_view precision, std::string_view what = "precision") {
  check_precision_name(precision, what);
  require(!is_decoding_precision(precision), what, " ", precision,
          " is for decoding (sample, translate, eval); training runs in fp32 or bf16");
}

// The backend `name` in `precision` can run here, or xfmr::Error naming
// the options (`name_option`, `precision_option`) and why: the names known,
// the pair allowed (int8 weights on the CPU; bf16 products on cpu, cuda or
// cuda-bf16), and for a CUDA name an xfmr built with CUDA and a GPU the CUDA
// runtime sees. Programs call it with their other options, before they load
// or build anything (make_backend would refuse the same, later).
inline void check_backend(std::string_view name, std::string_view precision, std::string_view name_option = "backend",
                          std::string_view precision_option = "precision") {
  check_backend_name(name, name_option);
  check_precision_name(precision, precision_option);
  if (name == "cpu") return;
  require(!is_decoding_precision(precision), precision_option, " ", precision, " runs on the CPU backend (not ",
          name_option, " ", name, ")");
  require(precision != "bf16" || name != "cuda-tf32", precision_option, " bf16 goes with ", name_option,
          " cpu, cuda or cuda-bf16 (not ", name, ")");
#ifdef XFMR_WITH_CUDA
  require(cuda::device_count() > 0, name_option, " ", name, ": no usable CUDA device (the CUDA runtime sees none: ",
          "no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them); ", name_option, " cpu runs anywhere");
#else
  detail::fail(name_option, " ", name, ": this xfmr was built without CUDA (CMake found no CUDA compiler)");
#endif
}

// Calls f.template operator()<Backend>() with the backend type `name` names.
template <class F>
decltype(auto) with_backend(std::string_view name, F&& f) {
  check_backend_name(name);
  if (name != "cpu") {
#ifdef XFMR_WITH_CUDA
    if (name == "cuda-bf16") return f.template operator()<CudaBf16Backend>();
    return f.template operator()<CudaBackend>();
#else
    detail::fail("backend ", name, ": this xfmr was built without CUDA (CMake found no CUDA compiler)");
#endif
  }
  return f.template operator()<CpuBackend<float>>();
}

// The backend `name` names (with_backend chose its type) in `precision`; on
// a CPU without bf16 products, float32 with a notice on stderr.
template <class Be>
Be make_backend([[maybe_unused]] std::string_view name, std::string_view precision = "fp32") {
  check_precision_name(precision);
  if constexpr (std::is_same_v<Be, CpuBackend<float>>) {
    if (precision == "bf16") {
      if (bf16::available()) return Be({.bf16 = true});
      std::cerr << "note: bf16 precision unavailable (" << bf16::unavailable_reason() << "); running in float32\n";
    }
    if (precision == "int8") return Be({.int8 = true});
    if (precision == "q4") return Be({.q4 = true});
    return Be{};
  }
#ifdef XFMR_WITH_CUDA
  if constexpr (std::is_same_v<Be, CudaBackend>) {
    require(!is_decoding_precision(precision), precision, " precision runs on the CPU backend (not ", name, ")");
    require(precision == "fp32" || name == "cuda", "bf16 precision goes with the cuda backend (not ", name, ")");
    // Under mpirun, one GPU a rank: the ranks of a machine take its devices in turn.
    const int device = ProcessGroup::world().local_rank() % std::max(1, cuda::device_count());
    return CudaBackend({.device = device, .tf32 = name == "cuda-tf32", .bf16 = precision == "bf16"});
  }
  if constexpr (std::is_same_v<Be, CudaBf16Backend>) {  // bf16 storage: bf16 whatever the precision asked
    require(!is_decoding_precision(precision), precision, " precision runs on the CPU backend (not ", name, ")");
    const int device = ProcessGroup::world().local_rank() % std::max(1, cuda::device_count());
    return CudaBf16Backend({.device = device});
  }
#endif
  require(precision == "fp32", precision, " precision runs on the CPU", precision == "bf16" ? " and CUDA" : "",
          " backend", precision == "bf16" ? "s" : "", " (not ", Be::name, ")");
  return Be{};
}

// A LoRA run's backend (models/lora.hpp): its frozen base's products in
// `precision` (fp32; bf16: the products of the weights' bf16 copies, in
// both orientations; int8: the forward's products of the weights' int8
// copies, the decoding kernels', and the input gradient's of the values
// the base's source gives: an int8 checkpoint's own, or a float file's,
// as if the rounding to int8 passed the gradient through unchanged; q4:
// the forward's products of the 4-bit copies, the decoding kernels', and
// the input gradient's of the 4-bit weights themselves, as QLoRA's),
// every other product and operation float32 (WeightCopies). On the CPU
// backend only until LoRA has run on a GPU.
template <class Be>
Be make_frozen_base_backend(std::string_view name, std::string_view precision) {
  check_precision_name(precision);
  if constexpr (std::is_same_v<Be, CpuBackend<float>>) {
    if (precision == "fp32") return Be{};
    if (precision == "int8") return Be({.int8 = true});
    if (precision == "q4") return Be({.q4 = true});
    require(bf16::available(), "a bf16 base: ", bf16::unavailable_reason());
    return Be({.bf16_weights = true});
  } else {
    detail::fail("LoRA runs on the CPU backend (it has not run on a GPU yet), not ", name);
  }
}

// The precision a backend runs in: "bf16" (bf16 products, or bf16
// weights), "int8" (int8 weights), "q4" (4-bit weights) or "fp32".
template <class Be>
std::string precision_of(const Be& be) {
  if constexpr (requires(const Be& b) { b.options().bf16; })
    if (be.options().bf16) return "bf16";
  if constexpr (requires(const Be& b) { b.options().bf16_weights; })
    if (be.options().bf16_weights) return "bf16";
  if constexpr (requires(const Be& b) { b.options().int8; })
    if (be.options().int8) return "int8";
  if constexpr (requires(const Be& b) { b.options().q4; })
    if (be.options().q4) return "q4";
  (void)be;
  return "fp32";
}

// "cpu", "cpu (bf16 products)" or "cuda (NVIDIA H100 80GB HBM3)" (", TF32"
// or ", bf16 products" when on): a program's first line.
template <class Be>
std::string describe(const Be& be) {
#ifdef XFMR_WITH_CUDA
  if constexpr (std::is_same_v<Be, CudaBackend>)
    return std::string("cuda (") + be.device_name() +
           (be.options().tf32 ? ", TF32)" : be.options().bf16 ? ", bf16 products)" : ")");
  if constexpr (std::is_same_v<Be, CudaBf16Backend>)
    return std::string("cuda (") + be.device_name() + ", bf16 activations and products)";
#endif
  if constexpr (std::is_same_v<Be, CpuBackend<float>>) {
    if (be.options().bf16) return "cpu (bf16 products)";
    if (be.options().bf16_weights) return "cpu (bf16 weights)";
    if (be.options().int8) return "cpu (int8 weights)";
    if (be.options().q4) return "cpu (4-bit weights)";
  }
  (void)be;
  return Be::name;
}

}  // namespace xfmr
