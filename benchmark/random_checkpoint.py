#!/usr/bin/env python3
"""A published model's shape with random weights, in the format it is
published in, for decoding benchmarks (decoding speed does not depend on
the values; no real weights can be downloaded here):

    random_checkpoint.py PRESET OUT [GPT2_TOKENIZER] [--dtype f32|bf16]

  stories15m, stories42m, stories110m  llama2.c's legacy .bin (export.py
      version 0: header, embedding, per-kind layer tensors, rotary tables),
      classifier shared with the embedding, vocabulary 32,000;
  smollm-135m, tinyllama-1.1b, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b,
      qwen2.5-1.5b  a Hugging Face LlamaForCausalLM (Qwen2ForCausalLM)
      directory (model.safetensors, config.json) with the published
      config's sizes, tying, rotary theta and scaling, and Qwen2's q/k/v
      biases;
  distilgpt2, gpt2-small, gpt2-medium  a Hugging Face GPT-2 directory
      (Conv1D weights, no mask buffers), vocabulary 50,257.

--dtype bf16 writes the safetensors in bfloat16 (as Llama 3 and Qwen2.5
are published); the default is float32. Tensors are drawn and written one
block of rows at a time, so that an 8B model's 16 GB never sit in memory.

With GPT2_TOKENIZER (a directory of GPT-2's encoder.json and vocab.bpe, as
../shared/data/gpt2), a Hugging Face directory also gets a tokenizer of
exactly its vocabulary (vocab.json, merges.txt): GPT-2's first V - 1 tokens
(bytes, then the merges that made them, in order) and <|endoftext|> as id
V - 1, so that xfmr-serve can load the directory alone.

Weights N(0, 0.02), norms' gains 1, biases 0; the embedding row of BOS
(llama2.c's id 1) is zero, so that greedy decoding never picks it (run.c
stops there). NumPy only (no PyTorch needed)."""
import json
import struct
import sys
from pathlib import Path

import numpy as np

# name: (context, D, heads, key/value heads, layers, FF, vocab)
SHAPES = {
    "stories15m": (256, 288, 6, 6, 6, 768, 32000),
    "stories42m": (1024, 512, 8, 8, 8, 1376, 32000),
    "stories110m": (1024, 768, 12, 12, 12, 2048, 32000),
    "smollm-135m": (2048, 576, 9, 3, 30, 1536, 49152),
    "tinyllama-1.1b": (2048, 2048, 32, 4, 22, 5632, 32000),
    "llama-3.2-1b": (131072, 2048, 32, 8, 16, 8192, 128256),
    "llama-3.2-3b": (131072, 3072, 24, 8, 28, 8192, 128256),
    "llama-3.1-8b": (131072, 4096, 32, 8, 32, 14336, 128256),
    "qwen2.5-1.5b": (32768, 1536, 12, 2, 28, 8960, 151936),
    "distilgpt2": (1024, 768, 12, 12, 6, 3072, 50257),
    "gpt2-small": (1024, 768, 12, 12, 12, 3072, 50257),
    "gpt2-medium": (1024, 1024, 16, 16, 24, 4096, 50257),
}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# name: (tied, rope_theta, rope_scaling, rms_norm_eps)
LLAMA_KNOBS = {
    "smollm-135m": (True, 10000.0, None, 1e-5),
    "tinyllama-1.1b": (False, 10000.0, None, 1e-5),
    "llama-3.2-1b": (True, 500000.0, LLAMA3_ROPE, 1e-5),
    "llama-3.2-3b": (True, 500000.0, LLAMA3_ROPE, 1e-5),
    "llama-3.1-8b": (False, 500000.0, dict(LLAMA3_ROPE, factor=8.0), 1e-5),
    "qwen2.5-1.5b": (True, 1000000.0, None, 1e-6),
}
ROWS_AT_ONCE = 1 << 22  # values drawn and written at a time


class Tensor:
    """A tensor to write: its shape and how its values are made (normal,
    ones, zeros), drawn when written."""

    def __init__(self, kind, *shape, zero_row=None):
        self.kind, self.shape, self.zero_row = kind, shape, zero_row

    def numel(self):
        return int(np.prod(self.shape))

    def blocks(self, rng):
        cols = self.shape[-1]
        rows = self.numel() // cols
        step = max(1, ROWS_AT_ONCE // cols)
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            if self.kind == "normal":
                v = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(0.02)
                if self.zero_row is not None and r0 <= self.zero_row < r0 + n:
                    v[self.zero_row - r0] = 0
            else:
                v = np.full((n, cols), 1.0 if self.kind == "ones" else 0.0, dtype=np.float32)
            yield v


def w(*shape, **kw):
    return Tensor("normal", *shape, **kw)


def bf16_bytes(v):
    """float32 to bfloat16, rounded to nearest even (finite values)."""
    bits = v.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return rounded.astype(np.uint16).tobytes()


def write_safetensors(path, tensors, dtype, rng):
    size = 2 if dtype == "bf16" else 4
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        n = t.numel() * size
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode())
        for t in tensors.values():
            for v in t.blocks(rng):
                f.write(bf16_bytes(v) if dtype == "bf16" else v.tobytes())


