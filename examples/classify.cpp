// xfmr-classify: train a transformer sentence classifier on "label<TAB>text"
// files, and evaluate a trained one.
//
//   xfmr-classify train --train TSV --dev TSV [--model sst2] [--epochs N] ...
//   xfmr-classify eval --checkpoint DIR --dev TSV
#include <boost/program_options.hpp>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "xfmr/infer/classify.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/classifier_model.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/text/classification.hpp"
#include "xfmr/text/datasets.hpp"
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

constexpr const char* kFormat = "xfmr-classify";

// "note: 12 of 500 dev examples are longer than the model's 64 tokens; it reads the last 64 of each".
void report_cut(const EncodedExamples& e, const char* what, int max_t, const std::string& truncate) {
  if (e.cut > 0)
    std::cout << "note: " << e.cut << " of " << e.seqs.size() << " " << what << " examples are longer than the model's "
              << max_t << " tokens; it reads the " << (truncate == "tail" ? "last " : "first ") << max_t
              << " of each (--truncate " << truncate << ")\n";
}

struct TrainArgs : RunOptions {
  std::string train, dev, model = "sst2", tokens = "word", normalize = "none", truncate = "head", pooling = "mean",
              schedule = "cosine", resume;
  int epochs = 3, batch = 64, min_freq = 1, max_vocab = 0, eval_every = 500;
  long stop_after = 0;  // > 0: stop (and checkpoint) at this step of the plan
  double lr = 5e-4, weight_decay = 0.01, label_smoothing = 0.0, clip = 1.0;
  float dropout = -1.0f, attention_dropout = 0.0f;
  std::uint64_t seed = 1337;

  // What defines the run: every rank of a run across processes must agree
  // on it, and a resumed run takes it from the checkpoint.
  json settings() const {
    return {{"model", model}, {"tokens", tokens}, {"normalize", normalize}, {"truncate", truncate},
            {"pooling", pooling}, {"schedule", schedule}, {"epochs", epochs}, {"batch", batch},
            {"min_freq", min_freq}, {"max_vocab", max_vocab}, {"lr", lr}, {"weight_decay", weight_decay},
            {"label_smoothing", label_smoothing}, {"clip", clip}, {"dropout", dropout},
            {"attention_dropout", attention_dropout}, {"seed", seed}};
  }
  // --resume: the settings of the checkpoint's metadata (explicit options must agree).
  void take_settings(const boost::program_options::variables_map& vm, const json& saved) {
    take_saved(vm, saved, "model", "model", model, resume);
    take_saved(vm, saved, "tokens", "tokens", tokens, resume);
    take_saved(vm, saved, "normalize", "normalize", normalize, resume);
    take_saved(vm, saved, "truncate", "truncate", truncate, resume);
    take_saved(vm, saved, "pooling", "pooling", pooling, resume);
    take_saved(vm, saved, "schedule", "schedule", schedule, resume);
    take_saved(vm, saved, "epochs", "epochs", epochs, resume);
    take_saved(vm, saved, "batch", "batch", batch, resume);
    take_saved(vm, saved, "min-freq", "min_freq", min_freq, resume);
    take_saved(vm, saved, "max-vocab", "max_vocab", max_vocab, resume);
    take_saved(vm, saved, "lr", "lr", lr, resume);
    take_saved(vm, saved, "weight-decay", "weight_decay", weight_decay, resume);
    take_saved(vm, saved, "label-smoothing", "label_smoothing", label_smoothing, resume);
    take_saved(vm, saved, "clip", "clip", clip, resume);
    take_saved(vm, saved, "dropout", "dropout", dropout, resume);
    take_saved(vm, saved, "attention-dropout", "attention_dropout", attention_dropout, resume);
    take_saved(vm, saved, "seed", "seed", seed, resume);
  }
};

// The training order of one epoch: the examples shuffled with `rng` (the
// Trainer's data generator, drawn at the epoch's start).
std::vector<std::size_t> epoch_order(std::size_t n, Rng& rng) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  return order;
}

