// gguf_model.cpp: GGUF files' language models in and out
// (io/gguf_model.hpp).
#include "xfmr/io/gguf_model.hpp"

#include <cmath>
#include <cstdint>
#include <set>

#include "xfmr/core/error.hpp"
#include "xfmr/io/gpt2.hpp"
#include "xfmr/io/hf_llama.hpp"
#include "xfmr/io/model_tokenizer.hpp"
#include "xfmr/io/weight_sources.hpp"
#include "xfmr/layers/positional.hpp"

namespace fs = std::filesystem;

namespace xfmr {

namespace {

using GgufShape = std::vector<std::uint64_t>;  // innermost first, as the file's

// The tensors an architecture of preset p needs, by GGUF name, with their
// shapes (the head's only when untied; rope_freqs.weight apart).
std::map<std::string, GgufShape> expected_tensors(const std::string& family, const PresetInfo& p, int vocab, bool tied) {
  const std::uint64_t D = p.d_model, F = p.d_ff, V = vocab, Q = std::uint64_t(p.n_heads) * p.qk_head();
  const std::uint64_t KV = std::uint64_t(p.kv_heads()) * p.qk_head();
  std::map<std::string, GgufShape> t{{"token_embd.weight", {D, V}}, {"output_norm.weight", {D}}};
  if (!tied) t["output.weight"] = {D, V};
  const bool gpt2 = family == "gpt2";
  if (gpt2) t["position_embd.weight"] = {D, std::uint64_t(p.max_t)}, t["output_norm.bias"] = {D};
  for (int i = 0; i < p.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t[b + "attn_norm.weight"] = {D};
    t[b + "ffn_norm.weight"] = {D};
    t[b + "attn_output.weight"] = {Q, D};
    t[b + "ffn_up.weight"] = {D, F};
    t[b + "ffn_down.weight"] = {F, D};
    if (gpt2) {
      t[b + "attn_qkv.weight"] = {D, 3 * D}, t[b + "attn_qkv.bias"] = {3 * D};
      for (const char* n : {"attn_norm.bias", "ffn_norm.bias", "attn_output.bias", "ffn_down.bias"}) t[b + n] = {D};
      t[b + "ffn_up.bias"] = {F};
      continue;
    }
    t[b + "attn_q.weight"] = {D, Q}, t[b + "attn_k.weight"] = {D, KV}, t[b + "attn_v.weight"] = {D, KV};
    t[b + "ffn_gate.weight"] = {D, F};
    if (p.qkv_bias) t[b + "attn_q.bias"] = {Q}, t[b + "attn_k.bias"] = {KV}, t[b + "attn_v.bias"] = {KV};
  }
  return t;
}

std::string shape_text(const GgufShape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Llama 3.1's rope scaling from llama.cpp's rope_freqs.weight: the factor
// by which each rotary pair's divisor grows. Read as RopeScaling::llama3
// when it is that scaling's for a factor the file names (or Meta's 8 or
// 32) and Meta's other parameters, to float precision.
RopeScaling llama3_scaling(const GgufFile& g, const std::string& family, const PresetInfo& p) {
  const std::vector<float> f = g.values(g.tensor("rope_freqs.weight"));
  const std::string file = g.path().string();
  const int width = p.qk_head();
  require(int(f.size()) == width / 2, file, ": rope_freqs.weight holds ", f.size(), " factors; a head of ", width,
          " has ", width / 2, " rotary pairs");
  std::vector<double> factors{8.0, 32.0};
  const std::string key = family + ".rope.scaling.factor";
  if (g.has(key)) factors.insert(factors.begin(), g.number(key));
  for (const double factor : factors) {
    RopeScaling s{RopeScaling::llama3, factor, 1.0, 4.0, 8192};
    bool same = true;
    for (int i = 0; i < width / 2 && same; ++i) {
      const double want =
          detail::angle_divisor(i, width, p.rope_theta, s) / detail::angle_divisor(i, width, p.rope_theta, {});
      same = std::abs(f[std::size_t(i)] - want) <= 1e-5 * want;
    }
    if (same) return s;
  }
  detail::fail(file, ": rope_freqs.weight is not Llama 3's rope scaling (factor 8 or 32",
               g.has(key) ? " or the file's " + std::to_string(g.number(key)) : std::string(),
               ", low 1, high 4, original context 8192); other rotary factors are not built");
}

}  // namespace

GgufModel open_gguf_model(const fs::path& path) {
  GgufModel m;
  m.file = std::make_shared<const GgufFile>(GgufFile::open(path));
  const GgufFile& g = *m.file;
  const std::string file = path.string();
  m.family = g.string("general.architecture");
  const std::string& a = m.family;
  require(a == "llama" || a == "qwen2" || a == "gpt2", file, ": general.architecture '", a,
          "' is not one xfmr reads (llama, qwen2, gpt2)");
  auto get = [&](const std::string& key) {
    const std::int64_t v = g.integer(a + "." + key);
    require(v > 0 && v < (std::int64_t(1) << 31), file, ": ", a, ".", key, " is ", v);
    return int(v);
  };
  require(g.has_tensor("token_embd.weight") && g.tensor("token_embd.weight").shape.size() == 2, file,
          ": no token embedding 'token_embd.weight' (a matrix)");
  m.vocab = int(g.tensor("token_embd.weight").rows());
  m.tied = !g.has_tensor("output.weight");
  PresetInfo& p = m.architecture;
  if (a == "gpt2") {
    Gpt2Config c;
    c.vocab_size = m.vocab, c.n_positions = get("context_length"), c.n_embd = get("embedding_length");
    c.n_layer = get("block_count"), c.n_head = get("attention.head_count"), c.n_inner = get("feed_forward_length");
    const std::string eps = a + ".attention.layer_norm_epsilon";
    if (g.has(eps)) c.layer_norm_epsilon = g.number(eps);
    if (g.has(a + ".attention.head_count_kv"))
      require(get("attention.head_count_kv") == c.n_head, file, ": a GPT-2 with grouped key/value heads is not built");
    p = gpt2_architecture(c);
  } else {
    HfLlamaConfig h;
    h.model_type = a;
    h.vocab_size = m.vocab, h.max_position_embeddings = get("context_length"), h.hidden_size = get("embedding_length");
    h.num_hidden_layers = get("block_count"), h.intermediate_size = get("feed_forward_length");
    h.num_attention_heads = get("attention.head_count");
    h.num_key_value_heads = g.has(a + ".attention.head_count_kv") ? get("attention.head_count_kv") : h.num_attention_heads;
    h.tie_word_embeddings = m.tied;
    h.qkv_bias = a == "qwen2";
    const std::string eps = a + ".attention.layer_norm_rms_epsilon", theta = a + ".rope.freq_base";
    if (g.has(eps)) h.rms_norm_eps = g.number(eps);
    if (g.has(theta)) h.rope_theta = g.number(theta);
    require(h.hidden_size % h.num_attention_heads == 0 && h.num_attention_heads % h.num_key_value_heads == 0, file,
            ": ", h.num_attention_heads, " heads of ", h.num_key_value_heads, " key/value heads over a width of ",
            h.hidden_size);
    const int head = h.hidden_size / h.num_attention_heads;
    for (const char* key : {"rope.dimension_count", "attention.key_length", "attention.value_length"})
      if (g.has(a + "." + key))
        require(get(key) == head, file, ": ", a, ".", key, " is ", get(key), "; xfmr builds heads of width / heads (",
                head, ") with rotary positions over all of it");
    const std::string scaling = g.has(a + ".rope.scaling.type") ? g.string(a + ".rope.scaling.type") : "none";
    require(scaling == "none" || scaling == "linear", file, ": ", a, ".rope.scaling.type '", scaling,
            "' is not built (none, linear)");
    if (scaling == "linear") h.rope_scaling = {RopeScaling::linear, g.number(a + ".rope.scaling.factor")};
    p = hf_llama_architecture(h);
    if (g.has_tensor("rope_freqs.weight")) p.rope_scaling = llama3_scaling(g, a, p);
  }
  p.check();
  // Every tensor needed, of its shape, and none else.
  const std::map<std::string, GgufShape> want = expected_tensors(a, p, m.vocab, m.tied);
  for (const auto& [name, shape] : want) {
    require(g.has_tensor(name), file, ": no tensor '", name, "', which a ", a, " of ", p.n_layers,
            " layers needs");
    require(g.tensor(name).shape == shape, file, ": tensor '", name, "' has shape ",
            shape_text(g.tensor(name).shape), "; the metadata's sizes give ", shape_text(shape));
  }
  for (const GgufTensor& t : g.tensors())
    require(want.count(t.name) || t.name == "rope_freqs.weight", file, ": tensor '", t.name,
            "' is not part of a ", a, " xfmr builds");
  return m;
}

std::string gguf_precision(const GgufModel& m) {
  std::map<GgmlType, std::uint64_t> weights;  // the layers' matrices' weights by type
  for (const GgufTensor& t : m.file->tensors())
    if (t.name.starts_with("blk.") && t.shape.size() == 2) weights[t.type] += t.elements;
  GgmlType most = GgmlType::f32;
  std::uint64_t n = 0;
  for (const auto& [type, count] : weights)
    if (count > n) most = type, n = count;
  switch (most) {
    case GgmlType::q4_0:
    case GgmlType::q4_k: return "q4";
    case GgmlType::q8_0:
    case GgmlType::q6_k: return "int8";
    case GgmlType::bf16: return "bf16";  // F16 holds 3 more bits than bf16 does: fp32, exactly
    default: return "fp32";
  }
}

namespace detail {

std::shared_ptr<const WeightSource> gguf_source(const GgufModel& m, std::string_view xfmr_name,
                                                const std::vector<std::int64_t>& shape) {
  const std::string name(xfmr_name);
  const bool gpt2 = m.family == "gpt2";
  const int head = m.architecture.qk_head();
  std::vector<WeightPiece> pieces;
  auto leaf = [&](std::string_view prefix) { return name.substr(prefix.size()); };  // "weight" or "bias"
  if (name == "tok_emb.weight") pieces = {{"token_embd.weight"}};
  else if (name == "pos_emb.weight") pieces = {{"position_embd.weight"}};
  else if (name.starts_with("ln_f.")) pieces = {{"output_norm." + leaf("ln_f.")}};
  else if (name == "lm_head.weight") pieces = {{m.tied ? "token_embd.weight" : "output.weight"}};
  else {
    require(name.starts_with("blocks."), m.file->path().string(), ": no tensor for the model's '", name, "'");
    const std::size_t dot = name.find('.', 7);
    const std::string b = "blk." + name.substr(7, dot - 7) + ".", part = name.substr(dot + 1);
    const std::string kind = part.substr(part.rfind('.') + 1);  // weight or bias
    // qwen2's q and k heads are Hugging Face's halves; llama's are xfmr's pairs.
    const WeightPiece::Order rotary = m.family == "qwen2" ? WeightPiece::rotary_pairs : WeightPiece::rows;
    if (part.starts_with("ln1.")) pieces = {{b + "attn_norm." + kind}};
    else if (part.starts_with("ln2.")) pieces = {{b + "ffn_norm." + kind}};
    else if (part.starts_with("attn.proj.")) pieces = {{b + "attn_output." + kind}};
    else if (part.starts_with("ff.fc2.")) pieces = {{b + "ffn_down." + kind}};
    else if (part.starts_with("attn.qkv.") && gpt2) pieces = {{b + "attn_qkv." + kind}};
    else if (part.starts_with("attn.qkv."))
      pieces = {{b + "attn_q." + kind, rotary, head}, {b + "attn_k." + kind, rotary, head}, {b + "attn_v." + kind}};
    else if (part.starts_with("ff.fc1.") && gpt2) pieces = {{b + "ffn_up." + kind}};
    else if (part == "ff.fc1.weight") pieces = {{b + "ffn_gate.weight"}, {b + "ffn_up.weight"}};
    else detail::fail(m.file->path().string(), ": no tensor for the model's '", name, "'");
  }
  const std::int64_t rows = shape.empty() ? 0 : shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  return gguf_weights(m.file, std::move(pieces), rows, cols);
}

}  // namespace detail

namespace {

// The tokenizer's keys: a SentencePiece one's pieces, scores and types, or
// a byte-level BPE's tokens and merges.
void add_tokenizer(GgufWriter& w, const ModelTokenizer& tok, int vocab, const fs::path& path) {
  const std::string file = path.string();
  require(tok.size() <= vocab, file, ": the tokenizer's ", tok.size(), " tokens, the model's ", vocab, " rows");
  if (const Llama2cTokenizer* sp = tok.sentencepiece()) {
    require(sp->vocab_size() == vocab, file, ": the tokenizer's ", sp->vocab_size(), " pieces, the model's ", vocab,
            " rows");
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
    return;
  }
  const Gpt2Tokenizer& bpe = *tok.byte_level();
  std::vector<std::string> tokens = bpe.symbols();
  std::vector<std::int32_t> types(tokens.size(), 1);
  for (const std::int32_t id : bpe.special_ids()) types[std::size_t(id)] = 3;
  for (std::size_t id = tokens.size(); id < std::size_t(vocab); ++id)  // padding rows, as llama.cpp's converter names them
    tokens.push_back("[PAD" + std::to_string(id) + "]"), types.push_back(4);
  w.add("tokenizer.ggml.model", std::string("gpt2"));
  w.add("tokenizer.ggml.pre", std::string(bpe.pre_tokenizer()));
  w.add("tokenizer.ggml.tokens", tokens);
  w.add("tokenizer.ggml.token_type", types);
  w.add("tokenizer.ggml.merges", bpe.merges());
  if (bpe.end_of_text() >= 0) {
    w.add("tokenizer.ggml.bos_token_id", std::uint32_t(bpe.end_of_text()));
    w.add("tokenizer.ggml.eos_token_id", std::uint32_t(bpe.end_of_text()));
  }
  w.add("tokenizer.ggml.add_bos_token", false);
}

// Rows of a q or k matrix (or bias) from xfmr's rotary pairs to Hugging
// Face's halves, as qwen2 files hold them (the inverse of the reading).
std::vector<float> rotary_halves(std::span<const float> m, int head, std::uint64_t cols) {
  std::vector<float> out(m.size());
  const std::uint64_t rows = m.size() / cols;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint64_t h = r / head, j = r % head, s = h * head + (j % 2) * (head / 2) + j / 2;
    std::copy_n(m.data() + r * cols, cols, out.data() + s * cols);
  }
  return out;
}

}  // namespace

void write_gguf_model(const PresetInfo& p, int vocab, bool tied, GgmlType type,
                      const std::map<std::string, std::vector<float>>& t, const ModelTokenizer* tok,
                      const fs::path& path) {
  const bool gpt2 = gpt2_shaped(p);
  require(gpt2 || llama_shaped(p), path.string(), ": the model (", p.parts_name(), ") is not Llama-shaped (pre-norm "
          "rms-norm swiglu rope) nor GPT-2-shaped (pre-norm layer-norm gelu learned), the GGUF families xfmr writes");
  if (!gpt2) detail::llama_check_preset(p);
  const std::string a = gpt2 ? "gpt2" : p.qkv_bias ? "qwen2" : "llama";
  GgufWriter w;
  w.add("general.architecture", a);
  w.add("general.name", p.name);
  w.add(a + ".context_length", std::uint32_t(p.max_t));
  w.add(a + ".embedding_length", std::uint32_t(p.d_model));
  w.add(a + ".block_count", std::uint32_t(p.n_layers));
  w.add(a + ".feed_forward_length", std::uint32_t(p.d_ff));
  w.add(a + ".attention.head_count", std::uint32_t(p.n_heads));
  w.add(a + ".attention.head_count_kv", std::uint32_t(p.kv_heads()));
  if (gpt2) {
    w.add(a + ".attention.layer_norm_epsilon", float(p.norm_eps));
  } else {
    w.add(a + ".attention.layer_norm_rms_epsilon", float(p.norm_eps));
    w.add(a + ".rope.freq_base", float(p.rope_theta));
    w.add(a + ".rope.dimension_count", std::uint32_t(p.qk_head()));
    if (p.rope_scaling.kind == RopeScaling::linear) {
      w.add(a + ".rope.scaling.type", std::string("linear"));
      w.add(a + ".rope.scaling.factor", float(p.rope_scaling.factor));
    }
  }
  w.add(a + ".vocab_size", std::uint32_t(vocab));
  if (tok) add_tokenizer(w, *tok, vocab, path);
  const std::uint64_t D = p.d_model, F = p.d_ff, Q = std::uint64_t(p.n_heads) * p.qk_head();
  const std::uint64_t KV = std::uint64_t(p.kv_heads()) * p.qk_head();
  auto at = [&](const std::string& name) -> const std::vector<float>& {
    const auto it = t.find(name);
    require(it != t.end(), "write_gguf_model: no tensor '", name, "' in the model");
    return it->second;
  };
  // `rows` rows of `cols` from row `first` of a stacked matrix.
  auto rows_of = [](const std::vector<float>& m, std::uint64_t first, std::uint64_t rows, std::uint64_t cols) {
    return std::span<const float>(m.data() + first * cols, rows * cols);
  };
  // A matrix whose rows are not whole blocks of `type` is written in F16
  // (as llama.cpp's quantize falls back).
  const auto matrix = [&](const std::string& name, std::uint64_t cols, std::uint64_t rows, std::span<const float> v) {
    const bool blocks = type != GgmlType::q8_0 && type != GgmlType::q4_0;
    w.add_tensor(name, {cols, rows}, blocks || cols % 32 == 0 ? type : GgmlType::f16, v);
  };
  const auto vector_f32 = [&](const std::string& name, std::span<const float> v) {
    w.add_tensor(name, {v.size()}, GgmlType::f32, v);
  };
  if (p.rope_scaling.kind == RopeScaling::llama3) {  // llama.cpp's rope_freqs: each pair's divisor's factor
    std::vector<float> f(std::size_t(p.qk_head() / 2));
    for (int i = 0; i < p.qk_head() / 2; ++i)
      f[std::size_t(i)] = float(detail::angle_divisor(i, p.qk_head(), p.rope_theta, p.rope_scaling) /
                                detail::angle_divisor(i, p.qk_head(), p.rope_theta, {}));
    vector_f32("rope_freqs.weight", f);
  }
  matrix("token_embd.weight", D, std::uint64_t(vocab), at("tok_emb.weight"));
  if (gpt2) matrix("position_embd.weight", D, std::uint64_t(p.max_t), at("pos_emb.weight"));
  vector_f32("output_norm.weight", at("ln_f.weight"));
  if (gpt2) vector_f32("output_norm.bias", at("ln_f.bias"));
  if (!tied) matrix("output.weight", D, std::uint64_t(vocab), at("lm_head.weight"));
  const int head = p.qk_head();
  for (int i = 0; i < p.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", x = "blocks." + std::to_string(i) + ".";
    vector_f32(b + "attn_norm.weight", at(x + "ln1.weight"));
    vector_f32(b + "ffn_norm.weight", at(x + "ln2.weight"));
    matrix(b + "attn_output.weight", Q, D, at(x + "attn.proj.weight"));
    matrix(b + "ffn_down.weight", F, D, at(x + "ff.fc2.weight"));
    if (gpt2) {
      for (const auto& [to, from] : {std::pair{"attn_norm.bias", "ln1.bias"}, std::pair{"ffn_norm.bias", "ln2.bias"},
                                     std::pair{"attn_qkv.bias", "attn.qkv.bias"},
                                     std::pair{"attn_output.bias", "attn.proj.bias"},
                                     std::pair{"ffn_up.bias", "ff.fc1.bias"}, std::pair{"ffn_down.bias", "ff.fc2.bias"}})
        vector_f32(b + to, at(x + from));
      matrix(b + "attn_qkv.weight", D, 3 * D, at(x + "attn.qkv.weight"));
      matrix(b + "ffn_up.weight", D, F, at(x + "ff.fc1.weight"));
      continue;
    }
    const std::vector<float>& qkv = at(x + "attn.qkv.weight");
    const std::vector<float>& fc1 = at(x + "ff.fc1.weight");
    if (p.qkv_bias) {  // qwen2: q and k in Hugging Face's halves
      const std::vector<float>& bias = at(x + "attn.qkv.bias");
      matrix(b + "attn_q.weight", D, Q, rotary_halves(rows_of(qkv, 0, Q, D), head, D));
      matrix(b + "attn_k.weight", D, KV, rotary_halves(rows_of(qkv, Q, KV, D), head, D));
      vector_f32(b + "attn_q.bias", rotary_halves(rows_of(bias, 0, Q, 1), head, 1));
      vector_f32(b + "attn_k.bias", rotary_halves(rows_of(bias, Q, KV, 1), head, 1));
      vector_f32(b + "attn_v.bias", rows_of(bias, Q + KV, KV, 1));
    } else {
      matrix(b + "attn_q.weight", D, Q, rows_of(qkv, 0, Q, D));
      matrix(b + "attn_k.weight", D, KV, rows_of(qkv, Q, KV, D));
    }
    matrix(b + "attn_v.weight", D, KV, rows_of(qkv, Q + KV, KV, D));
    matrix(b + "ffn_gate.weight", D, F, rows_of(fc1, 0, F, D));
    matrix(b + "ffn_up.weight", D, F, rows_of(fc1, F, F, D));
  }
  w.write(path);
}

}  // namespace xfmr
