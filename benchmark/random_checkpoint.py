#!/usr/bin/env python3
"""A published model's shape with random weights, in the format it is
published in, for decoding benchmarks (decoding speed does not depend on
the values; no real weights can be downloaded here):

    random_checkpoint.py PRESET OUT [GPT2_TOKENIZER]

  stories15m, stories42m, stories110m  llama2.c's legacy .bin (export.py
      version 0: header, embedding, per-kind layer tensors, rotary tables),
      classifier shared with the embedding, vocabulary 32,000;
  smollm-135m  a Hugging Face LlamaForCausalLM directory (model.safetensors,
      config.json), tied, vocabulary 49,152;
  distilgpt2, gpt2-small, gpt2-medium  a Hugging Face GPT-2 directory
      (Conv1D weights, no mask buffers), vocabulary 50,257.

With GPT2_TOKENIZER (a directory of GPT-2's encoder.json and vocab.bpe, as
../shared/data/gpt2), a Hugging Face directory also gets a tokenizer of
exactly its vocabulary (vocab.json, merges.txt): GPT-2's first V - 1 tokens
(bytes, then the merges that made them, in order) and <|endoftext|> as id
V - 1, so that xfmr-serve can load the directory alone.

Weights N(0, 0.02), norms' gains 1, biases 0; the embedding row of BOS
(llama2.c's id 1) is zero, so that greedy decoding never picks it (run.c
stops there). Float32 throughout."""
import json
import struct
import sys
from pathlib import Path

import torch

# name: (context, D, heads, key/value heads, layers, FF, vocab)
SHAPES = {
    "stories15m": (256, 288, 6, 6, 6, 768, 32000),
    "stories42m": (1024, 512, 8, 8, 8, 1376, 32000),
    "stories110m": (1024, 768, 12, 12, 12, 2048, 32000),
    "smollm-135m": (2048, 576, 9, 3, 30, 1536, 49152),
    "distilgpt2": (1024, 768, 12, 12, 6, 3072, 50257),
    "gpt2-small": (1024, 768, 12, 12, 12, 3072, 50257),
    "gpt2-medium": (1024, 1024, 16, 16, 24, 4096, 50257),
}


def write_safetensors(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode())
        for t in tensors.values():
            f.write(t.contiguous().float().numpy().tobytes())


def main():
    preset, out = sys.argv[1], Path(sys.argv[2])
    T, D, H, KV, L, F, V = SHAPES[preset]
    g = torch.Generator().manual_seed(1)
    hd = D // H

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    emb = w(V, D)
    emb[1] = 0
    if preset.startswith("stories"):
        with open(out, "wb") as f:
            f.write(struct.pack("<7i", D, F, L, H, KV, V, T))
            for t in (emb, torch.ones(L, D), w(L, D, D), w(L, KV * hd, D), w(L, KV * hd, D), w(L, D, D),
                      torch.ones(L, D), w(L, F, D), w(L, D, F), w(L, F, D), torch.ones(D),
                      torch.zeros(T, hd // 2), torch.zeros(T, hd // 2)):
                f.write(t.contiguous().float().numpy().tobytes())
        return
    out.mkdir(parents=True, exist_ok=True)
    if preset == "smollm-135m":
        t = {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(D)}
        for i in range(L):
            p = f"model.layers.{i}."
            t.update({p + "input_layernorm.weight": torch.ones(D), p + "self_attn.q_proj.weight": w(D, D),
                      p + "self_attn.k_proj.weight": w(KV * hd, D), p + "self_attn.v_proj.weight": w(KV * hd, D),
                      p + "self_attn.o_proj.weight": w(D, D), p + "post_attention_layernorm.weight": torch.ones(D),
                      p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                      p + "mlp.down_proj.weight": w(D, F)})
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
                  "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
                  "num_key_value_heads": KV, "vocab_size": V, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
                  "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True, "rope_scaling": None}
    else:
        t = {"wte.weight": emb, "wpe.weight": w(T, D)}
        for i in range(L):
            p = f"h.{i}."
            t.update({p + "ln_1.weight": torch.ones(D), p + "ln_1.bias": torch.zeros(D),
                      p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": torch.zeros(3 * D),
                      p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": torch.zeros(D),
                      p + "ln_2.weight": torch.ones(D), p + "ln_2.bias": torch.zeros(D),
                      p + "mlp.c_fc.weight": w(D, F), p + "mlp.c_fc.bias": torch.zeros(F),
                      p + "mlp.c_proj.weight": w(F, D), p + "mlp.c_proj.bias": torch.zeros(D)})
        t["ln_f.weight"], t["ln_f.bias"] = torch.ones(D), torch.zeros(D)
        config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_positions": T,
                  "n_ctx": T, "n_embd": D, "n_layer": L, "n_head": H, "n_inner": None,
                  "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    write_safetensors(out / "model.safetensors", t)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if len(sys.argv) > 3:
        write_tokenizer(Path(sys.argv[3]), out, V)


def write_tokenizer(gpt2, out, V):
    encoder = json.loads((gpt2 / "encoder.json").read_text(encoding="utf-8"))
    merges = (gpt2 / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [m for m in merges[1:] if m]  # after the "#version" line
    tokens = sorted((i, t) for t, i in encoder.items() if t != "<|endoftext|>")
    assert [i for i, _ in tokens] == list(range(len(tokens))) and len(tokens) == 256 + len(merges)
    vocab = {t: i for i, t in tokens[:V - 1]}
    vocab["<|endoftext|>"] = V - 1
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("\n".join(["#version: 0.2"] + merges[:V - 1 - 256]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
