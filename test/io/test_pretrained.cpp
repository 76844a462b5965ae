// Published checkpoints by format and shape (io/pretrained.hpp): every
// published preset is what a config of its shape picks; a shape no preset
// has is refused with the family's list; a model saved in its family's
// Hugging Face layout, or written as a llama2.c .bin, loads back as the same
// preset, parameter for parameter.
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/parameters.hpp"
#include "xfmr/backend/cpu.hpp"
#include "xfmr/backend/factory.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"
#include "xfmr/io/llama2c.hpp"
#include "xfmr/io/pretrained.hpp"
#include "xfmr/io/model_tokenizer.hpp"

BOOST_AUTO_TEST_SUITE(test_pretrained)

using namespace xfmr;
using Cpu = CpuBackend<float>;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("xfmr_pretrained_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<float> logits(LanguageModel<Cpu>& m) {
  Cpu be;
  std::vector<std::int32_t> ids(6);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t(i * 7 % m.vocab());
  const auto l = m.forward(be, ids, Shape{1, 6});
  return {l.begin(), l.end()};
}

void check_has(const std::string& error, const std::string& part) {
  BOOST_TEST(error.find(part) != std::string::npos, "'" << error << "' does not say '" << part << "'");
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_config_of_a_preset_shape_takes_its_name) {
  int gpt2 = 0, llama = 0;
  for (const std::string_view name : LanguageModelPresets::names()) {
    const PresetInfo p = LanguageModelPresets::info(name);
    BOOST_TEST_CONTEXT(name) {
      if (gpt2_shaped(p)) {
        Gpt2Config c;
        c.n_positions = p.max_t, c.n_embd = p.d_model, c.n_layer = p.n_layers, c.n_head = p.n_heads;
        c.n_inner = p.d_ff;
        BOOST_TEST(gpt2_architecture(c).name == name);
        BOOST_TEST(gpt2_architecture(c).shape() == p.shape());
        ++gpt2;
      } else if (llama_shaped(p)) {
        const HfLlamaConfig c = detail::hf_llama_config_of(p, 32000, true);
        BOOST_TEST(hf_llama_architecture(c).name == name);
        Llama2cConfig l;
        l.dim = p.d_model, l.hidden_dim = p.d_ff, l.n_layers = p.n_layers, l.n_heads = p.n_heads;
        l.n_kv_heads = p.n_kv_heads, l.vocab_size = 32000, l.seq_len = p.max_t;
        BOOST_TEST(llama2c_architecture(l).name == name);
        BOOST_TEST(llama2c_architecture(l).shape() == p.shape());
        ++llama;
      }
    }
  }
  BOOST_TEST(gpt2 == 5);   // tiny, names, distilgpt2, gpt2-small, gpt2-medium
  BOOST_TEST(llama == 5);  // shakespeare-llama, stories15m, stories42m, stories110m, smollm-135m
  // The published shapes as their configs give them.
  const PresetInfo smol = LanguageModelPresets::info("smollm-135m");
  BOOST_TEST(smol.shape() == "D576 H9 KV3 L30 T2048 FF1536");
  BOOST_TEST(LanguageModelPresets::info("stories42m").shape() == "D512 H8 L8 T1024 FF1376");
  BOOST_TEST(LanguageModelPresets::info("gpt2-medium").shape() == "D1024 H16 L24 T1024 FF4096");
}

