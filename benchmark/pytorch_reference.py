#!/usr/bin/python3
"""The xfmr-bench measurements for the same models in PyTorch (eager).

The model is the seeds' character GPT, shaped exactly like xfmr's Decoder:
token and learned position embeddings, N pre-norm blocks (fused q/k/v linear,
causal softmax attention written out as in the seeds, output projection,
ReLU feed-forward, dropout on both residual branches), a final layer norm and
a linear head with bias. Initialisation as xfmr's init_gpt2: N(0, 0.02)
matrices and embeddings, zero biases. AdamW(0.9, 0.999, eps 1e-8, decay
0.01 on matrices only). Generation is the seeds' loop: recompute the whole
context for every new token. Prints the same JSON as xfmr-bench --json.

With --gpt2 DIR it times GPT-2 decoding instead, as xfmr-bench --pretrained does:
the same model with GELU (tanh), loaded from a Hugging Face GPT-2 checkpoint
of gpt2-small's shape (Conv1D weights transposed into nn.Linear, head tied
to the token embedding), greedy tokens after <|endoftext|> decoded with a
past_key_values-style cache (each layer's keys and values concatenated as
they grow), as transformers' GPT-2 does.

Run it with Debian's python3 and python3-torch, e.g.
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 benchmark/pytorch_reference.py \
      --model shakespeare-small --threads 2
or on an NVIDIA GPU with --device cuda (strict FP32 unless --tf32; every
timed call ends with torch.cuda.synchronize(), as xfmr-bench's do).
"""
import argparse
import ctypes
import json
import math
import resource
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

# name: (MAX_T, D, H, L, FF, dropout, default batch); as include/xfmr/presets.hpp
PRESETS = {
    "tiny": (16, 32, 2, 2, 64, 0.1, 16),
    "shakespeare-small": (32, 64, 4, 4, 256, 0.0, 16),
    "names": (16, 64, 4, 4, 256, 0.0, 16),
    "shakespeare-mid": (128, 128, 4, 4, 512, 0.0, 16),
    "shakespeare-large": (256, 384, 6, 6, 1536, 0.2, 64),
    "gpt2-small": (1024, 768, 12, 12, 3072, 0.0, 16),
}
# The feed-forward activation of each preset; ReLU where not named.
# xfmr's Gelu is the tanh approximation.
GELU_PRESETS = {"gpt2-small"}


# Attention through F.scaled_dot_product_attention (--sdpa) instead of written out.
SDPA = False

class Block(nn.Module):
    def __init__(self, d, h, ff, t, dropout, gelu):
        super().__init__()
        self.h = h
        self.act = (lambda z: F.gelu(z, approximate="tanh")) if gelu else F.relu
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(t, t, dtype=torch.bool)))

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        heads = lambda z: z.view(b, t, self.h, d // self.h).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        if SDPA:  # PyTorch's fused attention (flash / memory-efficient kernels where they apply)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d // self.h))
            scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, x):
        x = x + self.drop1(self.attention(self.ln1(x)))
        return x + self.drop2(self.fc2(self.act(self.fc1(self.ln2(x)))))

    def forward_cached(self, x, past):
        """x (b, t, d) after the positions in past = (k, v) or None; returns y and the new past."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        heads = lambda z: z.view(b, t, self.h, d // self.h).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        t0 = k.shape[2] - t
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d // self.h))
        if t > 1:
            scores = scores.masked_fill(~self.mask[t0:t0 + t, :t0 + t], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x)))), (k, v)


class CharGpt(nn.Module):
    def __init__(self, vocab, t, d, h, l, ff, dropout, gelu):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(t, d)
        self.blocks = nn.Sequential(*[Block(d, h, ff, t, dropout, gelu) for _ in range(l)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(t, device=ids.device))
        return self.lm_head(self.ln_f(self.blocks(x)))

    def forward_cached(self, ids, past):
        """Logits of ids (b, t) following the positions in past (a list per block, or None)."""
        t0 = 0 if past is None else past[0][0].shape[2]
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(t0, t0 + ids.shape[1], device=ids.device))
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if past is None else past[i])
            present.append(kv)
        return self.lm_head(self.ln_f(x)), present


def peak_rss_mb():
    """The process's peak RSS in megabytes (10^6 bytes; Linux reports kibibytes), as xfmr-bench's."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def load_gpt2(path, device):
    """A CharGpt holding a Hugging Face GPT-2 checkpoint of gpt2-small's shape (model.safetensors, config.json)."""
    with open(f"{path}/config.json") as f:
        c = json.load(f)
    with open(f"{path}/model.safetensors", "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in dtypes:
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtypes[info["dtype"]]).float()
        tensors[name.removeprefix("transformer.")] = t.view(info["shape"])
    t_max, d, h, l = c["n_positions"], c["n_embd"], c["n_head"], c["n_layer"]
    model = CharGpt(c["vocab_size"], t_max, d, h, l, c.get("n_inner") or 4 * d, 0.0, True)
    names = {"tok_emb.weight": "wte.weight", "pos_emb.weight": "wpe.weight", "ln_f.weight": "ln_f.weight",
             "ln_f.bias": "ln_f.bias"}
    for i in range(l):
        for ours, theirs in [("ln1", "ln_1"), ("qkv", "attn.c_attn"), ("proj", "attn.c_proj"), ("ln2", "ln_2"),
                             ("fc1", "mlp.c_fc"), ("fc2", "mlp.c_proj")]:
            for leaf in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{leaf}"] = f"h.{i}.{theirs}.{leaf}"
    with torch.no_grad():
        for ours, theirs in names.items():
            p = model.get_parameter(ours)
            t = tensors[theirs]
            p.copy_(t.T if p.dim() == 2 and ("blocks." in ours) else t)  # Conv1D: (in, out)
        model.lm_head.weight = model.tok_emb.weight  # tied, as GPT-2
        model.lm_head.bias.zero_()
    return model.to(device).eval(), c


