#include "support/temp_dir.hpp"
#include "xfmr/io/checkpoint.hpp"

#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>

#include "support/configs.hpp"
#include "support/errors.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/int8.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/train/optimizers.hpp"

BOOST_AUTO_TEST_SUITE(test_checkpoint)

using namespace xfmr;
using namespace xfmr::test;
namespace fs = std::filesystem;
using Be = CpuBackend<float>;

namespace {
struct TempDir : xfmr::test::TempDir {
  TempDir() : xfmr::test::TempDir("ckpt") {}
};
template <class M>
std::vector<float> flat(M& m) {
  std::vector<float> out;
  m.visit([&](std::string_view, auto& v, auto&) { out.insert(out.end(), v.begin(), v.end()); });
  return out;
}
struct TwoLayers : TinyPre {
  static constexpr int N_LAYERS = 2;
};
std::size_t entries(const fs::path& dir) {
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}
}  // namespace

BOOST_AUTO_TEST_CASE(model_and_optimizer_round_trip) {
  TempDir d;
  Decoder<TinyPre, Be> a(7, 1), b(7, 2);
  AdamW<Be> opt_a(a), opt_b(b);
  a.visit([](std::string_view, auto&, auto& g) { g.fill(0.1f); });
  Be be;
  opt_a.step(be, 1e-2);
  SafeTensorsWriter mw, ow;
  add_parameters(mw, a);
  mw.set_metadata("config", "tiny");
  add_optimizer_state(ow, opt_a);
  write_checkpoint(d.path / "ckpt", mw, ow, TrainerState{1, 0xfedcba9876543210ULL, {3, 0, 7}});
  BOOST_TEST(is_checkpoint(d.path / "ckpt"));
  const TrainerState st = read_trainer_state(d.path / "ckpt");
  BOOST_TEST(st.step == 1);
  BOOST_TEST(st.data_rng == 0xfedcba9876543210ULL);  // all 64 bits
  BOOST_TEST(st.dropout_calls == std::vector<std::uint64_t>({3, 0, 7}), boost::test_tools::per_element());
  BOOST_TEST(read_checkpoint_metadata(d.path / "ckpt") == (Metadata{{"config", "tiny"}}));

  BOOST_TEST((flat(a) != flat(b)));
  load_parameters(b, SafeTensors::load(d.path / "ckpt" / kModelFile));
  load_optimizer_state(opt_b, SafeTensors::load(d.path / "ckpt" / kOptimizerFile));
  BOOST_TEST(flat(a) == flat(b), boost::test_tools::per_element());
  BOOST_TEST(opt_b.steps() == 1);
  std::vector<float> ma, mb;
  opt_a.visit_state([&](const std::string&, auto& t) { ma.insert(ma.end(), t.begin(), t.end()); });
  opt_b.visit_state([&](const std::string&, auto& t) { mb.insert(mb.end(), t.begin(), t.end()); });
  BOOST_TEST(ma == mb, boost::test_tools::per_element());
}

// A step count that is not a non-negative integer is a clear error (it was
// std::stoll's exception, which ended the programs with an abort).
BOOST_AUTO_TEST_CASE(malformed_optimizer_step_count_is_a_clear_error) {
  Decoder<TinyPre, Be> model(7, 1);
  AdamW<Be> opt(model);
  for (const char* steps : {"x", "12x", "", "-5", "99999999999999999999"}) {
    SafeTensorsWriter w;
    add_optimizer_state(w, opt);
    w.set_metadata("steps", steps);
    BOOST_TEST_CONTEXT("steps '" << steps << "'") {
      BOOST_CHECK_THROW(load_optimizer_state(opt, SafeTensors::parse(w.serialize(), "optimizer.safetensors")), Error);
    }
  }
  try {
    SafeTensorsWriter w;
    add_optimizer_state(w, opt);
    w.set_metadata("steps", "x");
    load_optimizer_state(opt, SafeTensors::parse(w.serialize(), "optimizer.safetensors"));
    BOOST_FAIL("a step count of 'x' loaded");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "optimizer.safetensors: optimizer step count 'x' is not an integer");
  }
  // A metadata key that is not there names the file and the key (it was
  // std::map::at's out_of_range, e.g. a model file without its tokenizer).
  SafeTensorsWriter model_file;
  add_parameters(model_file, model);
  const auto st = SafeTensors::parse(model_file.serialize(), "model.safetensors");
  try {
    (void)st.metadata("tokenizer");
    BOOST_FAIL("a missing metadata key was found");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "model.safetensors: no 'tokenizer' in the metadata");
  }
}

