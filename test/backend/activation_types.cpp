// activation_types.cpp: compiled, never linked or run. Every model (a
// Decoder with GPT-2's blocks and with Llama's, a Seq2Seq, a Classifier, a
// Bigram), the loss, the optimizers, a Trainer's step and evaluation and a
// generation, on a backend whose activations are a type of their own (a
// 16-bit word with no arithmetic and no conversions) apart from its float
// parameters: every layer must pass activations, their gradients and the
// logits as Backend::Activation, and parameters, their gradients, saved
// statistics and scalars as Backend::Scalar (backend.hpp).
// CpuBackend and CudaBackend have the two the same, so their builds cannot
// tell a mix-up; this file's build fails on one.
//
// SplitBackend declares the operations a Decoder calls, each with the types
// a backend storing bfloat16 activations beside float32 parameters would
// take: products read activations and weights (Tensor::product_data(), the
// weights in the activations' type) and write activations, or float32
// parameter gradients; norms and losses keep float32 statistics. Defined
// nowhere: the object library (test/CMakeLists.txt) is compiled, not linked.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "xfmr/backend/attention_plan.hpp"
#include "xfmr/backend/backend.hpp"
#include "xfmr/core/mask.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/core/workspace.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/models/bigram.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"

namespace xfmr::check {

// An activation: 16 bits, nothing else.
struct Word {
  std::uint16_t bits;
};

template <class T>
class Buffer {
 public:
  T* reserve(std::size_t n);
  template <int COLS>
  Rows<T, COLS> rows(int r) {
    return {reserve(static_cast<std::size_t>(r) * COLS), r};
  }
  template <int COLS>
  Rows<T, COLS> rows(int r, Dim<COLS> cols) {
    return {reserve(static_cast<std::size_t>(r) * cols), r, cols};
  }
  T* data();
  const T* data() const;
  std::size_t capacity() const;
};

// Parameters and their gradients: float32, with the weights in the
// activations' type for products.
class Tensor : public ShapedStorage<Tensor, float> {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<std::int64_t> shape) { resize(std::move(shape)); }
  Tensor(std::initializer_list<std::int64_t> shape) : Tensor(std::vector<std::int64_t>(shape)) {}
  void resize(std::vector<std::int64_t> shape) { this->set_shape(std::move(shape)); }
  float* data();
  const float* data() const;
  const Word* product_data() const;
  void zero();
  void fill(float v);
  template <class F>
  void generate(F&& f) {
    for (std::size_t i = 0; i < size(); ++i) (void)float(f());
  }
  void copy_from_host(const float* src);
  void copy_to_host(float* dst) const;
};

struct SplitBackend {
  using Scalar = float;
  using Activation = Word;
  using S = float;
  using A = Word;
  using Tensor = check::Tensor;
  template <class T>
  using Buffer = check::Buffer<T>;
  static constexpr const char* name = "check";

  void synchronize();
  std::span<const S> host_view(std::span<const A> x, std::vector<S>& staging);
  std::span<const S> host_view(std::span<const S> x, std::vector<S>& staging);  // attention's probabilities
  Workspace<Buffer<A>>& workspace();

