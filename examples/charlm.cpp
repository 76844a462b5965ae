// xfmr-charlm: train a character-level GPT on a text file, and sample from it.
//
//   xfmr-charlm train --data FILE [--model shakespeare-small] [--steps N] ...
//   xfmr-charlm sample --checkpoint DIR [--tokens N] [--prompt TEXT] ...
//   xfmr-charlm sample --gpt2 DIR [--tokens N] [--prompt TEXT] ...
//     (a GPT-2 checkpoint in the Hugging Face layout, with its tokenizer)
//
// Run either command with --help for its options.
#include <boost/program_options.hpp>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "presets.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/bf16_weights.hpp"
#include "xfmr/infer/sampling.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/gpt2.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/text/gpt2_bpe.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace xfmr;
using namespace xfmr::examples;

namespace {

constexpr const char* kFormat = "xfmr-charlm";
constexpr std::uint64_t kEvalSeed = 0x5eed;

// Settings that define a run; on --resume they come from the checkpoint.
struct RunSettings {
  std::string model = "shakespeare-small", mode = "text", schedule = "constant";
  int batch = 16, grad_accum = 1;
  double lr = 1e-3, clip = 0.0, weight_decay = 0.01, val_fraction = 0.1;
  float dropout = -1.0f;            // < 0: the preset's
  float attention_dropout = 0.0f;   // on the attention probabilities
  std::uint64_t seed = 1337;

  json to_json() const {
    return {{"model", model},   {"mode", mode},       {"schedule", schedule}, {"batch", batch},
            {"grad_accum", grad_accum}, {"lr", lr},   {"clip", clip},         {"weight_decay", weight_decay},
            {"val_fraction", val_fraction}, {"dropout", dropout}, {"attention_dropout", attention_dropout},
            {"seed", seed}};
  }
  static RunSettings from_json(const json& j) {
    RunSettings s;
    s.model = j.at("model");
    s.mode = j.at("mode");
    s.schedule = j.at("schedule");
    s.batch = json_integer<int>(j, "batch");
    s.grad_accum = json_integer<int>(j, "grad_accum");
    s.lr = j.at("lr");
    s.clip = j.at("clip");
    s.weight_decay = j.at("weight_decay");
    s.val_fraction = j.at("val_fraction");
    s.dropout = j.at("dropout");
    s.attention_dropout = j.value("attention_dropout", 0.0f);  // absent before attention dropout existed
    s.seed = json_integer<std::uint64_t>(j, "seed");
    return s;
  }
};

// What a run resumes from, read from trainer_state.json before any work.
struct Resumed {
  TrainerState state;
  std::string data, data_hash;  // the corpus the checkpoint trained on, and its hash