// A checkpoint holding a NaN or an infinity is refused on load, naming the
// tensor (it loaded, and sampling printed garbage with exit status 0).
BOOST_AUTO_TEST_CASE(non_finite_values_are_refused_on_load) {
  Decoder<TinyPre, Be> model(7, 1);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SafeTensorsWriter w;
    model.visit([&](std::string_view name, auto& value, auto&) {
      std::vector<float> v(value.begin(), value.end());
      if (name == "blocks.0.ln1.weight") v[3] = bad;
      w.add<float>(std::string(name), value.shape(), v);
    });
    try {
      load_parameters(model, SafeTensors::parse(w.serialize(), "model.safetensors"));
      BOOST_FAIL("a non-finite weight loaded");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).starts_with("model.safetensors: tensor 'blocks.0.ln1.weight' holds "), e.what());
      BOOST_TEST(std::string(e.what()).find(" at element 3;") != std::string::npos, e.what());
    }
  }
}

BOOST_AUTO_TEST_CASE(wrong_model_is_a_clear_error) {
  TempDir d;
  Decoder<TinyPre, Be> small(7, 1), other_vocab(9, 1);
  SafeTensorsWriter w;
  add_parameters(w, small);
  const auto st = SafeTensors::parse(w.serialize(), "model.safetensors");
  try {
    load_parameters(other_vocab, st);
    BOOST_FAIL("a vocabulary-7 checkpoint loaded into a vocabulary-9 model");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) ==
               "model.safetensors: tensor 'tok_emb.weight' has shape (7, 8) but the model expects (9, 8)");
  }
  Decoder<TwoLayers, Be> deeper(7, 1);
  BOOST_CHECK_THROW(load_parameters(deeper, st), Error);  // blocks.1.* missing
  SafeTensorsWriter extra;
  add_parameters(extra, small);
  const std::vector<float> one = {1};
  extra.add<float>("stray.weight", {1}, one);
  BOOST_CHECK_THROW(load_parameters(small, SafeTensors::parse(extra.serialize())), Error);
}

BOOST_AUTO_TEST_CASE(overwrites_only_checkpoints_and_leaves_no_temporaries) {
  TempDir d;
  SafeTensorsWriter m1, m2, o;
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  m1.add<float>("w", {2}, a);
  m2.add<float>("w", {3}, b);
  write_checkpoint(d.path / "run", m1, o, {});
  write_checkpoint(d.path / "run", m2, o, {});  // replaces the old checkpoint whole
  BOOST_TEST(SafeTensors::load(d.path / "run" / kModelFile).values<float>("w") == b, boost::test_tools::per_element());
  BOOST_TEST(entries(d.path) == 1u);  // no temporary directories left behind

  // A directory of the user's is never replaced.
  fs::create_directories(d.path / "mine");
  std::ofstream(d.path / "mine" / "notes.txt") << "precious";
  try {
    write_checkpoint(d.path / "mine", m1, o, {});
    BOOST_FAIL("a non-checkpoint directory was overwritten");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("is not an xfmr checkpoint") != std::string::npos);
  }
  std::ifstream in(d.path / "mine" / "notes.txt");
  std::string s;
  in >> s;
  BOOST_TEST(s == "precious");
  BOOST_TEST(entries(d.path / "mine") == 1u);
  BOOST_CHECK_THROW(read_trainer_state(d.path / "mine"), Error);
}