// p: the preset (sizes, name, dropout), whose family's Classifier the
// library compiled (models/classifier_model.hpp).
template <class Be>
void train(const PresetInfo& p, TrainArgs a, const Metadata* resumed) {
  using Model = ClassifierModel<Be>;
  const auto train_rows = read_labeled_tsv(a.train), dev_rows = read_labeled_tsv(a.dev);
  const std::string train_hash = labeled_rows_hash(train_rows), dev_hash = labeled_rows_hash(dev_rows);
  int classes = 2;
  for (const auto& r : train_rows) classes = std::max(classes, r.label + 1);
  const bool cls = a.pooling == "cls";
  require(cls || a.pooling == "mean", "unknown --pooling '", a.pooling, "' (expected mean or cls)");
  if (resumed)
    check_resume(a.resume, {{"train_hash", train_hash, "--train " + a.train + " is not the data the checkpoint was trained on"},
                            {"dev_hash", dev_hash, "--dev " + a.dev + " is not the data the checkpoint was evaluated on"}});
  const ClassificationTokens tok =
      resumed ? ClassificationTokens::from_json(metadata_value(*resumed, "tokens", a.resume))
              : ClassificationTokens::build(a.tokens, a.normalize, train_rows, a.min_freq, a.max_vocab, cls, a.train,
                                            p.d_model, p.max_t, a.truncate);
  check_batch_memory(p, p.n_layers, a.batch, p.max_t, 0, "--batch " + std::to_string(a.batch));
  const EncodedExamples train_data = encode_examples(tok, train_rows, classes, p.max_t, a.truncate, a.train);
  const EncodedExamples dev_data = encode_examples(tok, dev_rows, classes, p.max_t, a.truncate, a.dev);
  // Under mpirun each rank trains on its rows of every batch (all draw the same batches).
  ProcessGroup& group = join_ranks(a, Be::name, a.settings().dump() + " zero " + std::to_string(a.zero),
                                   "--train with hash " + train_hash + ", --dev with hash " + dev_hash);

  Be be = make_backend<Be>(a.backend, a.precision);
  const ClassifierOptions model_opts{.dropout = a.dropout >= 0 ? a.dropout : p.dropout,
                                    .attention_dropout = a.attention_dropout,
                                    .pooling = cls ? Pooling::Cls : Pooling::Mean,
                                    .recompute = parse_recompute(a.recompute)};
  const auto model_ptr = make_classifier<Be>(p, tok.size(), classes, a.seed, model_opts);
  Model& model = *model_ptr;
  const long steps_per_epoch = long((train_data.seqs.size() + a.batch - 1) / a.batch);
  const long total = steps_per_epoch * a.epochs;
  // Batches change shape from step to step, so no graph steps on a GPU.
  TrainingRun<Model, Be> session(model, be, {.optimizer = adamw_recipe(AdamWRecipe::standard, a.weight_decay),
                                         .trainer = {.clip = a.clip,
                                                     .label_smoothing = a.label_smoothing,
                                                     .schedule = LrSchedule::parse(a.schedule, a.lr, total),
                                                     .data_seed = seed_for(a.seed, 0xc1a55),
                                                     .split = {.shards = a.shards, .group = &group, .zero = a.zero},
                                                     .graph_steps = false},
                                         .loop = {.total = total,
                                                  .stop_after = a.stop_after,
                                                  .eval_every = a.eval_every,
                                                  .tokens_per_step = long(a.batch) * p.max_t / 2,
                                                  .log_csv = a.log_csv}});
  auto& trainer = session.trainer();
  if (resumed) session.resume(a.resume);  // its data checked above
  const long start = trainer.steps();
  Epochs epochs(steps_per_epoch, start, trainer.data_rng(), resumed, a.resume);  // an epoch's order: drawn at its start
  std::cout << "xfmr-classify: " << p.name << " on " << describe(be) << ", " << model.parameter_count()
            << " parameters, " << a.tokens << " vocabulary " << tok.size() << ", " << classes << " classes, "
            << train_data.seqs.size() << " train / " << dev_data.seqs.size() << " dev examples, " << total
            << " steps" << (group.size() > 1 ? ", " + std::to_string(group.size()) + " ranks" : "")
            << (resumed ? ", resuming at step " + std::to_string(start) : std::string()) << std::endl;
  report_cut(train_data, "train", p.max_t, a.truncate);
  report_cut(dev_data, "dev", p.max_t, a.truncate);

  ClassifierScore dev{};
  auto save = [&] {
    if (a.out.empty()) return;
    session.save(a.out, {{"format", kFormat},
                         {"preset", p.name},
                         {"classes", std::to_string(classes)},
                         {"pooling", a.pooling},
                         {"truncate", a.truncate},
                         {"tokens", tok.to_json()},
                         {"settings", a.settings().dump()},
                         {"train_hash", train_hash},
                         {"dev_hash", dev_hash},
                         {"epoch_rng", std::to_string(epochs.state())},
                         {"dev_accuracy", number(dev.accuracy)}});  // every rank (join_ranks); rank 0 writes
  };
  std::vector<std::size_t> order;  // this epoch's
  std::vector<std::vector<std::int32_t>> seqs;
  std::vector<int> labels;
  long tokens_seen = 0;
  const TrainingOutcome o = session.run(
      group,
      [&](long step) {
        if (epochs.draw_at(step, trainer.data_rng())) order = epoch_order(train_data.seqs.size(), trainer.data_rng());
        const long k = step % steps_per_epoch;
        seqs.clear();
        labels.clear();
        for (std::size_t j = k * a.batch; j < std::min(order.size(), std::size_t(k + 1) * a.batch); ++j) {
          seqs.push_back(train_data.seqs[order[j]]);
          labels.push_back(train_data.labels[order[j]]);
        }
        const auto b = make_class_batch(seqs, labels, p.max_t, tok.pad, tok.cls);
        tokens_seen += long(b.B) * b.T;
        const auto rows = rank_rows(group, b.B);  // this rank's rows (clang 14's lambdas capture no structured binding)
        const int mine = rows.first, end = rows.second;
        return trainer.step(
            [&](int) { return BatchTargets{end - mine, std::span(b.labels).subspan(std::size_t(mine), std::size_t(end - mine))}; },
            [&](const Shard& s, Model& m, Be& mb) {
              const std::size_t first = std::size_t(mine + s.begin) * b.T;
              return m.forward(mb, std::span(b.ids).subspan(first, std::size_t(s.size()) * b.T), Shape{s.size(), b.T},
                               b.padding.data() + first);
            });
      },
      [&](const StepResult& r) {
        dev = evaluate_classifier(model, be, dev_data, tok.pad, tok.cls, p.max_t, 256, group,
                                  [&] { return session.interrupted(group); });
        return Evaluation{r.loss, dev.loss,
                          " (epoch " + std::to_string((r.step - 1) / steps_per_epoch + 1) + "): batch loss " +
                              fixed(r.loss, 4) + ", dev loss " + fixed(dev.loss, 4) + ", dev accuracy " +
                              fixed(100 * dev.accuracy, 2) + "%"};
      },
      save);
  const double wall = o.wall_s;
  std::cout << "dev accuracy " << std::fixed << std::setprecision(2) << 100 * dev.accuracy << "% (" << dev_data.seqs.size()
            << " examples), " << format_duration(wall) << std::defaultfloat << "\n";
  write_html_report(a.report, std::string("xfmr-classify: ") + p.name,
                    {{"model", p.name + " (" + p.shape() + ")"},
                     {"train", a.train},
                     {"dev", a.dev},
                     {"epochs", std::to_string(a.epochs)},
                     {"dev accuracy", fixed(100 * dev.accuracy, 2) + "%"},
                     {"wall time", format_duration(wall)}},
                    o.batch_losses, o.evals);
  if (!a.metrics_json.empty()) {
    const json m = {{"model", p.name}, {"backend", Be::name}, {"precision", precision_of(be)}, {"dev_accuracy", dev.accuracy}, {"dev_loss", dev.loss},
                    {"steps", total},     {"epochs", a.epochs},           {"tokens_per_s", tokens_seen / wall},
                    {"wall_s", wall},     {"first_batch_loss", o.batch_losses.empty() ? -1.0 : o.batch_losses.front().second},
                    {"last_batch_loss", o.batch_losses.empty() ? -1.0 : o.batch_losses.back().second},
                    {"train_truncated", train_data.cut}, {"dev_truncated", dev_data.cut}, {"truncate", a.truncate}};
    write_text_atomic(a.metrics_json, m.dump(2) + "\n");
  }
  session.finish(a.out);
}