  static Resumed from_json(const json& j) {
    const json& calls = j.at("dropout_calls");
    require(calls.is_array(), "checkpoint value 'dropout_calls' is not an array");
    std::vector<std::uint64_t> dropout_calls;
    for (const json& c : calls) {
      require(c.is_number_unsigned(), "checkpoint value 'dropout_calls' holds ", c.dump(), ", not a count");
      dropout_calls.push_back(c.get<std::uint64_t>());
    }
    return {{json_integer<long>(j, "step", 0),
             parse_integer<std::uint64_t>(j.at("rng").get<std::string>(), "trainer_state.json: rng"),
             std::move(dropout_calls)},
            j.at("data").get<std::string>(),
            j.at("data_hash").get<std::string>()};
  }
};

struct TrainArgs : RunOptions {
  RunSettings run;
  std::string data, resume;
  long steps = 5000, stop_after = 0;  // stop_after > 0: stop (and checkpoint) at that step of the plan
  int eval_every = 500, eval_batches = 100, samples = 300;
};

// The text the model learns from: train and validation streams (text mode),
// or train and validation names (names mode).
struct Corpus {
  std::string train, val;                   // text mode
  std::vector<std::string> train_names, val_names;  // names mode
  std::uint64_t hash = 0;
  std::string all_text() const {
    std::string s = train + val;
    for (const auto* v : {&train_names, &val_names})
      for (const auto& n : *v) s += n + "\n";
    return s;
  }
};

Corpus load_corpus(const std::string& path, const RunSettings& run) {
  require(!path.empty(), "--data FILE is required");
  Corpus c;
  const std::string text = read_text_file(path);
  c.hash = fnv1a(text);
  std::vector<std::string_view> chars;  // the characters, in order
  try {
    chars = utf8_characters(text);
  } catch (const Error& e) {
    detail::fail(path, ": ", e.what(), " (the character model reads UTF-8 text)");
  }
  if (run.mode == "names") {
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start < text.size()) {
      auto end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
      start = end + 1;
    }
    auto split = split_names(lines, 1.0 - run.val_fraction, run.seed);
    c.train_names = std::move(split.train);
    c.val_names = std::move(split.val);
  } else {
    require(run.mode == "text", "unknown --mode '", run.mode, "' (expected text or names)");
    // The first (1 - val_fraction) of the characters train, the rest validate.
    const std::size_t n_train = std::size_t(double(chars.size()) * (1.0 - run.val_fraction));
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < n_train; ++i) bytes += chars[i].size();
    c.train = text.substr(0, bytes);
    c.val = text.substr(bytes);
  }
  return c;
}

// Training and evaluation batches for either mode.
class Batches {
 public:
  Batches(const Corpus& c, const CharTokenizer& tok, const std::string& mode, int batch, int length, bool train) {
    if (mode == "names") {
      const auto sep = tok.find("\n").value();
      std::vector<std::vector<std::int32_t>> seqs;
      for (const auto& n : train ? c.train_names : c.val_names) seqs.push_back(tok.encode(n));
      seq_.emplace(std::move(seqs), batch, length, sep, sep, kIgnoreIndex);
    } else {
      ids_ = tok.encode(train ? c.train : c.val);
      lm_.emplace(ids_, batch, length);
    }
  }
  void sample(Rng& rng, std::int32_t* ids, std::int32_t* targets) const {
    lm_ ? lm_->sample(rng, ids, targets) : seq_->sample(rng, ids, targets);
  }
  // Evaluation batches: fixed random windows (text), or the names in order,
  // all of them when `cap` allows (names).
  int eval_count(int cap) const { return lm_ ? cap : std::min(cap, seq_->batches()); }
  void eval_batch(int i, std::int32_t* ids, std::int32_t* targets) const {
    lm_ ? lm_->fixed(kEvalSeed, i, ids, targets) : seq_->in_order(i, ids, targets);
  }
  std::size_t size() const { return lm_ ? ids_.size() : seq_->size(); }

 private:
  std::vector<std::int32_t> ids_;
  std::optional<LmBatcher> lm_;
  std::optional<SequenceBatcher> seq_;
};