// "run/" (as shell completion writes it) names the directory run: the
// first save and every later one land there, with no temporaries inside.
BOOST_AUTO_TEST_CASE(a_trailing_slash_names_the_directory) {
  TempDir d;
  SafeTensorsWriter m, o;
  const std::vector<float> a = {1, 2};
  m.add<float>("w", {2}, a);
  const std::string slashed = (d.path / "run").string() + "/";
  write_checkpoint(slashed, m, o, {});
  write_checkpoint(slashed, m, o, TrainerState{3, 0, {}});
  BOOST_TEST(is_checkpoint(slashed));
  BOOST_TEST(read_trainer_state(d.path / "run").step == 3);
  BOOST_TEST(entries(d.path) == 1u);
  BOOST_TEST(entries(d.path / "run") == 3u);
}

// One writer per checkpoint directory: a second lock, from this process or
// another, names the holder; releasing the first frees the directory and
// removes the lock file.
BOOST_AUTO_TEST_CASE(a_checkpoint_directory_takes_one_writer) {
  TempDir d;
  {
    const CheckpointLock first(d.path / "run");
    try {
      const CheckpointLock second(d.path / "run/");
      BOOST_ERROR("a second lock on the same directory was taken");
    } catch (const Error& e) {
      const std::string expected = "another run is writing the checkpoint directory " + (d.path / "run").string() +
                                   " (process " + std::to_string(::getpid()) + ")";
      BOOST_TEST(std::string(e.what()).find(expected) == 0u, e.what());
    }
    const CheckpointLock other(d.path / "other");  // another directory: no conflict
  }
  const CheckpointLock again(d.path / "run");
  BOOST_TEST(entries(d.path) == 1u);  // the lock file of "run" alone
}

// A checkpoint directory holding a file of the user's is not replaced: the
// swap would delete the file with the old checkpoint.
BOOST_AUTO_TEST_CASE(a_checkpoint_with_foreign_files_is_not_replaced) {
  TempDir d;
  SafeTensorsWriter m, o;
  const std::vector<float> a = {1, 2};
  m.add<float>("w", {2}, a);
  write_checkpoint(d.path / "run", m, o, {});
  std::ofstream(d.path / "run" / "notes.txt") << "precious";
  try {
    write_checkpoint(d.path / "run", m, o, TrainerState{2, 0, {}});
    BOOST_FAIL("a checkpoint holding a user's file was replaced");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("it holds notes.txt, which is not part of a checkpoint") != std::string::npos,
               e.what());
  }
  BOOST_TEST(fs::exists(d.path / "run" / "notes.txt"));
  BOOST_TEST(read_trainer_state(d.path / "run").step == 0);
}

// Saves interrupted by a crash leave .<name>.new.XXXXXX directories;
// remove_interrupted_saves removes those of one target and nothing else.
BOOST_AUTO_TEST_CASE(interrupted_saves_are_cleaned_up) {
  TempDir d;
  auto make = [&](const std::string& name, std::initializer_list<const char*> files) {
    fs::create_directories(d.path / name);
    for (const char* f : files) std::ofstream(d.path / name / f) << "x";
  };
  make(".run.new.abc123", {kModelFile, kOptimizerFile});            // partial new checkpoint: removed
  make(".run.new.XyZ789", {kModelFile, kOptimizerFile, kTrainerStateFile});  // old one after a swap: removed
  make(".run.new.empty0", {});                                      // nothing written yet: removed
  make(".run.new.keep01", {kModelFile, "notes.txt"});                // a user's file inside: kept
  make(".run.new.toolong", {kModelFile});                           // not the pattern: kept
  make(".other.new.abc123", {kModelFile});                          // another target's: kept
  make("run", {kModelFile, kOptimizerFile, kTrainerStateFile});
  BOOST_TEST(remove_interrupted_saves(d.path / "run") == 3);
  BOOST_TEST(!fs::exists(d.path / ".run.new.abc123"));
  BOOST_TEST(!fs::exists(d.path / ".run.new.XyZ789"));
  BOOST_TEST(!fs::exists(d.path / ".run.new.empty0"));
  BOOST_TEST(fs::exists(d.path / ".run.new.keep01" / "notes.txt"));
  BOOST_TEST(fs::exists(d.path / ".run.new.toolong"));
  BOOST_TEST(fs::exists(d.path / ".other.new.abc123"));
  BOOST_TEST(is_checkpoint(d.path / "run"));
  BOOST_TEST(remove_interrupted_saves(d.path / "run") == 0);
  BOOST_TEST(remove_interrupted_saves(d.path / "absent" / "run") == 0);  // a parent that does not exist
}

