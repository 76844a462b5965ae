#!/usr/bin/env python3
"""A small random language model as a GGUF file, written from the format's
description (ggml's docs/gguf.md, llama.cpp's tensor names and its
reference quantisation of Q8_0 and Q4_0), not by xfmr: what
test/reference/llama_cpp_agreement.sh gives llama.cpp and xfmr alike.

    python3 test/reference/random_gguf.py ARCH TYPE OUT.gguf [SEED]

ARCH: llama (q and k in Meta's interleaved rotary order, a SentencePiece
tokenizer of byte pieces and a few merges), qwen2 (q/k/v biases, q and k in
Hugging Face's halves, a byte-level BPE tokenizer with Qwen2's
pre-tokenizer) or gpt2 (LayerNorm, GELU, learned positions, biases, a head
tied to the embedding, a byte-level BPE tokenizer with GPT-2's
pre-tokenizer).
TYPE: f32, f16, bf16, q8_0, q4_0, q4_k or q6_k, the type of every matrix;
norms, biases and learned positions stay F32. Q4_K and Q6_K matrices are
random super-blocks of 256 (their reference quantiser is a search; the
model's weights are what the blocks decode to), the model 256 wide.
"""
import struct
import sys

import numpy as np

from make_gguf import kv, pack_q4_k, pack_q6_k, write

TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "q4_k": 12, "q6_k": 14, "bf16": 30}
HEADS, KV_HEADS, LAYERS, CONTEXT = 4, 2, 2, 128
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "in", "sun", "and", "he", "she", "it", "was"]


