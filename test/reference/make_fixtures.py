#!/usr/bin/python3
"""Writes the PyTorch reference fixtures that test_pytorch_agreement compares
xfmr's float32 blocks against.

Run with Debian's python3 and python3-torch (a pyenv python3 may come first on
PATH and lack torch):

    /usr/bin/python3 test/reference/make_fixtures.py test/reference/fixtures

The reference is torch's own nn.TransformerEncoderLayer / TransformerDecoderLayer
(dropout 0), not a re-implementation: their parameters are renamed to xfmr's
state-dict names. Values are drawn in float64, rounded to float32 (what is
stored, so both sides start from identical numbers), and the forward and
backward passes run in float64; everything is stored as F32.

Each fixture holds: x (and memory), dy, key-padding masks as U8 (1 = pad),
param.<name>, y, grad.x (grad.memory), grad.param.<name>; __metadata__ holds
the sizes and settings.
"""
import json
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
B, T, S, D, H, FF = 2, 5, 6, 16, 4, 32


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.uint8:
            dtype, data = "U8", t.numpy().tobytes()
        elif t.dtype == torch.int64:
            dtype, data = "I64", t.numpy().astype("<i8").tobytes()
        else:
            dtype, data = "F32", t.to(torch.float32).numpy().astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for b in blobs:
            f.write(b)


def f32(t):
    """Round to float32 and back, so the stored values are exactly the ones used."""
    return t.to(torch.float32).to(torch.float64)


def randomise(module, gen):
    for name, p in module.named_parameters():
        with torch.no_grad():
            if name.startswith("norm"):
                p.copy_(f32((1.0 if name.endswith("weight") else 0.0) + 0.2 * (2 * torch.rand(p.shape, generator=gen) - 1)))
            else:
                p.copy_(f32(0.4 * (2 * torch.rand(p.shape, generator=gen) - 1)))


def attn_names(prefix, torch_prefix, cross):
    """torch MultiheadAttention parameters -> xfmr names (weights split for cross-attention)."""
    if not cross:
        return {
            f"{torch_prefix}.in_proj_weight": [(f"{prefix}.qkv.weight", None)],
            f"{torch_prefix}.in_proj_bias": [(f"{prefix}.qkv.bias", None)],
            f"{torch_prefix}.out_proj.weight": [(f"{prefix}.proj.weight", None)],
            f"{torch_prefix}.out_proj.bias": [(f"{prefix}.proj.bias", None)],
        }
    return {  # rows [Wq; Wk; Wv]: q is the first D rows, kv the rest
        f"{torch_prefix}.in_proj_weight": [(f"{prefix}.q.weight", slice(0, D)), (f"{prefix}.kv.weight", slice(D, 3 * D))],
        f"{torch_prefix}.in_proj_bias": [(f"{prefix}.q.bias", slice(0, D)), (f"{prefix}.kv.bias", slice(D, 3 * D))],
        f"{torch_prefix}.out_proj.weight": [(f"{prefix}.proj.weight", None)],
        f"{torch_prefix}.out_proj.bias": [(f"{prefix}.proj.bias", None)],
    }


def common_names(n_norms):
    m = {
        "linear1.weight": [("ff.fc1.weight", None)], "linear1.bias": [("ff.fc1.bias", None)],
        "linear2.weight": [("ff.fc2.weight", None)], "linear2.bias": [("ff.fc2.bias", None)],
    }
    for i in range(1, n_norms + 1):
        m[f"norm{i}.weight"] = [(f"ln{i}.weight", None)]
        m[f"norm{i}.bias"] = [(f"ln{i}.bias", None)]
    return m


def export_params(module, mapping, out, grads):
    for tname, p in module.named_parameters():
        for xname, rows in mapping[tname]:
            src = p.grad if grads else p
            out[("grad.param." if grads else "param.") + xname] = src if rows is None else src[rows]


def causal_mask(n):
    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)  # True = masked


def self_block(name, norm_first, activation, causal, padding, seed, out_dir):
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                             norm_first=norm_first)
    randomise(layer, gen)
    x = f32(2 * torch.rand(B, T, D, generator=gen) - 1).requires_grad_()
    dy = f32(2 * torch.rand(B, T, D, generator=gen) - 1)
    pad = torch.zeros(B, T, dtype=torch.bool)
    if padding:
        pad[1, T - 2:] = True
    y = layer(x, src_mask=causal_mask(T) if causal else None, src_key_padding_mask=pad if padding else None)
    y.backward(dy)
    mapping = {**common_names(2), **{k: v for k, v in attn_names("attn", "self_attn", False).items()}}
    t = {"x": x, "dy": dy}
    if padding:
        t["key_padding"] = pad.to(torch.uint8)
    export_params(layer, mapping, t, grads=False)
    t["y"] = y
    t["grad.x"] = x.grad
    export_params(layer, mapping, t, grads=True)
    meta = {"B": B, "T": T, "D_MODEL": D, "N_HEADS": H, "D_FF": FF, "norm": "pre" if norm_first else "post",
            "activation": "gelu_tanh" if activation is gelu_tanh else "relu", "causal": causal,
            "reference": f"torch {torch.__version__} nn.TransformerEncoderLayer"}
    write_safetensors(out_dir / f"{name}.safetensors", t, {"config": json.dumps(meta)})


