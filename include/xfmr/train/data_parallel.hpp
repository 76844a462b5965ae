// data_parallel.hpp: DataParallel, a training step's forward and backward
// passes (or a forward pass alone: evaluation, inference) split by
// sequences over the CPU's cores, one model replica a core.
//
// A small model's step is hundreds of operations of a few microseconds to a
// few hundred each. Split operation by operation over the cores, every one
// pays a fork and a join, and hands its rows to the other core's cache:
// where the cores sit far apart (separate L3 caches) that waiting is a
// quarter of the step. Split by sequences instead, each core runs the whole
// step on its own shard of the batch, every operation on one thread, and
// meets the others twice: when its replica reads the model's weights, and
// when the shards' gradients are added up (PyTorch's DistributedDataParallel
// on the cores of one machine).
//
//   DataParallel<Model, Be> dp(model, be, [&] { return std::make_unique<Model>(V, 0); });
//   zero_grad(model);
//   const double loss = dp.backward(B, [&](const Shard& s, Model& m, Be& b) {
//     // m.forward(b, ...) on sequences [s.begin, s.end); the loss gradient
//     // scaled by s.share() (or by the shard's counted targets over the
//     // batch's); m.backward(b, ...); return the loss times that share
//   });
//   clip_gradients(be, model, 1.0);  // then everything on model, as ever
//   opt.step(be, lr);
//
//   // Evaluation: the same split, without gradients.
//   const double val = dp.forward(B, [&](const Shard& s, Model& m, Be& b) {
//     return loss_of(m.forward(b, ...)) * s.share();
//   });
//
// - Shard 0 runs on `model` and `be` themselves, on the calling thread: its
//   gradients accumulate into model's as in a plain step (so gradient
//   accumulation over micro-batches works unchanged).
// - Shard r > 0 runs on replica r and its own backend (made with be's
//   options where the backend has them: the same precision): the replica first
//   takes model's weights and dropout state (training flag, call counts) and
//   clears its gradients; afterwards its gradients are added into model's.
//   The sum runs in shard order, so a run repeats bit for bit.
// - Masks: replica r's dropout layers draw from stream first + r
//   (Dropout::set_stream; first is 0 unless set_first_stream says), shard 0
//   from stream first on the model itself.
// - With one shard (one thread, one sequence, or a backend whose memory is
//   not the host's) f runs once, on model and be: a plain step.
// - forward(sequences, f) runs the shards the same way, but leaves every
//   gradient alone (the replicas' are not cleared, nothing is added into
//   model's): for passes that do not train.
// - When f returns a number (its shard's weighted loss), backward and
//   forward return the sum over the shards, in shard order.
// - An exception from f in any shard is rethrown here once every shard has
//   finished (the lowest shard's); model's gradients are then unspecified.
//
// The shards run through the backend's for_each_thread (CpuBackend: one
// OpenMP thread each); every operation inside a shard stays on its thread,
// as does OpenBLAS's OpenMP build.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "xfmr/core/error.hpp"
#include "xfmr/core/tensor.hpp"
#include "xfmr/models/model.hpp"

namespace xfmr {

// Sequences [begin, end) of a batch of `total`, run as shard `index`.
struct Shard {
  int index = 0, begin = 0, end = 0, total = 0;
  int size() const { return end - begin; }
  // This shard's part of the batch: the factor for a loss averaged over it.
  double share() const { return total > 0 ? double(size()) / double(total) : 0.0; }
};

// The most shards a DataParallel takes: each holds a replica and its
// buffers, and a batch splits into no more shards than it has sequences.
inline constexpr int kMaxShards = 1024;

template <class Model, class Backend>
class DataParallel {
  static_assert(TrainableModel<Model>, "DataParallel: the model must provide visit(f), for_each_dropout(f) and "
                                       "set_training(bool) (models/model.hpp's TrainableModel)");

 public:
  using S = typename Backend::Scalar;
  using Factory = std::function<std::unique_ptr<Model>()>;
  // Replicas need host memory: the CPU backend (float or double).
  static constexpr bool kHostMemory = std::is_same_v<typename Backend::Tensor, xfmr::Tensor<S>>;

  // Up to `shards` shards a batch (never more than its sequences), one a
  // thread; 0 means default_shards(): one per thread on the CPU for models
  // of up to kShardMaxParameterBytes of parameters, one otherwise.
  // make_replica builds a model of model's type and shapes (its weights do
  // not matter: they are copied from model before every use); when empty,
  // a model with clone() (LanguageModel) replicates itself.
  DataParallel(Model& model, Backend& be, Factory make_replica, int shards = 0)
      : model_(model), be_(be), make_replica_(std::move(make_replica)), shards_(shards) {
    if constexpr (requires { { model.clone() } -> std::convertible_to<std::unique_ptr<Model>>; }) {
      if (!make_replica_) make_replica_ = [&model] { return model.clone(); };
    }
    require(shards >= 0 && shards <= kMaxShards, "DataParallel: ", shards, " shards outside 0..", kMaxShards,
            " (0: one per thread)");
    if (shards_ == 0) {
      if constexpr (kHostMemory) {
        std::size_t bytes = 0;
        model.visit([&](std::string_view, auto& value, auto&) { bytes += value.size() * sizeof(S); });
        shards_ = default_shards(be.threads(), bytes);
      } else {
        shards_ = 1;
      }
    }
    require(kHostMemory || shards_ == 1, "DataParallel: ", shards_, " shards on the ", Backend::name,
            " backend; sharding runs on the CPU backend only (give 1)");
    require(shards_ == 1 || bool(make_replica_), "DataParallel: ", shards_, " shards need a replica factory");
  }