def gpt2_benchmark(args):
    """Greedy decoding of --gpt2-tokens tokens after <|endoftext|>, with the cache."""
    model, c = load_gpt2(args.gpt2, args.device)
    v, n = c["vocab_size"], args.gpt2_tokens
    start = 50256 if v > 50256 else 0

    def generate():
        seq = [start]
        logits, past = model.forward_cached(torch.tensor([seq], device=args.device), None)
        for i in range(n):
            seq.append(int(logits[0, -1].argmax()))
            if i + 1 < n:
                logits, past = model.forward_cached(torch.tensor([[seq[-1]]], device=args.device), past)
        return seq
    with torch.no_grad():
        secs = time_calls(generate, args)
        seq = generate()
    backend = "cpu" if args.device == "cpu" else torch.cuda.get_device_name()
    out = {"impl": "pytorch", "backend": backend, "model": "gpt2 checkpoint", "torch": torch.__version__,
           "threads": torch.get_num_threads(), "parameters": sum(p.numel() for p in model.parameters()),
           "results": {"gpt2_generate_cached": summarize(secs, n, 0, 1, n)}, "greedy": seq[1:]}
    m = out["results"]["gpt2_generate_cached"]
    print(f"pytorch GPT-2 checkpoint {args.gpt2}, {backend}, {out['threads']} threads: {n} greedy tokens with the "
          f"cache, {m['median_ms']:.3f} ms/token [{m['p10_ms']:.3f}, {m['p90_ms']:.3f}], {m['tokens_per_s']:.1f} tok/s")
    print("  first greedy ids:", seq[1:17])
    return out


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def time_calls(f, args):
    for _ in range(args.warmup):
        f()
    sync(args)
    t, start = [], time.perf_counter()
    while len(t) < args.min_reps or time.perf_counter() - start < args.min_time:
        t0 = time.perf_counter()
        f()
        sync(args)
        t.append(time.perf_counter() - t0)
        if args.smoke:
            break
    return t


