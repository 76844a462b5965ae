// xfmr-lm: token-level language models: published checkpoints (GPT-2 and
// Llama in the Hugging Face layout, llama2.c's .bin files) and models of
// one's own, decoded, evaluated, trained or fine-tuned, and exported.
//
//   xfmr-lm sample --model PATH [--prompt TEXT] [--tokens N] ...
//   xfmr-lm eval   --model PATH --data FILE [--context T] [--windows N]
//   xfmr-lm train  --data FILE (--init PATH | (--preset NAME | --architecture FILE.json) --tokenizer PATH)
//                  --out DIR [--steps N] ...
//   xfmr-lm export --model PATH [--lora DIR[:SCALE]] (--hf DIR | --gguf FILE [--type f16])
//
// --model (and --init) is a Hugging Face model directory, a llama2.c .bin
// file, a GGUF file (llama, qwen2, gpt2), or a checkpoint `train --out` wrote; the preset
// comes from its config (io/pretrained.hpp). The tokenizer is --tokenizer,
// else the one beside the model (tokenizer.json, vocab.json + merges.txt,
// tokenizer.bin), a GGUF file's own, or the one a checkpoint carries. Run
// each command with --help for the rest.
#include <boost/program_options.hpp>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "xfmr/infer/engine.hpp"
#include "xfmr/infer/window_loss.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/io/peft.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/models/lora.hpp"
#include "xfmr/text/datasets.hpp"
#include "xfmr/io/model_tokenizer.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/training_run.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace xfmr;
using namespace xfmr::examples;