  int shards() const { return shards_; }
  // Scratch memory the shards' backends hold (core/workspace.hpp), in bytes.
  std::size_t workspace_bytes() {
    std::size_t n = be_.workspace().capacity();
    for (auto& r : replicas_) n += r.be.workspace().capacity();
    return n * sizeof(typename Backend::Activation);
  }

  // Shard r draws dropout stream first + r (the model's layers are set to
  // `first`): a process that is one of several runs its shards on streams
  // no other process uses (the Trainer gives rank k the streams k x shards
  // and on).
  void set_first_stream(std::uint64_t first) {
    first_stream_ = first;
    model_.for_each_dropout([&](auto& d) { d.set_stream(first); });
    for (std::size_t r = 0; r < replicas_.size(); ++r)
      replicas_[r].model->for_each_dropout([&](auto& d) { d.set_stream(first + r + 1); });
  }

  // Replicas pay for small models, whose steps are hundreds of short
  // operations (shakespeare-small's step 1.5x faster split, large's
  // 1.15x). A large model's step is a few long products, which thread well
  // on their own, while each step would copy, clear and add all of its
  // weights once more per replica, on products of half the rows: GPT-2
  // 124M (652 MB) at B4 T64 took 746 ms split and 618 ms threaded.
  static constexpr std::size_t kShardMaxParameterBytes = std::size_t(64) << 20;
  static int default_shards(int threads, std::size_t parameter_bytes) {
    return parameter_bytes <= kShardMaxParameterBytes ? std::max(1, threads) : 1;
  }

  // Runs f(shard, model, backend) for each shard of `sequences` sequences,
  // in parallel, and adds every shard's gradients into model's. Returns the
  // sum of f's results in shard order (0 when f returns nothing).
  template <class F>
  double backward(int sequences, F&& f) {
    return run_shards(sequences, f, true, "backward");
  }

  // The same for passes without gradients: every gradient is left as it was.
  template <class F>
  double forward(int sequences, F&& f) {
    return run_shards(sequences, f, false, "forward");
  }

 private:
  template <class F>
  double run_shards(int sequences, F& f, bool gradients, const char* what) {
    require(sequences >= 1, "DataParallel::", what, ": ", sequences, " sequences; need at least 1");
    const int n = std::min(shards_, sequences);
    auto shard = [&](int r) {
      return Shard{r, int(long(sequences) * r / n), int(long(sequences) * (r + 1) / n), sequences};
    };
    // f's result as a number, or 0 when it returns nothing.
    auto call = [&f](const Shard& s, Model& m, Backend& b) -> double {
      if constexpr (std::is_void_v<std::invoke_result_t<F&, const Shard&, Model&, Backend&>>) {
        f(s, m, b);
        return 0.0;
      } else {
        return double(f(s, m, b));
      }
    };
    if constexpr (!kHostMemory) {
      return call(shard(0), model_, be_);
    } else {
      if (n == 1) return call(shard(0), model_, be_);
      prepare(n);
      // A tensor allocates its storage at its first access (core/tensor.hpp):
      // the model's are settled here, on one thread, since shard 0 uses them
      // while the others copy them (two threads growing one vector corrupt
      // the heap), and the replicas' gradients before they are summed.
      for (Tensor* t : values_) (void)t->data();
      if (gradients) {
        for (Tensor* t : grads_) (void)t->data();
        for (Replica& rep : replicas_)
          for (Tensor* t : rep.grads) (void)t->data();
      }
      // The per-call lists live in members, so a step allocates nothing.
      std::vector<DropoutState>& dropout = dropout_;
      dropout_state(model_, dropout);  // before shard 0 advances it
      std::vector<std::exception_ptr>& errors = errors_;
      std::vector<double>& results = results_;
      errors.assign(std::size_t(n), nullptr);
      results.assign(std::size_t(n), 0.0);
      auto run = [&](int r) {
        try {
          if (r == 0) {
            results[0] = call(shard(0), model_, be_);
          } else {
            Replica& rep = replicas_[std::size_t(r - 1)];
            take_weights(rep, dropout, gradients);
            results[std::size_t(r)] = call(shard(r), *rep.model, rep.be);
          }
        } catch (...) {
          errors[std::size_t(r)] = std::current_exception();
        }
      };
      be_.for_each_thread(n, run);
      bool failed = false;
      for (const auto& e : errors) failed = failed || e;
      if (gradients && !failed) be_.for_each_thread(n, [&](int t) { add_gradients(n, t, n); });
      for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
      double total = 0.0;
      for (double v : results) total += v;
      return total;
    }
  }

