// xfmr-bench: how fast a character-LM preset trains and generates on this
// machine, in the format benchmark/pytorch_reference.py also prints, so that
// benchmark/compare can put the two side by side.
//
//   xfmr-bench --model shakespeare-small [--batch 16] [--modes train,forward,generate]
//              [--min-time 2] [--json FILE] [--smoke]
//   xfmr-bench --translator multi30k [--vocab 8000]   (translator decoding only)
//   xfmr-bench --pretrained PATH [--decode-tokens 128] [--batch B] [--prefill N] [--memory]
//              (a checkpoint's load, decoding and prompt)
//   xfmr-bench --pretrained PATH --lora r=16,alpha=32 [--batch 4] [--seq-len 256] [--recompute block]
//              (a LoRA training step on it)
//
// Modes (every time is the median of many repetitions after a warm-up):
//   train     one full step: forward, cross-entropy, backward, AdamW; under
//             mpirun (train alone) each rank steps on its B / N sequences and
//             the gradients are summed over the ranks; on the
//             CPU the batch is split by sequences over one model replica a
//             thread up to 64 MiB of parameters (DataParallel; --shards 1:
//             one model, each operation threaded)
//   forward   the logits of a batch (inference: no dropout, no saved loss),
//             split by sequences on the CPU as for training
//   generate  greedy generation of MAX_T - 1 tokens after a 1-token prompt,
//             per token, with the KV cache, and by recomputing the
//             context (the seeds' loop; for MAX_T over 256 only the first
//             64 tokens, or --recompute-tokens); one step at full context both ways; and the
//             weights' bytes a cached token streams per second against the
//             machine's streaming read bandwidth (measured here)
// The translator measurement decodes greedily against an encoded source of
// MAX_T / 2 tokens: with the caches (self-attention keys/values and the
// memory's cross-attention keys/values, computed once), and by the seeds'
// loop, which re-runs the whole decoder over the prefix for every token.
// The pretrained measurement loads a checkpoint (io/pretrained.hpp's
// load_model: GPT-2 or Llama in the Hugging Face layout, a llama2.c .bin,
// an xfmr checkpoint), times the load and the first token (the decoding
// precision's copies made from the file), and times
// greedy decoding after its start token (<|endoftext|>, BOS) with the KV
// cache, per token, with the weights' bytes a token streams against the
// read bandwidth (as benchmark/pytorch_reference.py --gpt2 does in PyTorch
// for GPT-2); it prints the greedy ids, which the two must share. With
// --batch B it also decodes B such sequences together through the
// server's engine (ContinuousBatcher, stepped on the calling thread: no
// HTTP, no other thread), per step, with the tokens a second of all B
// against one sequence's, each sequence's tokens checked against one
// alone.
// GFLOP/s count matrix products only (the exact count of the model's GEMMs
// and attention products, full T x T scores as computed), divided by the
// machine's single-precision GEMM ceiling, which the bench measures itself.
#include <sys/resource.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "xfmr/backend/attention_plan.hpp"
#include "xfmr/backend/cpu/kernels.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/lora.hpp"
#include "xfmr/models/translation_model.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"
#include "xfmr/train/training_run.hpp"

namespace po = boost::program_options;
using json = nlohmann::json;
using namespace xfmr;
using namespace xfmr::examples;