template <class Be>
void eval(const PresetInfo& p, const std::string& checkpoint, const Metadata& metadata, const std::string& dev_path,
          const std::string& metrics_json, const std::string& backend, const std::string& precision,
          std::string truncate) {
  if (truncate.empty()) truncate = metadata_value(metadata, "truncate", checkpoint);
  check_truncate(truncate);
  const ClassificationTokens tok = ClassificationTokens::from_json(metadata_value(metadata, "tokens", checkpoint));
  const int classes = parse_integer<int>(metadata_value(metadata, "classes", checkpoint), checkpoint + ": classes");
  require(classes >= 2 && classes <= kMaxClasses, checkpoint, ": classes ", classes, " outside 2..", kMaxClasses);
  const bool cls = metadata_value(metadata, "pooling", checkpoint) == "cls";
  Be be = make_backend<Be>(backend, precision);
  const auto model_ptr =
      make_classifier<Be>(p, tok.size(), classes, 0, {.dropout = 0.0f, .pooling = cls ? Pooling::Cls : Pooling::Mean});
  ClassifierModel<Be>& model = *model_ptr;
  defer_parameters(model, SafeTensors::load(fs::path(checkpoint) / kModelFile));  // read as needed
  const EncodedExamples dev = encode_examples(tok, read_labeled_tsv(dev_path), classes, p.max_t, truncate, dev_path);
  report_cut(dev, "dev", p.max_t, truncate);
  const auto r = evaluate_classifier(model, be, dev, tok.pad, tok.cls, p.max_t, 256);
  std::cout << "dev accuracy " << std::fixed << std::setprecision(2) << 100 * r.accuracy << "% (" << dev.seqs.size()
            << " examples), dev loss " << std::setprecision(4) << r.loss << "\n";
  if (!metrics_json.empty())
    write_text_atomic(metrics_json,
                      json{{"dev_accuracy", r.accuracy}, {"dev_loss", r.loss}, {"dev_truncated", dev.cut}}.dump(2) + "\n");
}