// Samples `tokens` tokens after `context`; piece(id) is a token's text. With a reset token (names mode:
// the separator), each generated separator starts a fresh context, as in
// training, where every row holds one name from its beginning.
// With the KV cache each new token costs one position of work; when the
// cache holds MAX_T positions it restarts from the last MAX_T / 2 tokens.
// Without it (the reference), every token re-reads the last MAX_T tokens;
// the two agree token for token while the context fits in MAX_T.
template <class Cfg, class Be, class Piece>
std::string generate(Decoder<Cfg, Be>& model, Be& be, const Piece& piece_of, std::vector<std::int32_t> context,
                     int tokens, const SamplingOptions& opts, Rng& rng, bool stream,
                     std::optional<std::int32_t> reset = std::nullopt, bool use_cache = true) {
  Sampler sampler(opts);
  const Bf16WeightCopies bf16_weights(be, model);  // bf16 precision: the weights a token reads are bfloat16
  std::string out;
  const int V = model.vocab();
  DecodingCache<Be> cache;
  std::vector<float> staging;
  std::span<const float> last;  // logits of the newest position, on the host
  auto encode_window = [&](int keep) {
    const std::span<const std::int32_t> window(context.data() + context.size() - keep, keep);
    const auto logits = use_cache ? (model.start_cache(cache, 1), model.forward_cached(be, window, 1, cache))
                                  : model.forward(be, window, Shape{1, keep});
    last = be.host_view(logits.subspan(std::size_t(keep - 1) * V, V), staging);
  };
  encode_window(std::min<int>(static_cast<int>(context.size()), Cfg::MAX_T));
  for (int i = 0; i < tokens; ++i) {
    const auto next = sampler(last, rng);
    const bool restart = reset && next == *reset;
    if (restart) context.clear();
    context.push_back(next);
    const std::string piece = piece_of(next);
    out += piece;
    if (stream) {
      std::cout << piece;
      std::cout.flush();
    }
    if (i + 1 == tokens) break;
    const int size = static_cast<int>(context.size());
    if (!use_cache) encode_window(std::min(size, Cfg::MAX_T));
    else if (restart) encode_window(1);
    else if (cache.length() == Cfg::MAX_T) encode_window(std::min(size, Cfg::MAX_T / 2));
    else last = be.host_view(model.forward_cached(be, std::span<const std::int32_t>(&context.back(), 1), 1, cache), staging);
  }
  return out;
}