def decoder_block(name, norm_first, activation, seed, out_dir):
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                             norm_first=norm_first)
    randomise(layer, gen)
    x = f32(2 * torch.rand(B, T, D, generator=gen) - 1).requires_grad_()
    memory = f32(2 * torch.rand(B, S, D, generator=gen) - 1).requires_grad_()
    dy = f32(2 * torch.rand(B, T, D, generator=gen) - 1)
    tgt_pad = torch.zeros(B, T, dtype=torch.bool)
    tgt_pad[0, T - 1] = True
    src_pad = torch.zeros(B, S, dtype=torch.bool)
    src_pad[1, S - 3:] = True
    y = layer(x, memory, tgt_mask=causal_mask(T), tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
    y.backward(dy)
    mapping = {**common_names(3), **attn_names("self_attn", "self_attn", False),
               **attn_names("cross_attn", "multihead_attn", True)}
    t = {"x": x, "memory": memory, "dy": dy, "tgt_padding": tgt_pad.to(torch.uint8),
         "src_padding": src_pad.to(torch.uint8)}
    export_params(layer, mapping, t, grads=False)
    t["y"] = y
    t["grad.x"] = x.grad
    t["grad.memory"] = memory.grad
    export_params(layer, mapping, t, grads=True)
    meta = {"B": B, "T": T, "S": S, "D_MODEL": D, "N_HEADS": H, "D_FF": FF, "norm": "pre" if norm_first else "post",
            "activation": "gelu_tanh" if activation is gelu_tanh else "relu",
            "reference": f"torch {torch.__version__} nn.TransformerDecoderLayer"}
    write_safetensors(out_dir / f"{name}.safetensors", t, {"config": json.dumps(meta)})


class TorchDecoderLM(torch.nn.Module):
    """GPT-style LM from torch parts: embeddings, pre-norm causal encoder layers, ln_f, head."""

    def __init__(self, vocab, max_t, layers):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, D)
        self.pos_emb = torch.nn.Parameter(torch.zeros(max_t, D))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=gelu_tanh, batch_first=True,
                                             norm_first=True) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb[:t]
        for block in self.blocks:
            x = block(x, src_mask=causal_mask(t))
        return self.lm_head(self.ln_f(x))


class TorchClassifier(torch.nn.Module):
    """Post-norm encoder layers with padding, mean pooling over non-pad positions, linear head."""

    def __init__(self, vocab, max_t, layers, classes):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, D)
        self.pos_emb = torch.nn.Parameter(torch.zeros(max_t, D))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation="relu", batch_first=True,
                                             norm_first=False) for _ in range(layers))
        self.head = torch.nn.Linear(D, classes)

    def forward(self, ids, pad):
        t = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb[:t]
        for block in self.blocks:
            x = block(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1))


def model_names(module, prefix):
    """torch parameter name -> [(xfmr name, rows)] for the models above."""
    mapping = {}
    for tname, _ in module.named_parameters():
        if tname.startswith("blocks."):
            i, rest = tname.split(".", 2)[1:]
            block = {**common_names(2), **attn_names("attn", "self_attn", False)}
            mapping[tname] = [(f"{prefix}blocks.{i}.{x}", rows) for x, rows in block[rest]]
        elif tname == "pos_emb":
            mapping[tname] = [(f"{prefix}pos_emb.weight", None)]
        elif tname.startswith(("lm_head", "head")):
            mapping[tname] = [(tname, None)]
        else:
            mapping[tname] = [(prefix + tname, None)]
    return mapping


def randomise_model(module, gen):
    for name, p in module.named_parameters():
        with torch.no_grad():
            if ".norm" in name or name.startswith("ln_f"):
                p.copy_(f32((1.0 if name.endswith("weight") else 0.0) + 0.2 * (2 * torch.rand(p.shape, generator=gen) - 1)))
            else:
                p.copy_(f32(0.4 * (2 * torch.rand(p.shape, generator=gen) - 1)))


def decoder_model(out_dir, vocab=11, max_t=8, layers=2, seed=5):
    gen = torch.Generator().manual_seed(seed)
    model = TorchDecoderLM(vocab, max_t, layers)
    randomise_model(model, gen)
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    logits = model(ids)
    dlogits = f32(2 * torch.rand(logits.shape, generator=gen) - 1)
    logits.backward(dlogits)
    mapping = model_names(model, "")
    t = {"ids": ids.to(torch.int64), "dlogits": dlogits}
    export_params(model, mapping, t, grads=False)
    t["logits"] = logits
    export_params(model, mapping, t, grads=True)
    meta = {"B": B, "T": T, "vocab": vocab, "MAX_T": max_t, "N_LAYERS": layers, "D_MODEL": D, "N_HEADS": H,
            "D_FF": FF, "norm": "pre", "activation": "gelu_tanh", "positions": "learned",
            "reference": f"torch {torch.__version__}: Embedding + TransformerEncoderLayer(norm_first, causal) + LayerNorm + Linear"}
    write_safetensors(out_dir / "decoder_model.safetensors", t, {"config": json.dumps(meta)})


def classifier_model(out_dir, vocab=13, max_t=8, layers=2, classes=3, seed=6):
    gen = torch.Generator().manual_seed(seed)
    model = TorchClassifier(vocab, max_t, layers, classes)
    randomise_model(model, gen)
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, T - 2:] = True
    logits = model(ids, pad)
    dlogits = f32(2 * torch.rand(logits.shape, generator=gen) - 1)
    logits.backward(dlogits)
    mapping = model_names(model, "encoder.")
    t = {"ids": ids.to(torch.int64), "key_padding": pad.to(torch.uint8), "dlogits": dlogits}
    export_params(model, mapping, t, grads=False)
    t["logits"] = logits
    export_params(model, mapping, t, grads=True)
    meta = {"B": B, "T": T, "vocab": vocab, "classes": classes, "MAX_T": max_t, "N_LAYERS": layers, "D_MODEL": D,
            "N_HEADS": H, "D_FF": FF, "norm": "post", "activation": "relu", "pooling": "mean",
            "reference": f"torch {torch.__version__}: Embedding + TransformerEncoderLayer(padding) + mean pool + Linear"}
    write_safetensors(out_dir / "classifier_model.safetensors", t, {"config": json.dumps(meta)})