// A shape no preset has is the family's architecture at that shape, with
// the config's knobs: no preset needs to be compiled in for it.
BOOST_AUTO_TEST_CASE(a_shape_no_preset_has_is_its_family_at_that_shape) {
  Gpt2Config c;
  c.n_embd = 1280, c.n_layer = 36, c.n_head = 20, c.n_positions = 2048, c.layer_norm_epsilon = 1e-6;
  const PresetInfo g = gpt2_architecture(c);
  BOOST_TEST(g.name == "gpt2");
  BOOST_TEST(g.shape() == "D1280 H20 L36 T2048 FF5120");
  BOOST_TEST(g.norm_eps == 1e-6);
  BOOST_TEST(gpt2_shaped(g));
  HfLlamaConfig l = detail::hf_llama_config_of(LanguageModelPresets::info("smollm-135m"), 49152, true);
  l.max_position_embeddings = 8192, l.rope_theta = 1e5;  // SmolLM2-135M's context and theta
  const PresetInfo s = hf_llama_architecture(l);
  BOOST_TEST(s.name == "llama");
  BOOST_TEST(s.shape() == "D576 H9 KV3 L30 T8192 FF1536");
  BOOST_TEST(s.rope_theta == 1e5);
  BOOST_TEST(llama_shaped(s));
  // The model builds, and its name and knobs are what it reports.
  auto m = make_language_model<Cpu>(s.with_dims([&] {
    ModelDims d = s.dims();
    d.n_layers = 1, d.max_t = 64;  // small enough to build here
    return d;
  }()), 100, 1);
  BOOST_TEST(m->preset().rope_theta == 1e5);
  BOOST_TEST(m->preset().name == "llama");
}

// Saved in its family's Hugging Face layout, a model comes back as the same
// preset with the same parameters and logits; tied or not, as it was.
BOOST_AUTO_TEST_CASE(save_pretrained_then_load_pretrained_is_bitwise) {
  struct Case {
    const char* preset;
    DecoderOptions opts;
    CheckpointFormat format;
  };
  for (const Case& c : {Case{"tiny", kGpt2Options, CheckpointFormat::gpt2},
                        Case{"shakespeare-llama", {.tie_weights = true, .head_bias = false}, CheckpointFormat::hf_llama},
                        Case{"shakespeare-llama", {.head_bias = false}, CheckpointFormat::hf_llama}}) {
    BOOST_TEST_CONTEXT(c.preset << ", tied " << c.opts.tie_weights) {
      const auto model = make_language_model<Cpu>(c.preset, 71, 3, c.opts);
      const fs::path d = fresh_dir("save");
      save_pretrained(*model, d);
      BOOST_TEST((checkpoint_format(d) == c.format));
      const auto back = load_pretrained<Cpu>(d, {.dropout = 0.1f});
      BOOST_TEST(back.model->preset().name == c.preset);
      BOOST_TEST(back.model->options().tie_weights == c.opts.tie_weights);
      BOOST_TEST(back.model->options().dropout == 0.1f);
      BOOST_TEST((back.file == d / "model.safetensors"));
      BOOST_TEST((test::host_parameters(*back.model) == test::host_parameters(*model)));
      back.model->set_training(false);
      BOOST_TEST((logits(*back.model) == logits(*model)));
      fs::remove_all(d);
    }
  }
  // published_head: what a preset needs to export as its family.
  const PresetInfo llama = LanguageModelPresets::info("shakespeare-llama"), small = LanguageModelPresets::info("shakespeare-small");
  BOOST_TEST((published_head(llama, {.dropout = 0.1f}).tie_weights && !published_head(llama).head_bias));
  BOOST_TEST(published_head(llama, {.dropout = 0.1f}).dropout == 0.1f);
  BOOST_TEST((!published_head(small).tie_weights && published_head(small).head_bias));
  const auto relu = make_language_model<Cpu>("shakespeare-small", 11, 3, kGpt2Options);
  check_has(test::error_of([&] { save_pretrained(*relu, fresh_dir("relu")); }), "'shakespeare-small' (D64 H4 L4 T32 FF256) is not Llama-shaped");
}

