// pretrained.cpp: which format a checkpoint is in, and which preset its
// config names (io/pretrained.hpp).
#include "xfmr/io/pretrained.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "xfmr/io/gguf.hpp"
#include "xfmr/text/text.hpp"

namespace fs = std::filesystem;

namespace xfmr {

std::string_view format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::gpt2: return "gpt2";
    case CheckpointFormat::hf_llama: return "llama";
    case CheckpointFormat::llama2c: return "llama2.c";
    case CheckpointFormat::xfmr: return "xfmr";
    case CheckpointFormat::gguf: return "gguf";
  }
  return "?";
}

CheckpointFormat checkpoint_format(const fs::path& path) {
  require(fs::exists(path), path.string(), ": no such file or directory (a Hugging Face model directory, its "
          ".safetensors file, or a llama2.c .bin file)");
  // Any other file is read as llama2.c's: its reader checks the header and
  // names the field it refuses (a legacy header has no magic to test first).
  if (fs::is_regular_file(path) && path.extension() != ".safetensors") {
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {};
    in.read(magic, 4);
    return std::string_view(magic, 4) == "GGUF" ? CheckpointFormat::gguf : CheckpointFormat::llama2c;
  }
  const fs::path file = fs::is_directory(path) ? path / "model.safetensors" : path;
  const fs::path config = file.parent_path() / "config.json";
  std::string type;
  if (fs::exists(config)) {
    const auto j = nlohmann::json::parse(read_text_file(config), nullptr, false);
    require(j.is_object(), config.string(), ": not a JSON object (", j.is_discarded() ? "unreadable or truncated JSON"
                                                                                     : "a JSON value of another kind",
            ")");
    require(j.contains("model_type") && j["model_type"].is_string(), config.string(),
            ": no model_type (\"gpt2\", \"llama\", \"qwen2\" or \"mistral\")");
    type = j["model_type"];
  } else {
    require(fs::exists(file), file.string(), ": no such file, and no config.json beside it");
    // A GPT-2 file xfmr wrote carries its config in its metadata.
    const SafeTensors st = SafeTensors::load(file);
    require(st.metadata().count("config"), file.string(), ": no config.json beside it to say what model it is");
    type = "gpt2";
  }
  if (type == "gpt2") return CheckpointFormat::gpt2;
  if (type == "llama" || type == "qwen2" || type == "mistral") return CheckpointFormat::hf_llama;
  detail::fail(config.string(), ": model_type \"", type,
               "\" is not one xfmr reads (\"gpt2\", \"llama\", \"qwen2\" or \"mistral\")");
}

PresetInfo llama2c_architecture(const Llama2cConfig& c) {
  HfLlamaConfig h;
  h.max_position_embeddings = c.seq_len, h.hidden_size = c.dim, h.num_attention_heads = c.n_heads;
  h.num_key_value_heads = c.n_kv_heads, h.num_hidden_layers = c.n_layers, h.intermediate_size = c.hidden_dim;
  PresetInfo p = hf_llama_architecture(h);
  if (p.name == "llama") p.name = "llama2.c";
  return p;
}