def attention_benchmark(args):
    """xfmr-bench --attention's measurement through PyTorch: causal SDPA, forward and backward, with the same
    FLOP count (the causal forward's two products, 2 B H T^2 hd, and the backward 2.5 times that)."""
    if not hasattr(F, "scaled_dot_product_attention"):
        raise SystemExit(f"--attention: PyTorch {torch.__version__} has no scaled_dot_product_attention (2.0 on)")
    b, h, t, hd = args.batch or 1, 12, args.attention, 64
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    gen = torch.Generator(device="cpu").manual_seed(3)
    q, k, v, dy = (torch.randn(b, h, t, hd, generator=gen).to(args.device, dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)

    def step():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(dy)
    r = summarize(time_calls(step, args), b * t, 0, 0)
    r["tflops"] = 3.5 * 2.0 * b * h * t * t * hd / (r["median_ms"] * 1e-3) * 1e-12
    backend = "cpu" if args.device == "cpu" else torch.cuda.get_device_name()
    print(f"pytorch sdpa forward+backward (B{b} H{h} T{t} head {hd}, causal, {dtype}), {backend}: "
          f"{r['median_ms']:.3f} ms, {r['tflops']:.1f} TFLOP/s")
    return {"impl": "pytorch", "backend": backend, "torch": torch.__version__, "precision": args.precision,
            "attention": {"B": b, "H": h, "T": t, "head": hd}, "results": {"sdpa": r}}


class LoraLinear(nn.Module):
    """A frozen base matrix in its own dtype (fp32 or bf16: its product in that
    dtype, the result back in float32) plus peft's adapter in float32:
    y = x W^T + (alpha / r) (x A^T) B^T, A Kaiming-uniform, B zero."""

    def __init__(self, fin, fout, rank, alpha, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fout, fin, dtype=dtype).normal_(0, 0.02), requires_grad=False)
        self.lora_a = nn.Parameter(torch.empty(rank, fin))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.lora_b = nn.Parameter(torch.zeros(fout, rank))
        self.scale = alpha / rank

    def forward(self, x):
        y = F.linear(x.to(self.weight.dtype), self.weight).float()
        return y + self.scale * F.linear(F.linear(x, self.lora_a), self.lora_b)


class LlamaBlock(nn.Module):
    """Hugging Face Llama's block: RMSNorm, rotary (rotate-half) attention with
    grouped key/value heads written out, SwiGLU; LoRA on all seven projections."""

    def __init__(self, d, h, kv, ff, rank, alpha, dtype):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        lin = lambda i, o: LoraLinear(i, o, rank, alpha, dtype)
        self.q, self.k, self.v, self.o = lin(d, d), lin(d, kv * self.hd), lin(d, kv * self.hd), lin(d, d)
        self.gate, self.up, self.down = lin(d, ff), lin(d, ff), lin(ff, d)
        self.norm1 = nn.Parameter(torch.ones(d), requires_grad=False)
        self.norm2 = nn.Parameter(torch.ones(d), requires_grad=False)

    @staticmethod
    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g

    @staticmethod
    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        a = self.rms(x, self.norm1)
        q = self.rotate(self.q(a).view(b, t, self.h, self.hd).transpose(1, 2), cos, sin)
        k = self.rotate(self.k(a).view(b, t, self.kv, self.hd).transpose(1, 2), cos, sin)
        v = self.v(a).view(b, t, self.kv, self.hd).transpose(1, 2)
        k, v = (z.repeat_interleave(self.h // self.kv, dim=1) for z in (k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        y = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        m = self.rms(x, self.norm2)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


class LoraLlama(nn.Module):
    def __init__(self, shape, rank, alpha, dtype):
        super().__init__()
        _, d, h, kv, l, ff, v = shape
        self.emb = nn.Parameter(torch.empty(v, d).normal_(0, 0.02), requires_grad=False)
        self.blocks = nn.ModuleList(LlamaBlock(d, h, kv, ff, rank, alpha, dtype) for _ in range(l))
        self.norm = nn.Parameter(torch.ones(d), requires_grad=False)
        self.head = nn.Parameter(torch.empty(v, d, dtype=dtype).normal_(0, 0.02), requires_grad=False)
        self.hd = d // h

    def forward(self, ids):
        t = ids.shape[1]
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(t).float(), inv)
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        x = self.emb[ids]
        for blk in self.blocks:
            x = blk(x, cos, sin, mask)
        return F.linear(LlamaBlock.rms(x, self.norm).to(self.head.dtype), self.head).float()


def lora_benchmark(args):
    """A LoRA training step on a Llama shape (random weights): forward, cross-entropy, backward to the adapters
    only (the base frozen, in --precision), AdamW on the adapters, as xfmr-bench --pretrained --lora times it."""
    from random_checkpoint import SHAPES
    shape = SHAPES[args.lora]
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    b, t, v = args.batch or 4, args.seq_len or 256, shape[6]
    torch.manual_seed(1337)
    t0 = time.perf_counter()
    model = LoraLlama(shape, args.rank, 2 * args.rank, dtype)
    build_s = time.perf_counter() - t0
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ids, targets = torch.randint(0, v, (b, t)), torch.randint(0, v, (b, t))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(ids).view(-1, v), targets.view(-1)).backward()
        opt.step()
    r = summarize(time_calls(step, args), b * t, 0, 0)
    _, d, h, kv, l, ff, _ = shape
    out = {"impl": "pytorch", "backend": "cpu", "model": args.lora, "torch": torch.__version__,
           "precision": args.precision, "attention": "written out",
           "shape": {"B": b, "T": t, "D": d, "H": h, "KV": kv, "L": l, "FF": ff, "V": v},
           "lora": {"rank": args.rank, "alpha": 2 * args.rank, "trained": sum(p.numel() for p in trained)},
           "threads": torch.get_num_threads(), "blas": blas_kernel(),
           "parameters": sum(p.numel() for p in model.parameters()), "load": {"load_s": build_s},
           "results": {"train_step": r},
           "memory": {"peak_rss_mb": peak_rss_mb()}}
    print(f"pytorch LoRA r{args.rank} {args.lora} (B{b} T{t}), base {args.precision}, {out['threads']} threads: "
          f"{r['median_ms']:.0f} ms a step, {r['tokens_per_s']:.0f} tok/s, peak RSS {out['memory']['peak_rss_mb']:.0f} MB")
    return out