template <class Cfg, class Be>
void train(TrainArgs args, const std::optional<Resumed>& resumed) {
  using Model = Decoder<Cfg, Be>;
  RunSettings& run = args.run;
  const float dropout = run.dropout >= 0 ? run.dropout : Cfg::DROPOUT;
  const DecoderOptions model_opts{
      .dropout = dropout, .attention_dropout = run.attention_dropout, .recompute = parse_recompute(args.recompute)};
  const Corpus corpus = load_corpus(args.data, run);

  // Tokenizer: built from the whole corpus, or the checkpoint's.
  std::optional<SafeTensors> ckpt_model;
  CharTokenizer tok = CharTokenizer::byte_level();
  if (resumed) {
    require(resumed->data_hash == hex(corpus.hash), "--data ", args.data,
            " is not the text the checkpoint was trained on (", resumed->data, ")");
    ckpt_model = SafeTensors::load(fs::path(args.resume) / kModelFile);
    tok = CharTokenizer::from_json(ckpt_model->metadata("tokenizer"));
  } else {
    tok = CharTokenizer::from_corpus(corpus.all_text());
  }
  const Batches train_batches(corpus, tok, run.mode, run.batch, Cfg::MAX_T, true);
  const Batches val_batches(corpus, tok, run.mode, run.batch, Cfg::MAX_T, false);

  // Under mpirun, each of the N ranks trains (and evaluates) on its batch / N
  // sequences of every batch (all draw the same batches).
  ProcessGroup& group = join_ranks(args, Be::name,
                                   run.to_json().dump() + " steps " + std::to_string(args.steps) + " zero " +
                                       std::to_string(args.zero),
                                   "--data with hash " + hex(corpus.hash));
  const int ranks = group.size();
  require(run.batch % ranks == 0, "--batch ", run.batch, " is not a multiple of the ", ranks, " ranks");
  const int my_rows = run.batch / ranks, my_first = rank_rows(group, run.batch).first;

  Be be = make_backend<Be>(args.backend, args.precision);
  Model model(tok.size(), run.seed, model_opts);
  AdamW<Be> opt(model, {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = run.weight_decay});
  const int V = tok.size();
  Trainer<Model, Be> trainer(model, be, opt,
                             {.grad_accum = run.grad_accum,
                              .clip = run.clip,
                              .schedule = LrSchedule::parse(run.schedule, run.lr, args.steps),
                              .shards = args.shards,
                              .data_seed = detail::mix64(run.seed ^ 0xda7aULL),
                              .group = &group,
                              .zero = args.zero},
                             [&] { return std::make_unique<Model>(V, run.seed, model_opts); });
  if (resumed) {
    trainer.load(*ckpt_model, SafeTensors::load(fs::path(args.resume) / kOptimizerFile));  // model file read above
    trainer.restore(resumed->state);
    require(trainer.steps() <= args.steps, "the checkpoint is at step ", trainer.steps(), ", past --steps ", args.steps);
  }
  const long start = trainer.steps();

  const int T = Cfg::MAX_T, rows = run.batch * T;
  std::cout << "xfmr-charlm: " << Cfg::NAME << " on " << describe(be) << ", " << Model::parameter_count(V, false) << " parameters, vocabulary "
            << V << ", " << train_batches.size() << " train / " << val_batches.size()
            << (run.mode == "names" ? " val names" : " val tokens") << ", batch " << run.batch
            << " x " << T << (resumed ? ", resuming at step " + std::to_string(start) : std::string())
            << (ranks > 1 ? ", " + std::to_string(ranks) + " ranks of " + std::to_string(my_rows) + " sequences" : "")
            << "\n";

  std::vector<std::int32_t> ids(rows), targets(rows);
  // The model's logits for a shard of this rank's rows of the batch in ids.
  const std::size_t mine = std::size_t(my_first) * T;
  auto forward = [&](const Shard& s, Model& m, Be& b) {
    return m.forward(b, std::span<const std::int32_t>(ids).subspan(mine + std::size_t(s.begin) * T, std::size_t(s.size()) * T),
                     Shape{s.size(), T});
  };
  auto my_targets = [&] { return std::span<const std::int32_t>(targets).subspan(mine, std::size_t(my_rows) * T); };
  // Mean loss over every counted target of the evaluation batches (names
  // mode pads; in text mode every target counts).
  auto evaluate = [&](const Batches& b) {
    LossSum sum;
    for (int i = 0; i < b.eval_count(args.eval_batches); ++i) {
      b.eval_batch(i, ids.data(), targets.data());
      sum += trainer.evaluate({my_rows, my_targets()}, forward);
    }
    return sum.mean();
  };
  auto save = [&] {
    if (args.out.empty()) return;
    SafeTensorsWriter mw, ow;
    trainer.save(mw, ow);  // every rank (join_ranks)
    if (!group.root()) return;
    mw.set_metadata("format", kFormat);
    mw.set_metadata("model", Cfg::NAME);
    mw.set_metadata("tokenizer", tok.to_json());
    const TrainerState st = trainer.state();
    json state = {{"format", kFormat},  {"version", 1},           {"step", st.step},
                  {"steps", args.steps}, {"rng", std::to_string(st.data_rng)}, {"dropout_calls", st.dropout_calls},
                  {"data", args.data},  {"data_hash", hex(corpus.hash)}, {"vocab", V},
                  {"settings", run.to_json()}};
    write_checkpoint(args.out, mw, ow, state.dump(2));
  };

  CsvLog csv(args.log_csv);
  std::vector<std::pair<long, double>> batch_losses;
  std::vector<LossPoint> evals;
  Progress progress(start, args.steps, long(rows) * run.grad_accum);
  double last_train = -1, last_val = -1, last_loss = 0;
  const long stop = args.stop_after > 0 ? std::min(args.stop_after, args.steps) : args.steps;
  while (trainer.steps() < stop) {
    const StepResult r = trainer.step(
        [&](int) {
          train_batches.sample(trainer.data_rng(), ids.data(), targets.data());
          return BatchTargets{my_rows, my_targets()};
        },
        forward);
    const long step = r.step - 1;
    const double lr = r.lr, loss = r.loss;
    last_loss = loss;
    batch_losses.emplace_back(step + 1, loss);
    csv.batch(step + 1, lr, loss);
    progress.update(step, loss);
    warn_if_diverging(r, trainer.first_loss(), progress);
    if ((step + 1) % args.eval_every == 0 || step + 1 == stop) {
      last_train = evaluate(train_batches);
      last_val = evaluate(val_batches);
      progress.clear_line();
      std::cout << "step " << step + 1 << ": train loss " << std::fixed << std::setprecision(4) << last_train
                << ", val loss " << last_val << std::defaultfloat << std::endl;
      evals.push_back({step + 1, last_train, last_val});
      csv.eval(step + 1, lr, last_train, last_val);
      save();
    }
  }
  progress.clear_line();
  const double wall = progress.elapsed(), tps = progress.tokens_per_second();
  if (start == args.steps) std::cout << "already at step " << start << "; nothing to train\n";

  std::string sample;
  if (args.samples > 0 && group.root()) {
    model.set_training(false);
    Rng sample_rng(run.seed);
    const auto nl = tok.find("\n");
    std::cout << "--- sample ---\n";
    std::optional<std::int32_t> reset;
    if (run.mode == "names") reset = nl;
    sample = generate(model, be, [&](std::int32_t id) { return tok.token(id); }, {nl.value_or(0)}, args.samples, {},
                      sample_rng, true, reset);
    std::cout << "\n--------------\n";
  }
  csv.save();
  write_html_report(args.report, std::string("xfmr-charlm: ") + Cfg::NAME,
                    {{"model", Cfg::NAME},
                     {"parameters", std::to_string(Model::parameter_count(V, false))},
                     {"data", args.data},
                     {"steps", std::to_string(args.steps)},
                     {"batch", std::to_string(run.batch) + " x " + std::to_string(T)},
                     {"learning rate", std::to_string(run.lr) + " (" + run.schedule + ")"},
                     {"final train loss", std::to_string(last_train)},
                     {"final val loss", std::to_string(last_val)},
                     {"tokens/s", std::to_string(tps)},
                     {"wall time", format_duration(wall)},
                     {"sample", sample}},
                    batch_losses, evals);
  if (!args.metrics_json.empty()) {
    json m = {{"model", Cfg::NAME},   {"backend", Be::name}, {"precision", precision_of(be)}, {"parameters", Model::parameter_count(V, false)}, {"steps", args.steps},
              {"batch", run.batch},   {"train_loss", last_train}, {"val_loss", last_val},
              {"last_batch_loss", last_loss}, {"first_batch_loss", batch_losses.empty() ? -1.0 : batch_losses.front().second},
              {"tokens_per_s", tps},  {"wall_s", wall}};
    write_text_atomic(args.metrics_json, m.dump(2) + "\n");
  }
}