namespace {

constexpr const char* kFormat = "xfmr-lm";
constexpr int kMaxTokens = 1 << 24;

// A model from --model or --init, with its tokenizer (io/pretrained.hpp).
template <class Be>
struct Loaded {
  std::unique_ptr<LanguageModel<Be>> model;
  std::optional<FoundTokenizer> tok;
};

// Says on stderr how many bytes of `what` the tokenizer dropped (a
// byte-level BPE without a token for each byte).
void warn_dropped(const ModelTokenizer& tok, std::size_t dropped, std::size_t bytes, const std::string& what) {
  if (dropped > 0)
    std::cerr << "xfmr-lm: warning: " << dropped << " of the " << bytes << " bytes of " << what
              << " were dropped: the tokenizer " << tok.files().front().string() << " has no token for "
              << tok.missing_bytes() << " of the 256 byte values (Hugging Face drops them too)\n";
}

// `path`: a checkpoint of this program's or a published one, and
// `tokenizer` (--tokenizer) or the one the model comes with.
template <class Be>
Loaded<Be> load_lm(const std::string& path, const std::string& tokenizer, DecoderOptions opts) {
  if (is_checkpoint(path)) (void)read_checkpoint_metadata(path, kFormat);
  Pretrained<Be> p = load_model<Be>(path, opts);
  try {
    FoundTokenizer tok = load_model_tokenizer(p, tokenizer);
    return {std::move(p.model), std::move(tok)};
  } catch (const Error& e) {
    fail(e.what(), tokenizer.empty() ? " (name one with --tokenizer)" : "");
  }
}

// The tokens of the text file `path`, each checked against the vocabulary.
std::vector<std::int32_t> corpus_tokens(const std::string& path, const ModelTokenizer& tok) {
  require(!path.empty(), "--data FILE is required");
  const std::string text = read_text_file(path);
  std::size_t dropped = 0;
  std::vector<std::int32_t> ids = tok.encode_corpus(text, &dropped);
  warn_dropped(tok, dropped, text.size(), "--data " + path);
  require(ids.size() >= 2, "--data ", path, ": ", ids.size(), " tokens, too few to predict one");
  return ids;
}

// sample --------------------------------------------------------------------

struct SampleArgs {
  std::string model, tokenizer, prompt, backend = "cpu", precision = "fp32", lora;
  int tokens = 256;
  SamplingOptions sampling;
  std::uint64_t seed = 1;
  bool no_cache = false;
};

void sample(const SampleArgs& a, const EngineOptions& o) {
  Engine engine = Engine::load(a.model, o);
  if (!a.lora.empty()) {
    const auto [dir, scale] = adapter_location(a.lora, "--lora");
    const LoraOptions l = engine.load_adapter(dir, scale);
    std::cerr << "xfmr-lm: LoRA " << dir << " (rank " << l.rank << ", alpha " << l.alpha << ", scale x" << scale << ")\n";
  }
  std::size_t dropped = 0;
  std::vector<std::int32_t> context = engine.tokenizer().encode(a.prompt, &dropped);
  warn_dropped(engine.tokenizer(), dropped, a.prompt.size(), "--prompt");
  if (context.empty()) context = engine.prompt("");
  require(int(context.size()) < engine.max_t(), "--prompt is ", context.size(), " tokens; the model's context is ",
          engine.max_t());
  std::cout << a.prompt;
  const auto t0 = Clock::now();
  // Past the end-of-text token too: --tokens of them.
  const Completion c = engine.generate(
      {.prompt = std::move(context), .sampling = a.sampling, .max_tokens = a.tokens, .seed = a.seed,
       .ignore_eos = true, .use_cache = !a.no_cache},
      [](std::string_view text) {
        std::cout << text << std::flush;
        return true;
      });
  const double s = seconds_since(t0);
  std::cerr << "\n[" << c.ids.size() << " tokens in " << s << " s, " << double(c.ids.size()) / s << " tokens/s, "
            << engine.architecture().name << ", " << engine.describe() << (a.no_cache ? ", no cache" : ", KV cache")
            << "]";
  std::cout << "\n";
}

int run_sample(int argc, char** argv) {
  SampleArgs a;
  po::options_description opts("xfmr-lm sample: generate text from a model");
  opts.add_options()("help", "show this help")
      ("model", po::value(&a.model), "a Hugging Face directory (GPT-2 or Llama), a llama2.c .bin, a GGUF file (llama, qwen2, gpt2), or a train --out "
       "checkpoint (required)")
      ("tokenizer", po::value(&a.tokenizer), "tokenizer.json, tokenizer.bin or a directory of GPT-2's files "
       "(default: the model's)")
      ("prompt", po::value(&a.prompt)->default_value(""), "text to continue")
      ("tokens", po::value(&a.tokens)->default_value(a.tokens), "tokens to generate (up to the model's context)")
      ("temperature", po::value(&a.sampling.temperature)->default_value(1.0), "0 = greedy")
      ("top-k", po::value(&a.sampling.top_k)->default_value(0), "sample among the k most likely (0 = all)")
      ("top-p", po::value(&a.sampling.top_p)->default_value(1.0), "nucleus sampling threshold (1 = off)")
      ("seed", po::value(&a.seed)->default_value(a.seed), "sampling seed")
      ("no-cache", po::bool_switch(&a.no_cache), "recompute the whole context for every token (the reference path)")
      ("lora", po::value(&a.lora), "DIR[:SCALE]: a LoRA adapter in peft's format (adapter_config.json, "
       "adapter_model.safetensors) on the model, at SCALE times its own (default 1)")
      ("precision", po::value(&a.precision)->default_value(a.precision), kDecodePrecisionHelp)
      ("backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp);
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.model.empty(), "--model PATH is required");
  require(a.tokens >= 0 && a.tokens <= kMaxTokens, "--tokens ", a.tokens, " outside 0..", kMaxTokens);
  a.sampling.validate();
  const EngineOptions o = engine_options(vm, a.backend, a.precision, a.tokenizer);
  (void)Engine::check(a.model, o);
  if (kFuzzingCommandLine) return 0;
  sample(a, o);
  return 0;
}

// eval ----------------------------------------------------------------------

struct EvalArgs {
  std::string model, tokenizer, data, metrics_json, backend = "cpu", precision = "fp32";
  int context = 0, batch = 8;
  long windows = 0;
};

void eval(const EvalArgs& a, const EngineOptions& o) {
  Engine engine = Engine::load(a.model, o);
  const std::vector<std::int32_t> tokens = corpus_tokens(a.data, engine.tokenizer());
  const int T = a.context > 0 ? a.context : std::min(engine.max_t(), 256);
  require(T <= engine.max_t(), "--context ", T, " exceeds the model's ", engine.max_t());
  const auto t0 = Clock::now();
  const LossSum sum = engine.loss(tokens, T, a.batch, a.windows);
  const double s = seconds_since(t0), loss = sum.checked_mean(a.model + " on --data " + a.data);
  const std::string& name = engine.architecture().name;
  std::cout << "loss " << std::fixed << std::setprecision(6) << loss << ", perplexity " << std::setprecision(3)
            << std::exp(loss) << " (" << sum.counted << " tokens in windows of " << T << ", " << name << ", "
            << engine.describe() << ", " << std::setprecision(1) << s << " s)\n";
  if (!a.metrics_json.empty())
    write_text_atomic(a.metrics_json, json{{"loss", loss},
                                           {"perplexity", std::exp(loss)},
                                           {"tokens", sum.counted},
                                           {"context", T},
                                           {"preset", name},
                                           {"wall_s", s}}
                                              .dump(2) + "\n");
}

int run_eval(int argc, char** argv) {
  EvalArgs a;
  po::options_description opts("xfmr-lm eval: loss and perplexity of a model on a text file");
  opts.add_options()("help", "show this help")("model", po::value(&a.model), "the model, as sample's (required)")
      ("tokenizer", po::value(&a.tokenizer), "as sample's")
      ("data", po::value(&a.data), "text file, plain or .gz (required)")
      ("context", po::value(&a.context)->default_value(a.context), "window length (0: the model's, at most 256)")
      ("windows", po::value(&a.windows)->default_value(a.windows), "consecutive windows from the start (0: all)")
      ("batch", po::value(&a.batch)->default_value(a.batch), "windows a forward")
      ("metrics-json", po::value(&a.metrics_json), "write the loss here")
      ("precision", po::value(&a.precision)->default_value(a.precision), kDecodePrecisionHelp)
      ("backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp);
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.model.empty(), "--model PATH is required");
  require(a.context >= 0 && a.windows >= 0, "--context and --windows must not be negative");
  check_batch(a.batch);
  const EngineOptions o = engine_options(vm, a.backend, a.precision, a.tokenizer);
  (void)Engine::check(a.model, o);
  check_output_paths({{"--metrics-json", a.metrics_json}}, {{"--model", a.model}, {"--data", a.data}});
  if (kFuzzingCommandLine) return 0;
  eval(a, o);
  return 0;
}

// train ---------------------------------------------------------------------

// Settings that define a run; on --resume they come from the checkpoint.
struct RunSettings : LmTrainingSettings {
  std::string preset, init, tokenizer;
  std::string architecture;  // --architecture's, as architecture_json writes it
  std::string lora;          // --lora's, as LoraOptions::str writes it: adapters on --init's frozen model
  int context = 0;