// A model loaded to decode (load_model) holds no gradients, and none of
// its matrices in float32 until asked: they stay in the mapped file. In a
// WeightCopies scope each precision's copies are made from the file (in
// bf16, int8 and q4 no matrix is ever read into float32), and the logits
// are those of the same model held in memory, bit for bit; nothing of
// training is allocated. A Trainer converts the model to float32 master
// weights and gradients, the file's values.
BOOST_AUTO_TEST_CASE(a_loaded_model_holds_no_gradients_and_decodes_from_its_file) {
  const fs::path d = fresh_dir("deferred");
  {
    const auto model = make_language_model<Cpu>("shakespeare-llama", 71, 3, {.tie_weights = false, .head_bias = false});
    save_pretrained(*model, d);
  }
  auto count = [](LanguageModel<Cpu>& m) {
    std::size_t deferred = 0, matrices = 0, gradient_bytes = 0;
    m.visit([&](std::string_view, auto& value, auto& grad) {
      matrices += value.shape().size() == 2;
      deferred += value.deferred();
      gradient_bytes += grad.allocated_bytes();
    });
    return std::array<std::size_t, 3>{deferred, matrices, gradient_bytes};
  };
  std::vector<std::string> precisions = {"fp32", "int8", "q4"};
  if (bf16::available()) precisions.push_back("bf16");
  const std::vector<std::int32_t> ids = {1, 8, 15, 22, 29, 36, 43, 50};
  for (const std::string& precision : precisions) {
    BOOST_TEST_CONTEXT(precision) {
      auto loaded = load_model<Cpu>(d), held = load_model<Cpu>(d);
      LanguageModel<Cpu>& m = *loaded.model;
      m.set_training(false), held.model->set_training(false);
      auto c = count(m);
      BOOST_TEST((c[0] == c[1] && c[1] > 0 && c[2] == 0u));  // every matrix deferred, no gradient
      (void)test::host_parameters(*held.model);            // read into memory
      BOOST_TEST(count(*held.model)[0] == 0u);
      Cpu be = make_backend<Cpu>("cpu", precision), be_held = make_backend<Cpu>("cpu", precision);
      std::vector<float> a, b;
      {
        const WeightCopies copies(be, m), copies_held(be_held, *held.model);
        const auto la = m.forward(be, ids, Shape{1, 8});
        a.assign(la.begin(), la.end());
        const auto lb = held.model->forward(be_held, ids, Shape{1, 8});
        b.assign(lb.begin(), lb.end());
        BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        c = count(m);
        BOOST_TEST(c[2] == 0u);
        if (precision != "fp32") BOOST_TEST(c[0] == c[1]);  // the copies made from the file; no float32 matrix
      }
      AdamW<Cpu> opt(m);
      Trainer<LanguageModel<Cpu>, Cpu> trainer(m, be_held, opt, {});
      c = count(m);
      BOOST_TEST(c[0] == 0u);  // float32 master weights now,
      m.visit([&](std::string_view, auto&, auto& grad) { BOOST_TEST(grad.allocated_bytes() == grad.size() * 4); });
      BOOST_TEST((test::host_parameters(m) == test::host_parameters(*held.model)));  // the file's values
    }
  }
  fs::remove_all(d);
}