def quantile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    i = int(pos)
    f = pos - i
    return v[i] * (1 - f) + v[i + 1] * f if i + 1 < len(v) else v[i]


def summarize(secs, tokens, flops, ceiling, per=1.0):
    unit = [s / per for s in secs]
    med = quantile(unit, 0.5)
    j = {"median_ms": med * 1e3, "p10_ms": quantile(unit, 0.1) * 1e3, "p90_ms": quantile(unit, 0.9) * 1e3,
         "reps": len(secs), "samples_ms": [s * 1e3 for s in unit], "tokens_per_s": tokens / per / med}
    if flops > 0:
        j["gflops"] = flops / per / med * 1e-9
        j["ceiling_fraction"] = j["gflops"] / ceiling
    return j


def forward_flops(cfg, b, t, v):
    _, d, _, l, ff, _, _ = cfg
    per_row = l * (2 * d * 3 * d + 2 * d * d + 2 * 2 * d * ff) + 2 * d * v
    return b * t * per_row + b * l * 4 * t * t * d


def blas_kernel():
    """The OpenBLAS kernel torch's BLAS runs here (OPENBLAS_CORETYPE, if set,
    overrides OpenBLAS's own choice), or what else torch was built with."""
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "libopenblas" in line})
    if not libs:
        return "not OpenBLAS"
    lib = ctypes.CDLL(libs[0])
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return "OpenBLAS " + lib.openblas_get_corename().decode()


