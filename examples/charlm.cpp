// xfmr-charlm: train a character-level GPT on a text file, and sample from it.
//
//   xfmr-charlm train --data FILE [--model shakespeare-small] [--steps N] ...
//   xfmr-charlm sample --checkpoint DIR [--tokens N] [--prompt TEXT] ...
//
// Token-level models (GPT-2, Llama, llama2.c checkpoints) are xfmr-lm's.
//
// Run either command with --help for its options.
#include <boost/program_options.hpp>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/io/architecture.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/text/char_corpus.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/training_run.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace xfmr;
using namespace xfmr::examples;

namespace {

constexpr const char* kFormat = "xfmr-charlm";

// Settings that define a run; on --resume they come from the checkpoint.
struct RunSettings : LmTrainingSettings {
  std::string model = "shakespeare-small", mode = "text";
  float attention_dropout = 0.0f;  // on the attention probabilities

  json to_json() const {
    json j = {{"model", model}, {"mode", mode}, {"attention_dropout", attention_dropout}};
    write(j);
    return j;
  }
  static RunSettings from_json(const json& j) {
    RunSettings s;
    s.read(j);
    s.model = j.at("model");
    s.mode = j.at("mode");
    s.attention_dropout = j.value("attention_dropout", 0.0f);  // absent before attention dropout existed
    return s;
  }
};

// What a run resumes from, read from the checkpoint before any work: its
// metadata (the corpus it trained on and its hash, the tokenizer) and its
// trainer state, checked here so that a malformed one costs no work.
struct Resumed {
  Metadata metadata;
  std::string data;