  RunSettings() {  // fine-tuning's defaults
    batch = 8;
    lr = 3e-4;
    clip = 1.0;
  }
  json to_json() const {
    json j = {{"preset", preset}, {"init", init}, {"tokenizer", tokenizer}, {"context", context}};
    if (!architecture.empty()) j["architecture"] = architecture;
    if (!lora.empty()) j["lora"] = lora;
    write(j);
    return j;
  }
  static RunSettings from_json(const json& j) {
    RunSettings s;
    s.read(j);
    s.preset = j.at("preset");
    s.init = j.at("init");
    s.tokenizer = j.at("tokenizer");
    s.context = json_integer<int>(j, "context");
    if (j.contains("architecture")) s.architecture = j.at("architecture").get<std::string>();
    if (j.contains("lora")) s.lora = j.at("lora").get<std::string>();
    return s;
  }
};

struct TrainArgs : RunOptions {
  RunSettings run;
  std::string data, resume;
  std::string resume_tokenizer;  // --tokenizer given to a resumed run: its content must be the checkpoint's
  long steps = 1000, stop_after = 0;
  int eval_every = 200, eval_windows = 32;
};

template <class Be>
void train(TrainArgs a, const std::optional<Metadata>& resumed) {
  RunSettings& run = a.run;
  const DecoderOptions base{.dropout = std::max(run.dropout, 0.0f), .recompute = parse_recompute(a.recompute)};
  // The model: the preset's, freshly initialised, or --init's weights
  // (fine-tuning); its vocabulary, tying and bias are the source's. A
  // resumed fine-tune is built from its own checkpoint, which carries the
  // architecture and the tokenizer: the base model may have moved since.
  Loaded<Be> l;
  if (resumed && !run.init.empty() && run.lora.empty()) {
    l = load_lm<Be>(a.resume, a.resume_tokenizer, base);
  } else if (!run.init.empty()) {
    l = load_lm<Be>(run.init, run.tokenizer, base);
  } else {
    l.tok = resumed ? load_model_tokenizer(CheckpointFormat::xfmr, fs::path(a.resume) / kModelFile, *resumed, 0,
                                           a.resume_tokenizer)
                    : FoundTokenizer{ModelTokenizer::load(run.tokenizer), fs::absolute(run.tokenizer)};
    // A GPT-2 or Llama shape gets its family's head, so that it exports.
    const PresetInfo p = run.architecture.empty() ? LanguageModelPresets::info(run.preset)
                                                  : architecture_from_json(run.architecture, "the run's architecture");
    DecoderOptions opts = published_head(p, base);
    if (run.dropout < 0) opts.dropout = p.dropout;
    l.model = make_language_model<Be>(p, l.tok->tokenizer.size(), run.seed, opts);
  }
  const std::string tokenizer_hash = hex(l.tok->tokenizer.content_hash());
  const std::vector<AttachedFile> tokenizer_files = l.tok->tokenizer.attached_files();  // each checkpoint carries them
  if (resumed && resumed->count("tokenizer_hash"))
    require(resumed->at("tokenizer_hash") == tokenizer_hash, "the tokenizer ", l.tok->source.string(),
            " is not the one the checkpoint ", a.resume, " trained with (its files' contents differ)");
  LanguageModel<Be>& model = *l.model;
  // LoRA: adapters on the frozen base; what trains (and what a checkpoint
  // holds) is them alone, as one shard.
  constexpr bool kCpu = std::is_same_v<Be, CpuBackend<float>>;  // LoRA's one backend until it has run on a GPU
  std::optional<LoraOptions> lora;
  std::unique_ptr<LanguageModel<Be>> lora_model;
  if (!run.lora.empty()) {
    if constexpr (kCpu) {
      lora = LoraOptions::parse(run.lora);
      add_lora(model, *lora, seed_for(run.seed, 0x10a));
      lora_model = std::make_unique<LoraModel<Be>>(model);
    } else {
      detail::fail("--lora runs on the CPU backend (it has not run on a GPU yet), not --backend ", a.backend);
    }
  }
  LanguageModel<Be>& trained = lora_model ? *lora_model : model;
  const std::string preset(model.preset().name);
  const PresetInfo arch = model.preset();
  const int V = model.vocab(), T = run.context > 0 ? run.context : std::min(model.max_t(), 256);
  require(T <= model.max_t(), "--context ", T, " exceeds the model's ", model.max_t());
  const DecoderOptions opts = model.options();
  check_batch_memory(model.preset(), model.preset().n_layers, run.batch, T, V, "--batch " + std::to_string(run.batch));

  const std::string text = read_text_file(a.data);
  // The data as this tokenizer reads it (a checkpoint written before
  // tokenizer_hash hashed the tokenizer's path).
  const std::string data_hash =
      hex(fnv1a(text) ^ (resumed && !resumed->count("tokenizer_hash") ? fnv1a(metadata_value(*resumed, "tokenizer", a.resume))
                                                                      : l.tok->tokenizer.content_hash()));
  if (resumed)
    check_resume(a.resume, {{"data_hash", data_hash, "--data " + a.data +
                             " (with its tokenizer) is not what the checkpoint trained on (" +
                             metadata_value(*resumed, "data", a.resume) + ")"}});
  const std::vector<std::int32_t> tokens = corpus_tokens(a.data, l.tok->tokenizer);
  const std::size_t n_train = std::size_t(double(tokens.size()) * (1.0 - run.val_fraction));
  const std::span<const std::int32_t> train_ids(tokens.data(), n_train), val_ids(tokens.data() + n_train, tokens.size() - n_train);
  require(train_ids.size() > std::size_t(T) && val_ids.size() > std::size_t(T), "--data ", a.data, ": ", tokens.size(),
          " tokens, too few for windows of ", T, " + 1 in both the training and the validation part");
  const LmBatcher batches(train_ids, run.batch, T);

  // Under mpirun, each of the N ranks trains on its batch / N sequences of
  // every batch (all draw the same batches) and evaluates the same windows.
  ProcessGroup& group = join_ranks(a, Be::name,
                                   run.to_json().dump() + " steps " + std::to_string(a.steps) + " zero " +
                                       std::to_string(a.zero),
                                   "--data with hash " + data_hash);
  const int ranks = group.size();
  require(run.batch % ranks == 0, "--batch ", run.batch, " is not a multiple of the ", ranks, " ranks");
  const int my_rows = run.batch / ranks, my_first = rank_rows(group, run.batch).first;
  // A LoRA run's --precision is its frozen base's (bf16, int8, q4: held as such copies, the forward through
  // them; the input gradient as make_frozen_base_backend says; the rest float32).
  Be be = lora ? make_frozen_base_backend<Be>(a.backend, a.precision) : make_backend<Be>(a.backend, a.precision);
  TrainingRun<LanguageModel<Be>, Be> session(
      trained, be, {.optimizer = adamw_recipe(AdamWRecipe::language_model, run.weight_decay),
              .trainer = {.grad_accum = run.grad_accum,
                          .clip = run.clip,
                          .schedule = LrSchedule::parse(run.schedule, run.lr, a.steps),
                          .data_seed = seed_for(run.seed, 0xda7a),
                          .split = {.shards = lora ? 1 : a.shards, .group = &group, .zero = a.zero}},
              .loop = {.total = a.steps,
                       .stop_after = a.stop_after,
                       .eval_every = a.eval_every,
                       .tokens_per_step = long(run.batch) * T * run.grad_accum,
                       .log_csv = a.log_csv}});
  auto& trainer = session.trainer();
  if (lora) session.hold_frozen_base(model);
  if (resumed) session.resume(a.resume);  // its data checked above
  const long start = trainer.steps();
  Metadata metadata = {{"format", kFormat},
                             {"preset", preset},
                             {"architecture", architecture_json(arch)},
                             {"vocab", std::to_string(V)},
                             {"tie_weights", opts.tie_weights ? "1" : "0"},
                             {"head_bias", opts.head_bias ? "1" : "0"},
                             {"tokenizer", resumed ? metadata_value(*resumed, "tokenizer", a.resume) : l.tok->source.string()},
                             {"tokenizer_hash", tokenizer_hash},
                             {"settings", run.to_json().dump()},
                             {"steps", std::to_string(a.steps)},
                             {"data", a.data},
                             {"data_hash", data_hash}};
  if (lora) {  // what Engine::load refuses to decode alone, naming the base
    metadata["lora"] = run.lora;
    metadata["lora_base"] = run.init;
  }
  std::cout << "xfmr-lm: " << preset << (run.init.empty() ? "" : " from " + run.init) << " on " << describe(be)
            << ", " << model.parameter_count() << " parameters"
            << (lora ? " (LoRA " + lora->str() + ": " + std::to_string(trained.parameter_count()) + " trained)" : "")
            << ", vocabulary " << V << ", " << train_ids.size()
            << " train / " << val_ids.size() << " val tokens, batch " << run.batch << " x " << T
            << (resumed ? ", resuming at step " + std::to_string(start) : std::string())
            << (ranks > 1 ? ", " + std::to_string(ranks) + " ranks of " + std::to_string(my_rows) + " sequences" : "")
            << std::endl;
  auto val_loss = [&] {
    const double loss =
        window_loss(model, be, val_ids, T, run.batch, a.eval_windows, [&] { return session.interrupted(group); })
            .mean();
    model.set_training(true);
    return loss;
  };
  double start_val = start == 0 ? val_loss() : -1;
  if (session.stopped()) start_val = -1;  // a signal cut the evaluation short: the run stops after one step
  else if (start == 0) std::cout << "step 0: val loss " << std::fixed << std::setprecision(4) << start_val << std::defaultfloat << std::endl;

  std::vector<std::int32_t> ids(std::size_t(run.batch) * T), targets(ids.size());
  // This rank's rows of the batch in ids.
  const std::size_t mine = std::size_t(my_first) * T;
  auto forward = [&](const Shard& s, LanguageModel<Be>& m, Be& b) {
    return m.forward_to_head(
        b, std::span<const std::int32_t>(ids).subspan(mine + std::size_t(s.begin) * T, std::size_t(s.size()) * T),
        Shape{s.size(), T});
  };
  const TrainingOutcome o = session.run(
      group,
      [&](long) {
        return trainer.step(
            [&](int) {
              batches.sample(trainer.data_rng(), ids.data(), targets.data());
              return BatchTargets{my_rows, std::span<const std::int32_t>(targets).subspan(mine, std::size_t(my_rows) * T)};
            },
            forward);
      },
      [&](const StepResult& r) {
        const double val = val_loss();
        return Evaluation{r.loss, val, ": train batch loss " + fixed(r.loss, 4) + ", val loss " + fixed(val, 4)};
      },
      [&] {
        if (a.out.empty()) return;
        // A LoRA run's checkpoint is also a peft adapter directory (sample --lora).
        std::vector<AttachedFile> files = tokenizer_files;
        if constexpr (kCpu)
          if (lora)
            for (AttachedFile& f : peft_adapter_files(model, *lora)) files.push_back(std::move(f));
        session.save(a.out, metadata, files);
      });
  const double last_val = o.evals.empty() ? start_val : o.last.val;
  write_html_report(a.report, "xfmr-lm: " + preset,
                    {{"model", preset + " (" + model.preset().shape() + ")"},
                     {"from", run.init.empty() ? "scratch" : run.init},
                     {"parameters", std::to_string(model.parameter_count())},
                     {"data", a.data},
                     {"steps", std::to_string(a.steps)},
                     {"batch", std::to_string(run.batch) + " x " + std::to_string(T)},
                     {"final val loss", fixed(last_val, 4)},
                     {"tokens/s", fixed(o.tokens_per_s, 0)}},
                    o.batch_losses, o.evals);
  if (!a.metrics_json.empty())
    write_text_atomic(a.metrics_json, json{{"preset", preset},
                                           {"parameters", model.parameter_count()},
                                           {"steps", a.steps},
                                           {"start_val_loss", start_val},
                                           {"val_loss", last_val},
                                           {"tokens_per_s", o.tokens_per_s},
                                           {"wall_s", o.wall_s}}
                                              .dump(2) + "\n");
  session.finish(a.out);
}

int run_train(int argc, char** argv) {
  TrainArgs a;
  std::string architecture_file;
  po::options_description opts("xfmr-lm train: train a model from scratch (--preset) or fine-tune one (--init)");
  opts.add_options()("help", "show this help")
      ("data", po::value(&a.data), "training text, plain or .gz (required); its last --val-fraction validates")
      ("init", po::value(&a.run.init), "start from this model's weights (as sample's --model): fine-tuning")
      ("preset", po::value(&a.run.preset), ("or start from scratch: " + preset_help<LanguageModelPresets>()).c_str())
      ("architecture", po::value(&architecture_file), "or from scratch, any architecture: a JSON file as xfmr.Model's "
       "config gives ({\"name\", \"parts\": {pre_norm, rms_norm, activation, positions}, \"dims\": {...}})")
      ("tokenizer", po::value(&a.run.tokenizer), "tokenizer (required with --preset; default with --init: the model's)")
      ("steps", po::value(&a.steps)->default_value(a.steps), "total optimisation steps (the schedule spans them)")
      ("stop-after", po::value(&a.stop_after), "stop at this step of the plan, with a checkpoint (resume later)")
      ("context", po::value(&a.run.context)->default_value(a.run.context), "sequence length (0: the model's, at most 256)")
      ("eval-every", po::value(&a.eval_every)->default_value(a.eval_every), "steps between evaluations (and checkpoints)")
      ("eval-windows", po::value(&a.eval_windows)->default_value(a.eval_windows), "validation windows per loss")
      ("resume", po::value(&a.resume), "continue from this checkpoint (its settings; --data must be the same)")
      ("lora", po::value(&a.run.lora), "with --init: train low-rank adapters on its frozen weights, "
       "r=16,alpha=32,targets=q,k,v,o,gate,up,down[,dropout=0.05][,rslora] (GPT-2: targets=qkv,o,fc1,down); "
       "--precision is then the frozen base's (fp32, bf16, int8 or q4); the checkpoint is the adapters (a peft adapter "
       "directory: sample --lora) and the run's state");
  add_lm_training_options(opts, a.run, "peak learning rate (AdamW, betas 0.9, 0.95)",
                          "dropout rate (default: the preset's; 0 for a published model)");
  add_run_options(opts, a, "lm", "checkpoint directory, written at every evaluation", "the losses, tokens/s and wall time");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  if (!architecture_file.empty())  // the file read once, kept in the run's settings
    a.run.architecture =
        architecture_json(architecture_from_json(read_text_file(architecture_file), "--architecture " + architecture_file));
  std::optional<Metadata> resumed;
  if (!a.resume.empty()) {
    resumed = read_checkpoint_metadata(a.resume, kFormat);
    const RunSettings saved = RunSettings::from_json(json::parse(metadata_value(*resumed, "settings", a.resume)));
    // A resumed run takes its settings from the checkpoint; those given must agree.
    const RunSettings& given = a.run;
    const auto agree = [&](const char* option, bool same) {
      require(!vm.count(option) || vm[option].defaulted() || same, "--", option, " differs from the checkpoint in ",
              a.resume, ", whose settings a resumed run takes");
    };
    agree("init", given.init == saved.init);
    agree("preset", given.preset == saved.preset);
    agree("architecture", given.architecture == saved.architecture);
    agree("context", given.context == saved.context);
    agree("lora", !given.lora.empty() && LoraOptions::parse(given.lora).str() == saved.lora);
    given.agree_with(saved, agree);
    a.resume_tokenizer = given.tokenizer;  // compared by content, in train()
    a.run = saved;
    a.steps = saved.resumed_steps(a.steps, !vm["steps"].defaulted(), *resumed, a.resume);
    if (a.out.empty()) a.out = a.resume;
  } else {  // saved as absolute paths: a resumed run may start elsewhere
    if (!a.run.init.empty()) a.run.init = fs::absolute(a.run.init).string();
    if (!a.run.tokenizer.empty()) a.run.tokenizer = fs::absolute(a.run.tokenizer).string();
  }
  require(int(!a.run.init.empty()) + int(!a.run.preset.empty()) + int(!a.run.architecture.empty()) == 1,
          "give one of --init PATH (fine-tune), --preset NAME or --architecture FILE (from scratch)");
  if (!a.run.lora.empty()) {
    require(!a.run.init.empty(), "--lora trains adapters on --init's model (give --init PATH)");
    require(a.shards <= 1, "--lora trains as one shard (--shards ", a.shards, "): a replica would copy the base");
    a.run.lora = LoraOptions::parse(a.run.lora).str();
  }
  if (!a.run.preset.empty()) (void)LanguageModelPresets::info(a.run.preset);
  if (a.run.init.empty())
    require(!a.run.tokenizer.empty(), a.run.preset.empty() ? "--architecture" : "--preset",
            " needs --tokenizer (tokenizer.json, tokenizer.bin or GPT-2's files)");
  require(a.steps > 0 && a.run.grad_accum > 0 && a.eval_every > 0 && a.eval_windows > 0 && a.run.context >= 0,
          "--steps, --grad-accum, --eval-every and --eval-windows must be positive, --context not negative");
  check_batch(a.run.batch);
  check_stop_after(vm, a.stop_after);
  check_optimizer_options(a.run.lr, a.run.clip, a.run.weight_decay);
  check_dropout_options(vm, a.run.dropout, 0.0f);
  require(a.run.val_fraction > 0 && a.run.val_fraction < 1, "--val-fraction ", a.run.val_fraction, " outside (0, 1)");
  (void)LrSchedule::parse(a.run.schedule, a.run.lr, a.steps);
  (void)parse_recompute(a.recompute);
  require(!a.data.empty(), "--data FILE is required");
  const auto lock = start_run(a, {{"--data", a.data}, {"--init", a.run.init}}, a.resume, !a.run.lora.empty());
  dispatch_backend(a.backend, [&]<class Be>() { train<Be>(a, resumed); });
  return 0;
}

// export --------------------------------------------------------------------

int run_export(int argc, char** argv) {
  std::string model, tokenizer, hf, gguf, type = "f16", lora;
  bool overwrite = false;
  po::options_description opts("xfmr-lm export: a model in the Hugging Face layout of its family (GPT-2 or Llama), or "
                               "as a GGUF file llama.cpp reads (llama, qwen2 or gpt2)");
  opts.add_options()("help", "show this help")("model", po::value(&model), "the model, as sample's (required)")
      ("tokenizer", po::value(&tokenizer), "as sample's; its files are copied into the export under their usual names")
      ("hf", po::value(&hf), "directory to write model.safetensors, config.json and the tokenizer to")
      ("gguf", po::value(&gguf), "or a GGUF file to write (a Llama-, Qwen2- or GPT-2-shaped model, with its tokenizer)")
      ("type", po::value(&type)->default_value(type), "--gguf's matrices: f32, f16, bf16, q8_0 or q4_0 (rows that "
       "are not whole blocks of 32 in f16; norms in f32)")
      ("lora", po::value(&lora), "DIR[:SCALE]: a LoRA adapter (peft's format) merged into the model's weights first")
      ("overwrite", po::bool_switch(&overwrite), "replace an export already there");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!model.empty() && hf.empty() != gguf.empty(), "--model PATH and one of --hf DIR and --gguf FILE are required");
  const GgmlType ggml = ggml_type_named(type, "--type");
  const std::string out = hf.empty() ? gguf : hf;
  require(!same_file(model, out), hf.empty() ? "--gguf " : "--hf ", out, " is the --model input");
  check_writable_directory(hf.empty() ? "--gguf" : "--hf", out, !hf.empty());  // --hf makes missing parents, as --out
  if (!gguf.empty())  // before the model is read (the engine checks again)
    require(overwrite || !fs::exists(gguf), "--gguf ", gguf, " exists already (--overwrite replaces it)");
  Engine engine = Engine::load(model, {.tokenizer = tokenizer, .tokenizer_required = hf.empty() ? false : true,
                                       .tokenizer_option = "--tokenizer"});
  if (!lora.empty()) {
    const auto [dir, scale] = adapter_location(lora, "--lora");
    (void)engine.load_adapter(dir, scale);
    engine.merge_adapter();
  }
  if (!gguf.empty()) {
    engine.export_gguf(gguf, ggml, overwrite);
    std::cout << "xfmr-lm: " << engine.architecture().name << " (" << engine.parameter_count() << " parameters) to "
              << gguf << " as GGUF, matrices " << ggml_type_name(ggml)
              << (engine.has_tokenizer() ? ", with its tokenizer\n" : ", without a tokenizer\n");
    return 0;
  }
  engine.export_hf(hf, overwrite);
  std::cout << "xfmr-lm: " << engine.architecture().name << " (" << engine.parameter_count() << " parameters) to "
            << hf << " as " << (gpt2_shaped(engine.architecture()) ? "GPT2LMHeadModel" : "LlamaForCausalLM")
            << ", with its tokenizer\n";
  return 0;
}