def gemm_ceiling(args):
    best = 0.0
    sizes = [256, 512, 1024] if args.device == "cpu" else [2048, 4096, 8192]
    for n in ([128] if args.smoke else sizes):
        a = torch.rand((n, n), device=args.device)
        b = torch.rand((n, n), device=args.device)
        timing = argparse.Namespace(**vars(args))
        timing.min_time = 0 if args.smoke else 0.5
        t = time_calls(lambda: torch.mm(a, b), timing)
        best = max(best, 2.0 * n ** 3 / quantile(t, 0.5) * 1e-9)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="shakespeare-small", choices=sorted(PRESETS))
    p.add_argument("--seq-len", type=int, default=0, help="train and forward: positions per sequence (0: MAX_T)")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--modes", default="train,forward,generate")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tf32", action="store_true", help="on CUDA, TF32 matrix products (default strict FP32)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: the training step under torch.autocast (bf16 matrix products), as xfmr's --precision bf16")
    p.add_argument("--sdpa", action="store_true",
                   help="attention through torch.nn.functional.scaled_dot_product_attention (PyTorch 2.0 on) "
                        "instead of written out")
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--min-reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--gpt2", help="time GPT-2 decoding from this Hugging Face checkpoint directory instead")
    p.add_argument("--attention", type=int, default=0,
                   help="time scaled_dot_product_attention alone instead, forward and backward at this many positions "
                        "(12 heads of 64, causal, --batch or 1; bf16 tensors with --precision bf16), as xfmr-bench "
                        "--attention")
    p.add_argument("--lora", help="time a LoRA training step on this Llama shape of random_checkpoint.py instead "
                   "(r --rank on q, k, v, o, gate, up, down; the base frozen in --precision)")
    p.add_argument("--rank", type=int, default=16, help="with --lora: the adapters' rank (alpha twice it)")
    p.add_argument("--gpt2-tokens", type=int, default=128, help="with --gpt2: greedy tokens per generation")
    args = p.parse_args()
    if args.smoke:
        args.warmup, args.min_reps, args.min_time = 0, 1, 0
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.sdpa:
        if not hasattr(F, "scaled_dot_product_attention"):
            p.error(f"--sdpa: PyTorch {torch.__version__} has no scaled_dot_product_attention (2.0 on)")
        global SDPA
        SDPA = True
    if args.gpt2 or args.attention or args.lora:
        out = gpt2_benchmark(args) if args.gpt2 else attention_benchmark(args) if args.attention else lora_benchmark(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
        return 0
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    modes = args.modes.split(",")
    cfg = PRESETS[args.model]
    t_max, d, h, l, ff, dropout, default_batch = cfg
    b = args.batch or default_batch
    v = args.vocab
    torch.manual_seed(1337)
    ceiling = gemm_ceiling(args)
    model = CharGpt(v, t_max, d, h, l, ff, dropout, args.model in GELU_PRESETS).to(args.device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    t = args.seq_len or t_max
    if not 0 < t <= t_max:
        p.error(f"--seq-len {t} outside 1..{t_max}")
    ids = torch.randint(0, v, (b, t), device=args.device)
    targets = torch.randint(0, v, (b, t), device=args.device)
    backend = "cpu" if args.device == "cpu" else torch.cuda.get_device_name() + (" tf32" if args.tf32 else "")
    out = {"impl": "pytorch", "backend": backend, "model": args.model, "torch": torch.__version__,
           "precision": args.precision,
           "attention": "scaled_dot_product_attention" if SDPA else "written out",
           "shape": {"B": b, "T": t, "D": d, "H": h, "L": l, "FF": ff, "V": v, "dropout": dropout},
           "threads": torch.get_num_threads(), "blas": blas_kernel(), "gemm_ceiling_gflops": ceiling,
           "parameters": sum(p.numel() for p in model.parameters()), "results": {}}
    fwd = forward_flops(cfg, b, t, v)

    if "train" in modes:
        model.train()

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                logits = model(ids)
            loss = F.cross_entropy(logits.float().view(-1, v), targets.view(-1))
            loss.backward()
            opt.step()
        out["results"]["train_step"] = summarize(time_calls(step, args), b * t, 3 * fwd, ceiling)
    model.eval()
    with torch.no_grad():
        if "forward" in modes:
            out["results"]["forward"] = summarize(time_calls(lambda: model(ids), args), b * t, fwd, ceiling)
        if "generate" in modes:
            n = t_max - 1
            flops = sum(forward_flops(cfg, 1, i + 1, v) for i in range(n))

            def generate():
                seq = torch.zeros((1, 1), dtype=torch.long, device=args.device)
                for _ in range(n):
                    logits = model(seq[:, -t_max:])
                    seq = torch.cat([seq, logits[:, -1, :].argmax(-1, keepdim=True)], dim=1)
                return seq
            out["results"]["generate_recompute"] = summarize(time_calls(generate, args), n, flops, ceiling, n)
            full = generate()
            out["results"]["full_context_recompute"] = summarize(
                time_calls(lambda: model(full), args), 1, forward_flops(cfg, 1, t_max, v), ceiling)
    out["memory"] = {"peak_rss_mb": peak_rss_mb()}
    if args.device == "cuda":
        out["memory"]["peak_device_mb"] = torch.cuda.max_memory_allocated() / 1e6
    print(f"pytorch {args.model} (B{b} T{t} D{d} H{h} L{l}), {backend}, {out['threads']} threads, {out['blas']}; "
          f"GEMM ceiling {ceiling:.1f} GFLOP/s")
    for name, m in out["results"].items():
        print(f"  {name:24s}{m['median_ms']:10.3f} ms  [{m['p10_ms']:.3f}, {m['p90_ms']:.3f}]"
              f"{m['tokens_per_s']:10.0f} tok/s{m.get('gflops', 0):8.1f} GFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
