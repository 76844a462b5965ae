#!/usr/bin/python3
"""Writes fixtures/lora/: LoRA adapters in Hugging Face peft's format for
two of fixtures/families' models, written here from peft's definitions
(adapter_config.json; adapter_model.safetensors with keys
base_model.model.<module>.lora_A.weight (r, in) and .lora_B.weight
(out, r)), and the float64 logits of the base with each adapter merged as
peft merges it (W += scale B A, scale alpha / r or alpha / sqrt(r) with
use_rslora; a GPT-2 Conv1D weight, (in, out), takes the transpose:
fan_in_fan_out), for test_peft:

    /usr/bin/python3 test/reference/lora_reference.py test/reference/fixtures

  smollm2       r 4, lora_alpha 8, q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
  gpt2-ctx2048  r 2, lora_alpha 4, use_rslora, c_attn c_proj c_fc (fan_in_fan_out)

Each directory's expected.safetensors: ids (12, the family's), logits (12,
vocab) with the adapter. A and B are drawn uniform in [-0.3, 0.3] (B is not
zero: the adapter changes the logits)."""
import json
import math
import sys
from pathlib import Path

import torch

from families import llama_forward
from lm_loss import read_safetensors
from make_fixtures import f32, gpt2_forward, write_safetensors

torch.set_default_dtype(torch.float64)


def adapter(base, modules, r, gen):
    """{peft key: tensor} for each module (name, in, out), A (r, in), B (out, r)."""
    out = {}
    for name, n_in, n_out in modules:
        out[f"base_model.model.{name}.lora_A.weight"] = f32(0.3 * (2 * torch.rand(r, n_in, generator=gen) - 1))
        out[f"base_model.model.{name}.lora_B.weight"] = f32(0.3 * (2 * torch.rand(n_out, r, generator=gen) - 1))
    return out


def write(dest, tensors, config, ids, logits):
    dest.mkdir(parents=True, exist_ok=True)
    write_safetensors(dest / "adapter_model.safetensors", tensors, {"format": "pt"})
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(dest / "expected.safetensors", {"ids": torch.tensor(ids, dtype=torch.int64), "logits": logits},
                      {"reference": f"torch {torch.__version__}, float64, the base with the adapter merged"})


def config_of(r, alpha, targets, rslora, fan_in_fan_out):
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
            "target_modules": targets, "fan_in_fan_out": fan_in_fan_out, "bias": "none", "use_rslora": rslora,
            "use_dora": False, "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {},
            "alpha_pattern": {}, "init_lora_weights": True, "inference_mode": True,
            "base_model_name_or_path": None}


def base_of(fixtures, family):
    """A family's config, its float64 tensors and its ids."""
    base = fixtures / "families" / family
    return json.loads((base / "config.json").read_text()), read_safetensors(base / "model.safetensors"), \
        read_safetensors_ids(base)


def llama(fixtures, gen):
    c, hf, ids = base_of(fixtures, "smollm2")
    r, alpha = 4, 8
    d, f = c["hidden_size"], c["intermediate_size"]
    kv = d // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (d, kv), "self_attn.v_proj": (d, kv),
              "self_attn.o_proj": (d, d), "mlp.gate_proj": (d, f), "mlp.up_proj": (d, f), "mlp.down_proj": (f, d)}
    modules = [(f"model.layers.{i}.{m}", n_in, n_out) for i in range(c["num_hidden_layers"])
               for m, (n_in, n_out) in shapes.items()]
    t = adapter(hf, modules, r, gen)
    merged, scale = dict(hf), alpha / r
    for name, _, _ in modules:
        a, b = t[f"base_model.model.{name}.lora_A.weight"], t[f"base_model.model.{name}.lora_B.weight"]
        merged[name + ".weight"] = hf[name + ".weight"] + scale * (b.double() @ a.double())
    targets = [m.split(".")[1] for m in shapes]
    write(fixtures / "lora" / "smollm2", t, config_of(r, alpha, targets, False, False), ids,
          llama_forward(merged, c, ids))


def gpt2(fixtures, gen):
    c, p, ids = base_of(fixtures, "gpt2-ctx2048")
    r, alpha = 2, 4
    d, layers = c["n_embd"], c["n_layer"]
    shapes = {"attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d), "mlp.c_fc": (d, 4 * d), "mlp.c_proj": (4 * d, d)}
    modules = [(f"transformer.h.{i}.{m}", n_in, n_out) for i in range(layers) for m, (n_in, n_out) in shapes.items()]
    t = adapter(p, modules, r, gen)
    merged, scale = dict(p), alpha / math.sqrt(r)
    for name, _, _ in modules:
        a, b = t[f"base_model.model.{name}.lora_A.weight"], t[f"base_model.model.{name}.lora_B.weight"]
        key = name.removeprefix("transformer.") + ".weight"
        merged[key] = p[key] + scale * (b.double() @ a.double()).T  # Conv1D: (in, out)
    logits = gpt2_forward(merged, torch.tensor([ids]), c["n_head"], layers, eps=c["layer_norm_epsilon"])[0][0]
    write(fixtures / "lora" / "gpt2-ctx2048", t, config_of(r, alpha, ["c_attn", "c_proj", "c_fc"], True, True), ids,
          logits)


def read_safetensors_ids(base):
    """The family's ids (its expected.safetensors, int64)."""
    data = (base / "expected.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])["ids"]
    a, b = info["data_offsets"]
    return torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]), dtype=torch.int64).tolist()


def main():
    fixtures = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "fixtures")
    gen = torch.Generator().manual_seed(77)
    llama(fixtures, gen)
    gpt2(fixtures, gen)


if __name__ == "__main__":
    main()