struct SampleArgs {
  std::string checkpoint, gpt2, tokenizer, prompt, backend = "cpu", precision = "fp32";
  bool no_cache = false;
  int tokens = 500;
  SamplingOptions sampling;
  std::uint64_t seed = 1;
};

// "[500 tokens in 1.2 s, 416 tokens/s, KV cache]" on stderr, after the text.
void report_speed(const SampleArgs& args, double s) {
  std::cerr << "\n[" << args.tokens << " tokens in " << s << " s, " << args.tokens / s << " tokens/s, "
            << (args.no_cache ? "no cache" : "KV cache") << "]";
  std::cout << "\n";
}

template <class Cfg, class Be>
void sample(const SampleArgs& args, const std::string& mode) {
  const auto st = SafeTensors::load(fs::path(args.checkpoint) / kModelFile);
  const auto tok = CharTokenizer::from_json(st.metadata("tokenizer"));
  Be be = make_backend<Be>(args.backend, args.precision);
  Decoder<Cfg, Be> model(tok.size(), 0);
  load_parameters(model, st);
  model.set_training(false);
  std::vector<std::int32_t> context;
  try {
    context = tok.encode(args.prompt);
  } catch (const Error& e) {
    detail::fail("prompt: ", e.what());
  }
  if (context.empty()) context.push_back(tok.find("\n").value_or(0));
  Rng rng(args.seed);
  std::cout << args.prompt;
  std::optional<std::int32_t> reset;
  if (mode == "names") reset = tok.find("\n");
  if (reset && context.front() != *reset) context.insert(context.begin(), *reset);  // a name starts after a separator
  const auto t0 = Clock::now();
  generate(model, be, [&](std::int32_t id) { return tok.token(id); }, context, args.tokens, args.sampling, rng, true,
           reset, !args.no_cache);
  report_speed(args, seconds_since(t0));
}