namespace {

struct Args {
  std::string model = "shakespeare-small", modes = "train,forward,generate", json_path, translator, backend = "cpu";
  std::string pretrained;  // a published checkpoint to time decoding of
  int decode_tokens = 128;
  int batch = 0;  // 0: the preset's benchmark batch
  int seq_len = 0;  // train and forward: positions per sequence (0: MAX_T)
  int recompute_tokens = 0;  // generate: tokens of the recompute loop (0: all MAX_T - 1 up to MAX_T 256, else 64)
  int vocab = 65;  // tiny Shakespeare's characters
  double min_time = 2.0;  // seconds of timed repetitions per measurement
  int min_reps = 10, warmup = 3;
  bool smoke = false;
  bool eager = false;  // no graph steps (run_step) for training and forward passes
  int shards = 0;      // training step and forward pass: DataParallel shards (0: one per CPU thread; 1: none)
  int zero = 0;        // under mpirun: 1, ZeRO-1 (AdamW's moments sharded over the ranks)
  std::string precision = "fp32";  // or bf16 (bf16 products)
  std::string recompute = "none";  // train: activation recompute (none or block)
  int attention = 0;               // > 0: time attention alone at this length, tiled and materialised
  bool materialise_attention = false;  // the model's attention keeps its probabilities (not tiled)
  bool memory = false;  // --pretrained: no GEMM ceiling or bandwidth measurement (their buffers would count)
  int prefill = 0;      // --pretrained: also time a prompt of this many tokens
  std::string lora;     // --pretrained: time a LoRA training step on it instead (LoraOptions::parse)
};

// Batch sizes of the benchmark presets (the shapes).
int default_batch(const std::string& model) { return model == "shakespeare-large" ? 64 : 16; }

// Times f() repeatedly: `warmup` untimed calls, then at least min_reps and
// at least min_time seconds of calls. Returns seconds per call. Each call
// ends with be.synchronize(), so a GPU's queued work is inside its time.
template <class Be, class F>
std::vector<double> time_calls(const Args& a, Be& be, F&& f) {
  for (int i = 0; i < a.warmup; ++i) f();
  be.synchronize();
  std::vector<double> t;
  const auto start = Clock::now();
  // Under mpirun every rank must time as many calls: they agree each time.
  ProcessGroup& group = ProcessGroup::world();
  auto more = [&] {
    const bool mine = int(t.size()) < a.min_reps || seconds_since(start) < a.min_time;
    return group.size() == 1 ? mine : group.sum(std::int64_t(mine)) > 0;
  };
  while (more()) {
    const auto t0 = Clock::now();
    f();
    be.synchronize();
    t.push_back(seconds_since(t0));
    if (a.smoke) break;
  }
  return t;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const std::size_t i = std::size_t(pos);
  const double f = pos - double(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

// One measurement: per-call seconds -> JSON with median and spread. `per`
// divides a call into units (tokens generated); flops is per call.
json summarize(const std::vector<double>& secs, double tokens_per_call, double flops_per_call, double ceiling,
               double per = 1.0) {
  std::vector<double> unit;
  for (double s : secs) unit.push_back(s / per);
  const double med = quantile(unit, 0.5);
  json j = {{"median_ms", med * 1e3},
            {"p10_ms", quantile(unit, 0.1) * 1e3},
            {"p90_ms", quantile(unit, 0.9) * 1e3},
            {"reps", secs.size()},
            {"samples_ms", json::array()}};
  for (double s : unit) j["samples_ms"].push_back(s * 1e3);
  j["tokens_per_s"] = tokens_per_call / per / med;
  if (flops_per_call > 0) {
    j["gflops"] = flops_per_call / per / med * 1e-9;
    if (ceiling > 0) j["ceiling_fraction"] = flops_per_call / per / med * 1e-9 / ceiling;
  }
  return j;
}

// MFU as llm.c counts it (gpt2_estimate_mfu): 6 N + 6 L D T FLOPs a token
// (N every parameter, the tied embedding once; the second term attention's
// products), against the dense peak of the GPU in the run's precision, in
// TFLOP/s: NVIDIA's figures for the H100 SXM (which the H200 shares), the
// H100 PCIe and the A100; 0 for any other device, which gets no MFU.
[[maybe_unused]] double promised_tflops(const std::string& device, const std::string& precision) {
  struct Peak {
    const char* name;
    double bf16, tf32, fp32;
  };
  static constexpr Peak kPeaks[] = {{"H100 PCIe", 756, 378, 51}, {"H100", 989.4, 494.7, 66.9},
                                    {"H200", 989.4, 494.7, 66.9}, {"A100", 312, 156, 19.5}};
  for (const Peak& p : kPeaks)
    if (device.find(p.name) != std::string::npos)
      return precision == "bf16" ? p.bf16 : precision == "tf32" ? p.tf32 : p.fp32;
  return 0;
}

// The BLAS behind the CPU backend's larger float products (cpu/gemm.hpp),
// and OpenBLAS's kernel on this processor (OPENBLAS_CORETYPE, if set,
// overrides its own choice), which runs them without oneDNN.
std::string blas_kernel() {
#ifdef XFMR_WITH_OPENBLAS
  const std::string openblas = std::string("OpenBLAS ") + openblas_get_corename();
  return detail::onednn_sgemm_available() ? "oneDNN sgemm (" + openblas + " for GEMV)" : openblas;
#else
  return detail::onednn_sgemm_available() ? "oneDNN sgemm" : "none";
#endif
}

// Single-precision GEMM ceiling of this machine through the backend's gemm:
// the best of square products at a few sizes (all threads), in GFLOP/s.
template <class Be>
double gemm_ceiling(const Args& a, Be& be) {
  double best = 0;
  for (int n : a.smoke ? std::vector<int>{128} : std::vector<int>{256, 512, 1024, 4096}) {
    if (n == 4096 && std::string(Be::name) == "cpu") continue;  // a GPU needs a larger product to peak
    // Random operands: a GPU can multiply zeros faster than real data.
    typename Be::Tensor A({n, n}), B({n, n});
    typename Be::template Buffer<typename Be::Activation> C;
    Rng rng(n);
    A.generate([&] { return float(rng.uniform()); });
    B.generate([&] { return float(rng.uniform()); });
    const auto *pa = A.product_data(), *pb = B.product_data();  // in the activations' type
    auto* pc = C.reserve(std::size_t(n) * n);
    Args timing = a;
    timing.min_time = a.smoke ? 0 : 0.5;
    const auto t = time_calls(timing, be, [&] { be.gemm(false, false, n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n); });
    best = std::max(best, 2.0 * n * n * n / quantile(t, 0.5) * 1e-9);
  }
  return best;
}

// Feed-forward matrices of a preset's blocks: two, three with a gated activation (SwiGLU).
double ff_matrices(const PresetInfo& p) { return p.parts.gated() ? 3 : 2; }
// Exact matrix-product FLOPs of a forward pass over B sequences of T
// positions (full T x T attention scores, as computed).
double forward_flops(const PresetInfo& p, double B, double T, double V) {
  const double D = p.d_model, FF = p.d_ff, L = p.n_layers;
  const double per_row = L * (2 * D * 3 * D + 2 * D * D + ff_matrices(p) * 2 * D * FF) + 2 * D * V;
  return B * T * per_row + B * L * 4 * T * T * D;
}
// One cached decoding step at position t (t positions already cached).
double cached_step_flops(const PresetInfo& p, double t, double V) {
  const double D = p.d_model, FF = p.d_ff, L = p.n_layers, kv = D / p.n_heads * p.n_kv_heads;
  return L * (2 * D * (D + 2 * kv) + 2 * D * D + ff_matrices(p) * 2 * D * FF) + 2 * D * V + L * 4 * (t + 1) * D;
}

// What a training step must hold, in bytes: parameters, gradients, AdamW's
// two moments, and the activations a textbook backward needs (per block and
// row: block input, both norm outputs and statistics, q/k/v, the attention
// probabilities, the attention context, the residual stream between the
// sublayers (the second norm's input), the feed-forward pre-activation and
// activation, with dropout its two masks at a byte an element; then the
// final norm, the logits and their gradient: the fused loss keeps no
// softmax). B is
// this process's rows; `moments` the share of AdamW's moments it keeps (1,
// or 1 / N under ZeRO-1).
// Attention saves its probabilities (H T a row) where it materialises them,
// a log-sum-exp (H) where it tiles; under cheap recompute the blocks share
// one copy of the norm outputs (pre-norm) and the activation; under block
// recompute the blocks keep their inputs and one block at a time the rest.
// Activations take `activation_bytes` each (2 with bfloat16 storage, whose
// weight matrices' bfloat16 copies, `weight_copy_bytes` a value of
// `matrices`, count too); statistics (the norms', log-sum-exps, materialised
// probabilities) stay float32.
json analytical_memory(const PresetInfo& p, std::size_t params, double B, double T, double V, double moments = 1.0,
                       bool tiled = false, Recompute recompute = Recompute::none, double activation_bytes = 4,
                       double matrices = 0, double weight_copy_bytes = 0) {
  const double D = p.d_model, FF = p.d_ff, L = p.n_layers, H = p.n_heads, A = activation_bytes;
  const double rows = B * T;
  const double masks = p.dropout > 0 ? 2 * D : 0;  // bytes
  // Bytes a row of a block keeps past its input: activations, statistics, masks.
  const double block = A * (2 * D + 3 * D + D + D + ff_matrices(p) * FF) + 4 * (2 * 2 + (tiled ? H : H * T)) + masks;
  const bool pre = p.parts.pre_norm;
  const double own = A * ((pre ? 2 * D : 0) + FF), shared = A * ((pre ? D : 0) + FF);  // cheap: each block's, the stack's
  const double blocks = recompute == Recompute::block   ? L * A * D + block
                        : recompute == Recompute::cheap ? L * (A * D + block - own) + shared
                                                        : L * (A * D + block);
  const double act = rows * (blocks + A * D + 4 * 2 + A * 2 * V);  // bytes, with the final norm and the logits
  const double bytes = double(params) * 4, copies = matrices * weight_copy_bytes;
  json count = {{"parameters_mb", bytes / 1e6},
                {"gradients_mb", bytes / 1e6},
                {"optimizer_mb", 2 * bytes * moments / 1e6},
                {"activations_mb", act / 1e6},
                {"total_mb", ((2 + 2 * moments) * bytes + act + copies) / 1e6}};
  if (copies > 0) count["weight_copies_mb"] = copies / 1e6;
  return count;
}

// The machine's streaming read bandwidth, in GB/s: each thread sums its
// part of a 1 GiB buffer (far past the caches) as eight streams read side
// by side, sixteen floats at a time (a single stream a core leaves
// bandwidth unused, and a decoding step's product reads sixteen rows at
// once); best of five passes. What a decoding step that streams its
// weights from memory can reach at best.
double read_bandwidth_gbs(bool smoke) {
  const std::size_t n = (smoke ? 16u : 256u) << 20;  // floats
  AlignedVector<float> buf(n);
#pragma omp parallel for schedule(static)  // first touch by the thread that reads it
  for (long c = 0; c < 1024; ++c) std::fill_n(buf.data() + c * long(n / 1024), n / 1024, 1.0f);
  double best = 0, sink = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (long c = 0; c < 1024; ++c) {
      const long len = long(n / 1024) / 8;
      const float* p = buf.data() + c * long(n / 1024);
      float acc[8][16] = {};
      for (long i = 0; i < len; i += 16)
        for (int s = 0; s < 8; ++s)
          for (int j = 0; j < 16; ++j) acc[s][j] += p[s * len + i + j];
      for (const auto& a : acc)
        for (float v : a) total += v;
    }
    best = std::max(best, double(n) * sizeof(float) / seconds_since(t0) * 1e-9);
    sink += total;
  }
  return sink > 0 ? best : 0;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) * 1024.0 / 1e6;  // Linux counts kibibytes: megabytes (10^6), as weights' sizes are
}

std::int32_t argmax(std::span<const float> row) {
  return std::int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// The bytes a decoding step reads a weight element in, on the CPU: its
// copy's in bf16 (2), int8 (1; the scales, 4 bytes a row, left out) or
// q4 (18 bytes a block of 32) precision, float32's otherwise.
template <class Be>
double weight_element_bytes(const Be& be) {
  if (std::string(Be::name) != "cpu") return sizeof(float);
  const std::string precision = precision_of(be);
  return precision == "bf16" ? 2.0 : precision == "int8" ? 1.0 : precision == "q4" ? 18.0 / 32 : double(sizeof(float));
}

template <class Be>
json run(const Args& a) {
  using Model = LanguageModel<Be>;
  const PresetInfo p = LanguageModelPresets::info(a.model);
  Be be = make_backend<Be>(a.backend, a.precision);
  const int B = a.batch > 0 ? a.batch : default_batch(a.model), V = a.vocab;
  const int T = a.seq_len > 0 ? a.seq_len : p.max_t;
  require(T <= p.max_t, "--seq-len ", T, " exceeds ", a.model, "'s MAX_T ", p.max_t);
  require(B <= kMaxBatch, "--batch ", B, " outside 1..", kMaxBatch);
  check_batch_memory(p, p.n_layers, B, T, V, "--batch " + std::to_string(B));
  const double rss_before = peak_rss_mb();
  const double ceiling = gemm_ceiling(a, be);
  bool graphs = false;  // whether run_step replays graphs here
  if constexpr (requires { be.options().graph_steps; })
    graphs = be.options().graph_steps && !a.eager && a.recompute != "block";
  // A timed step: through run_step (graphs on a GPU) unless --eager. Block
  // recompute runs directly, as Trainer::step runs it (trainer.hpp says why).
  auto timed_step = [&](const char* key, auto& step) {
    a.eager || a.recompute == "block" ? step() : run_step(be, key, step);
  };
  const Recompute recompute_mode = parse_recompute(a.recompute);
  const DecoderOptions model_opts{.dropout = p.dropout, .recompute = recompute_mode};
  // --materialise-attention: every attention layer keeps its probabilities
  // (the path before tiled attention), for comparison in one binary.
  auto make = [&] {
    auto m = make_language_model<Be>(a.model, V, 1337, model_opts);
    m->keep_attention_probabilities(a.materialise_attention);
    return m;
  };
  const std::unique_ptr<Model> model_ptr = make();
  Model& model = *model_ptr;
  json out = {{"impl", "xfmr"},
              {"backend", describe(be)},
              {"graph_steps", graphs},
              {"model", a.model},
              {"shape", {{"B", B}, {"T", T}, {"D", p.d_model}, {"H", p.n_heads}, {"L", p.n_layers},
                         {"FF", p.d_ff}, {"V", V}, {"dropout", p.dropout}}},
              {"threads", cpu_threads()},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"blas", blas_kernel()},
              {"cpu_kernels", cpu_level_description()},
              {"gemm_ceiling_gflops", ceiling},
              {"parameters", model.parameter_count()},
              {"results", json::object()}};
  out["recompute"] = recompute_name(recompute_mode);
  AdamW<Be> opt(model, {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  Rng rng(7);
  std::vector<std::int32_t> ids(std::size_t(B) * T), targets(ids.size());
  for (auto& i : ids) i = std::int32_t(rng.below(V));
  for (auto& i : targets) i = std::int32_t(rng.below(V));
  std::vector<float> staging;  // logits on the host, for argmax
  const double tokens = double(B) * T, fwd = forward_flops(p, B, T, V);
  auto has = [&](const char* m) { return ("," + a.modes + ",").find("," + std::string(m) + ",") != std::string::npos; };
  // Under mpirun (train mode only): each rank steps on its B / N sequences
  // of the batch and the Trainer sums the gradients over the ranks.
  ProcessGroup& group = ProcessGroup::world();
  const int ranks = group.size(), my_rows = B / ranks, my_first = group.rank() * my_rows;
  if (ranks > 1) {
    require(a.modes == "train", "under mpirun xfmr-bench times the training step alone (--modes train)");
    require(B % ranks == 0, "--batch ", B, " is not a multiple of the ", ranks, " ranks");
    out["ranks"] = ranks;
  }

  // The programs' training step (train/trainer.hpp): on the CPU a batch is
  // split by sequences over replicas, one a thread, for training and for
  // the forward pass; with one shard this is the plain step.
  Trainer<Model, Be> trainer(model, be, opt,
                             {.schedule = LrSchedule{.lr = 1e-4},
                              .split = {.shards = a.shards, .group = &group, .zero = a.zero},
                              .graph_steps = !a.eager},
                             make);
  out["shards"] = std::min(trainer.shards(), B);
  if (ranks > 1) out["zero"] = a.zero;
  auto forward = [&](const Shard& s, Model& m, Be& b) {
    const std::size_t first = std::size_t(s.begin) * T, rows = std::size_t(s.size()) * T;
    return m.forward(b, std::span(ids).subspan(first, rows), Shape{s.size(), T});
  };
  if (has("train")) {
    model.set_training(true);
    const std::size_t mine = std::size_t(my_first) * T;
    auto my_forward = [&](const Shard& s, Model& m, Be& b) {  // the programs' step: head and loss by blocks
      return m.forward_to_head(b, std::span(ids).subspan(mine + std::size_t(s.begin) * T, std::size_t(s.size()) * T),
                               Shape{s.size(), T});
    };
    const auto t = time_calls(a, be, [&] {
      trainer.step([&](int) { return BatchTargets{my_rows, std::span(targets).subspan(mine, std::size_t(my_rows) * T)}; },
                   my_forward);
    });
    out["results"]["train_step"] = summarize(t, tokens, 3 * fwd, ceiling);
#ifdef XFMR_WITH_CUDA
    if constexpr (std::is_same_v<Be, CudaBackend> || std::is_same_v<Be, CudaBf16Backend>) {
      const std::string precision = be.options().bf16 ? "bf16" : be.options().tf32 ? "tf32" : "fp32";
      const double per_token = 6.0 * double(model.parameter_count()) + 6.0 * p.n_layers * p.d_model * T;
      auto& r = out["results"]["train_step"];
      if (const double peak = promised_tflops(be.device_name(), precision); peak > 0) {
        r["mfu"] = per_token * r["tokens_per_s"].get<double>() / (peak * 1e12);
        r["mfu_peak_tflops"] = peak;
      }
    }
#endif
  }
  if (has("forward")) {
    model.set_training(false);
    auto step = [&] {
      trainer.data_parallel().forward(B, [&](const Shard& s, Model& m, Be& b) { forward(s, m, b); });
    };
    const auto t = time_calls(a, be, [&] { timed_step("forward", step); });
    out["results"]["forward"] = summarize(t, tokens, fwd, ceiling);
  }
  if (has("generate")) {
    // Greedy generation of MAX_T - 1 tokens after a 1-token prompt through
    // the cache (infer/generate.hpp); the recompute loop (the seeds') re-reads
    // the whole context for each of its first --recompute-tokens tokens,
    // which must agree.
    const int TM = p.max_t, n = TM - 1;
    const int nr = std::min(n, a.recompute_tokens > 0 ? a.recompute_tokens : TM <= 256 ? n : 64);
    double cached_flops = 0, recompute_flops = 0;
    for (int i = 0; i < n; ++i) cached_flops += cached_step_flops(p, i, V);
    for (int i = 0; i < nr; ++i) recompute_flops += forward_flops(p, 1, i + 1, V);
    const WeightCopies weight_copies(be, model);  // in bf16, int8 or q4 precision, the weights a token reads are copies
    Generator<Model, Be> generator(model, be);        // its cache kept from call to call
    std::vector<std::int32_t> greedy, seq;
    Rng unused(0);
    const auto cached = time_calls(a, be, [&] {
      greedy = generator({0}, {.sampling = {.temperature = 0}, .max_tokens = n}, unused);
    });
    const auto recompute = time_calls(a, be, [&] {
      seq = generator({0}, {.sampling = {.temperature = 0}, .max_tokens = nr, .use_cache = false}, unused);
    });
    require(std::equal(seq.begin(), seq.end(), greedy.begin()), "cached and recomputed greedy generation disagree");
    out["results"]["generate_cached"] = summarize(cached, n, cached_flops, ceiling, n);
    out["results"]["generate_recompute"] = summarize(recompute, nr, recompute_flops, ceiling, nr);

    // One token at full context: the cache holds MAX_T - 1 positions.
    greedy.insert(greedy.begin(), 0);
    DecodingCache<Be> cache;
    model.start_cache(cache, 1);
    model.forward_cached(be, std::span(greedy.data(), TM - 1), 1, cache);
    const auto step = time_calls(a, be, [&] {
      model.forward_cached(be, std::span(&greedy[TM - 1], 1), 1, cache);
      cache.truncate(TM - 1);
    });
    const auto full = time_calls(a, be, [&] { model.forward(be, greedy, Shape{1, TM}); });
    out["results"]["full_context_cached"] = summarize(step, 1, cached_step_flops(p, TM - 1, V), ceiling);
    out["results"]["full_context_recompute"] = summarize(full, 1, forward_flops(p, 1, TM, V), ceiling);
  }
  const int hd = p.d_model / p.n_heads;
  bool tiled = false;
  if constexpr (requires { be.attention_kernels(); })
    tiled = !a.materialise_attention &&
            plan_attention(AttentionDims{my_rows, p.n_heads, T, T, hd, hd}, AttentionUse::training,
                           be.attention_kernels()) == AttentionPath::tiled;
  // The weight matrices' elements: bfloat16 activations keep bfloat16 copies
  // of them, and so does the CPU's decoding in bf16, int8 or q4 (below).
  constexpr double activation_bytes = sizeof(typename Be::Activation);
  double matrices = 0;
  model.visit([&](std::string_view, auto& value, auto&) {
    if (value.shape().size() == 2) matrices += double(value.size());
  });
  out["memory"] = {{"peak_rss_mb", peak_rss_mb()},
                   {"rss_before_model_mb", rss_before},
                   {"workspace_mb", double(trainer.data_parallel().workspace_bytes()) / 1e6},  // every shard's
                   {"attention", tiled ? "tiled" : "materialised"},
                   {"analytical", analytical_memory(p, model.parameter_count(), my_rows, T, V,
                                                    a.zero == 1 ? 1.0 / ranks : 1.0, tiled, recompute_mode,
                                                    activation_bytes, matrices,
                                                    activation_bytes < 4 ? activation_bytes : 0)}};
  // Bandwidth, after the memory figures (its buffer would top them): a
  // cached token reads every weight once, from memory when the weights
  // outgrow the caches (64 MiB and more here; smaller models decode from
  // cache, faster than memory streams).
#ifdef XFMR_WITH_CUDA
  if constexpr (std::is_same_v<Be, CudaBackend> || std::is_same_v<Be, CudaBf16Backend>)
    out["memory"]["peak_device_mb"] = double(cuda::memory_use().peak_bytes) / 1e6;
#endif
  // In bf16, int8 or q4 precision the CPU decodes from copies of the weight
  // matrices (WeightCopies), which the count adds.
  const double copy_element_bytes = weight_element_bytes(be);
  if (copy_element_bytes < sizeof(float) && has("generate")) {
    auto& count = out["memory"]["analytical"];
    count["weight_copies_mb"] = matrices * copy_element_bytes / 1e6;
    count["total_mb"] = count["total_mb"].get<double>() + matrices * copy_element_bytes / 1e6;
  }
  const double weight_bytes = double(model.parameter_count()) * copy_element_bytes;
  if (has("generate") && std::string(Be::name) == "cpu" && weight_bytes >= double(64 << 20)) {
    const double bw = read_bandwidth_gbs(a.smoke);
    for (const char* k : {"generate_cached", "full_context_cached"}) {
      const double gbs = weight_bytes / (out["results"][k]["median_ms"].get<double>() * 1e-3) * 1e-9;
      out["results"][k]["weight_gbs"] = gbs;
      out["results"][k]["bandwidth_fraction"] = gbs / bw;
    }
    out["read_bandwidth_gbs"] = bw;
  }
  return out;
}

// The all-reduce of training across processes (ProcessGroup::all_reduce_sum
// of floats) under mpirun, from 4 KiB to 64 MiB: its time per size, the
// bandwidth each rank moves (2 (N - 1) / N of the buffer each way), and the
// cost model time = latency + bytes / bandwidth with the latency of the
// smallest size and the buffer bandwidth of the largest.
json run_allreduce(const Args& a) {
  ProcessGroup& group = ProcessGroup::world();
  const int N = group.size();
  require(N > 1, "--modes allreduce needs mpirun with at least 2 ranks");
  CpuBackend<float> be;
  json out = {{"impl", "xfmr"}, {"mode", "allreduce"}, {"ranks", N}, {"results", json::array()}};
  for (std::size_t bytes = 4096; bytes <= (std::size_t(64) << 20); bytes *= 4) {
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    const auto t = time_calls(a, be, [&] { group.all_reduce_sum(std::span<float>(v)); });
    const double med = quantile(t, 0.5);
    const double moved = 2.0 * (N - 1) / N * double(bytes);
    out["results"].push_back({{"bytes", bytes}, {"median_ms", med * 1e3}, {"p10_ms", quantile(t, 0.1) * 1e3},
                              {"p90_ms", quantile(t, 0.9) * 1e3}, {"bus_gbs", moved / med * 1e-9}});
  }
  const auto& first = out["results"].front();
  const auto& last = out["results"].back();
  out["fit"] = {{"latency_us", first["median_ms"].get<double>() * 1e3},
                {"buffer_gbs", last["bytes"].get<double>() / last["median_ms"].get<double>() * 1e-6}};
  return out;
}

// Greedy decoding of a GPT-2 checkpoint (--gpt2) with the KV cache.
// Attention alone, forward and backward, at T positions: GPT-2's heads (12
// of 64), causal, batch --batch (0: 1), random inputs; tiled first, then
// materialised (peak RSS only grows). Per path: the time of a forward and
// backward, its rate (FlashAttention's count: the causal forward's two
// products, 2 B H T^2 hd, and the backward 2.5 times that), and the bytes it
// keeps from one to the other (probabilities or log-sum-exps) and, on the
// CPU, asks of the backend as per-thread scratch. On CUDA the tiled path is
// the one `--precision` picks (bf16: the tensor cores), whether or not
// CudaOptions::flash_attention is on.
template <class Be>
json run_attention(const Args& a) {
  const int B = a.batch > 0 ? a.batch : 1, H = 12, hd = 64, T = a.attention, ld = 3 * H * hd, K = H * hd;
  // The materialised path keeps B x H x T x T probabilities and their gradient.
  const double bytes = 2.0 * 4.0 * B * H * double(T) * T;
  const double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  require(bytes <= memory / 2, "--attention ", T, " with --batch ", B, ": the materialised path would keep ",
          std::lround(bytes / 1e9), " GB of probabilities, more than half this machine's ", std::lround(memory / 1e9),
          " GB");
  const AttentionDims dims{B, H, T, T, hd, hd};
  const AttentionMask mask{true, nullptr};
  json out = {{"impl", "xfmr"}, {"backend", describe(make_backend<Be>(a.backend, a.precision))},  // (no GPU: stops)
              {"attention", {{"B", B}, {"H", H}, {"T", T}, {"head", hd}}}, {"threads", cpu_threads()},
              {"results", json::object()}};
  using Tensor = typename Be::Tensor;
  using A = typename Be::Activation;
  Rng rng(3);
  // Random inputs as tensors, read in the activations' type (product_data());
  // outputs and gradients in activation buffers.
  Tensor qkv({std::int64_t(B) * T * ld}), up({std::int64_t(B) * T * K});
  qkv.generate([&] { return float(rng.normal()); });
  up.generate([&] { return float(rng.normal()); });
  typename Be::template Buffer<A> outputs, gradients;
  const A* q = qkv.product_data();
  const A* dy = up.product_data();
  A* y = outputs.reserve(std::size_t(B) * T * K);
  A* g = gradients.reserve(std::size_t(B) * T * ld);
  const double bh = double(B) * H, flops = 3.5 * 2.0 * bh * double(T) * T * hd;
  const auto record = [&](const char* path, Be& be, const std::vector<double>& secs, double saved_floats) {
    auto r = summarize(secs, double(B) * T, 0, 0);
    r["tflops"] = flops / (r["median_ms"].template get<double>() * 1e-3) * 1e-12;
    r["saved_mb"] = saved_floats * 4 / 1e6;
    if constexpr (requires { be.attention_scratch_bytes(); })
      r["scratch_mb"] = double(be.attention_scratch_bytes()) / 1e6;
    r["peak_rss_mb"] = peak_rss_mb();
    out["results"][path] = r;
  };
  {
    Be be = make_backend<Be>(a.backend, a.precision);  // a backend of its own: its scratch is this path's
    Tensor saved({std::int64_t(bh * T)});
    const auto secs = time_calls(a, be, [&] {
      be.flash_attention_forward(dims, q, ld, q + K, ld, q + 2 * K, ld, y, K, saved.data(), mask);
      be.flash_attention_backward(dims, dy, K, y, K, q, ld, q + K, ld, q + 2 * K, ld, saved.data(), mask, g, g + K,
                                  g + 2 * K);
    });
    record("tiled", be, secs, bh * T);
  }
  {
    Be be = make_backend<Be>(a.backend, a.precision);
    Tensor saved({std::int64_t(bh * T * T)});
    const auto secs = time_calls(a, be, [&] {
      be.attention_forward(dims, q, ld, q + K, ld, q + 2 * K, ld, y, K, saved.data(), mask);
      be.attention_backward(dims, dy, K, q, ld, q + K, ld, q + 2 * K, ld, saved.data(), g, g + K, g + 2 * K);
    });
    record("materialised", be, secs, bh * T * T);
  }
  return out;
}

// Decoding a checkpoint through the Engine (infer/engine.hpp), as xfmr-lm,
// xfmr-serve and Python decode it: load, first token, a token's step, a
// prompt's prefill, and B sequences decoded together.
json run_pretrained(const Args& a, const std::string& precision) {
  // Load (the matrices deferred to the mapped file), then the first token:
  // the copies made as its products first read each matrix.
  const auto t_load = Clock::now();
  Engine engine = Engine::load(
      a.pretrained, {.backend = a.backend, .precision = precision, .tokenizer_required = false});
  const double load_s = seconds_since(t_load);
  const PresetInfo& p = engine.architecture();
  const int V = engine.vocab(), n = a.decode_tokens;
  require(n < p.max_t, "--decode-tokens ", n, " must be below the model's context ", p.max_t);
  double flops = 0;
  for (int i = 0; i < n; ++i) flops += cached_step_flops(p, i, V);
  // <|endoftext|> (GPT-2), BOS (llama2.c and GGUF llama: 1; SmolLM: 0).
  const std::string_view format = engine.format();
  const std::int32_t start = format == "gpt2"                             ? (V > 50256 ? 50256 : 0)
                             : format == "llama2.c" || format == "gguf" ? 1
                                                                         : 0;
  const auto greedy_request = [&](int tokens) {
    return CompletionRequest{.prompt = {start}, .sampling = {.temperature = 0}, .max_tokens = tokens, .ignore_eos = true};
  };
  (void)engine.generate(greedy_request(1));
  const double first_token_s = seconds_since(t_load);
  return engine.visit([&]<class Be>(LanguageModel<Be>& model, Be& be) {
    std::vector<std::int32_t> greedy;
    const auto t = time_calls(a, be, [&] { greedy = engine.generate(greedy_request(n)).ids; });
    const double decoding_rss_mb = peak_rss_mb();
    const double ceiling = a.memory ? 0.0 : gemm_ceiling(a, be);  // (its operands would count in the peak)
    std::vector<double> tp;  // --prefill: a prompt of that many tokens through the cache, its logits
    if (a.prefill > 0) {
      require(a.prefill < p.max_t, "--prefill ", a.prefill, " must be below the model's context ", p.max_t);
      std::vector<std::int32_t> prompt(std::size_t(a.prefill));
      for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t((i * 7919 + 1) % std::size_t(V));
      DecodingCache<Be> cache;
      tp = time_calls(a, be, [&] {
        model.start_cache(cache, 1, a.prefill);
        (void)model.forward_cached(be, prompt, 1, cache);
      });
    }
    json out = {{"impl", "xfmr"},
                {"backend", engine.describe()},
                {"model", std::string(p.name) + " " + std::string(format) + " checkpoint"},
                {"shape", {{"B", 1}, {"T", n}, {"D", p.d_model}, {"H", p.n_heads}, {"L", p.n_layers},
                           {"FF", p.d_ff}, {"V", V}, {"dropout", 0}}},
                {"threads", cpu_threads()},
                {"blas", blas_kernel()},
                {"cpu_kernels", cpu_level_description()},
                {"gemm_ceiling_gflops", ceiling},
                {"parameters", engine.parameter_count()},
                {"greedy", greedy},
                {"results", {{"generate_cached", summarize(t, n, flops, ceiling, n)}}},
                {"load", {{"load_s", load_s}, {"first_token_s", first_token_s}, {"precision", engine.precision()}}},
                {"memory", {{"peak_rss_mb", decoding_rss_mb}}}};
    if (!tp.empty()) out["results"]["prefill"] = summarize(tp, a.prefill, 0, ceiling);
    if (a.batch > 1) {
      // --batch B: B sequences decoded together by the server's batcher
      // (infer/continuous_batching.hpp), each step on this thread: a step's
      // time, the tokens a second of all B, and that against one sequence's.
      const std::vector<CompletionRequest> requests(std::size_t(a.batch), greedy_request(n));
      std::vector<Completion> drawn;
      const auto tb = time_calls(a, be, [&] { drawn = engine.generate_batch(requests, a.batch); });
      for (const Completion& d : drawn)
        require(d.ids == greedy, "a batched sequence's greedy tokens differ from one alone");
      auto& r = out["results"];
      r["generate_batched"] = summarize(tb, double(a.batch) * n, double(a.batch) * flops, ceiling, n);
      r["generate_batched"]["speedup_vs_one"] =
          r["generate_batched"]["tokens_per_s"].get<double>() / r["generate_cached"]["tokens_per_s"].get<double>();
      out["shape"]["B"] = a.batch;
    }
    if (std::string(Be::name) == "cpu") {
      // A token reads every weight once, but of an embedding not tied to the
      // head (or a learned position table) one row.
      const double tables = (p.parts.positions == ModelParts::Positions::learned ? double(p.max_t - 1) * p.d_model : 0.0) +
                            (model.options().tie_weights ? 0.0 : double(V - 1) * p.d_model);
      const double bytes = (double(engine.parameter_count()) - tables) * weight_element_bytes(be);  // the copies'
      const double bw = a.memory ? 0.0 : read_bandwidth_gbs(a.smoke);
      auto& m = out["results"]["generate_cached"];
      m["weight_gbs"] = bytes / (m["median_ms"].get<double>() * 1e-3) * 1e-9;
      if (bw > 0) {
        m["bandwidth_fraction"] = m["weight_gbs"].get<double>() / bw;
        out["read_bandwidth_gbs"] = bw;
      }
    }
    return out;
  });
}

// A LoRA training step on a checkpoint (models/lora.hpp; as xfmr-lm train
// --init CKPT --lora SPEC steps): adapters on its projections, the base
// frozen, forward, cross-entropy, backward to the adapters and the input,
// AdamW on the adapters; B x T random tokens, one shard (the products
// threaded). In bf16, int8 or q4 precision the base is held as its copies
// alone (hold_frozen_base: a WeightCopies scope over the file's matrices),
// never in float32, and its products are the precision's (every other one
// float32: make_frozen_base_backend). Load time, the step, the process's peak RSS.
json run_lora(const Args& a) {
  using Be = CpuBackend<float>;
  const auto t_load = Clock::now();
  Pretrained<Be> loaded = load_model<Be>(a.pretrained, {.recompute = parse_recompute(a.recompute)});
  const double load_s = seconds_since(t_load);
  LanguageModel<Be>& model = *loaded.model;
  const LoraOptions o = LoraOptions::parse(a.lora);
  add_lora(model, o, 1337);
  LoraModel<Be> lora(model);
  const PresetInfo& p = model.preset();
  const int B = a.batch > 0 ? a.batch : 4, T = a.seq_len > 0 ? a.seq_len : std::min(p.max_t, 256), V = model.vocab();
  require(T <= p.max_t, "--seq-len ", T, " exceeds the model's context ", p.max_t);
  check_batch_memory(p, p.n_layers, B, T, V, "--batch " + std::to_string(B));
  Be be = make_frozen_base_backend<Be>(a.backend, a.precision);
  std::optional<WeightCopies<Be>> copies;
  hold_frozen_base(be, model, copies);  // as a TrainingRun holds it
  AdamW<Be> opt(lora, {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  Trainer<LanguageModel<Be>, Be> trainer(lora, be, opt, {.schedule = LrSchedule{.lr = 1e-4}, .split = {.shards = 1}});
  Rng rng(7);
  std::vector<std::int32_t> ids(std::size_t(B) * T), targets(ids.size());
  for (auto& i : ids) i = std::int32_t(rng.below(V));
  for (auto& i : targets) i = std::int32_t(rng.below(V));
  model.set_training(true);
  const auto t = time_calls(a, be, [&] {
    trainer.step([&](int) { return BatchTargets{B, std::span<const std::int32_t>(targets)}; },
                 [&](const Shard& s, LanguageModel<Be>& m, Be& b) {
                   return m.forward_to_head(
                       b, std::span<const std::int32_t>(ids).subspan(std::size_t(s.begin) * T, std::size_t(s.size()) * T),
                       Shape{s.size(), T});
                 });
  });
  return {{"impl", "xfmr"},
          {"backend", describe(be)},
          {"model", std::string(p.name) + " " + std::string(format_name(loaded.format)) + " checkpoint"},
          {"shape", {{"B", B}, {"T", T}, {"D", p.d_model}, {"H", p.n_heads}, {"KV", p.kv_heads()}, {"L", p.n_layers},
                     {"FF", p.d_ff}, {"V", V}}},
          {"lora", {{"options", o.str()}, {"trained", lora.parameter_count()}}},
          {"recompute", a.recompute},
          {"threads", cpu_threads()},
          {"blas", blas_kernel()},
          {"cpu_kernels", cpu_level_description()},
          {"gemm_ceiling_gflops", 0.0},
          {"parameters", model.parameter_count()},
          {"results", {{"train_step", summarize(t, double(B) * T, 0, 0)}}},
          {"load", {{"load_s", load_s}, {"precision", a.precision}}},
          {"memory", {{"peak_rss_mb", peak_rss_mb()}}}};
}

// Greedy translation decoding, per token, with and without the caches.
// p: the preset, whose family's Seq2Seq the library compiled.
template <class Be>
json run_translator(const PresetInfo& p, const Args& a) {
  Be be = make_backend<Be>(a.backend, a.precision);
  std::vector<float> staging;  // logits on the host, for argmax
  const int V = a.vocab, S_len = p.max_t / 2, n = p.max_t - 1;
  json out = {{"impl", "xfmr"},
              {"backend", describe(be)},
              {"model", std::string("translator-") + p.name},
              {"shape", {{"B", 1}, {"T", p.max_t}, {"D", p.d_model}, {"H", p.n_heads}, {"L", p.n_layers},
                         {"FF", p.d_ff}, {"V", V}, {"dropout", 0.0}}},
              {"threads", cpu_threads()},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"blas", blas_kernel()},
              {"cpu_kernels", cpu_level_description()},
              {"gemm_ceiling_gflops", gemm_ceiling(a, be)},
              {"results", json::object()}};
  const auto model_ptr = make_translation_model<Be>(p, V, V, 1337);
  TranslationModel<Be>& model = *model_ptr;
  out["parameters"] = model.parameter_count();
  model.set_training(false);
  const WeightCopies weight_copies(be, model);
  Rng rng(9);
  std::vector<std::int32_t> src(S_len);
  for (auto& i : src) i = std::int32_t(2 + rng.below(V - 2));
  model.encode(be, src, Shape{1, S_len});
  Seq2SeqDecodeState<Be> st;
  std::vector<std::int32_t> seq(n + 1);  // token 0, then the n generated
  const auto cached = time_calls(a, be, [&] {
    model.start_decoding(be, st);
    auto logits = model.decode(be, std::span(seq.data(), 1), st);
    for (int i = 0; i < n; ++i) {
      seq[i + 1] = argmax(be.host_view(logits, staging));
      if (i + 1 < n) logits = model.decode(be, std::span(&seq[i + 1], 1), st);
    }
  });
  const auto greedy = seq;
  const auto recompute = time_calls(a, be, [&] {
    for (int i = 0; i < n; ++i) {
      model.start_decoding(be, st);
      const auto logits = model.decode(be, std::span(seq.data(), i + 1), st);
      seq[i + 1] = argmax(be.host_view(logits.subspan(std::size_t(i) * V, V), staging));
    }
  });
  require(seq == greedy, "cached and recomputed greedy translation disagree");
  // One token at full context.
  model.start_decoding(be, st);
  model.decode(be, std::span(greedy.data(), n), st);
  const auto step = time_calls(a, be, [&] {
    model.decode(be, std::span(&greedy[n], 1), st);
    st.self.truncate(n);
  });
  const auto full = time_calls(a, be, [&] {
    model.start_decoding(be, st);
    model.decode(be, greedy, st);
  });
  out["results"]["translate_cached"] = summarize(cached, n, 0, 1, n);
  out["results"]["translate_recompute"] = summarize(recompute, n, 0, 1, n);
  out["results"]["translate_full_context_cached"] = summarize(step, 1, 0, 1);
  out["results"]["translate_full_context_recompute"] = summarize(full, 1, 0, 1);
  out["memory"] = {{"peak_rss_mb", peak_rss_mb()}};
  return out;
}

void print(const json& r) {
  const auto& s = r["shape"];
  std::cout << "xfmr-bench " << r["model"].get<std::string>() << " (B" << s["B"] << " T" << s["T"] << " D" << s["D"]
            << " H" << s["H"] << " L" << s["L"] << "), " << r["backend"].get<std::string>()
            << (r.value("graph_steps", false) ? " (CUDA graph steps)" : "") << ", " << r["threads"]
            << " threads, " << r["blas"].get<std::string>() << ", kernels "
            << r.value("cpu_kernels", std::string("?")) << std::fixed << std::setprecision(1);
  if (r["gemm_ceiling_gflops"].get<double>() > 0)
    std::cout << "; GEMM ceiling " << r["gemm_ceiling_gflops"].get<double>() << " GFLOP/s";
  std::cout << "\n";
  if (r.contains("lora"))
    std::cout << "  LoRA " << r["lora"]["options"].get<std::string>() << ": " << r["lora"]["trained"]
              << " parameters trained, the base's frozen; load " << std::setprecision(2)
              << r["load"]["load_s"].get<double>() << " s, recompute " << r["recompute"].get<std::string>()
              << ", peak RSS " << std::setprecision(0) << r["memory"]["peak_rss_mb"].get<double>() << " MB\n";
  else if (r.contains("load"))
    std::cout << "  load " << std::setprecision(2) << r["load"]["load_s"].get<double>() << " s, first token after "
              << r["load"]["first_token_s"].get<double>() << " s (the " << r["load"]["precision"].get<std::string>()
              << " copies made), peak RSS while decoding " << std::setprecision(0)
              << r["memory"]["peak_rss_mb"].get<double>() << " MB\n";
  for (const auto& [name, m] : r["results"].items()) {
    std::cout << "  " << std::left << std::setw(24) << name << std::right << std::setprecision(3) << std::setw(10)
              << m["median_ms"].get<double>() << " ms  [" << m["p10_ms"].get<double>() << ", "
              << m["p90_ms"].get<double>() << "]  " << std::setprecision(0) << std::setw(9)
              << m["tokens_per_s"].get<double>() << " tok/s";
    if (m.contains("gflops") && m.contains("ceiling_fraction"))
      std::cout << std::setprecision(1) << std::setw(8) << m["gflops"].get<double>() << " GFLOP/s ("
                << std::setprecision(0) << 100 * m["ceiling_fraction"].get<double>() << "% of ceiling)";
    if (m.contains("mfu"))
      std::cout << std::setprecision(1) << "  MFU " << 100 * m["mfu"].get<double>() << "% (of "
                << m["mfu_peak_tflops"].get<double>() << " TFLOP/s)";
    if (m.contains("speedup_vs_one"))
      std::cout << std::setprecision(2) << "  " << m["speedup_vs_one"].get<double>() << "x one sequence's tokens/s";
    if (m.contains("bandwidth_fraction"))
      std::cout << std::setprecision(1) << "  weights " << m["weight_gbs"].get<double>() << " GB/s ("
                << std::setprecision(0) << 100 * m["bandwidth_fraction"].get<double>() << "% of the read bandwidth)";
    else if (m.contains("weight_gbs"))
      std::cout << std::setprecision(1) << "  weights " << m["weight_gbs"].get<double>() << " GB/s";
    std::cout << "\n";
  }
  if (r.contains("read_bandwidth_gbs"))
    std::cout << "  streaming read bandwidth " << std::setprecision(1) << r["read_bandwidth_gbs"].get<double>()
              << " GB/s (1 GiB, all threads)\n";
  const auto& mem = r["memory"];
  if (!mem.contains("analytical")) return;
  if (mem.contains("peak_device_mb"))
    std::cout << "  peak device memory " << std::setprecision(1) << mem["peak_device_mb"].get<double>()
              << " MB (xfmr's allocations)\n";
  if (r.contains("recompute"))
    std::cout << "  recompute " << r["recompute"].get<std::string>() << ", attention "
              << mem.value("attention", std::string("materialised")) << "\n";
  std::cout << "  peak RSS " << std::setprecision(1) << mem["peak_rss_mb"].get<double>() << " MB ("
            << mem["rss_before_model_mb"].get<double>() << " before the model), workspace "
            << mem["workspace_mb"].get<double>() << " MB; analytical params+grads+AdamW+activations"
            << (mem["analytical"].contains("weight_copies_mb") ? "+weight copies " : " ")
            << mem["analytical"]["total_mb"].get<double>() << " MB\n";
}

}  // namespace

int main(int argc, char** argv) {
  return run_command("xfmr-bench", [&] {
    Args a;
    po::options_description opts("xfmr-bench options");
    opts.add_options()("help,h", "show this help")
      ("model", po::value(&a.model)->default_value(a.model), preset_help<LanguageModelPresets>().c_str())
      ("batch", po::value(&a.batch)->default_value(a.batch), "sequences per batch (0: 64 for shakespeare-large, else 16); with --pretrained, B > 1 also times B sequences decoded together (the server's engine)")
      ("seq-len", po::value(&a.seq_len)->default_value(a.seq_len), "train and forward: positions per sequence (0: MAX_T)")
      ("recompute-tokens", po::value(&a.recompute_tokens)->default_value(a.recompute_tokens),
       "generate: tokens the recompute loop times (0: all MAX_T - 1 up to MAX_T 256, else 64)")
      ("vocab", po::value(&a.vocab)->default_value(a.vocab), "vocabulary size (65; 8000 with --translator)")
      ("translator", po::value(&a.translator), ("time translation decoding of this preset instead: " +
                                                TranslatorPresets::list()).c_str())
      ("pretrained", po::value(&a.pretrained), "time greedy decoding of this checkpoint instead (a Hugging Face GPT-2 "
       "or Llama directory, a llama2.c .bin, or an xfmr checkpoint: a quantised one in its precision unless "
       "--precision says), with its load time and the time to its first token")
      ("memory", po::bool_switch(&a.memory), "with --pretrained: measure neither the GEMM ceiling nor the read "
       "bandwidth, whose buffers would count in the process's peak memory (/usr/bin/time -v)")
      ("prefill", po::value(&a.prefill)->default_value(a.prefill), "with --pretrained: also time a prompt of this "
       "many tokens through the KV cache (its tokens a second)")
      ("lora", po::value(&a.lora), "with --pretrained: time a LoRA training step on it instead (xfmr-lm train --lora's "
       "SPEC, e.g. r=16,alpha=32; --batch 4, --seq-len 256 by default; CPU; --precision bf16, int8 or q4: the base held "
       "as such copies)")
      ("decode-tokens", po::value(&a.decode_tokens)->default_value(a.decode_tokens),
       "with --pretrained: tokens per generation (below the model's context)")
      ("modes", po::value(&a.modes)->default_value(a.modes), "comma-separated: train, forward, generate; under mpirun: train, or allreduce (its cost by size)")
      ("min-time", po::value(&a.min_time)->default_value(a.min_time), "timed seconds per measurement (at least)")
      ("min-reps", po::value(&a.min_reps)->default_value(a.min_reps), "timed repetitions per measurement (at least)")
      ("warmup", po::value(&a.warmup)->default_value(a.warmup), "untimed repetitions first")
      ("json", po::value(&a.json_path), "also write the results as JSON to this file")
      ("smoke", po::bool_switch(&a.smoke), "one repetition of everything (a test that the bench runs)")
      ("eager", po::bool_switch(&a.eager),
       "CUDA: queue every kernel from the host, instead of replaying CUDA graphs of the training step and forward pass")
      ("shards", po::value(&a.shards)->default_value(a.shards),
       "CPU training step and forward pass: split the batch over this many model replicas, one a thread "
       "(DataParallel); 0: one per thread, or 1 for models over 64 MiB of parameters; 1: one model, each operation "
       "threaded instead")
      ("precision", po::value(&a.precision)->default_value(a.precision),
       "fp32; bf16: matrix products on bfloat16 operands summed in float32 (CPU: AVX512-BF16, or float32 products of the rounded operands); int8 "
       "(CPU: decoding, or --lora's base): weights quantised to int8 once, a float32 scale a row; or q4 (CPU: "
       "decoding, or --lora's base): 4-bit "
       "blocks of 32 with a scale each. A quantised checkpoint decodes in its own by default")
      ("zero", po::value(&a.zero)->default_value(a.zero),
       "under mpirun: 1 shards AdamW's moments over the ranks (ZeRO-1), 0 keeps them whole")
      ("recompute", po::value(&a.recompute)->default_value(a.recompute),
       (std::string("training step: ") + kRecomputeHelp + " (peak memory: run one mode a process)").c_str())
      ("materialise-attention", po::bool_switch(&a.materialise_attention),
       "the model's attention layers keep their probabilities instead of tiling (the path before tiled attention)")
      ("attention", po::value(&a.attention)->default_value(a.attention),
       "time attention alone instead, forward and backward at this many positions (12 heads of 64, causal, batch "
       "--batch or 1): tiled against materialised, with their TFLOP/s, what each saves and the peak RSS after each")
      ("backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp);
    po::variables_map vm;
    if (!parse_options(argc, argv, opts, vm)) return 0;
    (void)LanguageModelPresets::info(a.model);
    if (!a.pretrained.empty() && is_checkpoint(a.pretrained))
      a.precision = decoding_precision(vm, a.precision, read_checkpoint_metadata(a.pretrained));
    check_decoding_backend(vm, a.backend, a.precision);
    require(!is_decoding_precision(a.precision) || a.modes == "generate" || !a.pretrained.empty() ||
                !a.translator.empty(),
            "--precision ", a.precision, " times decoding: --modes generate, --pretrained or --translator");
    (void)parse_recompute(a.recompute);
    require(a.batch >= 0, "--batch ", a.batch, " is negative");
    require(a.seq_len >= 0, "--seq-len ", a.seq_len, " is negative");
    require(a.recompute_tokens >= 0, "--recompute-tokens ", a.recompute_tokens, " is negative");
    require(a.shards >= 0, "--shards ", a.shards, " is negative");
    require(a.vocab >= 2, "--vocab ", a.vocab, " must be at least 2");
    check_vocabulary(std::size_t(a.vocab), 1, LanguageModelPresets::info(a.model).d_model, "--vocab", "a smaller --vocab");
    require(a.shards <= kMaxShards, "--shards ", a.shards, " outside 0..", kMaxShards);
    require(a.min_reps >= 1 && a.warmup >= 0 && a.min_time >= 0, "--min-reps must be >= 1, --warmup and --min-time >= 0");
    // Where the results go is checked before the benchmark runs, not after.
    check_output_paths({{"--json", a.json_path}}, {}, "");
    {
      std::istringstream in(a.modes);
      for (std::string m; std::getline(in, m, ',');)
        require(m == "train" || m == "forward" || m == "generate" || m == "allreduce", "unknown mode '", m,
                "' (choose from train, forward, generate; allreduce under mpirun)");
    }
    if (a.smoke) a.warmup = 0, a.min_reps = 1, a.min_time = 0;
    require(a.decode_tokens >= 1 && a.decode_tokens < (1 << 20), "--decode-tokens ", a.decode_tokens, " is not positive");
    require(a.prefill >= 0 && a.prefill < (1 << 20), "--prefill ", a.prefill, " is negative");
    require(a.lora.empty() || (!a.pretrained.empty() && a.backend == "cpu"),
            "--lora times a LoRA step on a --pretrained checkpoint, on the CPU backend");
    json result;
    if (a.modes == "allreduce") {
      result = run_allreduce(a);
      std::cout << "xfmr-bench all-reduce, " << result["ranks"] << " ranks (ProcessGroup::all_reduce_sum, float)\n";
      for (const auto& r : result["results"])
        std::cout << "  " << std::setw(10) << r["bytes"].get<std::size_t>() << " bytes  " << std::fixed
                  << std::setprecision(3) << std::setw(9) << r["median_ms"].get<double>() << " ms  "
                  << std::setprecision(2) << std::setw(7) << r["bus_gbs"].get<double>() << " GB/s moved a rank\n";
      std::cout << "  fit: " << std::setprecision(1) << result["fit"]["latency_us"].get<double>() << " us + bytes / "
                << std::setprecision(2) << result["fit"]["buffer_gbs"].get<double>() << " GB/s\n";
      if (!a.json_path.empty() && ProcessGroup::world().root()) write_text_atomic(a.json_path, result.dump(1) + "\n");
      return 0;
    }
    if (a.attention > 0) {
      dispatch_backend(a.backend, [&]<class Be>() { result = run_attention<Be>(a); });
      const auto& s = result["attention"];
      std::cout << "xfmr-bench attention forward+backward (B" << s["B"] << " H" << s["H"] << " T" << s["T"] << " head "
                << s["head"] << ", causal), " << result["backend"].get<std::string>() << ", " << result["threads"]
                << " threads\n";
      for (const auto& [name, m] : result["results"].items())
        std::cout << "  " << std::left << std::setw(13) << name << std::right << std::fixed << std::setprecision(2)
                  << std::setw(10) << m["median_ms"].get<double>() << " ms, " << m["tflops"].get<double>()
                  << " TFLOP/s  saved " << m["saved_mb"].get<double>() << " MB, scratch "
                  << m.value("scratch_mb", 0.0) << " MB, peak RSS after " << std::setprecision(1)
                  << m["peak_rss_mb"].get<double>() << " MB\n";
      if (!a.json_path.empty()) write_text_atomic(a.json_path, result.dump(1) + "\n");
      return 0;
    } else if (!a.lora.empty()) {
      result = run_lora(a);
    } else if (!a.pretrained.empty()) {
      result = run_pretrained(a, a.precision);
    } else if (a.translator.empty()) {
      dispatch_backend(a.backend, [&]<class Be>() { result = run<Be>(a); });
    } else {
      if (vm["vocab"].defaulted()) a.vocab = 8000;
      dispatch_backend(a.backend,
                       [&]<class Be>() { result = run_translator<Be>(TranslatorPresets::info(a.translator), a); });
    }
    print(result);
    if (result.contains("greedy")) {
      std::cout << "  first greedy ids:";
      for (std::size_t i = 0; i < std::min<std::size_t>(16, result["greedy"].size()); ++i) std::cout << " " << result["greedy"][i];
      std::cout << "\n";
    }
    if (!a.json_path.empty() && ProcessGroup::world().root()) write_text_atomic(a.json_path, result.dump(1) + "\n");
    return 0;
  });
}
