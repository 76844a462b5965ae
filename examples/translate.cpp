// xfmr-translate: train an encoder-decoder translator on parallel text,
// translate with beam search, and score with BLEU.
//
//   xfmr-translate train [--src-train F --tgt-train F --src-val F --tgt-val F] [--model multi30k] ...
//   xfmr-translate translate --checkpoint DIR [--input FILE] [--beam 4] [--attention-map map.svg]
//   xfmr-translate eval --checkpoint DIR --src FILE --ref FILE
// Tokens are whole words (--tokens word, rare ones <unk>) or byte-level BPE
// pieces learned from the training text (--tokens bpe); the vocabularies or
// merges go into the checkpoint. --share-embeddings learns one joint
// vocabulary and one token table for both languages.
// Files are one sentence per line, plain or .gz. Without file options, train
// uses Multi30k English->French from ../shared/data/multi30k when present.
#include <algorithm>
#include <boost/program_options.hpp>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "xfmr/infer/beam_search.hpp"
#include "xfmr/infer/translate.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/infer/bleu.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/translation_model.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/text/translation.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/training_run.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace xfmr;
using namespace xfmr::examples;

namespace {

constexpr const char* kFormat = "xfmr-translate";

struct TrainArgs : RunOptions {
  std::string src_train, tgt_train, src_val, tgt_val, model = "multi30k", schedule = "cosine", resume;
  std::string tokens = "word";
  int epochs = 10, batch = 64, min_freq = 2, bpe_vocab = 8000, beam = 4, eval_every = 1000, bleu_sentences = 0;
  long stop_after = 0;  // > 0: stop (and checkpoint) at this step of the plan
  double lr = 5e-4, label_smoothing = 0.1, clip = 1.0, weight_decay = 0.01, length_penalty = 0.6;
  float attention_dropout = 0.0f;
  bool lowercase = false, truncate = false, share_embeddings = false;
  std::uint64_t seed = 1337;