// trainer_state.json round-trips, and each malformed one is an Error naming
// the file and the field.
BOOST_AUTO_TEST_CASE(trainer_state_json_is_checked) {
  const TrainerState st{42, 0xffffffffffffffffULL, {1, 2}};
  const TrainerState back = parse_trainer_state(trainer_state_json(st), "s.json");
  BOOST_TEST(back.step == 42);
  BOOST_TEST(back.data_rng == st.data_rng);
  BOOST_TEST(back.dropout_calls == st.dropout_calls, boost::test_tools::per_element());
  auto error = [](const std::string& text) {
    try {
      (void)parse_trainer_state(text, "s.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head = R"({"format": "xfmr-trainer", "version": 1, )";
  BOOST_TEST(error("[1") .find("s.json: not valid JSON") == 0u);
  BOOST_TEST(error(R"({"step": 1})") == "s.json: not an xfmr trainer state (format \"xfmr-trainer\")");
  BOOST_TEST(error(head + R"("data_rng": "1", "dropout_calls": []})") == "s.json: no 'step'");
  BOOST_TEST(error(head + R"("step": 1e100, "data_rng": "1", "dropout_calls": []})") ==
             "s.json: step 1e+100 is not an integer");
  BOOST_TEST(error(head + R"("step": -1, "data_rng": "1", "dropout_calls": []})").find("s.json: step -1 outside") == 0u);
  BOOST_TEST(error(head + R"("step": 1, "data_rng": "abc", "dropout_calls": []})") ==
             "s.json: data_rng 'abc' is not an integer");
  BOOST_TEST(error(head + R"("step": 1, "data_rng": "1", "dropout_calls": [-3]})") ==
             "s.json: dropout_calls holds -3, not a count");
  BOOST_TEST(error(std::string(100, '[')).find("nests deeper than") != std::string::npos);
}

namespace {
// A float32 checkpoint of `model` in `dir` (no optimizer moments needed).
template <class M>
void save_float(const fs::path& dir, M& model) {
  SafeTensorsWriter mw, ow;
  add_parameters(mw, model);
  mw.set_metadata("preset", "tiny");
  write_checkpoint(dir, mw, ow, TrainerState{5, 1, {}});
}
}  // namespace

// quantise_checkpoint: every matrix as the per-row int8 the CPU's int8
// precision makes (core/int8.hpp), its scales beside it, the rest and the
// metadata as they were; loading gives the matrices scale_r q_rk exactly.
BOOST_AUTO_TEST_CASE(int8_checkpoint_round_trip) {
  TempDir d;
  Decoder<TwoLayers, Be> a(29, 3), b(29, 4);
  save_float(d.path / "f32", a);
  const QuantisedCheckpoint report = quantise_checkpoint(d.path / "f32", d.path / "i8");
  BOOST_TEST(is_checkpoint(d.path / "i8"));
  BOOST_TEST(!fs::exists(d.path / "i8" / kOptimizerFile));  // for decoding: no optimizer state
  BOOST_TEST(read_trainer_state(d.path / "i8").step == 5);
  const Metadata meta = read_checkpoint_metadata(d.path / "i8");
  BOOST_TEST(meta.at("preset") == "tiny");
  BOOST_TEST(quantised_weights(meta) == "int8");
  BOOST_TEST(report.quantised_bytes == fs::file_size(d.path / "i8" / kModelFile));

  const SafeTensors st = SafeTensors::load(d.path / "i8" / kModelFile);
  int matrices = 0;
  std::vector<float> bound;  // a's elements' quantisation bound, in flat()'s order
  a.visit([&](std::string_view name, auto& v, auto&) {
    const std::string key(name);
    if (v.shape().size() != 2) {
      BOOST_TEST((st.info(key).dtype == DType::F32 && st.values<float>(key) == std::vector<float>(v.begin(), v.end())));
      bound.insert(bound.end(), v.size(), 0.0f);
      return;
    }
    ++matrices;
    const int rows = int(v.dim(0)), cols = int(v.dim(1));
    std::vector<std::int8_t> q(v.size());
    std::vector<float> scale(std::size_t(rows), 0.0f);
    for (int r = 0; r < rows; ++r) scale[std::size_t(r)] = detail::quantise_row_int8(v.data() + r * cols, cols, q.data() + r * cols);
    BOOST_TEST((st.info(key).dtype == DType::I8));
    const auto saved = st.bytes(key);
    BOOST_TEST(std::equal(q.begin(), q.end(), saved.begin(), [](std::int8_t x, std::byte y) { return x == std::int8_t(y); }));
    BOOST_TEST(st.values<float>(key + kScaleSuffix) == scale, boost::test_tools::per_element());
    for (std::size_t i = 0; i < v.size(); ++i) bound.push_back(0.5f * scale[i / std::size_t(cols)] * (1.0f + 1e-6f));
  });
  BOOST_TEST(report.matrices == matrices);

  // Loaded into another model: the matrices are scale_r q_rk, within half a
  // scale of the originals; the rest equal.
  load_parameters(b, st);
  std::vector<float> fa = flat(a), fb = flat(b);
  BOOST_TEST(fa.size() == fb.size());
  b.visit([&](std::string_view name, auto& v, auto&) {
    if (v.shape().size() != 2) return;
    const std::string key(name);
    const auto q = st.bytes(key);
    const auto scale = st.values<float>(key + kScaleSuffix);
    const int cols = int(v.dim(1));
    for (std::size_t i = 0; i < v.size(); ++i)
      BOOST_TEST_REQUIRE(v.data()[i] == scale[i / std::size_t(cols)] * float(std::int8_t(q[i])));
  });
  for (std::size_t i = 0; i < fa.size(); ++i) BOOST_TEST_REQUIRE(std::fabs(fa[i] - fb[i]) <= bound[i]);
}

// What quantise_checkpoint refuses, and what it may replace.
BOOST_AUTO_TEST_CASE(int8_checkpoint_destinations) {
  TempDir d;
  Decoder<TwoLayers, Be> a(29, 3);
  save_float(d.path / "f32", a);
  save_float(d.path / "other", a);
  BOOST_TEST(error_of([&] { quantise_checkpoint(d.path / "f32", d.path / "f32"); }).find("into itself") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { quantise_checkpoint(d.path / "f32", d.path / "other"); }).find("float32 checkpoint would be lost") !=
             std::string::npos);
  BOOST_TEST(is_checkpoint(d.path / "other"));
  BOOST_TEST(fs::exists(d.path / "other" / kOptimizerFile));  // untouched
  quantise_checkpoint(d.path / "f32", d.path / "i8");
  BOOST_CHECK_NO_THROW(quantise_checkpoint(d.path / "f32", d.path / "i8"));  // an int8 one is replaced
  BOOST_TEST(error_of([&] { quantise_checkpoint(d.path / "i8", d.path / "i8b"); }).find("int8 weights already") !=
             std::string::npos);
  BOOST_TEST(!fs::exists(d.path / "i8b"));
  Decoder<TwoLayers, CpuBackend<double>> wide(29, 3);
  SafeTensorsWriter mw, ow;
  add_parameters(mw, wide);
  write_checkpoint(d.path / "f64", mw, ow, TrainerState{});
  BOOST_TEST(error_of([&] { quantise_checkpoint(d.path / "f64", d.path / "i8c"); }).find("F64") != std::string::npos);
}

// A damaged or mismatched int8 file is refused on load, naming the tensor.
BOOST_AUTO_TEST_CASE(bad_int8_files_are_refused) {
  TempDir d;
  Decoder<TwoLayers, Be> a(29, 3);
  save_float(d.path / "f32", a);
  quantise_checkpoint(d.path / "f32", d.path / "i8");
  const SafeTensors good = SafeTensors::load(d.path / "i8" / kModelFile);
  const std::string matrix = "blocks.0.ff.fc1.weight", scales = matrix + kScaleSuffix;
  BOOST_TEST_REQUIRE((good.info(matrix).dtype == DType::I8));
  // good's tensors, with `edit` changing the named ones (or dropping them).
  auto rewritten = [&](const std::function<bool(const std::string&, SafeTensorsWriter&)>& edit) {
    SafeTensorsWriter w;
    for (const auto& n : good.names())
      if (!edit(n, w)) w.add(n, good.info(n).dtype, good.info(n).shape, good.bytes(n).data());
    return SafeTensors::parse(w.serialize(), "bad.safetensors");
  };
  auto load_error = [&](const SafeTensors& st) {
    Decoder<TwoLayers, Be> b(29, 4);
    return error_of([&] { load_parameters(b, st); });
  };
  auto has = [](const std::string& msg, const std::string& part) {
    BOOST_TEST_INFO(msg);
    BOOST_TEST(msg.find(part) != std::string::npos);
  };
  has(load_error(rewritten([&](const std::string& n, SafeTensorsWriter&) { return n == scales; })), "has no scales '" + scales);
  const int rows = int(good.info(matrix).shape[0]);
  auto with_scales = [&](std::vector<float> s, std::vector<std::int64_t> shape) {
    return rewritten([&, s, shape](const std::string& n, SafeTensorsWriter& w) {
      if (n != scales) return false;
      w.add<float>(n, shape, std::span<const float>(s));
      return true;
    });
  };
  has(load_error(with_scales(std::vector<float>(std::size_t(rows) + 1, 0.1f), {rows + 1})), "expected F32 [");
  std::vector<float> s = good.values<float>(scales);
  s[2] = -s[2];
  has(load_error(with_scales(s, {rows})), "at row 2");
  s[2] = std::nanf("");
  has(load_error(with_scales(s, {rows})), "must be finite");
  // Finite, but its weights are not: scale x 127 overflows float.
  s[2] = 3e38f;
  has(load_error(with_scales(s, {rows})), "at row 2; a scale must not be negative, and scale x 127");
  s[2] = std::nextafter(std::numeric_limits<float>::max() / 127.0f, 0.0f);  // the largest that is finite: loads
  BOOST_TEST(load_error(with_scales(s, {rows})) == "");
  has(load_error(rewritten([&](const std::string& n, SafeTensorsWriter& w) {
        if (n != matrix) return false;
        std::vector<std::int8_t> q(good.info(n).elements(), 1);
        q[7] = -128;
        w.add<std::int8_t>(n, good.info(n).shape, std::span<const std::int8_t>(q));
        return true;
      })),
      "-128 at element 7");
  // A vector stored as int8, and scales with no int8 matrix.
  const std::string bias = "blocks.0.ff.fc1.bias";
  has(load_error(rewritten([&](const std::string& n, SafeTensorsWriter& w) {
        if (n != bias) return false;
        std::vector<std::int8_t> q(good.info(n).elements(), 1);
        w.add<std::int8_t>(n, good.info(n).shape, std::span<const std::int8_t>(q));
        return true;
      })),
      "only matrices are stored as int8");
  has(load_error(rewritten([&](const std::string& n, SafeTensorsWriter& w) {
        if (n != bias) return false;
        const auto v = good.values<float>(n);
        w.add<float>(n, good.info(n).shape, std::span<const float>(v));
        w.add<float>(n + kScaleSuffix, good.info(n).shape, std::span<const float>(v));
        return true;
      })),
      "matches no parameter");
  // The int8 file of another model's shape.
  Decoder<TinyPre, Be> small(29, 1);
  has(error_of([&] { load_parameters(small, good); }), "matches no parameter");
}

BOOST_AUTO_TEST_SUITE_END()