  using Tensor = typename Backend::Tensor;  // a parameter or gradient
  struct DropoutState {
    bool training;
    std::uint64_t calls;
  };
  struct Replica {
    std::unique_ptr<Model> model;
    Backend be;
    std::vector<Tensor*> values, grads;
  };

  static void dropout_state(Model& m, std::vector<DropoutState>& state) {
    state.clear();
    m.for_each_dropout([&](auto& d) { state.push_back({d.training(), d.calls()}); });
  }

  // Builds the replicas shards 1..n-1 need, and checks each lists the
  // model's tensors in the same order and shapes.
  void prepare(int n) {
    if (values_.empty()) {
      model_.visit([&](std::string_view name, Tensor& value, Tensor& grad) {
        names_.emplace_back(name);
        values_.push_back(&value);
        grads_.push_back(&grad);
      });
    }
    while (int(replicas_.size()) < n - 1) {
      Replica& rep = replicas_.emplace_back();
      if constexpr (requires { Backend(be_.options()); }) rep.be = Backend(be_.options());  // the same precision
      rep.model = make_replica_();
      require(rep.model != nullptr, "DataParallel: the replica factory returned no model");
      std::size_t i = 0;
      rep.model->visit([&](std::string_view name, Tensor& value, Tensor& grad) {
        require(i < names_.size() && name == names_[i] && value.shape() == values_[i]->shape(),
                "DataParallel: replica tensor '", name, "' ", shape_string(value.shape()),
                " does not match the model's ", i < names_.size() ? "'" + names_[i] + "' " + shape_string(values_[i]->shape()) : std::string("(it has fewer tensors)"));
        rep.values.push_back(&value);
        rep.grads.push_back(&grad);
        ++i;
      });
      require(i == names_.size(), "DataParallel: the replica has ", i, " tensors, the model ", names_.size());
      const std::uint64_t stream = first_stream_ + replicas_.size();  // replica r draws stream first + r
      rep.model->for_each_dropout([&](auto& d) { d.set_stream(stream); });
      std::vector<DropoutState> mine, theirs;
      dropout_state(*rep.model, mine);
      dropout_state(model_, theirs);
      require(mine.size() == theirs.size(), "DataParallel: the replica's dropout layers do not match the model's");
    }
  }

  // On the replica's own thread: the model's weights and dropout state in,
  // and (for backward) the replica's gradients cleared.
  void take_weights(Replica& rep, const std::vector<DropoutState>& dropout, bool clear_gradients) {
    for (std::size_t i = 0; i < rep.values.size(); ++i) {
      std::copy_n(values_[i]->data(), rep.values[i]->size(), rep.values[i]->data());
      if (clear_gradients) rep.grads[i]->zero();
    }
    std::size_t i = 0;
    rep.model->for_each_dropout([&](auto& d) {
      d.set_training(dropout[i].training);
      d.set_calls(dropout[i].calls);
      ++i;
    });
  }

  // Slice t of k of the gradients adds, element by element, model's (shard
  // 0's, plus whatever it held) + replica 1's + ... in that order. Slices
  // are whole cache lines of the concatenated gradients.
  void add_gradients(int n, int t, int k) {
    std::size_t total = 0;
    for (const Tensor* g : grads_) total += g->size();
    constexpr std::size_t line = 64 / sizeof(S);
    const std::size_t lines = (total + line - 1) / line;
    const std::size_t lo = std::min(total, lines * std::size_t(t) / std::size_t(k) * line);
    const std::size_t hi = std::min(total, lines * std::size_t(t + 1) / std::size_t(k) * line);
    std::size_t offset = 0;
    for (std::size_t j = 0; j < grads_.size() && offset < hi; offset += grads_[j]->size(), ++j) {
      const std::size_t a = std::max(lo, offset), b = std::min(hi, offset + grads_[j]->size());
      if (a >= b) continue;
      S* out = grads_[j]->data() + (a - offset);
      for (int r = 1; r < n; ++r) {
        const S* in = replicas_[std::size_t(r - 1)].grads[j]->data() + (a - offset);
        for (std::size_t i = 0; i < b - a; ++i) out[i] += in[i];
      }
    }
  }

  Model& model_;
  Backend& be_;
  Factory make_replica_;
  int shards_;
  std::uint64_t first_stream_ = 0;
  std::deque<Replica> replicas_;  // replica r is replicas_[r - 1]; they do not move
  std::vector<std::string> names_;
  std::vector<Tensor*> values_, grads_;
  std::vector<DropoutState> dropout_;      // a call's: the model's dropout state,
  std::vector<std::exception_ptr> errors_;  // each shard's failure,
  std::vector<double> results_;             // and each shard's result
};

}  // namespace xfmr