// quantise ------------------------------------------------------------------

int run_quantise_lm(int argc, char** argv) {
  std::string model, tokenizer, out, precision = "q4";
  po::options_description opts("xfmr-lm quantise: a checkpoint for decoding, from any model sample reads (every weight "
                               "matrix 4-bit in blocks of 32 with a scale each, or int8 with a scale a row); decoding "
                               "from it loads no float32 weights");
  opts.add_options()("help", "show this help")("model", po::value(&model), "the model, as sample's (required)")
      ("tokenizer", po::value(&tokenizer), "as sample's; the checkpoint carries its files")
      ("out", po::value(&out), "directory of the checkpoint (required; replaces only a quantised checkpoint)")
      ("precision", po::value(&precision)->default_value(precision), "q4 or int8");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!model.empty() && !out.empty(), "--model PATH and --out DIR are required");
  require(is_decoding_precision(precision), "--precision '", precision, "': a checkpoint is quantised to int8 or q4");
  require(!same_file(model, out), "--out ", out, " is the --model input");
  if (is_checkpoint(model)) {
    const std::string already = quantised_weights(read_checkpoint_metadata(model, kFormat));
    require(already.empty(), "--model ", model, " holds ", already, " weights already");
  }
  check_writable_directory("--out", out, true);
#ifdef XFMR_FUZZ_CLI  // the work stops here, as in dispatch_backend
  return 0;
#endif
  const CheckpointLock lock(out);
  print_quantised("xfmr-lm", quantise_language_model<CpuBackend<float>>(model, out, precision, tokenizer), precision,
                  out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_commands("xfmr-lm", argc, argv,
                      {{"sample", run_sample},
                       {"eval", run_eval},
                       {"train", run_train},
                       {"export", run_export},
                       {"quantise", run_quantise_lm}});
}