// The first of `names` in `dir`, or an error naming them all.
fs::path find_file(const fs::path& dir, std::initializer_list<const char*> names, const char* what) {
  std::string tried;
  for (const char* n : names) {
    if (fs::exists(dir / n)) return dir / n;
    tried += (tried.empty() ? "" : " or ") + std::string(n);
  }
  detail::fail("no ", what, " in ", dir.string(), " (looked for ", tried, ")");
}

// sample --gpt2: a Hugging Face GPT-2 checkpoint (model.safetensors and
// config.json) with its tokenizer (vocab.json and merges.txt, or OpenAI's
// encoder.json and vocab.bpe), in the gpt2-small shape.
template <class Be>
void sample_gpt2(const SampleArgs& args) {
  using Cfg = Gpt2Small;
  const Gpt2Checkpoint ckpt = open_gpt2(args.gpt2, "--gpt2");
  const fs::path& model_file = ckpt.file;
  const Gpt2Config& config = ckpt.config;
  require(config.n_embd == Cfg::D_MODEL && config.n_layer == Cfg::N_LAYERS && config.n_head == Cfg::N_HEADS &&
              config.n_positions == Cfg::MAX_T && config.d_ff() == Cfg::D_FF,
          model_file.string(), ": n_embd ", config.n_embd, ", n_layer ", config.n_layer, ", n_head ", config.n_head,
          ", n_positions ", config.n_positions, "; xfmr-charlm runs GPT-2 checkpoints of gpt2-small's shape (768, 12, "
          "12, 1024)");
  const fs::path tok_dir = args.tokenizer.empty() ? model_file.parent_path() : fs::path(args.tokenizer);
  const auto tok = Gpt2Tokenizer::load(find_file(tok_dir, {"vocab.json", "encoder.json"}, "GPT-2 vocabulary"),
                                       find_file(tok_dir, {"merges.txt", "vocab.bpe"}, "GPT-2 merges"));
  require(tok.size() == config.vocab_size, "the tokenizer in ", tok_dir.string(), " has ", tok.size(),
          " tokens but the checkpoint's vocab_size is ", config.vocab_size);
  Be be = make_backend<Be>(args.backend, args.precision);
  Decoder<Cfg, Be> model(config.vocab_size, 0, kGpt2Options);
  load_gpt2(model, ckpt.tensors, config);
  model.set_training(false);
  std::vector<std::int32_t> context = tok.encode(args.prompt);
  if (context.empty()) context.push_back(tok.end_of_text());  // GPT-2 starts a text after <|endoftext|>
  Rng rng(args.seed);
  std::cout << args.prompt;
  const auto t0 = Clock::now();
  generate(model, be, [&](std::int32_t id) { return tok.decode(std::span(&id, 1)); }, context, args.tokens,
           args.sampling, rng, true, std::nullopt, !args.no_cache);
  report_speed(args, seconds_since(t0));
}

int usage(const char* argv0) {
  std::cerr << "usage: " << argv0 << " train|sample [options]   (" << argv0 << " train --help for the options)\n";
  return 2;
}

