#!/usr/bin/python3
"""Writes fixtures/families/: one random checkpoint of each published family
in a shape that no preset has, in the family's own Hugging Face layout, with
the float64 logits and greedy tokens of a plain-PyTorch reference that
test_families compares xfmr's Dynamic models against (load_pretrained).

    /usr/bin/python3 test/reference/families.py test/reference/fixtures

  gpt2-ctx2048   GPT-2 with a 2048-position table and layer_norm_epsilon 1e-6
  llama3-scaled  Llama 3-style: rope_scaling "llama3", grouped-query
                 attention (4 heads, 1 key/value head), theta 500000
  qwen2          Qwen2: biases on q, k and v, theta 1e6, rms_norm_eps 1e-6,
                 tied embeddings
  smollm2        SmolLM2-style: theta 1e5, tied embeddings, 6 heads and 2
                 key/value heads

The Llama-family reference is written from the definitions: rotate-half
rotary positions as transformers' LlamaRotaryEmbedding applies them, and
Llama 3's frequency scaling as its _compute_llama3_parameters defines it.
Every vocabulary is 257, the size of fixtures/lm/tokenizer.json (a byte's
id its value), and the ids are printable ASCII, so that xfmr-lm can run
each with that tokenizer (run_examples.sh).
expected.safetensors: ids (12), logits (12, vocab) of the whole sequence,
and 12 greedy tokens after ids[:4], the prefix recomputed for each; its
metadata records the smallest gap between the two best logits on the way.
"""
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from make_fixtures import f32, gpt2_forward, gpt2_params, llama_hf_layers, write_gpt2_dir, write_safetensors

torch.set_default_dtype(torch.float64)


def llama3_inv_freq(inv, factor, low, high, old):
    """transformers' _compute_llama3_parameters, over inverse frequencies."""
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = old / low, old / high
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def llama_forward(hf, c, ids):
    """A LlamaForCausalLM (Qwen2's q/k/v biases where hf has them) over
    Hugging Face-named tensors, at config c's theta, scaling and epsilon:
    logits (T, vocab)."""
    T, d, heads, kv = len(ids), c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, eps = d // heads, c["rms_norm_eps"]
    inv = c["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rs = c.get("rope_scaling")
    if rs and rs["rope_type"] == "llama3":
        inv = llama3_inv_freq(inv, rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                              rs["original_max_position_embeddings"])
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)

    def rms(v, g):
        return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps) * g

    def rotate_half(t):
        return torch.cat((-t[..., hd // 2:], t[..., :hd // 2]), dim=-1)

    tensors = dict(hf)
    if c["tie_word_embeddings"]:
        tensors["lm_head.weight"] = hf["model.embed_tokens.weight"]
    return llama_hf_layers(tensors, ids, c["num_hidden_layers"], heads, kv, hd, d, cos, sin, rms, rotate_half)


def llama_params(c, gen):
    d, f, heads, kv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    kvw = d // heads * kv

    def u(*shape, centre=0.0, spread=0.3):
        return f32(centre + spread * (2 * torch.rand(shape, generator=gen) - 1))
    hf = {"model.embed_tokens.weight": u(c["vocab_size"], d), "model.norm.weight": u(d, centre=1.0, spread=0.2)}
    if not c["tie_word_embeddings"]:
        hf["lm_head.weight"] = u(c["vocab_size"], d)
    for i in range(c["num_hidden_layers"]):
        l = f"model.layers.{i}."
        hf.update({l + "input_layernorm.weight": u(d, centre=1.0, spread=0.2),
                   l + "self_attn.q_proj.weight": u(d, d), l + "self_attn.k_proj.weight": u(kvw, d),
                   l + "self_attn.v_proj.weight": u(kvw, d), l + "self_attn.o_proj.weight": u(d, d),
                   l + "post_attention_layernorm.weight": u(d, centre=1.0, spread=0.2),
                   l + "mlp.gate_proj.weight": u(f, d), l + "mlp.up_proj.weight": u(f, d),
                   l + "mlp.down_proj.weight": u(d, f)})
        if c["model_type"] == "qwen2":
            hf.update({l + "self_attn.q_proj.bias": u(d), l + "self_attn.k_proj.bias": u(kvw),
                       l + "self_attn.v_proj.bias": u(kvw)})
    return hf


def greedy(forward, ids):
    """12 greedy tokens after ids[:4], the prefix recomputed for each, and the
    smallest gap between the two best logits on the way."""
    seq, out, gap = list(ids[:4]), [], float("inf")
    for _ in range(12):
        last = forward(seq)[-1]
        top = last.topk(2).values
        gap = min(gap, float(top[0] - top[1]))
        seq.append(int(last.argmax()))
        out.append(seq[-1])
    return out, gap


def write_expected(d, ids, logits, tokens, gap, what):
    assert gap > 1e-3, f"{d.name}: greedy gap {gap} too small for a float32 comparison; change the seed"
    write_safetensors(d / "expected.safetensors",
                      {"ids": torch.tensor(ids, dtype=torch.int64), "logits": logits,
                       "greedy": torch.tensor(tokens, dtype=torch.int64)},
                      {"reference": f"torch {torch.__version__}, float64, {what}; greedy after ids[:4], gap {gap:.3g}"})


def llama_family(out, name, config, seed):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "rope_scaling": None, "tie_word_embeddings": False, "max_position_embeddings": 64}
    c.update(config)
    gen = torch.Generator().manual_seed(seed)
    hf = llama_params(c, gen)
    ids = torch.randint(32, 127, (12,), generator=gen).tolist()
    d = out / "families" / name
    d.mkdir(parents=True, exist_ok=True)
    write_safetensors(d / "model.safetensors", hf, {"format": "pt"})
    (d / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    tokens, gap = greedy(lambda s: llama_forward(hf, c, s), ids)
    write_expected(d, ids, llama_forward(hf, c, ids), tokens, gap, f"plain {c['model_type']}")


def gpt2_family(out, seed=44, vocab=257, n_pos=2048, d=24, layers=2, heads=3, eps=1e-6):
    gen = torch.Generator().manual_seed(seed)
    p = gpt2_params(vocab, n_pos, d, layers, gen, scale=0.3)
    dest = out / "families" / "gpt2-ctx2048"
    write_gpt2_dir(dest, p, vocab, n_pos, d, layers, heads)
    c = json.loads((dest / "config.json").read_text())
    c["layer_norm_epsilon"] = eps
    (dest / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    # A position table of 2048 rows: the attention masks' buffers would be
    # 2048^2 a layer, so this file holds none (they are optional).
    write_safetensors(dest / "model.safetensors", p, {"format": "pt"})
    ids = torch.randint(32, 127, (12,), generator=gen).tolist()

    def forward(s):
        return gpt2_forward(p, torch.tensor([s]), heads, layers, eps=eps)[0][0]
    tokens, gap = greedy(forward, ids)
    write_expected(dest, ids, forward(ids), tokens, gap, "plain GPT-2")


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "fixtures")
    gpt2_family(out)
    llama_family(out, "llama3-scaled",
                 {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 1, "vocab_size": 257, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                  "max_position_embeddings": 128,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}, seed=41)
    llama_family(out, "qwen2",
                 {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 24,
                  "intermediate_size": 56, "num_hidden_layers": 2, "num_attention_heads": 3,
                  "num_key_value_heads": 1, "vocab_size": 257, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                  "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32}, seed=42)
    llama_family(out, "smollm2",
                 {"hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 6,
                  "num_key_value_heads": 2, "vocab_size": 257, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                  "tie_word_embeddings": True}, seed=43)


if __name__ == "__main__":
    main()
