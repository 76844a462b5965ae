// gguf_model.hpp: a GGUF file's language model (io/gguf.hpp) into xfmr's
// Decoder, and an xfmr model out to a GGUF file llama.cpp reads.
//
//   const xfmr::GgufModel g = xfmr::open_gguf_model("qwen2.5-0.5b-q4_0.gguf");
//   g.architecture;          // PresetInfo: qwen2's parts at the file's sizes and knobs
//   xfmr::gguf_precision(g); // "q4": the precision its matrices are stored in
//   // load_model / load_pretrained (io/pretrained.hpp) read it so.
//
// Architectures (general.architecture), their sizes and knobs from the
// "<arch>." keys (context_length, embedding_length, feed_forward_length,
// block_count, attention.head_count, attention.head_count_kv, the norm
// epsilon, rope.freq_base):
//   llama  Llama 2 and 3.x, Mistral, TinyLlama, SmolLM: pre-norm RMSNorm,
//          SwiGLU, rotary positions with q and k in Meta's interleaved
//          order (xfmr's own); rope.scaling.type linear (rope.scaling.
//          factor), and Llama 3.1's scaling, which llama.cpp's converter
//          stores as the tensor rope_freqs.weight (a divisor a rotary
//          pair): read when it equals RopeScaling::llama3's factors for
//          the file's rope.scaling.factor (or Meta's 8 and 32), low 1,
//          high 4, original context 8192, refused by name otherwise.
//   qwen2  the same block with biases on q, k and v, and q and k in
//          Hugging Face's halves (reordered as read, io/hf_llama.hpp).
//   gpt2   pre-norm LayerNorm, GELU, learned positions, biases; q, k and v
//          one matrix (attn_qkv); output.weight, when present, is the head.
// A tied head is one without output.weight. Every tensor the architecture
// needs is checked present with its shape, and every tensor of the file
// known, before anything is allocated: an error names the file, the
// tensor and the shapes (another architecture, partial rotary, a missing
// or extra tensor).
//
// gguf_source(g, name, shape): the values of the Decoder parameter `name`
//   from the file, deferred to it (io/weight_sources.hpp's gguf_weights):
//   nothing is read or converted at load; a Q4_0 matrix becomes 4-bit
//   panels exactly, BF16 rows are read in place, others are converted
//   chunk by chunk as a decoding copy is made.
// gguf_precision(g): the decoding precision of the type most of the
//   layers' matrix weights are stored in, for about the file's bytes: q4
//   for Q4_0 (its values exactly) and Q4_K (a Q4_K_M file; its asymmetric
//   blocks requantised into symmetric ones), int8 for Q8_0 and Q6_K (a
//   scale a row, requantised from the file's blocks), bf16 for BF16, fp32
//   for F16 and F32 (their values exactly). A requantised file's logits
//   move more than llama.cpp's (test/llama_cpp/agreement.py measures it);
//   precision fp32 reads every type's values exactly.
//   load_model gives it as the metadata "weights", the engine's default
//   precision (io/checkpoint.hpp's decoding_precision).
//
// write_gguf_model(arch, vocab, tied, type, tensors, tokenizer, path): a
//   llama- (with q/k/v biases: qwen2) or GPT-2-shaped model's tensors (by
//   xfmr's names, float32) as the GGUF of its family, every matrix in
//   `type` (F32, F16, BF16, Q8_0, Q4_0; a matrix whose rows are not whole
//   blocks in F16, as llama.cpp's quantize does), norms and biases in F32,
//   with the tokenizer: a SentencePiece one's pieces, scores and types
//   (U+2581 for the space; byte pieces, BOS, EOS and <unk> typed as
//   llama.cpp's are), or a byte-level BPE's tokens and merges
//   (tokenizer.ggml.model gpt2). io/pretrained.hpp's save_gguf calls it.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xfmr/core/weight_source.hpp"
#include "xfmr/io/gguf.hpp"
#include "xfmr/presets.hpp"

namespace xfmr {

class ModelTokenizer;

struct GgufModel {
  std::shared_ptr<const GgufFile> file;
  std::string family;        // general.architecture: "llama", "qwen2" or "gpt2"
  PresetInfo architecture;
  int vocab = 0;
  bool tied = false;         // no output.weight: the head is the embedding
};
GgufModel open_gguf_model(const std::filesystem::path& path);
std::string gguf_precision(const GgufModel& g);

namespace detail {
std::shared_ptr<const WeightSource> gguf_source(const GgufModel& g, std::string_view xfmr_name,
                                                const std::vector<std::int64_t>& shape);
}  // namespace detail

void write_gguf_model(const PresetInfo& arch, int vocab, bool tied, GgmlType type,
                      const std::map<std::string, std::vector<float>>& tensors, const ModelTokenizer* tok,
                      const std::filesystem::path& path);

}  // namespace xfmr