int run_train(int argc, char** argv) {
  TrainArgs a;
  po::options_description opts("xfmr-charlm train: train a character-level GPT");
  opts.add_options()("help", "show this help")
      ("data", po::value(&a.data), "training text, plain or .gz (required)")
      ("model", po::value(&a.run.model)->default_value(a.run.model), (std::string("preset: ") + lm_preset_names()).c_str())
      ("mode", po::value(&a.run.mode)->default_value(a.run.mode), "text (one stream, 90/10 split) or names (one name per line)")
      ("steps", po::value(&a.steps)->default_value(a.steps), "total optimisation steps (the schedule spans them)")
      ("stop-after", po::value(&a.stop_after), "stop at this step of the plan, with a checkpoint (resume later)")
      ("batch", po::value(&a.run.batch)->default_value(a.run.batch), "sequences per batch")
      ("grad-accum", po::value(&a.run.grad_accum)->default_value(a.run.grad_accum), "micro-batches per step")
      ("lr", po::value(&a.run.lr)->default_value(a.run.lr), "peak learning rate (AdamW)")
      ("schedule", po::value(&a.run.schedule)->default_value(a.run.schedule), "constant, cosine (warmup + cosine) or onecycle")
      ("weight-decay", po::value(&a.run.weight_decay)->default_value(a.run.weight_decay), "AdamW weight decay (matrices only)")
      ("clip", po::value(&a.run.clip)->default_value(a.run.clip), "global gradient-norm clip (0 = off)")
      ("dropout", po::value(&a.run.dropout), "dropout rate (default: the preset's)")
      ("attention-dropout", po::value(&a.run.attention_dropout)->default_value(a.run.attention_dropout),
       "dropout on the attention probabilities")
      ("val-fraction", po::value(&a.run.val_fraction)->default_value(a.run.val_fraction), "share of the data held out")
      ("seed", po::value(&a.run.seed)->default_value(a.run.seed), "seed for initialisation, data order and dropout")
      ("eval-every", po::value(&a.eval_every)->default_value(a.eval_every), "steps between evaluations (and checkpoints)")
      ("eval-batches", po::value(&a.eval_batches)->default_value(a.eval_batches), "batches per loss estimate")
      ("resume", po::value(&a.resume), "continue from this checkpoint (settings come from it)")
      ("samples", po::value(&a.samples)->default_value(a.samples), "characters to sample at the end");
  add_run_options(opts, a, "charlm", "checkpoint directory, written at every evaluation",
                  "final losses, tokens/s and wall time");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  // The settings, given or (on --resume) the checkpoint's, make sense.
  auto check_settings = [&] {
    require(a.steps > 0 && a.run.grad_accum > 0 && a.eval_every > 0 && a.eval_batches > 0,
            "--steps, --grad-accum, --eval-every and --eval-batches must be positive");
    check_batch(a.run.batch);
    check_optimizer_options(a.run.lr, a.run.clip, a.run.weight_decay);
    check_dropout_options(vm, a.run.dropout, a.run.attention_dropout);
    require(a.run.val_fraction > 0 && a.run.val_fraction < 1, "--val-fraction ", a.run.val_fraction, " outside (0, 1)");
  };
  check_settings();

  std::optional<Resumed> resumed;
  if (!a.resume.empty()) {
    const json state = json::parse(read_trainer_state(a.resume));
    require(state.value("format", "") == kFormat, a.resume, ": not an xfmr-charlm checkpoint");
    const RunSettings saved = RunSettings::from_json(state.at("settings"));
    // Settings given explicitly must agree with the checkpoint's.
    auto agree = [&](const char* flag, bool same) {
      require(!vm.count(flag) || vm[flag].defaulted() || same, "--", flag, " differs from the checkpoint in ", a.resume);
    };
    agree("model", a.run.model == saved.model);
    agree("mode", a.run.mode == saved.mode);
    agree("batch", a.run.batch == saved.batch);
    agree("grad-accum", a.run.grad_accum == saved.grad_accum);
    agree("lr", a.run.lr == saved.lr);
    agree("schedule", a.run.schedule == saved.schedule);
    agree("weight-decay", a.run.weight_decay == saved.weight_decay);
    agree("clip", a.run.clip == saved.clip);
    agree("dropout", a.run.dropout == saved.dropout);
    agree("attention-dropout", a.run.attention_dropout == saved.attention_dropout);
    agree("seed", a.run.seed == saved.seed);
    agree("val-fraction", a.run.val_fraction == saved.val_fraction);
    // The schedule spans --steps: a cosine or one-cycle run resumes with
    // the plan it started with (a constant rate may train on past it).
    const long planned = json_integer<long>(state, "steps", 1);
    if (vm["steps"].defaulted()) a.steps = planned;
    require(a.steps == planned || saved.schedule == "constant", "--steps ", a.steps, " differs from the ", planned,
            " that the checkpoint's ", saved.schedule, " schedule spans; resume with --steps ", planned,
            " (only a constant schedule may change it)");
    a.run = saved;
    if (a.out.empty()) a.out = a.resume;
    resumed = Resumed::from_json(state);
    check_settings();
  }
  check_run_options(a, {{"--data", a.data}}, a.resume);
  with_backend(a.backend, [&]<class Be>() { with_lm_preset(a.run.model, [&]<class Cfg>() { train<Cfg, Be>(a, resumed); }); });
  return 0;
}

