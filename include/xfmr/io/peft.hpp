// peft.hpp: LoRA adapters (models/lora.hpp) in Hugging Face peft's format:
// a directory of adapter_config.json (peft_type LORA, r, lora_alpha,
// use_rslora, target_modules, fan_in_fan_out) and adapter_model.safetensors,
// whose keys are base_model.model.<module>.lora_A.weight (r, in) and
// .lora_B.weight (out, r), the modules named as the base's Hugging Face
// model names them:
//   rotary positions (LlamaForCausalLM, Qwen2, SmolLM2): model.layers.<i>.
//     self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj; q's and k's B
//     rows are Hugging Face's rotate-half halves, which xfmr holds as
//     pairs (io/weight_sources.hpp's rotary_pairs), reordered both ways;
//   learned positions (GPT2LMHeadModel): transformer.h.<i>.attn.c_attn
//     (all of qkv), attn.c_proj, mlp.c_fc (all of fc1), mlp.c_proj; its
//     Conv1D weights are (in, out), so peft merges the transpose
//     (fan_in_fan_out); A and B are as ever.
//
//   xfmr::save_peft_adapter(*model, lora, "adapter");        // what peft's PeftModel.from_pretrained reads
//   const xfmr::LoraOptions o = xfmr::load_peft_adapter(*model, "adapter");  // add_lora, then the file's A and B
#pragma once

#include <filesystem>
#include <vector>

#include "xfmr/io/safetensors.hpp"
#include "xfmr/models/lora.hpp"

namespace xfmr {

// The model's adapters (those add_lora put there with o) as a peft
// adapter directory's two files: adapter_config.json and
// adapter_model.safetensors (a checkpoint carries them: AttachedFile).
template <class Backend>
std::vector<AttachedFile> peft_adapter_files(LanguageModel<Backend>& model, const LoraOptions& o);

// Writes them to dir; an existing adapter there is replaced only with overwrite.
template <class Backend>
void save_peft_adapter(LanguageModel<Backend>& model, const LoraOptions& o, const std::filesystem::path& dir,
                       bool overwrite = false);

// Reads a peft adapter directory into the model: add_lora with its
// settings (the base frozen) and id, then each A and B from the file, whose
// every tensor must be one the settings put there, of its shape. The
// settings. Id 0: the model's own adapter; k > 0: the k-th loaded beside
// it, for the rows that select it (layers/lora.hpp).
template <class Backend>
LoraOptions load_peft_adapter(LanguageModel<Backend>& model, const std::filesystem::path& dir, int id = 0);

// Compiled once in the library (src/peft.cpp), for the CPU backend: LoRA
// has not run on a GPU yet (Engine::load_adapter and xfmr-lm refuse CUDA).
#define XFMR_PEFT(KEYWORDS, Be)                                                                                   \
  KEYWORDS std::vector<AttachedFile> peft_adapter_files<Be>(LanguageModel<Be>&, const LoraOptions&);            \
  KEYWORDS void save_peft_adapter<Be>(LanguageModel<Be>&, const LoraOptions&, const std::filesystem::path&, bool); \
  KEYWORDS LoraOptions load_peft_adapter<Be>(LanguageModel<Be>&, const std::filesystem::path&, int);
XFMR_PEFT(extern template, CpuBackend<float>)

}  // namespace xfmr