  // What defines the run: every rank of a run across processes must agree
  // on it, and a resumed run takes it from the checkpoint.
  json settings() const {
    return {{"model", model}, {"schedule", schedule}, {"tokens", tokens}, {"epochs", epochs}, {"batch", batch},
            {"min_freq", min_freq}, {"bpe_vocab", bpe_vocab}, {"beam", beam},
            {"bleu_sentences", bleu_sentences}, {"lr", lr}, {"label_smoothing", label_smoothing}, {"clip", clip},
            {"weight_decay", weight_decay}, {"length_penalty", length_penalty},
            {"attention_dropout", attention_dropout}, {"lowercase", lowercase}, {"truncate", truncate},
            {"share_embeddings", share_embeddings}, {"seed", seed}};
  }
  // --resume: the settings of the checkpoint's metadata (explicit options must agree).
  void take_settings(const boost::program_options::variables_map& vm, const json& saved) {
    take_saved(vm, saved, "model", "model", model, resume);
    take_saved(vm, saved, "schedule", "schedule", schedule, resume);
    take_saved(vm, saved, "tokens", "tokens", tokens, resume);
    take_saved(vm, saved, "epochs", "epochs", epochs, resume);
    take_saved(vm, saved, "batch", "batch", batch, resume);
    take_saved(vm, saved, "min-freq", "min_freq", min_freq, resume);
    take_saved(vm, saved, "bpe-vocab", "bpe_vocab", bpe_vocab, resume);
    take_saved(vm, saved, "beam", "beam", beam, resume);
    take_saved(vm, saved, "bleu-sentences", "bleu_sentences", bleu_sentences, resume);
    take_saved(vm, saved, "lr", "lr", lr, resume);
    take_saved(vm, saved, "label-smoothing", "label_smoothing", label_smoothing, resume);
    take_saved(vm, saved, "clip", "clip", clip, resume);
    take_saved(vm, saved, "weight-decay", "weight_decay", weight_decay, resume);
    take_saved(vm, saved, "length-penalty", "length_penalty", length_penalty, resume);
    take_saved(vm, saved, "attention-dropout", "attention_dropout", attention_dropout, resume);
    take_saved(vm, saved, "lowercase", "lowercase", lowercase, resume);
    take_saved(vm, saved, "truncate", "truncate", truncate, resume);
    take_saved(vm, saved, "share-embeddings", "share_embeddings", share_embeddings, resume);
    take_saved(vm, saved, "seed", "seed", seed, resume);
  }
};

// p: the preset (sizes, name, dropout), whose family's Seq2Seq the library
// compiled (models/translation_model.hpp).
template <class Be>
void train(const PresetInfo& p, TrainArgs a, const Metadata* resumed) {
  using Model = TranslationModel<Be>;
  const int max_len = p.max_t - 1;  // room for <bos> (input) or <eos> (target)
  const auto src_lines = read_sentences(a.src_train), tgt_lines = read_sentences(a.tgt_train);
  const auto src_val = read_sentences(a.src_val), tgt_val = read_sentences(a.tgt_val);
  require(src_lines.size() == tgt_lines.size(), a.src_train, " has ", src_lines.size(), " lines but ", a.tgt_train,
          " has ", tgt_lines.size());
  require(src_val.size() == tgt_val.size(), a.src_val, " has ", src_val.size(), " lines but ", a.tgt_val, " has ",
          tgt_val.size());
  auto hash = [](const std::vector<std::string>& lines, std::uint64_t h) {
    for (const auto& l : lines) h = fnv1a(l + "\n", h);
    return h;
  };
  const std::string data_hash = hex(hash(tgt_val, hash(src_val, hash(tgt_lines, hash(src_lines, fnv1a(""))))));
  if (resumed)
    check_resume(a.resume,
                 {{"data_hash", data_hash, "the training and validation files are not those the checkpoint was trained on"}});
  auto learn = [&](const std::vector<std::string>& lines) {
    return a.tokens == "bpe" ? TranslationCodec::bpe(lines, a.bpe_vocab, a.lowercase)
                             : TranslationCodec::words(lines, a.min_freq, a.lowercase, std::size_t(max_len));
  };
  auto both = src_lines;
  if (a.share_embeddings && !resumed) both.insert(both.end(), tgt_lines.begin(), tgt_lines.end());
  const TranslationVocabs v = resumed ? TranslationVocabs::from_json(metadata_value(*resumed, "vocabs", a.resume))
                               : a.share_embeddings ? TranslationVocabs{learn(both), learn(both), true}
                                                    : TranslationVocabs{learn(src_lines), learn(tgt_lines), false};
  if (!resumed) {
    const std::string files = a.share_embeddings ? a.src_train + " and " + a.tgt_train : a.src_train;
    check_vocabulary(std::size_t(v.src.size()), TranslationCodec::kSpecials, p.d_model, "the source vocabulary of " + files,
                     a.tokens == "bpe" ? "--bpe-vocab" : "--min-freq");
    check_vocabulary(std::size_t(v.tgt.size()), TranslationCodec::kSpecials, p.d_model,
                     "the target vocabulary of " + (a.share_embeddings ? files : a.tgt_train),
                     a.tokens == "bpe" ? "--bpe-vocab" : "--min-freq");
  }
  check_batch_memory(p, 2 * p.n_layers, a.batch, p.max_t, v.tgt.size(), "--batch " + std::to_string(a.batch),
                     false);  // a translation model's logits: the batch's
  const auto src_ids = encode_sentences(v.src, src_lines, max_len, a.truncate, a.src_train);
  const auto tgt_ids = encode_sentences(v.tgt, tgt_lines, max_len, a.truncate, a.tgt_train);
  std::vector<SentencePair> data;
  for (std::size_t i = 0; i < src_ids.size(); ++i) data.push_back({src_ids[i], tgt_ids[i]});
  const auto vsrc = encode_sentences(v.src, src_val, max_len, a.truncate, a.src_val);
  const auto vtgt = encode_sentences(v.tgt, tgt_val, max_len, a.truncate, a.tgt_val);
  std::vector<SentencePair> val;
  for (std::size_t i = 0; i < vsrc.size(); ++i) val.push_back({vsrc[i], vtgt[i]});

  // Under mpirun each rank trains on its rows of every batch (all draw the same batches).
  ProcessGroup& group = join_ranks(a, Be::name,
                                   a.settings().dump() + " eval_every " + std::to_string(a.eval_every) + " zero " +
                                       std::to_string(a.zero),
                                   "the data with hash " + data_hash);

  Be be = make_backend<Be>(a.backend, a.precision);
  const Seq2SeqOptions model_opts{.dropout = p.dropout,
                                  .attention_dropout = a.attention_dropout,
                                  .tie_output = false,
                                  .share_embeddings = v.shared,
                                  .recompute = parse_recompute(a.recompute)};
  const auto model_ptr = make_translation_model<Be>(p, v.src.size(), v.tgt.size(), a.seed, model_opts);
  Model& model = *model_ptr;
  const long per_epoch = long((data.size() + a.batch - 1) / a.batch), total = per_epoch * a.epochs;
  // Batches change shape from step to step, so no graph steps on a GPU.
  TrainingRun<Model, Be> session(model, be, {.optimizer = adamw_recipe(AdamWRecipe::translator, a.weight_decay),
                                             .trainer = {.clip = a.clip,
                                                         .label_smoothing = a.label_smoothing,
                                                         .schedule = LrSchedule::parse(a.schedule, a.lr, total),
                                                         .data_seed = seed_for(a.seed, 0x7a5),
                                                         .split = {.shards = a.shards, .group = &group, .zero = a.zero},
                                                         .graph_steps = false},
                                             .loop = {.total = total,
                                                      .stop_after = a.stop_after,
                                                      .eval_every = a.eval_every,
                                                      .tokens_per_step = long(a.batch) * 14,
                                                      .log_csv = a.log_csv}});
  auto& trainer = session.trainer();
  if (resumed) session.resume(a.resume);  // its data checked above
  const long start = trainer.steps();
  Epochs epochs(per_epoch, start, trainer.data_rng(), resumed, a.resume);  // an epoch's batches: drawn at its start
  // The model's logits for a shard of the sentence pairs in b from `mine` on
  // (this rank's rows), and those rows' targets.
  auto forward = [](const PairBatch& b, int mine) {
    return [&b, mine](const Shard& s, Model& m, Be& mb) {
      const std::size_t S = std::size_t(b.src.T), T = std::size_t(b.tgt.T), first = std::size_t(mine + s.begin);
      const std::size_t n = std::size_t(s.size());
      return m.forward(mb, std::span(b.src_ids).subspan(first * S, n * S), Shape{s.size(), b.src.T},
                       b.src_pad.data() + first * S, std::span(b.tgt_in).subspan(first * T, n * T),
                       Shape{s.size(), b.tgt.T}, b.tgt_pad.data() + first * T);
    };
  };
  std::cout << "xfmr-translate: " << p.name << " on " << describe(be) << ", "
            << model.parameter_count() << " parameters, "
            << (v.shared ? "one joint " : "") << v.src.kind() << " vocabular" << (v.shared ? "y " : "ies ")
            << v.src.size();
  if (!v.shared) std::cout << " / " << v.tgt.size();
  std::cout << ", " << data.size() << " train / " << val.size() << " val pairs, " << total << " steps"
            << (group.size() > 1 ? ", " + std::to_string(group.size()) + " ranks" : "")
            << (resumed ? ", resuming at step " + std::to_string(start) : std::string()) << std::endl;
  auto my_rows = [&](const PairBatch& b) {
    const auto [mine, end] = rank_rows(group, b.src.B);
    const std::size_t T = std::size_t(b.tgt.T);
    return std::pair(mine, BatchTargets{end - mine, std::span<const std::int32_t>(b.tgt_out)
                                                        .subspan(std::size_t(mine) * T, std::size_t(end - mine) * T)});
  };

  // Mean loss over the validation pairs' counted (non-pad) target tokens.
  auto val_loss = [&]() {
    LossSum sum;
    for (std::size_t i = 0; i < val.size() && !session.interrupted(group); i += 128) {
      std::vector<int> which(std::min<std::size_t>(128, val.size() - i));
      std::iota(which.begin(), which.end(), int(i));
      const PairBatch b = make_pair_batch(val, which, v);
      const auto rows = my_rows(b);
      sum += trainer.evaluate(rows.second, forward(b, rows.first));
    }
    return sum.mean();
  };
  auto save = [&](std::optional<double> bleu) {
    if (a.out.empty()) return;
    Metadata md = {{"format", kFormat},
                   {"preset", p.name},
                   {"vocabs", v.to_json()},
                   {"settings", a.settings().dump()},
                   {"data_hash", data_hash},
                   {"epoch_rng", std::to_string(epochs.state())}};
    if (bleu) md["val_bleu"] = number(*bleu);
    session.save(a.out, md);  // every rank (join_ranks); rank 0 writes
  };

  long tokens = 0;
  double vloss = 0;
  std::vector<std::vector<int>> batches;  // this epoch's
  const TrainingOutcome o = session.run(
      group,
      [&](long step) {
        if (epochs.draw_at(step, trainer.data_rng())) batches = bucket_batches(data, a.batch, trainer.data_rng());
        const PairBatch b = make_pair_batch(data, batches[std::size_t(step % per_epoch)], v);
        const auto rows = my_rows(b);
        tokens += b.tokens;
        return trainer.step([&](int) { return rows.second; }, forward(b, rows.first));
      },
      [&](const StepResult& r) {
        vloss = val_loss();
        return Evaluation{r.loss, vloss,
                          " (epoch " + std::to_string((r.step - 1) / per_epoch + 1) + "): batch loss " + fixed(r.loss, 4) +
                              ", val loss " + fixed(vloss, 4)};
      },
      [&] { save(std::nullopt); });
  const long stop = o.stop;
  const double train_s = o.wall_s;
  auto report = [&](const std::string& bleu) {
    write_html_report(a.report, std::string("xfmr-translate: ") + p.name,
                      {{"model", p.name + " (" + p.shape() + ")"},
                       {"epochs", std::to_string(a.epochs)},
                       {"val loss", fixed(vloss, 4)},
                       {"val BLEU", bleu},
                       {"training time", format_duration(train_s)}},
                      o.batch_losses, o.evals);
  };
  if (stop < total) {  // stopped early, to be resumed: no BLEU yet
    report("- (stopped at step " + std::to_string(stop) + " of " + std::to_string(total) + ")");
    session.finish(a.out);
    return;
  }
  // BLEU on the validation set (or its first --bleu-sentences) with beam search.
  model.set_training(false);
  std::vector<std::string> srcs = src_val, refs = tgt_val;
  if (a.bleu_sentences > 0 && std::size_t(a.bleu_sentences) < srcs.size()) {
    srcs.resize(a.bleu_sentences);
    refs.resize(a.bleu_sentences);
  }
  const auto t0 = Clock::now();
  const BeamOptions beam{.beam = a.beam, .length_penalty = a.length_penalty, .max_len = max_len + 1,
                         .bos = v.bos(), .eos = v.eos()};
  const auto hyps = translate_sentences(group, model, be, v, srcs, beam, 32, max_len, true, a.src_val);
  const double decode_s = seconds_since(t0);
  const std::vector<std::vector<std::string>> ref_sets = {refs};
  const auto bleu = corpus_bleu(hyps, ref_sets);
  std::cout << "val " << bleu.to_string() << " (" << hyps.size() << " sentences, beam " << a.beam << ")\n";
  for (std::size_t i = 0; i < std::min<std::size_t>(3, hyps.size()); ++i)
    std::cout << "  " << srcs[i] << "\n  -> " << hyps[i] << "\n";
  save(bleu.score);
  report(bleu.to_string());
  if (!a.metrics_json.empty()) {
    const json m = {{"model", p.name}, {"backend", Be::name}, {"precision", precision_of(be)}, {"bleu", bleu.score},      {"val_loss", vloss},
                    {"epochs", a.epochs},  {"steps", total},         {"train_s", train_s},
                    {"train_tokens_per_s", tokens / train_s}, {"decode_sentences_per_s", hyps.size() / decode_s}};
    write_text_atomic(a.metrics_json, m.dump(2) + "\n");
  }
}

struct UseArgs {
  std::string checkpoint, input, src, ref, attention_map, metrics_json, backend = "cpu", precision = "fp32";
  int beam = 4, head = -1;
  double length_penalty = 0.6;
  bool truncate = false;
};

template <class Be>
void use(const PresetInfo& p, const UseArgs& a, const Metadata& metadata, bool evaluate) {
  require(a.head < p.n_heads, "--head ", a.head, " out of range [0, ", p.n_heads, ") of ", p.name, "'s heads");
  const TranslationVocabs v = TranslationVocabs::from_json(metadata_value(metadata, "vocabs", a.checkpoint));
  Be be = make_backend<Be>(a.backend, a.precision);
  const auto model_ptr = make_translation_model<Be>(p, v.src.size(), v.tgt.size(), 0, {.share_embeddings = v.shared});
  TranslationModel<Be>& model = *model_ptr;
  defer_parameters(model, SafeTensors::load(fs::path(a.checkpoint) / kModelFile));  // read as needed
  model.set_training(false);
  const int max_len = p.max_t - 1;
  const BeamOptions beam{.beam = a.beam, .length_penalty = a.length_penalty, .max_len = max_len + 1,
                         .bos = v.bos(), .eos = v.eos()};
  if (evaluate) {
    const auto srcs = read_sentences(a.src), refs = read_sentences(a.ref);
    require(srcs.size() == refs.size(), a.src, " has ", srcs.size(), " lines but ", a.ref, " has ", refs.size());
    const auto t0 = Clock::now();
    const auto hyps = translate_sentences(model, be, v, srcs, beam, 32, max_len, a.truncate, a.src);
    const double s = seconds_since(t0);
    const std::vector<std::vector<std::string>> ref_sets = {refs};
    const auto bleu = corpus_bleu(hyps, ref_sets);
    std::cout << bleu.to_string() << " (" << hyps.size() << " sentences, beam " << a.beam << ", " << s << " s)\n";
    if (!a.metrics_json.empty())
      write_text_atomic(a.metrics_json, json{{"bleu", bleu.score}, {"sentences", hyps.size()}, {"decode_s", s}}.dump(2) + "\n");
    return;
  }
  std::vector<std::string> lines;
  if (a.input.empty()) {
    long number = 0;
    for (std::string line; std::getline(std::cin, line);) {
      check_utf8(line, "standard input, line " + std::to_string(++number));
      if (!line.empty()) lines.push_back(line);
    }
    require(!lines.empty(), "no sentences to translate: standard input held none (pipe sentences in, one a line, or "
                            "pass --input FILE)");
  } else {
    lines = read_sentences(a.input);
    require(!lines.empty(), "no sentences to translate: ", a.input, " holds none");
  }
  const auto out = translate_sentences(model, be, v, lines, beam, 32, max_len, a.truncate, a.input.empty() ? "stdin" : a.input);
  for (const auto& t : out) std::cout << t << "\n";
  if (!a.attention_map.empty() && !lines.empty())
    write_attention_map(model, be, v, lines[0], out[0], a.attention_map, a.head, max_len);
}

// Beam search keeps `beam` hypotheses of every sentence of a batch, each
// with its logits and KV cache: a beam beyond kMaxBeam only exhausts memory.
constexpr int kMaxBeam = 100;
void check_beam(int beam, double length_penalty) {
  require(beam >= 1 && beam <= kMaxBeam, "--beam ", beam, " outside 1..", kMaxBeam);
  check_length_penalty(length_penalty, "--length-penalty");
}

// A checkpoint of this program's: its metadata, checked before any work.
Metadata read_translator_checkpoint(const std::string& dir) {
  Metadata md = read_checkpoint_metadata(dir, kFormat);
  (void)TranslatorPresets::info(metadata_value(md, "preset", dir));
  return md;
}

std::string shared_data(const char* name) {
  for (const char* base : {"../shared/data/multi30k/", "../../shared/data/multi30k/"})
    if (fs::exists(fs::path(base) / name)) return (fs::path(base) / name).string();
  return "";
}

int run_train(int argc, char** argv) {
  TrainArgs a;
  a.src_train = shared_data("train.en.gz"), a.tgt_train = shared_data("train.fr.gz");
  a.src_val = shared_data("val.en.gz"), a.tgt_val = shared_data("val.fr.gz");
  po::options_description opts("xfmr-translate train: train an encoder-decoder translator");
  opts.add_options()("help", "show this help")
      ("src-train", po::value(&a.src_train), "source sentences (default: Multi30k English, when present)")
      ("tgt-train", po::value(&a.tgt_train), "target sentences (default: Multi30k French)")
      ("src-val", po::value(&a.src_val), "validation source")("tgt-val", po::value(&a.tgt_val), "validation target")
      ("model", po::value(&a.model)->default_value(a.model), preset_help<TranslatorPresets>().c_str())
      ("epochs", po::value(&a.epochs)->default_value(a.epochs), "passes over the training pairs")
      ("stop-after", po::value(&a.stop_after), "stop at this step of the plan, with a checkpoint (resume later)")
      ("batch", po::value(&a.batch)->default_value(a.batch), "sentence pairs per batch (bucketed by length)")
      ("lr", po::value(&a.lr)->default_value(a.lr), "peak learning rate")
      ("schedule", po::value(&a.schedule)->default_value(a.schedule), "constant, cosine or onecycle")
      ("label-smoothing", po::value(&a.label_smoothing)->default_value(a.label_smoothing), "label smoothing")
      ("attention-dropout", po::value(&a.attention_dropout)->default_value(a.attention_dropout),
       "dropout on the attention probabilities (self and cross)")
      ("tokens", po::value(&a.tokens)->default_value(a.tokens), "word (a vocabulary of whole words) or bpe (byte-level BPE)")
      ("min-freq", po::value(&a.min_freq)->default_value(a.min_freq), "--tokens word: rarer words map to <unk>")
      ("bpe-vocab", po::value(&a.bpe_vocab)->default_value(a.bpe_vocab), "--tokens bpe: symbols per vocabulary")
      ("share-embeddings", po::bool_switch(&a.share_embeddings), "one joint vocabulary and token table for both sides")
      ("lowercase", po::bool_switch(&a.lowercase), "lower-case before tokenizing")
      ("truncate", po::bool_switch(&a.truncate), "cut sentences longer than the model allows (else an error)")
      ("beam", po::value(&a.beam)->default_value(a.beam), "beam size for the final BLEU")
      ("length-penalty", po::value(&a.length_penalty)->default_value(a.length_penalty), "GNMT alpha")
      ("bleu-sentences", po::value(&a.bleu_sentences)->default_value(0), "score only the first N validation pairs")
      ("eval-every", po::value(&a.eval_every)->default_value(a.eval_every), "steps between validation losses (and checkpoints)")
      ("seed", po::value(&a.seed)->default_value(a.seed), "seed")
      ("resume", po::value(&a.resume), "continue the run of this checkpoint, bit for bit (its settings come from it)");
  add_run_options(opts, a, "translate", "checkpoint directory, written at every evaluation", "BLEU, loss and timing");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.src_train.empty() && !a.tgt_train.empty() && !a.src_val.empty() && !a.tgt_val.empty(),
          "no training data: pass --src-train, --tgt-train, --src-val and --tgt-val");
  std::optional<Metadata> resumed;
  if (!a.resume.empty()) {
    resumed = read_translator_checkpoint(a.resume);
    (void)read_trainer_state(a.resume);
    a.take_settings(vm, json::parse(metadata_value(*resumed, "settings", a.resume)));
    if (a.out.empty()) a.out = a.resume;
  }
  require(a.epochs > 0 && a.eval_every > 0, "--epochs and --eval-every must be positive");
  check_stop_after(vm, a.stop_after);
  check_batch(a.batch);
  const auto lock = start_run(a, {{"--src-train", a.src_train}, {"--tgt-train", a.tgt_train}, {"--src-val", a.src_val},
                        {"--tgt-val", a.tgt_val}}, a.resume);
  check_beam(a.beam, a.length_penalty);
  require(a.tokens == "word" || a.tokens == "bpe", "--tokens ", a.tokens, " is not word or bpe");
  check_optimizer_options(a.lr, a.clip, a.weight_decay);
  check_dropout_options(vm, 0.0f, a.attention_dropout);
  (void)parse_recompute(a.recompute);
  (void)TranslatorPresets::info(a.model);
  dispatch_backend(a.backend,
                   [&]<class Be>() { train<Be>(TranslatorPresets::info(a.model), a, resumed ? &*resumed : nullptr); });
  return 0;
}