// An export is one directory xfmr-lm and transformers both load: the
// tokenizer under its canonical name, written with the model and swapped in
// whole, so nothing of an earlier export stays beside it; what is not an
// export's is never deleted.
BOOST_AUTO_TEST_CASE(an_export_is_a_whole_directory_with_its_tokenizer) {
  const fs::path d = fresh_dir("export"), tok_file = d / "tok.json", e = d / "hf";
  fs::copy_file(fs::path(XFMR_FIXTURE_DIR) / "lm" / "tokenizer.json", tok_file);
  const ModelTokenizer tok = ModelTokenizer::load(tok_file);
  const auto model = make_language_model<Cpu>("tiny", tok.size(), 3, kGpt2Options);
  save_pretrained(*model, e, false, tok.attached_files());
  BOOST_TEST(fs::exists(e / "tokenizer.json"));
  BOOST_TEST(!fs::exists(e / "tok.json"));
  BOOST_TEST(ModelTokenizer::load(e).content_hash() == tok.content_hash());
  BOOST_TEST(ModelTokenizer::load(e).size() == tok.size());
  // A stale tokenizer of another kind goes with the rest of the old export.
  std::ofstream(e / "vocab.json") << "{}";
  check_has(test::error_of([&] { save_pretrained(*model, e, false, tok.attached_files()); }), "needs overwrite");
  save_pretrained(*model, e, true, tok.attached_files());
  BOOST_TEST(!fs::exists(e / "vocab.json"));
  BOOST_TEST(fs::exists(e / "tokenizer.json"));
  // A file an export does not write is named, and stays.
  std::ofstream(e / "notes.txt") << "mine";
  check_has(test::error_of([&] { save_pretrained(*model, e, true, tok.attached_files()); }),
            "it holds notes.txt, which is not part of an export");
  BOOST_TEST(fs::exists(e / "notes.txt"));
  BOOST_TEST(fs::exists(e / "model.safetensors"));
  // load_model_tokenizer: an export's is beside its weights; one named
  // instead is read; a checkpoint's is its own copy (Trainer::save's
  // attached files), else none, said so.
  const Pretrained<Cpu> exported = load_model<Cpu>(e);
  FoundTokenizer found = load_model_tokenizer(exported);
  BOOST_TEST(found.tokenizer.content_hash() == tok.content_hash());
  BOOST_TEST(found.source == fs::absolute(e));
  BOOST_TEST(found.padding == 0);
  BOOST_TEST(load_model_tokenizer(exported, tok_file).source == fs::absolute(tok_file));
  SafeTensorsWriter weights;
  add_parameters(weights, *model);
  weights.set_metadata("preset", "tiny");
  write_checkpoint(d / "ck", weights, TrainerState{}, tok.attached_files());
  BOOST_TEST(load_model_tokenizer(load_model<Cpu>(d / "ck")).tokenizer.content_hash() == tok.content_hash());
  write_checkpoint(d / "bare", weights, TrainerState{});
  check_has(test::error_of([&] { (void)load_model_tokenizer(load_model<Cpu>(d / "bare")); }), "no tokenizer here");
  // The content hash follows the bytes, not the path.
  std::ofstream(tok_file, std::ios::app) << "\n";
  BOOST_TEST(ModelTokenizer::load(tok_file).content_hash() != tok.content_hash());
  fs::remove_all(d);
}

// A tokenizer fits a model's vocabulary: never larger; smaller only by a
// padding up to a multiple of 64.
BOOST_AUTO_TEST_CASE(a_tokenizer_must_fit_the_models_vocabulary) {
  const ModelTokenizer tok = ModelTokenizer::load(fs::path(XFMR_FIXTURE_DIR) / "lm" / "tokenizer.json");
  const int n = tok.size(), padded = (n / 64 + 1) * 64;
  BOOST_TEST(tok.check_fits(n, "m") == 0);
  BOOST_TEST(tok.check_fits(padded, "m") == padded - n);
  check_has(test::error_of([&] { (void)tok.check_fits(n - 1, "the model m"); }),
            "tokens, more than the " + std::to_string(n - 1) + " of the model m's vocabulary");
  check_has(test::error_of([&] { (void)tok.check_fits(padded + 1, "m"); }), "fewer than the");
  check_has(test::error_of([&] { (void)tok.check_fits(n + 2048 - n % 64, "m"); }), "it could not decode");
}

