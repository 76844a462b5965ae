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