def llama_tensors(preset):
    T, D, H, KV, L, F, V = SHAPES[preset]
    tied = LLAMA_KNOBS[preset][0]
    hd, qwen = D // H, preset.startswith("qwen")
    t = {"model.embed_tokens.weight": w(V, D, zero_row=1)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = Tensor("ones", D)
        for proj, rows in (("q", D), ("k", KV * hd), ("v", KV * hd)):
            t[p + f"self_attn.{proj}_proj.weight"] = w(rows, D)
            if qwen:
                t[p + f"self_attn.{proj}_proj.bias"] = Tensor("zeros", rows)
        t.update({p + "self_attn.o_proj.weight": w(D, D), p + "post_attention_layernorm.weight": Tensor("ones", D),
                  p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                  p + "mlp.down_proj.weight": w(D, F)})
    t["model.norm.weight"] = Tensor("ones", D)
    if not tied:
        t["lm_head.weight"] = w(V, D)
    return t


def llama_config(preset, dtype):
    T, D, H, KV, L, F, V = SHAPES[preset]
    tied, theta, scaling, eps = LLAMA_KNOBS[preset]
    qwen = preset.startswith("qwen")
    return {"architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
            "model_type": "qwen2" if qwen else "llama", "hidden_size": D, "intermediate_size": F,
            "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV, "vocab_size": V,
            "max_position_embeddings": T, "rms_norm_eps": eps, "rope_theta": theta, "hidden_act": "silu",
            "tie_word_embeddings": tied, "rope_scaling": scaling,
            "torch_dtype": "bfloat16" if dtype == "bf16" else "float32"}


def gpt2_tensors(preset):
    T, D, H, KV, L, F, V = SHAPES[preset]
    t = {"wte.weight": w(V, D), "wpe.weight": w(T, D)}
    for i in range(L):
        p = f"h.{i}."
        t.update({p + "ln_1.weight": Tensor("ones", D), p + "ln_1.bias": Tensor("zeros", D),
                  p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": Tensor("zeros", 3 * D),
                  p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": Tensor("zeros", D),
                  p + "ln_2.weight": Tensor("ones", D), p + "ln_2.bias": Tensor("zeros", D),
                  p + "mlp.c_fc.weight": w(D, F), p + "mlp.c_fc.bias": Tensor("zeros", F),
                  p + "mlp.c_proj.weight": w(F, D), p + "mlp.c_proj.bias": Tensor("zeros", D)})
    t["ln_f.weight"], t["ln_f.bias"] = Tensor("ones", D), Tensor("zeros", D)
    return t


def gpt2_config(preset):
    T, D, H, KV, L, F, V = SHAPES[preset]
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_positions": T,
            "n_ctx": T, "n_embd": D, "n_layer": L, "n_head": H, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}


def write_llama2c(preset, out, rng):
    T, D, H, KV, L, F, V = SHAPES[preset]
    hd = D // H
    with open(out, "wb") as f:
        f.write(struct.pack("<7i", D, F, L, H, KV, V, T))
        for t in (w(V, D, zero_row=1), Tensor("ones", L, D), w(L, D, D), w(L, KV * hd, D), w(L, KV * hd, D),
                  w(L, D, D), Tensor("ones", L, D), w(L, F, D), w(L, D, F), w(L, F, D), Tensor("ones", D),
                  Tensor("zeros", T, hd // 2), Tensor("zeros", T, hd // 2)):
            for v in t.blocks(rng):
                f.write(v.tobytes())


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dtype = "f32"
    if "--dtype" in sys.argv:
        dtype = sys.argv[sys.argv.index("--dtype") + 1]
        args.remove(dtype)
    if len(args) < 2 or args[0] not in SHAPES or dtype not in ("f32", "bf16"):
        sys.exit("usage: random_checkpoint.py PRESET OUT [GPT2_TOKENIZER] [--dtype f32|bf16]\n  presets: " +
                 ", ".join(SHAPES))
    preset, out = args[0], Path(args[1])
    rng = np.random.default_rng(1)
    if preset.startswith("stories"):
        if dtype != "f32":
            sys.exit("llama2.c's .bin is float32")
        return write_llama2c(preset, out, rng)
    out.mkdir(parents=True, exist_ok=True)
    if preset in LLAMA_KNOBS:
        tensors, config = llama_tensors(preset), llama_config(preset, dtype)
    else:
        tensors, config = gpt2_tensors(preset), gpt2_config(preset)
    write_safetensors(out / "model.safetensors", tensors, dtype, rng)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if len(args) > 2:
        write_tokenizer(Path(args[2]), out, SHAPES[preset][6])


def write_tokenizer(gpt2, out, V):
    encoder = json.loads((gpt2 / "encoder.json").read_text(encoding="utf-8"))
    merges = (gpt2 / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [m for m in merges[1:] if m]  # after the "#version" line
    tokens = sorted((i, t) for t, i in encoder.items() if t != "<|endoftext|>")
    assert [i for i, _ in tokens] == list(range(len(tokens))) and len(tokens) == 256 + len(merges)
    V = min(V, len(tokens) + 1)  # a vocabulary past GPT-2's: its first tokens, the rest unreachable
    vocab = {t: i for i, t in tokens[:V - 1]}
    vocab["<|endoftext|>"] = V - 1
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("\n".join(["#version: 0.2"] + merges[:V - 1 - 256]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