GgufLlama read_gguf_llama(const fs::path& path) {
  const GgufFile g = GgufFile::open(path);
  const std::string file = path.string(), arch = g.string("general.architecture");
  require(arch == "llama", file, ": general.architecture '", arch, "': xfmr reads GGUF's llama models so far");
  auto get = [&](const char* key) { return int(g.integer(std::string("llama.") + key)); };
  GgufLlama out;
  Llama2cConfig& c = out.checkpoint.config;
  c.dim = get("embedding_length"), c.hidden_dim = get("feed_forward_length"), c.n_layers = get("block_count");
  c.n_heads = get("attention.head_count");
  c.n_kv_heads = g.has("llama.attention.head_count_kv") ? get("attention.head_count_kv") : c.n_heads;
  c.seq_len = get("context_length");
  c.vocab_size = int(g.tensor("token_embd.weight").rows());
  c.shared_classifier = !g.has_tensor("output.weight");
  const std::string scaling = g.has("llama.rope.scaling.type") ? g.string("llama.rope.scaling.type") : "none";
  require(scaling == "none", file, ": rope scaling '", scaling, "' is not read from GGUF yet");
  HfLlamaConfig h;
  h.max_position_embeddings = c.seq_len, h.hidden_size = c.dim, h.num_attention_heads = c.n_heads;
  h.num_key_value_heads = c.n_kv_heads, h.num_hidden_layers = c.n_layers, h.intermediate_size = c.hidden_dim;
  if (g.has("llama.attention.layer_norm_rms_epsilon")) h.rms_norm_eps = g.number("llama.attention.layer_norm_rms_epsilon");
  if (g.has("llama.rope.freq_base")) h.rope_theta = g.number("llama.rope.freq_base");
  out.architecture = hf_llama_architecture(h);
  if (out.architecture.name == "llama") out.architecture.name = "gguf-llama";
  const std::int64_t rotary = g.has("llama.rope.dimension_count") ? g.integer("llama.rope.dimension_count")
                                                                    : c.dim / c.n_heads;
  require(rotary == c.dim / c.n_heads, file, ": rotary positions over ", rotary, " of a head's ", c.dim / c.n_heads,
          " dimensions (partial rotary) are not built");
  // The tensors by xfmr's names, as llama2.c's reader gives them: q, k and
  // v rows stacked, gate and up rows stacked (GGUF's llama files keep q and
  // k in Meta's interleaved rotary order, xfmr's own). Matrices are
  // (rows, inner) row-major: GGUF's shape is innermost first.
  auto tensor = [&](const std::string& name) {
    const GgufTensor& t = g.tensor(name);
    Llama2cCheckpoint::Tensor out_t;
    out_t.values = g.values(t);
    if (t.shape.size() == 1) out_t.shape = {std::int64_t(t.shape[0])};
    else out_t.shape = {std::int64_t(t.rows()), std::int64_t(t.shape[0])};
    return out_t;
  };
  auto stacked = [&](std::initializer_list<std::string> names) {
    Llama2cCheckpoint::Tensor s;
    std::int64_t rows = 0, cols = 0;
    for (const std::string& n : names) {
      Llama2cCheckpoint::Tensor part = tensor(n);
      rows += part.shape[0], cols = part.shape[1];
      s.values.insert(s.values.end(), part.values.begin(), part.values.end());
    }
    s.shape = {rows, cols};
    return s;
  };
  auto& t = out.checkpoint.tensors;
  t["tok_emb.weight"] = tensor("token_embd.weight");
  t["ln_f.weight"] = tensor("output_norm.weight");
  if (!c.shared_classifier) t["lm_head.weight"] = tensor("output.weight");
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", x = "blocks." + std::to_string(i) + ".";
    t[x + "ln1.weight"] = tensor(b + "attn_norm.weight");
    t[x + "attn.qkv.weight"] = stacked({b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"});
    t[x + "attn.proj.weight"] = tensor(b + "attn_output.weight");
    t[x + "ln2.weight"] = tensor(b + "ffn_norm.weight");
    t[x + "ff.fc1.weight"] = stacked({b + "ffn_gate.weight", b + "ffn_up.weight"});
    t[x + "ff.fc2.weight"] = tensor(b + "ffn_down.weight");
  }
  out.checkpoint.file = path;
  return out;
}

void write_gguf_llama(const PresetInfo& p, int vocab, bool tied, GgmlType type,
                      const std::map<std::string, std::vector<float>>& t, const ModelTokenizer* tok,
                      const fs::path& path) {
  GgufWriter w;
  w.add("general.architecture", std::string("llama"));
  w.add("general.name", p.name);
  w.add("llama.context_length", std::uint32_t(p.max_t));
  w.add("llama.embedding_length", std::uint32_t(p.d_model));
  w.add("llama.block_count", std::uint32_t(p.n_layers));
  w.add("llama.feed_forward_length", std::uint32_t(p.d_ff));
  w.add("llama.attention.head_count", std::uint32_t(p.n_heads));
  w.add("llama.attention.head_count_kv", std::uint32_t(p.kv_heads()));
  w.add("llama.attention.layer_norm_rms_epsilon", float(p.norm_eps));
  w.add("llama.rope.freq_base", float(p.rope_theta));
  w.add("llama.rope.dimension_count", std::uint32_t(p.qk_head()));
  w.add("llama.vocab_size", std::uint32_t(vocab));
  require(p.rope_scaling.kind == RopeScaling::none && !p.qkv_bias, path.string(),
          ": rope scaling and q/k/v biases are not written to GGUF yet");
  if (tok) {
    const Llama2cTokenizer* sp = tok->sentencepiece();
    require(sp != nullptr, path.string(), ": a GGUF carries a SentencePiece (llama) tokenizer so far; this model's is "
            "byte-level BPE");
    require(sp->vocab_size() == vocab, path.string(), ": the tokenizer's ", sp->vocab_size(), " pieces, the model's ",
            vocab, " rows");
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<std::int32_t> types;  // llama.cpp's: 1 normal, 2 unknown, 3 control, 6 byte
    for (std::int32_t id = 0; id < vocab; ++id) {
      std::string piece;
      for (char ch : sp->piece(id)) piece += ch == ' ' ? std::string("\xe2\x96\x81") : std::string(1, ch);
      const bool byte = piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">");
      types.push_back(id == 0 ? 2 : id <= Llama2cTokenizer::kEos ? 3 : byte ? 6 : 1);
      pieces.push_back(std::move(piece));
      scores.push_back(sp->score(id));
    }
    w.add("tokenizer.ggml.model", std::string("llama"));
    w.add("tokenizer.ggml.tokens", pieces);
    w.add("tokenizer.ggml.scores", scores);
    w.add("tokenizer.ggml.token_type", types);
    w.add("tokenizer.ggml.bos_token_id", std::uint32_t(Llama2cTokenizer::kBos));
    w.add("tokenizer.ggml.eos_token_id", std::uint32_t(Llama2cTokenizer::kEos));
    w.add("tokenizer.ggml.unknown_token_id", std::uint32_t(0));
    w.add("tokenizer.ggml.add_bos_token", true);
  }
  const std::uint64_t D = p.d_model, F = p.d_ff, Q = std::uint64_t(p.n_heads) * p.qk_head();
  const std::uint64_t KV = std::uint64_t(p.kv_heads()) * p.qk_head();
  auto at = [&](const std::string& name) -> const std::vector<float>& {
    const auto it = t.find(name);
    require(it != t.end(), "write_gguf_llama: no tensor '", name, "' in the model");
    return it->second;
  };
  // A matrix of `rows` rows of `cols` from `first` of a stacked one.
  auto rows_of = [](const std::vector<float>& m, std::uint64_t first, std::uint64_t rows, std::uint64_t cols) {
    return std::span<const float>(m.data() + first * cols, rows * cols);
  };
  // A matrix whose rows are not whole blocks of `type` is written in F16
  // (as llama.cpp's quantize falls back).
  const auto matrix = [&](const std::string& name, std::uint64_t cols, std::uint64_t rows, std::span<const float> v) {
    const bool blocks = type != GgmlType::q8_0 && type != GgmlType::q4_0;
    w.add_tensor(name, {cols, rows}, blocks || cols % 32 == 0 ? type : GgmlType::f16, v);
  };
  matrix("token_embd.weight", D, std::uint64_t(vocab), at("tok_emb.weight"));
  w.add_tensor("output_norm.weight", {D}, GgmlType::f32, at("ln_f.weight"));
  if (!tied) matrix("output.weight", D, std::uint64_t(vocab), at("lm_head.weight"));
  for (int i = 0; i < p.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", x = "blocks." + std::to_string(i) + ".";
    const std::vector<float>& qkv = at(x + "attn.qkv.weight");
    const std::vector<float>& fc1 = at(x + "ff.fc1.weight");
    w.add_tensor(b + "attn_norm.weight", {D}, GgmlType::f32, at(x + "ln1.weight"));
    matrix(b + "attn_q.weight", D, Q, rows_of(qkv, 0, Q, D));
    matrix(b + "attn_k.weight", D, KV, rows_of(qkv, Q, KV, D));
    matrix(b + "attn_v.weight", D, KV, rows_of(qkv, Q + KV, KV, D));
    matrix(b + "attn_output.weight", Q, D, at(x + "attn.proj.weight"));
    w.add_tensor(b + "ffn_norm.weight", {D}, GgmlType::f32, at(x + "ln2.weight"));
    matrix(b + "ffn_gate.weight", D, F, rows_of(fc1, 0, F, D));
    matrix(b + "ffn_up.weight", D, F, rows_of(fc1, F, F, D));
    matrix(b + "ffn_down.weight", F, D, at(x + "ff.fc2.weight"));
  }
  w.write(path);
}

FoundTokenizer load_model_tokenizer(CheckpointFormat format, const fs::path& weights, const Metadata& metadata,
                                    int vocab, const fs::path& given) {
  const fs::path model = format == CheckpointFormat::xfmr ? weights.parent_path() : weights;
  fs::path source = given;
  if (source.empty() && format == CheckpointFormat::xfmr) {
    source = metadata.count("tokenizer") ? fs::path(metadata.at("tokenizer")) : model;  // an older checkpoint's
    for (const auto& e : fs::directory_iterator(model))
      if (is_tokenizer_file_name(e.path().filename().string())) source = model;
  } else if (source.empty()) {
    source = format == CheckpointFormat::gguf ? fs::absolute(weights) : fs::absolute(weights).parent_path();
  }
  ModelTokenizer tokenizer = ModelTokenizer::load(source);
  const int padding = vocab > 0 ? tokenizer.check_fits(vocab, "the model " + model.string()) : 0;
  return {std::move(tokenizer), fs::absolute(source), padding};
}

}  // namespace xfmr