// A checkpoint of this program's: its metadata, checked before any work.
Metadata read_classifier_checkpoint(const std::string& dir) {
  Metadata md = read_checkpoint_metadata(dir, kFormat);
  (void)ClassifierPresets::info(metadata_value(md, "preset", dir));
  return md;
}


int run_train(int argc, char** argv) {
  TrainArgs a;
  po::options_description opts("xfmr-classify train: train a sentence classifier");
  opts.add_options()("help", "show this help")
      ("train", po::value(&a.train), "training TSV: header line, then label<TAB>text (required)")
      ("dev", po::value(&a.dev), "development TSV, same format (required)")
      ("model", po::value(&a.model)->default_value(a.model), preset_help<ClassifierPresets>().c_str())
      ("tokens", po::value(&a.tokens)->default_value(a.tokens), "word or char")
      ("normalize", po::value(&a.normalize)->default_value(a.normalize),
       "word text: none (whitespace), words (HTML line breaks to spaces, punctuation split off) or lower (words, "
       "lower-cased)")
      ("min-freq", po::value(&a.min_freq)->default_value(a.min_freq), "words seen fewer times map to <unk>")
      ("max-vocab", po::value(&a.max_vocab)->default_value(a.max_vocab),
       "keep only this many of the most frequent words (0 = all); the rest map to <unk>")
      ("truncate", po::value(&a.truncate)->default_value(a.truncate),
       "a text longer than the model's MAX_T keeps its first (head) or last (tail) tokens")
      ("pooling", po::value(&a.pooling)->default_value(a.pooling), "mean (over non-pad tokens) or cls")
      ("epochs", po::value(&a.epochs)->default_value(a.epochs), "passes over the training data")
      ("stop-after", po::value(&a.stop_after), "stop at this step of the plan, with a checkpoint (resume later)")
      ("batch", po::value(&a.batch)->default_value(a.batch), "sentences per batch")
      ("lr", po::value(&a.lr)->default_value(a.lr), "peak learning rate (AdamW)")
      ("schedule", po::value(&a.schedule)->default_value(a.schedule), "constant, cosine or onecycle")
      ("weight-decay", po::value(&a.weight_decay)->default_value(a.weight_decay), "AdamW weight decay")
      ("label-smoothing", po::value(&a.label_smoothing)->default_value(a.label_smoothing), "cross-entropy label smoothing")
      ("clip", po::value(&a.clip)->default_value(a.clip), "global gradient-norm clip (0 = off)")
      ("dropout", po::value(&a.dropout), "dropout rate (default: the preset's)")
      ("attention-dropout", po::value(&a.attention_dropout)->default_value(a.attention_dropout),
       "dropout on the attention probabilities")
      ("seed", po::value(&a.seed)->default_value(a.seed), "seed")
      ("eval-every", po::value(&a.eval_every)->default_value(a.eval_every), "steps between dev evaluations (and checkpoints)")
      ("resume", po::value(&a.resume), "continue the run of this checkpoint, bit for bit (its settings come from it)");
  add_run_options(opts, a, "classify", "checkpoint directory, written at every evaluation",
                  "dev accuracy, loss and timing");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.train.empty() && !a.dev.empty(), "--train TSV and --dev TSV are required");
  std::optional<Metadata> resumed;
  if (!a.resume.empty()) {
    resumed = read_classifier_checkpoint(a.resume);
    (void)read_trainer_state(a.resume);
    a.take_settings(vm, json::parse(metadata_value(*resumed, "settings", a.resume)));
    if (a.out.empty()) a.out = a.resume;
  }
  const auto lock = start_run(a, {{"--train", a.train}, {"--dev", a.dev}}, a.resume);
  require(a.epochs > 0 && a.eval_every > 0, "--epochs and --eval-every must be positive");
  check_stop_after(vm, a.stop_after);
  check_batch(a.batch);
  check_truncate(a.truncate);
  require(a.max_vocab >= 0, "--max-vocab ", a.max_vocab, " must be 0 (no cap) or positive");
  check_optimizer_options(a.lr, a.clip, a.weight_decay);
  check_dropout_options(vm, a.dropout, a.attention_dropout);
  (void)parse_recompute(a.recompute);
  (void)ClassifierPresets::info(a.model);
  dispatch_backend(a.backend,
                   [&]<class Be>() { train<Be>(ClassifierPresets::info(a.model), a, resumed ? &*resumed : nullptr); });
  return 0;
}