int run_use(int argc, char** argv, bool evaluate) {
  UseArgs a;
  po::options_description opts(evaluate ? "xfmr-translate eval: BLEU of a checkpoint" : "xfmr-translate translate");
  opts.add_options()("help", "show this help")("checkpoint", po::value(&a.checkpoint), "checkpoint directory (required)")
      ("beam", po::value(&a.beam)->default_value(a.beam), "beam size (1 = greedy)")
      ("length-penalty", po::value(&a.length_penalty)->default_value(a.length_penalty), "GNMT alpha")
      ("truncate", po::bool_switch(&a.truncate), "cut over-long sentences instead of failing")
      ("precision", po::value(&a.precision)->default_value(a.precision), kDecodePrecisionHelp)
      ("backend", po::value(&a.backend)->default_value(a.backend), kBackendHelp);
  if (evaluate)
    opts.add_options()("src", po::value(&a.src), "source sentences")("ref", po::value(&a.ref), "reference translations")
        ("metrics-json", po::value(&a.metrics_json), "write BLEU here");
  else
    opts.add_options()("input", po::value(&a.input), "sentences to translate (default: standard input)")
        ("attention-map", po::value(&a.attention_map), "SVG heatmap of the first sentence's cross-attention")
        ("head", po::value(&a.head)->default_value(-1), "attention map of one head (default: the mean)");
  po::variables_map vm;
  if (!parse_options(argc, argv, opts, vm)) return 0;
  require(!a.checkpoint.empty(), "--checkpoint DIR is required");
  check_beam(a.beam, a.length_penalty);
  if (evaluate) require(!a.src.empty() && !a.ref.empty(), "--src FILE and --ref FILE are required");
  check_output_paths({{"--metrics-json", a.metrics_json}, {"--attention-map", a.attention_map}},
                     {{"--checkpoint", a.checkpoint}, {"--src", a.src}, {"--ref", a.ref}, {"--input", a.input}},
                     a.checkpoint);
  check_precision_name(a.precision, "--precision");
  const Metadata metadata = read_translator_checkpoint(a.checkpoint);
  a.precision = decoding_precision(vm, a.precision, metadata);
  check_decoding_backend(vm, a.backend, a.precision);
  dispatch_backend(a.backend, [&]<class Be>() {
    use<Be>(TranslatorPresets::info(metadata.at("preset")), a, metadata, evaluate);
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_commands("xfmr-translate", argc, argv,
                      {{"train", run_train},
                       {"translate", [](int n, char** a) { return run_use(n, a, false); }},
                       {"eval", [](int n, char** a) { return run_use(n, a, true); }},
                       {"quantise", [](int n, char** a) { return run_quantise("xfmr-translate", kFormat, n, a); }}});
}