  // linear
  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const A* a, int lda, const A* b, int ldb, S beta, A* c,
            int ldc);
  void gemm(bool ta, bool tb, int M, int N, int K, S alpha, const A* a, int lda, const A* b, int ldb, S beta, S* c,
            int ldc);  // parameter gradients
  void bias_add(int rows, int n, const S* bias, A* y);
  void bias_grad(int rows, int n, const A* dy, S* dbias);
  void linear_forward(int rows, int in, int out, const A* x, const A* w, const S* bias, A* y);
  void linear_gelu_forward(int rows, int in, int out, const A* x, const A* w, const S* bias, A* h, A* y);
  void linear_dgelu_input_grad(int rows, int in, int out, const A* dy, const A* w, const A* h, A* dh);
  // residual
  void add(std::size_t n, const A* a, const A* b, A* y);
  void add_to(std::size_t n, const A* x, A* y);
  void copy(std::size_t n, const A* x, A* y);
  // positional
  void add_positions_forward(int B, int T, int D, const A* x, const S* table, A* y);
  void add_positions_backward(int B, int T, int D, const A* dy, S* dtable);
  void rope_forward(int B, int T, int offset, int H, int hd, const S* table, A* x, int ld);
  void rope_backward(int B, int T, int offset, int H, int hd, const S* table, A* dx, int ld);
  // layer_norm, rms_norm
  void layer_norm_forward(int rows, int n, const A* x, const S* gamma, const S* beta, S eps, A* y, S* mean, S* rstd);
  void layer_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* mean, const S* rstd,
                           A* dx, S* dgamma, S* dbeta);
  void rms_norm_forward(int rows, int n, const A* x, const S* gamma, S eps, A* y, S* rstd);
  void rms_norm_backward(int rows, int n, const A* dy, const A* x, const S* gamma, const S* rstd, A* dx, S* dgamma);
  // activation
  void relu_forward(std::size_t n, const A* x, A* y);
  void relu_backward(std::size_t n, const A* x, const A* dy, A* dx);
  void gelu_forward(std::size_t n, const A* x, A* y);
  void gelu_backward(std::size_t n, const A* x, const A* dy, A* dx);
  void swiglu_forward(int rows, int n, const A* h, A* y);
  void swiglu_backward(int rows, int n, const A* h, const A* dy, A* dh);
  void geglu_forward(int rows, int n, const A* h, A* y);
  void geglu_backward(int rows, int n, const A* h, const A* dy, A* dh);
  // dropout
  void dropout_forward(std::size_t n, float p, std::uint64_t key, const A* x, A* y, std::uint8_t* keep);
  void dropout_backward(std::size_t n, float p, const std::uint8_t* keep, const A* dy, A* dx);
  // embedding
  void embedding_forward(int n, int V, int D, const std::int32_t* ids, const S* table, A* y);
  void embedding_backward(int n, int D, const std::int32_t* ids, const A* dy, S* dtable);
  // classifier
  void mean_pool_forward(int B, int T, int D, const A* x, const std::uint8_t* exclude, A* y);
  void mean_pool_backward(int B, int T, int D, const A* dy, const std::uint8_t* exclude, A* dx);
  // losses: the unfused pair keeps float32 probabilities
  double cross_entropy_forward(int rows, int V, const A* logits, const std::int32_t* targets, int ignore_index,
                               S* probs, S smoothing = S(0));
  void cross_entropy_backward(int rows, int V, const S* probs, const std::int32_t* targets, int ignore_index, S dloss,
                              A* dlogits, S smoothing = S(0));
  double cross_entropy_forward_backward(int rows, int V, const A* logits, const std::int32_t* targets,
                                        int ignore_index, S dloss, A* dlogits, S smoothing = S(0));
  // optimizers (and a non-finite loss's check of the logits)
  double sum_squares(std::size_t n, const S* x);
  double sum_squares(std::size_t n, const A* x);
  void sum_squares_each(std::span<const SquaresTensor<S>> tensors, std::span<double> sums);
  void scale(std::size_t n, S alpha, S* x);
  void adamw_step(std::span<const AdamWTensor<S>> tensors, S lr, S beta1, S beta2, S eps, S bias_correction1,
                  S bias_correction2);
  void sgd_step(std::size_t n, S* p, const S* g, S* buf, S lr, S momentum, S weight_decay);
  // attention: float32 probabilities and log-sum-exps
  AttentionKernels attention_kernels() const;
  void attention_forward(const AttentionDims& a, const A* q, int ldq, const A* k, int ldk, const A* v, int ldv, A* y,
                         int ldy, S* probs, const AttentionMask& mask);
  void attention_backward(const AttentionDims& a, const A* dy, int ldy, const A* q, int ldq, const A* k, int ldk,
                          const A* v, int ldv, const S* probs, A* dq, A* dk, A* dv);
  void flash_attention_forward(const AttentionDims& a, const A* q, int ldq, const A* k, int ldk, const A* v, int ldv,
                               A* y, int ldy, S* lse, const AttentionMask& mask);
  void flash_attention_backward(const AttentionDims& a, const A* dy, int ldy, const A* y, int ldo, const A* q, int ldq,
                                const A* k, int ldk, const A* v, int ldv, const S* lse, const AttentionMask& mask,
                                A* dq, A* dk, A* dv);
};
static_assert(Backend<SplitBackend>);
// The negative control: one operation short is not a backend.
struct WithoutGelu : SplitBackend {
  void gelu_forward() = delete;
};
static_assert(!Backend<WithoutGelu>, "a backend without gelu_forward(n, x, y) must fail the Backend concept");

// GPT-2's block (pre-norm, GELU, learned positions, biases) and Llama's
// (RMSNorm, SwiGLU, rotary positions, grouped-query attention).
struct Gpt2Like {
  static constexpr int MAX_T = 16, D_MODEL = 32, N_HEADS = 4, N_LAYERS = 2, D_FF = 64;
  using Norm = PreNorm;
  using Activation = Gelu;
};
struct LlamaLike : Gpt2Like {
  static constexpr int N_KV_HEADS = 2;
  template <int D, class Be>
  using NormLayer = RmsNorm<D, Be>;
  using Activation = SwiGlu;
  using Positions = Rope;
  static constexpr bool BIAS = false;
};

}  // namespace xfmr::check

namespace xfmr {
template class Decoder<check::Gpt2Like, check::SplitBackend>;
template class Decoder<check::LlamaLike, check::SplitBackend>;
template class Seq2Seq<check::Gpt2Like, check::Gpt2Like, check::SplitBackend>;
template class Classifier<check::Gpt2Like, check::SplitBackend>;
template class Bigram<check::SplitBackend>;
template class Trainer<Decoder<check::Gpt2Like, check::SplitBackend>, check::SplitBackend>;
template class CrossEntropyLoss<check::SplitBackend>;
template class AdamW<check::SplitBackend>;
template class Sgd<check::SplitBackend>;

namespace check {
// The member templates too: a training step, an evaluation and a generation.
void train_evaluate_generate(SplitBackend& be, std::span<const std::int32_t> ids,
                             std::span<const std::int32_t> targets) {
  using Model = Decoder<Gpt2Like, SplitBackend>;
  Model model(40, 1);
  AdamW<SplitBackend> opt(model);
  Trainer<Model, SplitBackend> trainer(model, be, opt, {});
  auto forward = [&](const Shard& s, Model& m, SplitBackend& b) {
    return m.forward(b, ids.subspan(std::size_t(s.begin) * 16, std::size_t(s.size()) * 16), Shape{s.size(), 16});
  };
  (void)trainer.step([&](int) { return BatchTargets{2, targets}; }, forward);
  (void)trainer.evaluate(BatchTargets{2, targets}, forward);
  Rng rng(1);
  (void)generate(model, be, {1, 2, 3}, GenerateOptions{}, rng);
}
}  // namespace check
}  // namespace xfmr