class TorchSeq2Seq(torch.nn.Module):
    """Embeddings + learned positions around torch's own nn.Transformer (pre-norm) + a Linear head."""

    def __init__(self, src_vocab, tgt_vocab, max_t, layers):
        super().__init__()
        self.src_emb = torch.nn.Embedding(src_vocab, D)
        self.src_pos = torch.nn.Parameter(torch.zeros(max_t, D))
        self.tgt_emb = torch.nn.Embedding(tgt_vocab, D)
        self.tgt_pos = torch.nn.Parameter(torch.zeros(max_t, D))
        self.transformer = torch.nn.Transformer(D, H, layers, layers, FF, dropout=0.0, activation=gelu_tanh,
                                                batch_first=True, norm_first=True)
        self.out = torch.nn.Linear(D, tgt_vocab)

    def forward(self, src, src_pad, tgt, tgt_pad):
        s = self.src_emb(src) + self.src_pos[:src.shape[1]]
        t = self.tgt_emb(tgt) + self.tgt_pos[:tgt.shape[1]]
        y = self.transformer(s, t, tgt_mask=causal_mask(tgt.shape[1]), src_key_padding_mask=src_pad,
                             tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return self.out(y)


def seq2seq_names(module):
    mapping = {}
    self_block = {**common_names(2), **attn_names("attn", "self_attn", False)}
    dec_block = {**common_names(3), **attn_names("self_attn", "self_attn", False),
                 **attn_names("cross_attn", "multihead_attn", True)}
    fixed = {"src_emb.weight": "encoder.tok_emb.weight", "src_pos": "encoder.pos_emb.weight",
             "tgt_emb.weight": "decoder.tok_emb.weight", "tgt_pos": "decoder.pos_emb.weight",
             "transformer.encoder.norm.weight": "encoder.ln_f.weight", "transformer.encoder.norm.bias": "encoder.ln_f.bias",
             "transformer.decoder.norm.weight": "decoder.ln_f.weight", "transformer.decoder.norm.bias": "decoder.ln_f.bias",
             "out.weight": "lm_head.weight", "out.bias": "lm_head.bias"}
    for tname, _ in module.named_parameters():
        if tname in fixed:
            mapping[tname] = [(fixed[tname], None)]
            continue
        side, _, i, rest = tname.split(".", 4)[1:]
        prefix, table = ("encoder", self_block) if side == "encoder" else ("decoder", dec_block)
        mapping[tname] = [(f"{prefix}.blocks.{i}.{x}", rows) for x, rows in table[rest]]
    return mapping


def seq2seq_model(out_dir, src_vocab=12, tgt_vocab=10, max_t=8, layers=2, seed=7):
    gen = torch.Generator().manual_seed(seed)
    model = TorchSeq2Seq(src_vocab, tgt_vocab, max_t, layers)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if "norm" in name:
                p.copy_(f32((1.0 if name.endswith("weight") else 0.0) + 0.2 * (2 * torch.rand(p.shape, generator=gen) - 1)))
            else:
                p.copy_(f32(0.4 * (2 * torch.rand(p.shape, generator=gen) - 1)))
    S_ = 6
    src = torch.randint(0, src_vocab, (B, S_), generator=gen)
    tgt = torch.randint(0, tgt_vocab, (B, T), generator=gen)
    src_pad = torch.zeros(B, S_, dtype=torch.bool)
    src_pad[1, S_ - 2:] = True
    tgt_pad = torch.zeros(B, T, dtype=torch.bool)
    tgt_pad[0, T - 1] = True
    logits = model(src, src_pad, tgt, tgt_pad)
    dlogits = f32(2 * torch.rand(logits.shape, generator=gen) - 1)
    logits.backward(dlogits)
    mapping = seq2seq_names(model)
    t = {"src": src.to(torch.int64), "tgt": tgt.to(torch.int64), "src_padding": src_pad.to(torch.uint8),
         "tgt_padding": tgt_pad.to(torch.uint8), "dlogits": dlogits}
    export_params(model, mapping, t, grads=False)
    t["logits"] = logits
    export_params(model, mapping, t, grads=True)
    meta = {"B": B, "S": S_, "T": T, "src_vocab": src_vocab, "tgt_vocab": tgt_vocab, "MAX_T": max_t,
            "N_LAYERS": layers, "D_MODEL": D, "N_HEADS": H, "D_FF": FF, "norm": "pre", "activation": "gelu_tanh",
            "reference": f"torch {torch.__version__}: nn.Transformer(norm_first) with embeddings and a Linear head"}
    write_safetensors(out_dir / "seq2seq_model.safetensors", t, {"config": json.dumps(meta)})


def rms_norm(out_dir, rows=7, seed=8, eps=1e-5):
    """RMSNorm written out in plain torch (1.13 has no nn.RMSNorm): x * rsqrt(mean(x^2) + eps) * weight."""
    gen = torch.Generator().manual_seed(seed)
    x = f32(2 * (2 * torch.rand(rows, D, generator=gen) - 1)).requires_grad_()
    w = f32(1.0 + 0.2 * (2 * torch.rand(D, generator=gen) - 1)).requires_grad_()
    dy = f32(2 * torch.rand(rows, D, generator=gen) - 1)
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w
    y.backward(dy)
    t = {"x": x, "dy": dy, "param.weight": w, "y": y, "grad.x": x.grad, "grad.param.weight": w.grad}
    meta = {"rows": rows, "D_MODEL": D, "eps": eps,
            "reference": f"torch {torch.__version__}: x * rsqrt(mean(x^2, -1) + eps) * weight"}
    write_safetensors(out_dir / "rms_norm.safetensors", t, {"config": json.dumps(meta)})


def swiglu_feed_forward(out_dir, rows=7, seed=9):
    """SwiGLU feed-forward in plain torch: fc2(silu(gate) * up), [gate | up] = fc1(x) (fc1 holds 2 FF rows)."""
    gated_feed_forward(out_dir, "swiglu_feed_forward", F.silu, "F.silu(gate) * up", rows, seed)


def geglu_feed_forward(out_dir, rows=7, seed=11):
    """GeGLU feed-forward (T5 v1.1) in plain torch: fc2(gelu(gate) * up), GELU's tanh form."""
    gated_feed_forward(out_dir, "geglu_feed_forward", lambda g: F.gelu(g, approximate="tanh"),
                       "F.gelu(gate, approximate='tanh') * up", rows, seed)


def gated_feed_forward(out_dir, name, act, formula, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(D, 2 * FF), torch.nn.Linear(FF, D)
    for p in list(fc1.parameters()) + list(fc2.parameters()):
        with torch.no_grad():
            p.copy_(f32(0.4 * (2 * torch.rand(p.shape, generator=gen) - 1)))
    x = f32(2 * torch.rand(rows, D, generator=gen) - 1).requires_grad_()
    dy = f32(2 * torch.rand(rows, D, generator=gen) - 1)
    gate, up = fc1(x).split(FF, dim=-1)
    y = fc2(act(gate) * up)
    y.backward(dy)
    t = {"x": x, "dy": dy}
    layers = {"fc1": fc1, "fc2": fc2}
    for prefix, layer in layers.items():
        t[f"param.{prefix}.weight"], t[f"param.{prefix}.bias"] = layer.weight, layer.bias
    t["y"], t["grad.x"] = y, x.grad
    for prefix, layer in layers.items():
        t[f"grad.param.{prefix}.weight"], t[f"grad.param.{prefix}.bias"] = layer.weight.grad, layer.bias.grad
    meta = {"rows": rows, "D_MODEL": D, "D_FF": FF,
            "reference": f"torch {torch.__version__}: Linear, split, {formula}, Linear"}
    write_safetensors(out_dir / f"{name}.safetensors", t, {"config": json.dumps(meta)})


def llama_block(out_dir, seed=10, eps=1e-5, KVH=2):
    """A Llama-style decoder-only block written out in plain torch: pre-norm RMSNorm, causal multi-head attention
    with rotary positions (pairs (2i, 2i+1) of each query and key head turned by t / 10000^(2i/head)) and grouped
    queries (KVH key/value heads, head g serving query heads g * H / KVH ..), a SwiGLU feed-forward, no biases;
    parameters under xfmr's names (qkv rows [q | k | v], fc1 rows [gate | up])."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(*shape, centre=0.0, scale=0.4):
        return f32(centre + scale * (2 * torch.rand(*shape, generator=gen) - 1)).requires_grad_()

    hd = D // H
    p = {"ln1.weight": uniform(D, centre=1.0, scale=0.2), "attn.qkv.weight": uniform(D + 2 * KVH * hd, D),
         "attn.proj.weight": uniform(D, D), "ln2.weight": uniform(D, centre=1.0, scale=0.2),
         "ff.fc1.weight": uniform(2 * FF, D), "ff.fc2.weight": uniform(D, FF)}
    x = uniform(B, T, D, scale=1.0)
    dy = f32(2 * torch.rand(B, T, D, generator=gen) - 1)

    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps) * w

    q, k, v = (rms(x, p["ln1.weight"]) @ p["attn.qkv.weight"].T).split([D, KVH * hd, KVH * hd], dim=-1)
    q = q.reshape(B, T, H, hd).transpose(1, 2)
    k, v = (t.reshape(B, T, KVH, hd).transpose(1, 2) for t in (k, v))
    angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, hd, 2) / hd)[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)

    def turn(t):
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    q, k = turn(q), turn(k)
    k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
    scores = (q @ k.transpose(-2, -1) / hd ** 0.5).masked_fill(causal_mask(T), float("-inf"))
    attn = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
    h = x + attn @ p["attn.proj.weight"].T
    gate, up = (rms(h, p["ln2.weight"]) @ p["ff.fc1.weight"].T).split(FF, dim=-1)
    y = h + (F.silu(gate) * up) @ p["ff.fc2.weight"].T
    y.backward(dy)
    t = {"x": x, "dy": dy}
    t.update({f"param.{n}": w for n, w in p.items()})
    t["y"], t["grad.x"] = y, x.grad
    t.update({f"grad.param.{n}": w.grad for n, w in p.items()})
    meta = {"B": B, "T": T, "D_MODEL": D, "N_HEADS": H, "N_KV_HEADS": KVH, "D_FF": FF, "norm": "pre, RMSNorm",
            "activation": "swiglu",
            "bias": False, "positions": "rotary", "causal": True, "reference": f"torch {torch.__version__}: written out"}
    write_safetensors(out_dir / "llama_block.safetensors", t, {"config": json.dumps(meta)})


# ---- GPT-2 in the Hugging Face layout ------------------------------------------
# A plain-PyTorch GPT-2 over a dict of Hugging Face-named tensors: Conv1D
# weights stored (in, out), tied head, GELU tanh, eps 1e-5, causal attention,
# and a past_key_values-style cache for decoding.

def gpt2_params(vocab, n_pos, d, layers, gen, scale):
    def u(*shape, centre=0.0, spread=scale):
        return f32(centre + spread * (2 * torch.rand(shape, generator=gen) - 1))
    p = {"wte.weight": u(vocab, d), "wpe.weight": u(n_pos, d)}
    for i in range(layers):
        h = f"h.{i}."
        p.update({h + "ln_1.weight": u(d, centre=1.0, spread=0.2), h + "ln_1.bias": u(d, spread=0.2),
                  h + "attn.c_attn.weight": u(d, 3 * d), h + "attn.c_attn.bias": u(3 * d),
                  h + "attn.c_proj.weight": u(d, d), h + "attn.c_proj.bias": u(d),
                  h + "ln_2.weight": u(d, centre=1.0, spread=0.2), h + "ln_2.bias": u(d, spread=0.2),
                  h + "mlp.c_fc.weight": u(d, 4 * d), h + "mlp.c_fc.bias": u(4 * d),
                  h + "mlp.c_proj.weight": u(4 * d, d), h + "mlp.c_proj.bias": u(d)})
    p["ln_f.weight"], p["ln_f.bias"] = u(d, centre=1.0, spread=0.2), u(d, spread=0.2)
    return p


def gpt2_forward(p, ids, heads, layers, past=None, eps=1e-5):
    """ids (B, T) -> logits (B, T, vocab), and the new past [(k, v)] per layer."""
    b, t = ids.shape
    t0 = 0 if past is None else past[0][0].shape[2]
    d = p["wte.weight"].shape[1]
    hd = d // heads
    x = p["wte.weight"][ids] + p["wpe.weight"][t0:t0 + t]
    present = []
    for i in range(layers):
        h = f"h.{i}."
        a = F.layer_norm(x, (d,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(d, dim=2)
        q, k, v = (z.view(b, t, heads, hd).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[i][0], k], dim=2), torch.cat([past[i][1], v], dim=2)
        present.append((k, v))
        s = q @ k.transpose(-1, -2) / hd ** 0.5
        allowed = torch.ones(t, t0 + t, dtype=torch.bool).tril(diagonal=t0)
        s = s.masked_fill(~allowed, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (d,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (d,), p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].T, present


def gpt2_greedy(p, prompt, n, heads, layers):
    """n greedy tokens after prompt (a list), decoding with the cache; and the
    smallest gap between the two best logits on the way (a float32 run picks
    the same tokens when it is far above float32 rounding)."""
    logits, past = gpt2_forward(p, torch.tensor([prompt]), heads, layers)
    out, gap = [], float("inf")
    for _ in range(n):
        top = logits[0, -1].topk(2).values
        gap = min(gap, float(top[0] - top[1]))
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        logits, past = gpt2_forward(p, torch.tensor([[nxt]]), heads, layers, past)
    return out, gap


def gpt2_config_json(vocab, n_pos, d, layers, heads):
    return json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": vocab,
                       "n_positions": n_pos, "n_ctx": n_pos, "n_embd": d, "n_layer": layers, "n_head": heads,
                       "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05},
                      indent=2) + "\n"


def write_gpt2_dir(out_dir, p, vocab, n_pos, d, layers, heads):
    """model.safetensors as the Hub's gpt2 holds it (no prefix, with the
    causal-mask buffers h.<i>.attn.bias), and config.json beside it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t = dict(p)
    for i in range(layers):
        t[f"h.{i}.attn.bias"] = torch.ones(n_pos, n_pos).tril().view(1, 1, n_pos, n_pos)
    write_safetensors(out_dir / "model.safetensors", t, {"format": "pt"})
    (out_dir / "config.json").write_text(gpt2_config_json(vocab, n_pos, d, layers, heads))


def gpt2_tiny(out_dir, vocab=61, n_pos=24, d=32, layers=2, heads=4, seed=11):
    """fixtures/gpt2_tiny/: the checkpoint, and expected.safetensors with
    ids (2, 7), their logits (14, vocab), a prompt and its 12 greedy tokens."""
    gen = torch.Generator().manual_seed(seed)
    p = gpt2_params(vocab, n_pos, d, layers, gen, scale=0.3)
    write_gpt2_dir(out_dir / "gpt2_tiny", p, vocab, n_pos, d, layers, heads)
    ids = torch.randint(0, vocab, (2, 7), generator=gen)
    logits, _ = gpt2_forward(p, ids, heads, layers)
    prompt = torch.randint(0, vocab, (5,), generator=gen).tolist()
    greedy, gap = gpt2_greedy(p, prompt, 12, heads, layers)
    assert gap > 1e-3, f"greedy margin {gap} too small for a float32 comparison; change the seed"
    write_safetensors(out_dir / "gpt2_tiny" / "expected.safetensors",
                      {"ids": ids.to(torch.int64), "logits": logits.reshape(-1, vocab),
                       "prompt": torch.tensor(prompt, dtype=torch.int64),
                       "greedy": torch.tensor(greedy, dtype=torch.int64)},
                      {"config": json.dumps({"n_head": heads, "n_layer": layers, "greedy_margin": gap,
                                             "reference": f"torch {torch.__version__}, float64, plain GPT-2"})})


# ---- llama2.c checkpoints ------------------------------------------------------
# A Llama written out in plain torch over llama2.c's tensors (its model.py:
# pre-norm RMSNorm with eps 1e-5, rotary pairs (2i, 2i+1) turned by
# t / 10000^(2i/head), grouped key/value heads, SwiGLU w2(silu(w1 x) * w3 x),
# no biases), and llama2.c's .bin layouts as its export.py writes them.

def llama2c_params(dim, hidden, layers, heads, kv_heads, vocab, shared, gen):
    def u(*shape, centre=0.0, spread=0.3):
        return f32(centre + spread * (2 * torch.rand(shape, generator=gen) - 1))
    kv = dim // heads * kv_heads
    p = {"tok_embeddings": u(vocab, dim), "norm": u(dim, centre=1.0, spread=0.2)}
    for i in range(layers):
        p.update({f"{i}.attention_norm": u(dim, centre=1.0, spread=0.2), f"{i}.wq": u(dim, dim), f"{i}.wk": u(kv, dim),
                  f"{i}.wv": u(kv, dim), f"{i}.wo": u(dim, dim), f"{i}.ffn_norm": u(dim, centre=1.0, spread=0.2),
                  f"{i}.w1": u(hidden, dim), f"{i}.w2": u(dim, hidden), f"{i}.w3": u(hidden, dim)})
    p["output"] = p["tok_embeddings"] if shared else u(vocab, dim)
    return p


def llama2c_forward(p, ids, layers, heads, kv_heads, eps=1e-5):
    """Logits (T, vocab) in float64 for one sequence of ids."""
    w = {k: v.double() for k, v in p.items()}
    T, dim = len(ids), w["norm"].shape[0]
    hd = dim // heads
    angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, hd, 2) / hd)[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)

    def rms(v, g):
        return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps) * g

    def turn(t):  # (heads, T, hd)
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    x = w["tok_embeddings"][torch.tensor(ids)]
    for i in range(layers):
        h = rms(x, w[f"{i}.attention_norm"])
        q = turn((h @ w[f"{i}.wq"].T).reshape(T, heads, hd).transpose(0, 1))
        k = turn((h @ w[f"{i}.wk"].T).reshape(T, kv_heads, hd).transpose(0, 1))
        v = (h @ w[f"{i}.wv"].T).reshape(T, kv_heads, hd).transpose(0, 1)
        k, v = k.repeat_interleave(heads // kv_heads, dim=0), v.repeat_interleave(heads // kv_heads, dim=0)
        scores = (q @ k.transpose(-2, -1) / hd ** 0.5).masked_fill(causal_mask(T), float("-inf"))
        x = x + (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(T, dim) @ w[f"{i}.wo"].T
        h = rms(x, w[f"{i}.ffn_norm"])
        x = x + (F.silu(h @ w[f"{i}.w1"].T) * (h @ w[f"{i}.w3"].T)) @ w[f"{i}.w2"].T
    return rms(x, w["norm"]) @ w["output"].T


def write_llama2c(path, p, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared):
    def floats(t):
        return struct.pack(f"<{t.numel()}f", *t.reshape(-1).tolist())

    def each(name):
        return b"".join(floats(p[f"{i}.{name}"]) for i in range(layers))

    hd = dim // heads
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, hd, 2) / hd)[None, :]
    if version == 0:
        out = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len)
        out += floats(p["tok_embeddings"]) + each("attention_norm") + each("wq") + each("wk") + each("wv")
        out += each("wo") + each("ffn_norm") + each("w1") + each("w2") + each("w3") + floats(p["norm"])
        out += floats(f32(torch.cos(angle))) + floats(f32(torch.sin(angle)))
    else:
        out = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv_heads, vocab, seq_len, int(shared))
        out += b"\0" * (256 - len(out))
        out += each("attention_norm") + each("ffn_norm") + floats(p["norm"]) + floats(p["tok_embeddings"])
        for name in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            out += each(name)
    if not shared:
        out += floats(p["output"])
    path.write_bytes(out)