namespace {
// A model of Llama's shape as llama2.c's version-1 .bin (export.py's
// layout: header, norms, embedding, then each matrix kind for all layers).
void write_llama2c_v1(LanguageModel<Cpu>& m, const fs::path& file) {
  const PresetInfo& p = m.preset();
  std::map<std::string, std::vector<float>> t;
  m.visit([&](std::string_view name, auto& value, auto&) {
    std::vector<float> host(value.size());
    value.copy_to_host(host.data());
    t[std::string(name)] = std::move(host);
  });
  const std::size_t D = std::size_t(p.d_model), F = std::size_t(p.d_ff), kv = D / std::size_t(p.n_heads) * std::size_t(p.n_kv_heads);
  std::ofstream out(file, std::ios::binary);
  const auto put = [&](const float* v, std::size_t n) { out.write(reinterpret_cast<const char*>(v), std::streamsize(n * 4)); };
  const auto layer = [&](int i, const char* part) -> std::vector<float>& { return t["blocks." + std::to_string(i) + "." + part]; };
  char header[256] = {};
  const std::uint32_t magic = 0x616b3432;
  const std::int32_t fields[8] = {1, p.d_model, p.d_ff, p.n_layers, p.n_heads, p.n_kv_heads, m.vocab(), p.max_t};
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, fields, sizeof fields);
  header[36] = m.options().tie_weights ? 1 : 0;
  out.write(header, sizeof header);
  for (const char* norm : {"ln1.weight", "ln2.weight"})
    for (int i = 0; i < p.n_layers; ++i) put(layer(i, norm).data(), D);
  put(t["ln_f.weight"].data(), D);
  put(t["tok_emb.weight"].data(), t["tok_emb.weight"].size());
  const std::pair<std::size_t, std::size_t> qkv[3] = {{0, D}, {D, kv}, {D + kv, kv}};  // (first row, rows)
  for (const auto& [first, rows] : qkv)
    for (int i = 0; i < p.n_layers; ++i) put(layer(i, "attn.qkv.weight").data() + first * D, rows * D);
  for (int i = 0; i < p.n_layers; ++i) put(layer(i, "attn.proj.weight").data(), D * D);
  for (int i = 0; i < p.n_layers; ++i) put(layer(i, "ff.fc1.weight").data(), F * D);  // w1: the gate
  for (int i = 0; i < p.n_layers; ++i) put(layer(i, "ff.fc2.weight").data(), D * F);
  for (int i = 0; i < p.n_layers; ++i) put(layer(i, "ff.fc1.weight").data() + F * D, F * D);  // w3: up
  if (!m.options().tie_weights) put(t["lm_head.weight"].data(), t["lm_head.weight"].size());
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_llama2c_file_loads_as_its_preset) {
  const auto model = make_language_model<Cpu>("shakespeare-llama", 37, 4, {.tie_weights = true, .head_bias = false});
  const fs::path d = fresh_dir("llama2c");
  write_llama2c_v1(*model, d / "model.bin");
  BOOST_TEST((checkpoint_format(d / "model.bin") == CheckpointFormat::llama2c));
  const auto back = load_pretrained<Cpu>(d / "model.bin");
  BOOST_TEST(back.model->preset().name == "shakespeare-llama");
  BOOST_TEST(back.model->options().tie_weights);
  BOOST_TEST((test::host_parameters(*back.model) == test::host_parameters(*model)));
  fs::remove_all(d);
}

BOOST_AUTO_TEST_CASE(what_is_not_a_checkpoint_is_refused_by_name) {
  const fs::path d = fresh_dir("bad");
  check_has(test::error_of([&] { (void)checkpoint_format(d / "none"); }), "none: no such file or directory");
  std::ofstream(d / "config.json") << R"({"model_type": "bert"})";
  check_has(test::error_of([&] { (void)checkpoint_format(d); }), "model_type \"bert\" is not one xfmr reads");
  std::ofstream(d / "config.json") << R"({"vocab_size": 3})";
  check_has(test::error_of([&] { (void)checkpoint_format(d); }), "config.json: no model_type");
  std::ofstream(d / "notes.txt") << "hello, world, this is not a model file";
  // A file that is not .safetensors is read as llama2.c's, whose reader
  // names the header field it refuses and asks whether the file is one.
  BOOST_TEST((checkpoint_format(d / "notes.txt") == CheckpointFormat::llama2c));
  check_has(test::error_of([&] { (void)read_llama2c(d / "notes.txt"); }),
            "notes.txt: llama2.c legacy header (no version-1 magic \"ak42\"; is this a llama2.c .bin file?) field dim is "
            "1819043176");
  fs::remove_all(d);
}

BOOST_AUTO_TEST_SUITE_END()