def f16_bits(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def encode(values, gtype):
    """ggml's bytes of a float32 matrix (rows of a multiple of 32 for the block types)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if gtype == 0:
        return x.tobytes()
    if gtype == 1:
        return x.astype(np.float16).tobytes()
    if gtype == 30:  # round to nearest even
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    blocks = x.reshape(-1, 32)
    out = bytearray()
    for b in blocks:
        if gtype == 8:  # Q8_0: d = amax / 127, q = round(x / d) half away from zero
            d = np.float32(np.abs(b).max() / np.float32(127))
            inv = np.float32(1) / d if d else np.float32(0)
            q = np.trunc(b * inv + np.copysign(np.float32(0.5), b * inv)).astype(np.int8)
            out += f16_bits(d).tobytes() + q.tobytes()
        else:  # Q4_0: d = (the value of largest magnitude) / -8, q = min(15, trunc(x / d + 8.5))
            m = b[np.argmax(np.abs(b))]
            d = np.float32(m / np.float32(-8))
            inv = np.float32(1) / d if d else np.float32(0)
            q = np.minimum(15, np.trunc(b * inv + np.float32(8.5))).astype(np.uint8)
            out += f16_bits(d).tobytes() + bytes(int(q[j]) | (int(q[j + 16]) << 4) for j in range(16))
    return bytes(out)


def k_blocks(rng, count, sigma, gtype):
    """count random Q4_K or Q6_K super-blocks whose values spread about sigma."""
    out = bytearray()
    for _ in range(count):
        if gtype == 12:  # d sc (nib - 7.5) about: the minimum centres the values
            sc = rng.integers(4, 9, 8)
            mn = np.rint(7.5 * sc).astype(int)
            d = f16_bits(sigma / (6 * 4.6)).item()
            out += pack_q4_k(d, d, sc, mn, rng.integers(0, 16, 256))
        else:  # d sc (q - 32)
            sc = rng.integers(20, 61, 16)
            out += pack_q6_k(rng.integers(0, 64, 256), sc, f16_bits(sigma / (40 * 18.5)).item())
    return bytes(out)


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 bytes: printable Latin-1 bytes
    stand for themselves, the others for code points from 256 in byte order."""
    out, nxt = [], 256
    for b in range(256):
        if (33 <= b <= 126) or (161 <= b <= 172) or (174 <= b <= 255):
            out.append(chr(b))
        else:
            out.append(chr(nxt))
            nxt += 1
    return out


def sentencepiece_tokenizer():
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = set()
    for w in WORDS:  # every prefix of "▁word", so that SentencePiece's merges reach the word
        s = "\u2581" + w
        for n in range(1, len(s) + 1):
            pieces.add(s[:n])
        pieces.update(w)
    for p in sorted(pieces, key=lambda p: (len(p), p)):
        tokens.append(p)
        types.append(1)
        scores.append(-100.0 + 10.0 * len(p) - 0.01 * len(tokens))
    return [
        kv("tokenizer.ggml.model", 8, "llama"), kv("tokenizer.ggml.tokens", 9, (8, tokens)),
        kv("tokenizer.ggml.scores", 9, (6, scores)), kv("tokenizer.ggml.token_type", 9, (5, types)),
        kv("tokenizer.ggml.bos_token_id", 4, 1), kv("tokenizer.ggml.eos_token_id", 4, 2),
        kv("tokenizer.ggml.unknown_token_id", 4, 0), kv("tokenizer.ggml.add_bos_token", 7, True),
    ], len(tokens)


def bpe_tokenizer(pre):
    sym = byte_symbols()
    tokens, merges = list(sym), []
    for w in WORDS:  # merge " word" left to right, a pair at a time
        s = [sym[b] for b in (" " + w).encode()]
        while len(s) > 1:
            pair = s[0] + " " + s[1]
            if pair not in merges:
                merges.append(pair)
                tokens.append(s[0] + s[1])
            s = [s[0] + s[1]] + s[2:]
    tokens.append("<|endoftext|>")
    types = [1] * (len(tokens) - 1) + [3]
    eot = len(tokens) - 1
    return [
        kv("tokenizer.ggml.model", 8, "gpt2"), kv("tokenizer.ggml.pre", 8, pre),
        kv("tokenizer.ggml.tokens", 9, (8, tokens)), kv("tokenizer.ggml.token_type", 9, (5, types)),
        kv("tokenizer.ggml.merges", 9, (8, merges)), kv("tokenizer.ggml.bos_token_id", 4, eot),
        kv("tokenizer.ggml.eos_token_id", 4, eot), kv("tokenizer.ggml.add_bos_token", 7, False),
    ], len(tokens)


def main(arch, type_name, out, seed):
    rng = np.random.default_rng(seed)
    gtype = TYPES[type_name]
    D, FF = (256, 512) if gtype in (12, 14) else (64, 96)  # rows of whole super-blocks for the K types
    gpt2 = arch == "gpt2"
    kv_heads = HEADS if gpt2 else KV_HEADS
    head = D // HEADS
    tok_meta, vocab = sentencepiece_tokenizer() if arch == "llama" else bpe_tokenizer("gpt-2" if gpt2 else "qwen2")
    meta = [kv("general.architecture", 8, arch), kv("general.name", 8, "random " + arch)]
    for key, v in (("context_length", CONTEXT), ("embedding_length", D), ("block_count", LAYERS),
                   ("feed_forward_length", FF), ("attention.head_count", HEADS),
                   ("attention.head_count_kv", kv_heads)):
        meta.append(kv(arch + "." + key, 4, v))
    if gpt2:
        meta.append(kv(arch + ".attention.layer_norm_epsilon", 6, 1e-5))
    else:
        meta += [kv(arch + ".attention.layer_norm_rms_epsilon", 6, 1e-6), kv(arch + ".rope.freq_base", 6, 10000.0),
                 kv(arch + ".rope.dimension_count", 4, head)]
    meta += tok_meta
    tensors = []

    def matrix(name, cols, rows, scale):
        if gtype in (12, 14):
            tensors.append((name, [cols, rows], gtype, k_blocks(rng, rows * cols // 256, scale, gtype)))
            return
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        tensors.append((name, [cols, rows], gtype, encode(w, gtype)))

    def vector(name, n, mean, scale):
        v = (mean + rng.standard_normal(n) * scale).astype(np.float32)
        tensors.append((name, [n], 0, v.tobytes()))

    # A tied head's logits are the embedding's products with the last state:
    # a small embedding keeps a token's own row from winning every time.
    matrix("token_embd.weight", D, vocab, 0.05 if gpt2 else 1.0)
    if gpt2:
        pos = (rng.standard_normal((CONTEXT, D)) * 0.1).astype(np.float32)
        tensors.append(("position_embd.weight", [D, CONTEXT], 0, pos.tobytes()))
        vector("output_norm.bias", D, 0.0, 0.1)
    vector("output_norm.weight", D, 1.0, 0.1)
    if not gpt2:  # an untied head; gpt2 ties its
        matrix("output.weight", D, vocab, 1.0)
    q, k = HEADS * head, kv_heads * head
    for i in range(LAYERS):
        b = "blk.%d." % i
        vector(b + "attn_norm.weight", D, 1.0, 0.1)
        vector(b + "ffn_norm.weight", D, 1.0, 0.1)
        matrix(b + "attn_output.weight", q, D, 0.5 / np.sqrt(q))
        matrix(b + "ffn_down.weight", FF, D, 0.5 / np.sqrt(FF))
        if gpt2:
            matrix(b + "attn_qkv.weight", D, 3 * D, 1.0 / np.sqrt(D))
            matrix(b + "ffn_up.weight", D, FF, 1.0 / np.sqrt(D))
            for name, n in (("attn_norm.bias", D), ("ffn_norm.bias", D), ("attn_qkv.bias", 3 * D),
                            ("attn_output.bias", D), ("ffn_up.bias", FF), ("ffn_down.bias", D)):
                vector(b + name, n, 0.0, 0.02)
            continue
        matrix(b + "attn_q.weight", D, q, 1.0 / np.sqrt(D))
        matrix(b + "attn_k.weight", D, k, 1.0 / np.sqrt(D))
        matrix(b + "attn_v.weight", D, k, 1.0 / np.sqrt(D))
        matrix(b + "ffn_gate.weight", D, FF, 1.0 / np.sqrt(D))
        matrix(b + "ffn_up.weight", D, FF, 1.0 / np.sqrt(D))
        if arch == "qwen2":
            vector(b + "attn_q.bias", q, 0.0, 0.02)
            vector(b + "attn_k.bias", k, 0.0, 0.02)
            vector(b + "attn_v.bias", k, 0.0, 0.02)
    write(out, meta, tensors)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 75)
