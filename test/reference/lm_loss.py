#!/usr/bin/env python3
"""The loss xfmr-lm eval computes, in plain PyTorch (float64), of a GPT-2
exported in the Hugging Face layout, on a text whose token ids are its bytes
(fixtures/lm/tokenizer.json):

    lm_loss.py MODEL_DIR TEXT_FILE CONTEXT WINDOWS

Window i predicts bytes [iT + 1, iT + T] from [iT, iT + T), for the first
WINDOWS windows; prints the mean cross-entropy."""
import json
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from make_fixtures import gpt2_forward


def read_safetensors(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{name}: {info['dtype']}"
        a, b = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    return out


def main():
    model_dir, text_file, T, windows = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = json.loads((model_dir / "config.json").read_text())
    p = read_safetensors(model_dir / "model.safetensors")
    ids = torch.tensor(list(Path(text_file).read_bytes()), dtype=torch.int64)
    n = min(windows, (len(ids) - 1) // T)
    x = ids[:n * T].reshape(n, T)
    y = ids[1:n * T + 1].reshape(n, T)
    with torch.no_grad():
        logits, _ = gpt2_forward(p, x, config["n_head"], config["n_layer"])
        loss = F.cross_entropy(logits.reshape(n * T, -1), y.reshape(-1))
    print(f"{loss.item():.6f}")


if __name__ == "__main__":
    main()