  static Resumed read(const std::string& dir) {
    Resumed r{read_checkpoint_metadata(dir, kFormat), {}};
    (void)read_trainer_state(dir);
    r.data = metadata_value(r.metadata, "data", dir);
    return r;
  }
};

struct TrainArgs : RunOptions {
  RunSettings run;
  std::string data, resume;
  long steps = 5000, stop_after = 0;  // stop_after > 0: stop (and checkpoint) at that step of the plan
  int eval_every = 500, eval_batches = 100, samples = 300;
};

// The checkpoint's metadata for a run of these settings: what sample and
// --resume read back.
Metadata run_metadata(const TrainArgs& args, const CharTokenizer& tok, std::uint64_t corpus_hash) {
  return {{"format", kFormat},
          {"preset", args.run.model},
          {"architecture", architecture_json(LanguageModelPresets::info(args.run.model))},
          {"tokenizer", tok.to_json()},
          {"settings", args.run.to_json().dump()},
          {"steps", std::to_string(args.steps)},
          {"data", args.data},
          {"data_hash", hex(corpus_hash)}};
}

template <class Be>
void train(TrainArgs args, const std::optional<Resumed>& resumed) {
  using Model = LanguageModel<Be>;
  RunSettings& run = args.run;
  const PresetInfo preset = LanguageModelPresets::info(run.model);
  const DecoderOptions model_opts{.dropout = run.dropout >= 0 ? run.dropout : preset.dropout,
                                  .attention_dropout = run.attention_dropout,
                                  .recompute = parse_recompute(args.recompute)};
  const CharCorpus corpus = load_char_corpus(args.data, run.mode, run.val_fraction, run.seed, preset.max_t);

  // Tokenizer: built from the whole corpus, or the checkpoint's.
  CharTokenizer tok = CharTokenizer::byte_level();
  if (resumed) {
    check_resume(args.resume, {{"data_hash", hex(corpus.hash), "--data " + args.data +
                                " is not the text the checkpoint was trained on (" + resumed->data + ")"}});
    tok = CharTokenizer::from_json(metadata_value(resumed->metadata, "tokenizer", args.resume));
  } else {
    tok = CharTokenizer::from_corpus(corpus.all_text());
  }
  const int T = preset.max_t, V = tok.size();
  check_batch_memory(preset, preset.n_layers, run.batch, T, V, "--batch " + std::to_string(run.batch));
  const CharBatches train_batches(corpus, tok, run.mode, run.batch, T, true, args.data);
  const CharBatches val_batches(corpus, tok, run.mode, run.batch, T, false, args.data);

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
  const auto model_ptr = make_language_model<Be>(run.model, V, run.seed, model_opts);
  Model& model = *model_ptr;
  const int rows = run.batch * T;
  TrainingRun<Model, Be> session(model, be, {.optimizer = adamw_recipe(AdamWRecipe::standard, run.weight_decay),
                                         .trainer = {.grad_accum = run.grad_accum,
                                                     .clip = run.clip,
                                                     .schedule = LrSchedule::parse(run.schedule, run.lr, args.steps),
                                                     .data_seed = seed_for(run.seed, 0xda7a),
                                                     .split = {.shards = args.shards, .group = &group, .zero = args.zero}},
                                         .loop = {.total = args.steps,
                                                  .stop_after = args.stop_after,
                                                  .eval_every = args.eval_every,
                                                  .tokens_per_step = long(rows) * run.grad_accum,
                                                  .log_csv = args.log_csv}});
  auto& trainer = session.trainer();
  if (resumed) session.resume(args.resume);  // its data checked above
  const long start = trainer.steps();
  std::cout << "xfmr-charlm: " << run.model << " on " << describe(be) << ", " << model.parameter_count()
            << " parameters, vocabulary " << V << ", " << train_batches.size() << " train / " << val_batches.size()
            << (run.mode == "names" ? " val names" : " val tokens") << ", batch " << run.batch << " x " << T
            << (resumed ? ", resuming at step " + std::to_string(start) : std::string())
            << (ranks > 1 ? ", " + std::to_string(ranks) + " ranks of " + std::to_string(my_rows) + " sequences" : "")
            << std::endl;  // flushed: a log file shows the run has started

  std::vector<std::int32_t> ids(rows), targets(rows);
  // The model's forward over a shard of this rank's rows of the batch in
  // ids, its head and loss left to the Trainer (head_loss).
  const std::size_t mine = std::size_t(my_first) * T;
  auto forward = [&](const Shard& s, Model& m, Be& b) {
    return m.forward_to_head(
        b, std::span<const std::int32_t>(ids).subspan(mine + std::size_t(s.begin) * T, std::size_t(s.size()) * T),
        Shape{s.size(), T});
  };
  auto my_targets = [&] { return std::span<const std::int32_t>(targets).subspan(mine, std::size_t(my_rows) * T); };
  // Mean loss over every counted target of the evaluation batches (names
  // mode pads; in text mode every target counts).
  auto evaluate = [&](const CharBatches& b) {
    LossSum sum;
    for (int i = 0; i < b.eval_count(args.eval_batches) && !session.interrupted(group); ++i) {
      b.eval_batch(i, ids.data(), targets.data());
      sum += trainer.evaluate({my_rows, my_targets()}, forward);
    }
    return sum.mean();
  };
  const Metadata metadata = run_metadata(args, tok, corpus.hash);
  const TrainingOutcome o = session.run(
      group,
      [&](long) {
        return trainer.step(
            [&](int) {
              train_batches.sample(trainer.data_rng(), ids.data(), targets.data());
              return BatchTargets{my_rows, my_targets()};
            },
            forward);
      },
      [&](const StepResult&) {
        const double train = evaluate(train_batches), val = evaluate(val_batches);
        return Evaluation{train, val, ": train loss " + fixed(train, 4) + ", val loss " + fixed(val, 4)};
      },
      [&] {
        if (!args.out.empty()) session.save(args.out, metadata);  // every rank (join_ranks); rank 0 writes
      });

  std::string sample;
  if (args.samples > 0 && group.root() && !session.stopped()) {
    Rng sample_rng(run.seed);
    const auto nl = tok.find("\n");
    std::cout << "--- sample ---\n";
    GenerateOptions gen{.max_tokens = args.samples};
    if (run.mode == "names") gen.restart = nl;
    generate(model, be, {nl.value_or(0)}, gen, sample_rng, [&](std::int32_t id) {
      sample += tok.token(id);
      std::cout << tok.token(id) << std::flush;
    });
    std::cout << "\n--------------\n";
  }
  write_html_report(args.report, "xfmr-charlm: " + run.model,
                    {{"model", run.model + " (" + preset.shape() + ")"},
                     {"parameters", std::to_string(model.parameter_count())},
                     {"data", args.data},
                     {"steps", std::to_string(args.steps)},
                     {"batch", std::to_string(run.batch) + " x " + std::to_string(T)},
                     {"learning rate", number(run.lr) + " (" + run.schedule + ")"},
                     {"final train loss", fixed(o.last.train, 4)},
                     {"final val loss", fixed(o.last.val, 4)},
                     {"tokens/s", fixed(o.tokens_per_s, 0)},
                     {"wall time", format_duration(o.wall_s)},
                     {"sample", sample}},
                    o.batch_losses, o.evals);
  if (!args.metrics_json.empty()) {
    json m = {{"model", run.model},   {"backend", Be::name}, {"precision", precision_of(be)}, {"parameters", model.parameter_count()}, {"steps", args.steps},
              {"batch", run.batch},   {"train_loss", o.last.train}, {"val_loss", o.last.val},
              {"last_batch_loss", o.batch_losses.empty() ? 0.0 : o.batch_losses.back().second}, {"first_batch_loss", o.batch_losses.empty() ? -1.0 : o.batch_losses.front().second},
              {"tokens_per_s", o.tokens_per_s},  {"wall_s", o.wall_s}};
    write_text_atomic(args.metrics_json, m.dump(2) + "\n");
  }
  session.finish(args.out);
}

struct SampleArgs {
  std::string checkpoint, prompt, backend = "cpu", precision = "fp32";
  bool no_cache = false;
  int tokens = 500;
  SamplingOptions sampling;
  std::uint64_t seed = 1;
};

// A checkpoint of this program's through the library's Engine
// (infer/engine.hpp): its precision the one given, else the checkpoint's;
// its characters are the program's (the CharTokenizer in its metadata).
Engine load_engine(const std::string& checkpoint, const boost::program_options::variables_map& vm,
                   const std::string& backend, const std::string& precision) {
  EngineOptions o = engine_options(vm, backend, precision, "");
  o.format = kFormat;
  o.tokenizer_required = false;
  return Engine::load(checkpoint, o);
}

// Streams `tokens` characters after the prompt to stdout, then "[500
// tokens in 1.2 s, 416 tokens/s, KV cache]" on stderr.
void sample(const SampleArgs& args, const Metadata& metadata, const boost::program_options::variables_map& vm) {
  const auto tok = CharTokenizer::from_json(metadata_value(metadata, "tokenizer", args.checkpoint));
  const std::string mode = json::parse(metadata_value(metadata, "settings", args.checkpoint)).at("mode");
  Engine engine = load_engine(args.checkpoint, vm, args.backend, args.precision);
  require(engine.vocab() == tok.size(), args.checkpoint, ": ", engine.vocab(), " token rows, ", tok.size(), " tokens");
  std::vector<std::int32_t> context;
  try {
    context = tok.encode(args.prompt);
  } catch (const Error& e) {
    fail("prompt: ", e.what());
  }
  if (context.empty()) context.push_back(tok.find("\n").value_or(0));
  std::optional<std::int32_t> restart;
  if (mode == "names") restart = tok.find("\n");
  if (restart && context.front() != *restart) context.insert(context.begin(), *restart);  // a name starts after a separator
  std::cout << args.prompt;
  const auto t0 = Clock::now();
  (void)engine.generate({.prompt = std::move(context),
                         .sampling = args.sampling,
                         .max_tokens = args.tokens,
                         .seed = args.seed,
                         .ignore_eos = true,
                         .use_cache = !args.no_cache,
                         .restart = restart},
                        OnToken([&](std::int32_t id, std::string_view) {
                          if (id >= 0) std::cout << tok.token(id) << std::flush;
                          return true;
                        }));
  const double s = seconds_since(t0);
  std::cerr << "\n[" << args.tokens << " tokens in " << s << " s, " << args.tokens / s << " tokens/s, "
            << (args.no_cache ? "no cache" : "KV cache") << "]";
  std::cout << "\n";
}

constexpr int kMaxSampleTokens = 1 << 24;


// A checkpoint of this program's: its metadata, checked before any work.
Metadata read_charlm_checkpoint(const std::string& dir) {
  Metadata md = read_checkpoint_metadata(dir, kFormat);
  (void)architecture_of(md, dir);
  return md;
}

int run_train(int argc, char** argv) {
  TrainArgs a;
  po::options_description opts("xfmr-charlm train: train a character-level GPT");
  opts.add_options()("help", "show this help")
      ("data", po::value(&a.data), "training text, plain or .gz (required)")
      ("model", po::value(&a.run.model)->default_value(a.run.model), preset_help<LanguageModelPresets>().c_str())
      ("mode", po::value(&a.run.mode)->default_value(a.run.mode), "text (one stream, 90/10 split) or names (one name per line)")
      ("steps", po::value(&a.steps)->default_value(a.steps), "total optimisation steps (the schedule spans them)")
      ("stop-after", po::value(&a.stop_after), "stop at this step of the plan, with a checkpoint (resume later)")
      ("attention-dropout", po::value(&a.run.attention_dropout)->default_value(a.run.attention_dropout),
       "dropout on the attention probabilities")
      ("eval-every", po::value(&a.eval_every)->default_value(a.eval_every), "steps between evaluations (and checkpoints)")
      ("eval-batches", po::value(&a.eval_batches)->default_value(a.eval_batches), "batches per loss estimate")
      ("resume", po::value(&a.resume), "continue from this checkpoint (settings come from it)")
      ("samples", po::value(&a.samples)->default_value(a.samples), "characters to sample at the end");
  add_lm_training_options(opts, a.run, "peak learning rate (AdamW, betas 0.9, 0.999)",
                          "dropout rate (default: the preset's)");
  add_run_options(opts, a, "charlm", "checkpoint directory, written at every evaluation",
                  "final losses, tokens/s and wall time");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  // The settings, given or (on --resume) the checkpoint's, make sense.
  auto check_settings = [&] {
    require(a.steps > 0 && a.run.grad_accum > 0 && a.eval_every > 0 && a.eval_batches > 0,
            "--steps, --grad-accum, --eval-every and --eval-batches must be positive");
    check_batch(a.run.batch);
    check_stop_after(vm, a.stop_after);
    require(a.samples <= kMaxSampleTokens, "--samples ", a.samples, " outside 0..", kMaxSampleTokens);
    check_optimizer_options(a.run.lr, a.run.clip, a.run.weight_decay);
    check_dropout_options(vm, a.run.dropout, a.run.attention_dropout);
    require(a.run.val_fraction > 0 && a.run.val_fraction < 1, "--val-fraction ", a.run.val_fraction, " outside (0, 1)");
    (void)LanguageModelPresets::info(a.run.model);  // a known preset
    (void)parse_recompute(a.recompute);
  };
  check_settings();

  std::optional<Resumed> resumed;
  if (!a.resume.empty()) {
    resumed = Resumed::read(a.resume);
    const RunSettings saved =
        RunSettings::from_json(json::parse(metadata_value(resumed->metadata, "settings", a.resume)));
    // Settings given explicitly must agree with the checkpoint's.
    auto agree = [&](const char* flag, bool same) {
      require(!vm.count(flag) || vm[flag].defaulted() || same, "--", flag, " differs from the checkpoint in ", a.resume);
    };
    agree("model", a.run.model == saved.model);
    agree("mode", a.run.mode == saved.mode);
    agree("attention-dropout", a.run.attention_dropout == saved.attention_dropout);
    a.run.agree_with(saved, agree);
    a.steps = saved.resumed_steps(a.steps, !vm["steps"].defaulted(), resumed->metadata, a.resume);
    a.run = saved;
    if (a.out.empty()) a.out = a.resume;
    check_settings();
  }
  const auto lock = start_run(a, {{"--data", a.data}}, a.resume);
  dispatch_backend(a.backend, [&]<class Be>() { train<Be>(a, resumed); });
  return 0;
}

int run_sample(int argc, char** argv) {
  SampleArgs a;
  po::options_description opts("xfmr-charlm sample: generate text from a checkpoint");
  opts.add_options()("help", "show this help")
      ("checkpoint", po::value(&a.checkpoint), "checkpoint directory written by train --out (required; GPT-2 and "
       "Llama checkpoints: xfmr-lm sample)")
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
  require(!a.checkpoint.empty(), "--checkpoint DIR is required (GPT-2 and Llama checkpoints: xfmr-lm sample --model)");
  // Generation returns its tokens (4 bytes each) besides printing them.
  require(a.tokens <= kMaxSampleTokens, "--tokens ", a.tokens, " outside 0..", kMaxSampleTokens);
  check_precision_name(a.precision, "--precision");
  a.sampling.validate();
  const Metadata metadata = read_charlm_checkpoint(a.checkpoint);
  EngineOptions o = engine_options(vm, a.backend, a.precision, "");
  o.format = kFormat;
  (void)Engine::check(a.checkpoint, o);
  if (kFuzzingCommandLine) return 0;
  sample(a, metadata, vm);
  return 0;
}

struct EvalArgs {
  std::string checkpoint, data, metrics_json, backend = "cpu", precision = "fp32";
  int batches = 200;
};

// The validation loss of a checkpoint on the validation part of the text it
// trained on: the windows (text mode) or names the training run evaluates
// on, `batches` of them of the run's batch size.
void eval(const EvalArgs& args, const Metadata& metadata, const boost::program_options::variables_map& vm) {
  const RunSettings run = RunSettings::from_json(json::parse(metadata_value(metadata, "settings", args.checkpoint)));
  const PresetInfo preset = LanguageModelPresets::info(run.model);
  const CharCorpus corpus = load_char_corpus(args.data, run.mode, run.val_fraction, run.seed, preset.max_t);
  require(metadata_value(metadata, "data_hash", args.checkpoint) == hex(corpus.hash), "--data ", args.data,
          " is not the text the checkpoint was trained on (", metadata_value(metadata, "data", args.checkpoint), ")");
  const auto tok = CharTokenizer::from_json(metadata_value(metadata, "tokenizer", args.checkpoint));
  const int T = preset.max_t, V = tok.size();
  const CharBatches val(corpus, tok, run.mode, run.batch, T, false, args.data);
  Engine engine = load_engine(args.checkpoint, vm, args.backend, args.precision);
  require(engine.vocab() == V, args.checkpoint, ": ", engine.vocab(), " token rows, ", V, " tokens");
  // The loss of the padded batches the run evaluates on (names mode pads), with the engine's model and backend.
  const auto [sum, n, s] = engine.visit([&]<class Be>(LanguageModel<Be>& model, Be& be) {
    model.set_training(false);
    CrossEntropyLoss<Be> ce;
    std::vector<std::int32_t> ids(std::size_t(run.batch) * T), targets(ids.size());
    LossSum total;
    const auto t0 = Clock::now();
    const int batches = val.eval_count(args.batches);
    for (int i = 0; i < batches; ++i) {
      val.eval_batch(i, ids.data(), targets.data());
      const long counted = counted_targets(targets);
      if (counted == 0) continue;
      const auto logits = model.forward(be, ids, Shape{run.batch, T});
      total += LossSum{ce.forward(be, logits, targets, V) * double(counted), counted};
    }
    return std::tuple(total, batches, seconds_since(t0));
  });
  (void)sum.checked_mean(args.checkpoint + " on --data " + args.data);
  std::cout << "val loss " << std::fixed << std::setprecision(4) << sum.mean() << " (" << sum.counted
            << " characters in " << n << " batches of " << run.batch << " x " << T << ", " << engine.precision()
            << ", " << std::setprecision(1) << s << " s)\n";
  if (!args.metrics_json.empty())
    write_text_atomic(args.metrics_json, json{{"val_loss", sum.mean()},
                                              {"characters", sum.counted},
                                              {"batches", n},
                                              {"precision", engine.precision()},
                                              {"wall_s", s}}
                                             .dump(2) + "\n");
}

int run_eval(int argc, char** argv) {
  EvalArgs a;
  po::options_description opts("xfmr-charlm eval: validation loss of a checkpoint");
  opts.add_options()("help", "show this help")("checkpoint", po::value(&a.checkpoint), "checkpoint directory (required)")
      ("data", po::value(&a.data), "the text it trained on (default: the path the checkpoint names)")
      ("batches", po::value(&a.batches)->default_value(a.batches), "validation batches (train's --eval-batches)")
      ("metrics-json", po::value(&a.metrics_json), "write the loss here")
      ("precision", po::value(&a.precision)->default_value(a.precision), kDecodePrecisionHelp)
      ("backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp);
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.checkpoint.empty(), "--checkpoint DIR is required");
  require(a.batches > 0, "--batches ", a.batches, " must be positive");
  check_precision_name(a.precision, "--precision");
  const Metadata metadata = read_charlm_checkpoint(a.checkpoint);
  if (a.data.empty()) a.data = metadata_value(metadata, "data", a.checkpoint);
  check_output_paths({{"--metrics-json", a.metrics_json}}, {{"--checkpoint", a.checkpoint}, {"--data", a.data}},
                     a.checkpoint);
  EngineOptions o = engine_options(vm, a.backend, a.precision, "");
  o.format = kFormat;
  (void)Engine::check(a.checkpoint, o);
  if (kFuzzingCommandLine) return 0;
  eval(a, metadata, vm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_commands("xfmr-charlm", argc, argv,
                      {{"train", run_train},
                       {"sample", run_sample},
                       {"eval", run_eval},
                       {"quantise", [](int n, char** a) { return run_quantise("xfmr-charlm", kFormat, n, a); }}});
}