int run_sample(int argc, char** argv) {
  SampleArgs a;
  po::options_description opts("xfmr-charlm sample: generate text from a checkpoint");
  opts.add_options()("help", "show this help")
      ("checkpoint", po::value(&a.checkpoint), "checkpoint directory written by train --out")
      ("gpt2", po::value(&a.gpt2), "instead: a GPT-2 checkpoint in the Hugging Face layout (directory with "
       "model.safetensors and config.json, or the .safetensors file)")
      ("tokenizer", po::value(&a.tokenizer), "with --gpt2: directory of vocab.json + merges.txt or encoder.json + "
       "vocab.bpe (default: the checkpoint's)")
      ("tokens", po::value(&a.tokens)->default_value(a.tokens), "tokens (characters) to generate")
      ("temperature", po::value(&a.sampling.temperature)->default_value(1.0), "0 = greedy")
      ("top-k", po::value(&a.sampling.top_k)->default_value(0), "sample among the k most likely (0 = all)")
      ("top-p", po::value(&a.sampling.top_p)->default_value(1.0), "nucleus sampling threshold (1 = off)")
      ("prompt", po::value(&a.prompt)->default_value(""), "text to continue")
      ("seed", po::value(&a.seed)->default_value(a.seed), "sampling seed")
      ("no-cache", po::bool_switch(&a.no_cache), "recompute the whole context for every token (the reference path)")
      ("precision", po::value(&a.precision)->default_value(a.precision), kDecodePrecisionHelp)
      ("backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp);
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(a.checkpoint.empty() != a.gpt2.empty(), "give one of --checkpoint DIR and --gpt2 DIR");
  require(a.tokenizer.empty() || !a.gpt2.empty(), "--tokenizer goes with --gpt2");
  require(a.tokens >= 0, "--tokens ", a.tokens, " must be >= 0");
  a.sampling.validate();
  if (!a.gpt2.empty()) {
    with_backend(a.backend, [&]<class Be>() { sample_gpt2<Be>(a); });
    return 0;
  }
  const json state = json::parse(read_trainer_state(a.checkpoint));
  require(state.value("format", "") == kFormat, a.checkpoint, ": not an xfmr-charlm checkpoint");
  const json& settings = state.at("settings");
  with_lm_preset(settings.at("model").get<std::string>(),
                 [&]<class Cfg>() {
                   with_backend(a.backend, [&]<class Be>() { sample<Cfg, Be>(a, settings.at("mode").get<std::string>()); });
                 });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const std::string command = argv[1];
  return run_command("xfmr-charlm", [&] {
    if (command == "train") return run_train(argc - 1, argv + 1);
    if (command == "sample") return run_sample(argc - 1, argv + 1);
    if (command == "--help" || command == "-h") {
      usage(argv[0]);
      return 0;
    }
    std::cerr << "xfmr-charlm: unknown command '" << command << "'\n";
    return usage(argv[0]);
  });
}