def llama2c_tiny(out_dir, dim=32, hidden=48, layers=2, heads=4, kv_heads=2, vocab=40, seq_len=16):
    """fixtures/llama2c/: model_v0.bin (legacy layout, classifier shared with
    the embedding) and model_v1.bin (version 1, a classifier of its own),
    and expected.json: a sequence of ids and each model's logits for it."""
    d = out_dir / "llama2c"
    d.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(20)
    ids = torch.randint(0, vocab, (12,), generator=gen).tolist()
    expected = {"ids": ids, "dim": dim, "hidden_dim": hidden, "n_layers": layers, "n_heads": heads,
                "n_kv_heads": kv_heads, "vocab_size": vocab, "seq_len": seq_len,
                "reference": f"torch {torch.__version__}, float64, llama2.c's model written out", "models": {}}
    for version, shared in ((0, True), (1, False)):
        p = llama2c_params(dim, hidden, layers, heads, kv_heads, vocab, shared, gen)
        name = f"model_v{version}.bin"
        write_llama2c(d / name, p, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared)
        logits = llama2c_forward(p, ids, layers, heads, kv_heads)
        expected["models"][name] = {"shared_classifier": shared, "logits": logits.reshape(-1).tolist()}
    (d / "expected.json").write_text(json.dumps(expected) + "\n")