int run_eval(int argc, char** argv) {
  std::string checkpoint, dev, metrics_json, backend = "cpu", precision = "fp32", truncate;
  po::options_description opts("xfmr-classify eval: accuracy of a trained classifier");
  opts.add_options()("help", "show this help")("checkpoint", po::value(&checkpoint), "checkpoint directory (required)")
      ("dev", po::value(&dev), "TSV to evaluate on (required)")("metrics-json", po::value(&metrics_json), "write results here")
      ("truncate", po::value(&truncate), "head or tail (default: as the model was trained)")
      ("precision", po::value(&precision)->default_value(precision), kDecodePrecisionHelp)
      ("backend", po::value(&backend)->default_value(backend), kBackendHelp);
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!checkpoint.empty() && !dev.empty(), "--checkpoint DIR and --dev TSV are required");
  if (!truncate.empty()) check_truncate(truncate);
  check_precision_name(precision, "--precision");
  check_output_paths({{"--metrics-json", metrics_json}}, {{"--dev", dev}, {"--checkpoint", checkpoint}}, checkpoint);
  const Metadata metadata = read_classifier_checkpoint(checkpoint);
  precision = decoding_precision(vm, precision, metadata);
  check_decoding_backend(vm, backend, precision);
  dispatch_backend(backend, [&]<class Be>() {
    eval<Be>(ClassifierPresets::info(metadata.at("preset")), checkpoint, metadata, dev, metrics_json, backend,
             precision, truncate);
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_commands("xfmr-classify", argc, argv,
                      {{"train", run_train},
                       {"eval", run_eval},
                       {"quantise", [](int n, char** a) { return run_quantise("xfmr-classify", kFormat, n, a); }}});
}