def llama2c_encode(pieces, scores, text, bos=True, eos=False):
    """llama2.c's run.c encode(): BOS, the dummy prefix " ", each UTF-8 code
    point as its piece or its bytes as <0xHH> (id byte + 3), then the
    best-scoring adjacent merge (leftmost among equals) until none is left."""
    ids_of = {}
    for i, p in enumerate(pieces):
        ids_of.setdefault(p, i)
    ids = [1] if bos else []
    if text:
        ids.append(ids_of[b" "])
    for ch in text:
        b = ch.encode("utf-8")
        ids.extend([ids_of[b]] if b in ids_of else [x + 3 for x in b])
    while True:
        best, best_id, best_at = -1e10, -1, -1
        for i in range(len(ids) - 1):
            j = ids_of.get(pieces[ids[i]] + pieces[ids[i + 1]], -1)
            if j >= 0 and scores[j] > best:
                best, best_id, best_at = scores[j], j, i
        if best_id < 0:
            break
        ids[best_at:best_at + 2] = [best_id]
    return ids + ([2] if eos else [])


def llama2c_tokenizer(out_dir):
    """fixtures/llama2c/tokenizer.bin (Llama's specials, the 256 byte pieces,
    then " ", some letters, marks and merges, scored as SentencePiece does,
    higher first) and tokenizer.json: texts with run.c's encodings."""
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]
    words = [" ", *"abcdefghijklmnopqrstuvwxyzOT", ",", ".", "!", "\u00e9",
             "th", "he", "the", " t", " the", "ll", "lo", "llo", "el", "hel", "hello", " h", " hello", "on", "ce",
             "nce", "Once", " Once", "up", "pon", "upon", " u", " upon", "ti", "me", "time", " time", " a", "or",
             "wor", "ld", "world", " w", " world", "caf", "caf\u00e9"]
    pieces += [w.encode("utf-8") for w in words]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(words))]
    max_len = max(len(p) for p in pieces)
    out = struct.pack("<i", max_len)
    for p, s in zip(pieces, scores):
        out += struct.pack("<fi", s, len(p)) + p
    d = out_dir / "llama2c"
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.bin").write_bytes(out)
    texts = ["Once upon a time", "hello, the world!", "caf\u00e9 \u00fcber alles", "a\nb", "", "the the  the"]
    cases = [{"text": t, "bos": True, "eos": False, "ids": llama2c_encode(pieces, scores, t)} for t in texts]
    cases.append({"text": "Once", "bos": False, "eos": True, "ids": llama2c_encode(pieces, scores, "Once", False, True)})
    (d / "tokenizer.json").write_text(json.dumps({"vocab_size": len(pieces), "max_token_length": max_len,
                                                  "cases": cases}, ensure_ascii=False) + "\n")


def hf_llama_tiny(out_dir, dim=32, hidden=48, layers=2, heads=4, kv_heads=2, vocab=40, n_pos=16):
    """fixtures/hf_llama/: a LlamaForCausalLM in the Hugging Face layout
    (model.safetensors, config.json; untied head, grouped key/value heads),
    q_proj and k_proj in Hugging Face's rotate-half order (its conversion
    script's permute of Meta's weights), and expected.safetensors: ids (12)
    and their float64 logits from a plain-torch Llama that turns pairs
    (i, i + head/2) as Hugging Face's rotate_half does; the same logits as
    the interleaved model the weights came from (asserted here)."""
    gen = torch.Generator().manual_seed(30)
    p = llama2c_params(dim, hidden, layers, heads, kv_heads, vocab, False, gen)
    hd = dim // heads

    def to_rotate_half(w, n):  # Meta's pairs (2i, 2i+1) -> Hugging Face's (i, i + hd/2), per head
        return w.reshape(n, hd // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape[0], w.shape[1])

    hf = {"model.embed_tokens.weight": p["tok_embeddings"], "model.norm.weight": p["norm"], "lm_head.weight": p["output"]}
    for i in range(layers):
        l = f"model.layers.{i}."
        hf.update({l + "input_layernorm.weight": p[f"{i}.attention_norm"],
                   l + "self_attn.q_proj.weight": to_rotate_half(p[f"{i}.wq"], heads),
                   l + "self_attn.k_proj.weight": to_rotate_half(p[f"{i}.wk"], kv_heads),
                   l + "self_attn.v_proj.weight": p[f"{i}.wv"], l + "self_attn.o_proj.weight": p[f"{i}.wo"],
                   l + "post_attention_layernorm.weight": p[f"{i}.ffn_norm"],
                   l + "mlp.gate_proj.weight": p[f"{i}.w1"], l + "mlp.up_proj.weight": p[f"{i}.w3"],
                   l + "mlp.down_proj.weight": p[f"{i}.w2"]})
    ids = torch.randint(0, vocab, (12,), generator=gen).tolist()

    def rms(v, g):
        return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * g

    def rotate_half(t):
        return torch.cat((-t[..., hd // 2:], t[..., :hd // 2]), dim=-1)

    def forward(ids):
        T = len(ids)
        inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angle = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
        return llama_hf_layers(hf, ids, layers, heads, kv_heads, hd, dim, cos, sin, rms, rotate_half)

    logits = forward(ids)
    # Greedy continuation, the whole prefix recomputed for each token (no
    # cache); the smallest gap between the two best logits on the way shows
    # that float32 picks the same tokens.
    greedy, gap, seq = [], float("inf"), list(ids[:4])
    for _ in range(len(ids) - 4):
        last = forward(seq)[-1]
        top = last.topk(2).values
        gap = min(gap, float(top[0] - top[1]))
        seq.append(int(last.argmax()))
        greedy.append(seq[-1])
    assert gap > 1e-3, f"greedy gap {gap} too small for float32"
    assert torch.allclose(logits, llama2c_forward(p, ids, layers, heads, kv_heads), atol=1e-9), "rotate-half mismatch"
    d = out_dir / "hf_llama"
    d.mkdir(parents=True, exist_ok=True)
    write_safetensors(d / "model.safetensors", hf, {"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
              "intermediate_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": n_pos,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
              "rope_scaling": None, "attention_bias": False}
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(d / "expected.safetensors", {"ids": torch.tensor(ids, dtype=torch.int64), "logits": logits,
                                                   "greedy": torch.tensor(greedy, dtype=torch.int64)},
                      {"reference": f"torch {torch.__version__}, float64, rotate-half Llama; greedy: "
                                    f"after ids[:4], gap {gap:.3g}"})


def llama_hf_layers(hf, ids, layers, heads, kv_heads, hd, dim, cos, sin, rms, rotate_half):
    """hf_llama_tiny's plain-torch LlamaForCausalLM forward: logits (T, vocab);
    q, k and v with their biases where hf has them (Qwen2)."""
    T = len(ids)

    def proj(h, name):
        y = h @ hf[name + ".weight"].T
        return y + hf[name + ".bias"] if name + ".bias" in hf else y

    x = hf["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(layers):
        l = f"model.layers.{i}."
        h = rms(x, hf[l + "input_layernorm.weight"])
        q = proj(h, l + "self_attn.q_proj").reshape(T, heads, hd).transpose(0, 1)
        k = proj(h, l + "self_attn.k_proj").reshape(T, kv_heads, hd).transpose(0, 1)
        v = proj(h, l + "self_attn.v_proj").reshape(T, kv_heads, hd).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(heads // kv_heads, dim=0), v.repeat_interleave(heads // kv_heads, dim=0)
        scores = (q @ k.transpose(-2, -1) / hd ** 0.5).masked_fill(causal_mask(T), float("-inf"))
        x = x + (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(T, dim) @ hf[l + "self_attn.o_proj.weight"].T
        h = rms(x, hf[l + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ hf[l + "mlp.gate_proj.weight"].T) * (h @ hf[l + "mlp.up_proj.weight"].T)) @ \
            hf[l + "mlp.down_proj.weight"].T
    return rms(x, hf["model.norm.weight"]) @ hf["lm_head.weight"].T


def byte_symbols():
    """GPT-2's stand-ins for the 256 bytes: the printable Latin-1 bytes are
    themselves, the others code points 256 and up in byte order."""
    printable = [b for b in range(256) if ord("!") <= b <= ord("~") or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff]
    symbols, n = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + n)
            n += 1
    return symbols


def bytes_tokenizer(out_dir):
    """fixtures/lm/tokenizer.json: byte-level BPE without merges, the id of
    a byte its value and <|endoftext|> 256: a tokenizer.json that makes a
    text's ids its bytes (the end-to-end test of xfmr-lm, lm_loss.py)."""
    vocab = {s: b for b, s in byte_symbols().items()}
    vocab["<|endoftext|>"] = 256
    j = {"version": "1.0", "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True}],
         "normalizer": None,
         "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
         "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    d = out_dir / "lm"
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def gpt2_small(out_dir, prompt, n=16, seed=12):
    """A gpt2-small shaped checkpoint with random weights (about 500 MB), and
    expected.json: the prompt's ids and n greedy ids after it."""
    vocab, n_pos, d, layers, heads = 50257, 1024, 768, 12, 12
    gen = torch.Generator().manual_seed(seed)
    p = gpt2_params(vocab, n_pos, d, layers, gen, scale=0.1)
    write_gpt2_dir(out_dir, p, vocab, n_pos, d, layers, heads)
    greedy, gap = gpt2_greedy(p, prompt, n, heads, layers)
    (out_dir / "expected.json").write_text(json.dumps({"prompt": prompt, "greedy": greedy, "margin": gap}) + "\n")
    print(f"gpt2-small: {n} greedy tokens, smallest top-2 logit gap {gap:.3g}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--gpt2-small":
        # make_fixtures.py --gpt2-small DIR ID,ID,...: the on-the-fly check of test_gpt2_small.sh.
        gpt2_small(Path(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")])
        return
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "fixtures")
    out_dir.mkdir(parents=True, exist_ok=True)
    self_block("decoder_only_block_prenorm", True, gelu_tanh, causal=True, padding=False, seed=1, out_dir=out_dir)
    self_block("encoder_block_postnorm_padded", False, F.relu, causal=False, padding=True, seed=2, out_dir=out_dir)
    decoder_block("decoder_block_postnorm", False, F.relu, seed=3, out_dir=out_dir)
    decoder_block("decoder_block_prenorm", True, gelu_tanh, seed=4, out_dir=out_dir)
    decoder_model(out_dir)
    classifier_model(out_dir)
    seq2seq_model(out_dir)
    rms_norm(out_dir)
    swiglu_feed_forward(out_dir)
    geglu_feed_forward(out_dir)
    llama_block(out_dir)
    gpt2_tiny(out_dir)
    llama2c_tiny(out_dir)
    llama2c_tokenizer(out_dir)
    hf_llama_tiny(out_dir)
    bytes_tokenizer(out_dir)
    for p in sorted(out_dir.glob("**/*.safetensors")):
        print(f"{p}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
