"""The Python module against the library and its references: each published
format's fixture loads and gives PyTorch's logits and greedy tokens; greedy
text equals `xfmr-lm sample --temperature 0`; a stream is the same
generation; errors are xfmr.Error with the library's message; Ctrl-C ends
a generation at the next token.

Run by ctest (python/CMakeLists.txt), which sets PYTHONPATH to the built
module, XFMR_FIXTURES to test/reference/fixtures and XFMR_LM to xfmr-lm.
"""
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import xfmr

FIXTURES = os.environ["XFMR_FIXTURES"]
XFMR_LM = os.environ["XFMR_LM"]
TOKENIZER = os.path.join(FIXTURES, "lm", "tokenizer.json")
SMOLLM = os.path.join(FIXTURES, "families", "smollm2")


def read_safetensors(path):
    """The tensors of a safetensors file, read as the format says (an 8-byte
    little-endian header size, a JSON header, the data): not through xfmr."""
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4"}
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    body = data[8 + size :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def close_to(got, want, rel=1e-4):
    """As test_families: every logit within rel of the largest's size."""
    scale = np.abs(want).max()
    worst = np.abs(got.astype(np.float64) - want).max()
    assert worst <= rel * scale, f"logits differ by {worst} at scale {scale}"


@pytest.fixture(scope="module")
def smollm():
    return xfmr.load(SMOLLM, tokenizer=TOKENIZER)


@pytest.mark.parametrize("family", ["gpt2-ctx2048", "llama3-scaled", "qwen2", "smollm2"])
def test_each_family_gives_pytorchs_logits_and_greedy_tokens(family):
    d = os.path.join(FIXTURES, "families", family)
    m = xfmr.load(d)
    assert m.tokenizer is None  # the fixture has none: logits and ids still work
    expected = read_safetensors(os.path.join(d, "expected.safetensors"))
    ids = expected["ids"].astype(np.int32)
    logits = m.logits(ids)
    assert logits.shape == (len(ids), m.config["vocab"]) and logits.dtype == np.float32
    close_to(logits, expected["logits"])
    out = m.generate(list(ids[:4]), max_tokens=len(expected["greedy"]), temperature=0)
    assert out.ids == list(expected["greedy"])
    assert out.text is None
    with pytest.raises(xfmr.Error, match="tokenizer"):
        m.generate("text needs a tokenizer")


def test_gpt2_and_llama_checkpoints_and_a_batch_of_sequences():
    gpt2 = xfmr.load(os.path.join(FIXTURES, "gpt2_tiny"))
    assert gpt2.config["format"] == "gpt2"
    expected = read_safetensors(os.path.join(FIXTURES, "gpt2_tiny", "expected.safetensors"))
    ids = expected["ids"].astype(np.int32)  # (2, 7): a batch
    logits = gpt2.logits(ids)
    assert logits.shape == (2, 7, 61)
    close_to(logits.reshape(14, 61), expected["logits"])
    # Each row of a batch is that sequence alone, to the bit.
    for b in range(2):
        assert np.array_equal(logits[b], gpt2.logits(ids[b]))
    llama = xfmr.load(os.path.join(FIXTURES, "hf_llama"))
    expected = read_safetensors(os.path.join(FIXTURES, "hf_llama", "expected.safetensors"))
    close_to(llama.logits(expected["ids"]), expected["logits"])


@pytest.mark.parametrize("file", ["model_v0.bin", "model_v1.bin"])
def test_llama2c_files(file):
    d = os.path.join(FIXTURES, "llama2c")
    m = xfmr.load(os.path.join(d, file))  # (the tokenizer.bin beside it is another model's: 328 tokens)
    assert m.config["format"] == "llama2.c" and m.tokenizer is None
    with open(os.path.join(d, "expected.json")) as f:
        expected = json.load(f)
    want = np.array(expected["models"][file]["logits"]).reshape(len(expected["ids"]), -1)
    close_to(m.logits(expected["ids"]), want)


def sampled(prompt, tokens):
    """What `xfmr-lm sample --temperature 0` prints after the prompt."""
    out = subprocess.run([XFMR_LM, "sample", "--model", SMOLLM, "--tokenizer", TOKENIZER, "--temperature", "0",
                          "--tokens", str(tokens), "--prompt", prompt], capture_output=True, check=True).stdout
    assert out.startswith(prompt.encode()) and out.endswith(b"\n")
    return out[len(prompt):-1].decode("utf-8", errors="replace")


@pytest.mark.parametrize("prompt", ["Once upon", "The cat", "a"])
def test_greedy_generate_equals_xfmr_lm_sample(smollm, prompt):
    # xfmr-lm sample goes past the end-of-text token; ignore_eos does too.
    out = smollm.generate(prompt, max_tokens=40, temperature=0, ignore_eos=True)
    assert out.text == sampled(prompt, 40)
    assert len(out.ids) == 40 and out.finish_reason == "length"
    # By default it ends at the end-of-text token, if one comes.
    ended = smollm.generate(prompt, max_tokens=40, temperature=0)
    start = smollm.tokenizer.start
    if start in out.ids:
        assert ended.ids == out.ids[: out.ids.index(start) + 1] and ended.finish_reason == "stop"
    else:
        assert ended.ids == out.ids


def test_a_stream_is_the_same_generation(smollm):
    whole = smollm.generate("The cat", max_tokens=30, temperature=0.8, top_k=20, seed=7, ignore_eos=True)
    stream = smollm.stream("The cat", max_tokens=30, temperature=0.8, top_k=20, seed=7, ignore_eos=True)
    parts = list(stream)
    assert "".join(parts) == whole.text and len(parts) > 1
    assert stream.ids == whole.ids and stream.finish_reason == "length"
    # Closed early, it says so.
    early = smollm.stream("The cat", max_tokens=30, ignore_eos=True)
    next(early)
    early.close()
    assert early.finish_reason == "cancelled" and 0 < len(early.ids) < 30
    # The same seed draws the same tokens; another draws others.
    assert smollm.generate("The cat", max_tokens=30, temperature=0.8, seed=7, ignore_eos=True).ids != \
        smollm.generate("The cat", max_tokens=30, temperature=0.8, seed=8, ignore_eos=True).ids


def test_a_batch_of_generations_is_each_one_alone(smollm):
    prompts = ["Once upon", "The cat", "a", [104, 105], "hello hello", "We", "42 is"]
    for kw in [dict(temperature=0), dict(temperature=0.9, top_k=30, seed=11), dict(temperature=0.7, seed=3, stop=["e"])]:
        batch = smollm.generate_batch(prompts, max_tokens=20, batch_size=3, **kw)
        assert len(batch) == len(prompts)
        for i, (p, b) in enumerate(zip(prompts, batch)):
            alone = dict(kw, seed=kw["seed"] + i) if "seed" in kw else kw
            one = smollm.generate(p, max_tokens=20, **alone)
            assert (b.ids, b.text, b.finish_reason) == (one.ids, one.text, one.finish_reason), (i, kw)
    assert smollm.generate_batch([], max_tokens=5) == []
    with pytest.raises(xfmr.Error, match="exceed the context of 64"):
        smollm.generate_batch(["a"], max_tokens=64)
    with pytest.raises(xfmr.Error, match="batch_size 0"):
        smollm.generate_batch(["a"], batch_size=0)


def test_stop_strings_cut_the_text(smollm):
    whole = smollm.generate("Once upon", max_tokens=40, temperature=0, ignore_eos=True)
    stop = next(c for c in whole.text[3:] if c.isascii() and c.isprintable())
    cut = smollm.generate("Once upon", max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])
    assert cut.text == whole.text[: whole.text.index(stop)] and cut.finish_reason == "stop"


def test_config_and_tokenizer(smollm):
    assert repr(smollm) == "<xfmr.Model llama D48 H6 KV2 L2 T64 FF64 V257, fp32>"
    c = smollm.config
    assert c["name"] == "llama" and c["vocab"] == 257 and c["precision"] == "fp32"
    assert c["dims"]["d_model"] == 48 and c["dims"]["n_kv_heads"] == 2
    assert len(smollm.tokenizer) == 257
    ids = smollm.tokenizer.encode("héllo wörld")
    assert smollm.tokenizer.decode(ids) == "héllo wörld"
    assert smollm.logits(ids).shape == (len(ids), 257)


def test_int8_and_bf16_run():
    m = xfmr.load(SMOLLM, tokenizer=TOKENIZER, precision="int8")
    assert m.config["precision"] == "int8"
    assert len(m.generate("a", max_tokens=5, temperature=0, ignore_eos=True).ids) == 5


def test_errors_are_xfmr_errors_with_the_librarys_message(smollm):
    assert issubclass(xfmr.Error, ValueError)
    with pytest.raises(xfmr.Error, match="no-such-model"):
        xfmr.load("/no-such-model")
    with pytest.raises(xfmr.Error, match="precision"):
        xfmr.load(SMOLLM, precision="fp8")
    with pytest.raises(xfmr.Error, match="backend 'tpu'"):
        xfmr.load(SMOLLM, backend="tpu")
    with pytest.raises(xfmr.Error, match=r"ids holds 300, outside \[0, 257\)"):
        smollm.logits([1, 300])
    with pytest.raises(xfmr.Error, match="context is 64"):
        smollm.logits(np.zeros(65, dtype=np.int32))
    with pytest.raises(xfmr.Error, match="temperature -1"):
        smollm.generate("a", temperature=-1)
    with pytest.raises(xfmr.Error, match="max_tokens -2"):
        smollm.generate("a", max_tokens=-2)
    with pytest.raises(xfmr.Error, match="top_p 0"):
        smollm.stream("a", top_p=0)
    with pytest.raises(xfmr.Error, match=r"ids holds -1, outside \[0, 257\)"):
        smollm.tokenizer.decode([-1])
    # The model still works after each.
    assert len(smollm.generate("a", max_tokens=3, ignore_eos=True).ids) == 3


def test_arguments_are_checked_by_their_python_names(smollm):
    # Ids are integers within the vocabulary: never wrapped (int64 -> int32) nor truncated (floats).
    for ids, pattern in [(np.array([1, 2**40]), r"ids holds 1099511627776, outside \[0, 257\)"),
                         (np.array([1.9, 2.0]), "ids must be integer ids, not float64 values"),
                         ([1, 2**70], "beyond 64-bit integers"), ("12", "not a string"),
                         (np.array([True, False]), "not bool values")]:
        with pytest.raises(xfmr.Error, match=pattern):
            smollm.logits(ids)
    assert smollm.logits(np.array([1, 2], dtype=np.uint8)).shape == (2, 257)
    with pytest.raises(xfmr.Error, match="prompt must be integer ids, not float64"):
        smollm.generate([1.5, 2.0])
    with pytest.raises(xfmr.Error, match="prompt holds 2147483648"):
        smollm.generate([2**31])
    # Every argument's range, by its Python name, as xfmr.Error (not pybind11's TypeError).
    for kwargs, pattern in [(dict(max_tokens=2**40), "max_tokens 1099511627776 outside"),
                            (dict(max_tokens=2**70), "max_tokens 1180591620717411303424 outside"),
                            (dict(seed=-1), r"seed -1 outside \[0, 2\*\*64\)"),
                            (dict(seed=2**64), r"seed 18446744073709551616 outside"),
                            (dict(seed=1.5), "seed must be an integer, not 1.5"),
                            (dict(top_k=-1), "top_k -1 outside"), (dict(top_p=1.5), "top_p 1.5 outside"),
                            (dict(temperature=float("nan")), "temperature nan")]:
        with pytest.raises(xfmr.Error, match=pattern):
            smollm.generate("a", **kwargs)
        with pytest.raises(xfmr.Error, match=pattern):
            smollm.stream("a", **kwargs)
    with pytest.raises(xfmr.Error, match="batch_size 0 outside"):
        smollm.generate_batch(["a"], batch_size=0)
    assert len(smollm.generate("a", max_tokens=2, seed=2**64 - 1, ignore_eos=True).ids) == 2


def test_an_embedding_is_the_mean_hidden_state_of_unit_length(smollm):
    e = smollm.embedding("The cat sat")
    assert e.dtype == np.float32 and e.shape == (smollm.config["dims"]["d_model"],)
    assert abs(float(np.linalg.norm(e)) - 1) < 1e-5
    assert np.array_equal(smollm.embedding(smollm.tokenizer.encode("The cat sat")), e)
    assert not np.array_equal(smollm.embedding("A dog"), e)
    with pytest.raises(xfmr.Error, match="prompt holds 999"):
        smollm.embedding([1, 999])


def test_structured_output_from_a_trained_model_and_a_random_one():
    # A model trained briefly on JSON records, and the same shape untrained:
    # 100 of 100 texts of each are values of the schema.
    schema = {"type": "object", "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                             "ok": {"type": "boolean"}}}
    records = "".join(json.dumps({"name": n, "age": a, "ok": a % 2 == 0}, separators=(",", ":")) + "\n"
                      for n, a in zip(["ann", "bob", "cy", "dee", "eve", "fay"] * 20, range(20, 140)))
    trained = fresh(dropout=0.0)
    ids = np.array(trained.tokenizer.encode(records), dtype=np.int32)
    trainer = xfmr.Trainer(trained, lr=3e-3, steps=150, schedule="constant")
    rng = np.random.default_rng(0)
    for _ in range(150):
        trainer.step(np.stack([ids[s:s + 33] for s in rng.integers(0, len(ids) - 33, 8)]))

    def check(v):
        return (isinstance(v, dict) and set(v) <= {"name", "age", "ok"} and isinstance(v["name"], str)
                and len(v["name"]) <= 8 and isinstance(v["age"], int) and not isinstance(v["age"], bool)
                and isinstance(v.get("ok", True), bool))

    for model in [trained, fresh(dropout=0.0)]:
        out = model.generate_batch(["\n"] * 100, max_tokens=40, temperature=1.0, seed=1, json_schema=schema)
        assert sum(check(json.loads(c.text)) for c in out) == 100, [c.text for c in out if not c.text.startswith("{")][:3]
    objects = trained.generate_batch(["\n"] * 10, max_tokens=40, seed=2, json_schema="json_object")
    assert all(isinstance(json.loads(c.text), dict) for c in objects)
    with pytest.raises(xfmr.Error, match="'pattern' is not supported"):
        trained.generate_batch(["a"], json_schema={"type": "string", "pattern": "x"})


def test_prompt_lookup_changes_no_token(smollm):
    prompts = ["the cat sat, the cat sat", "a b a b a b", "Once upon"]
    for temperature in [0.0, 0.8]:
        plain = smollm.generate_batch(prompts, max_tokens=24, temperature=temperature, seed=4, ignore_eos=True)
        fast = smollm.generate_batch(prompts, max_tokens=24, temperature=temperature, seed=4, ignore_eos=True, lookup=4)
        assert [c.ids for c in fast] == [c.ids for c in plain]
    with pytest.raises(xfmr.Error, match="lookup 17 outside"):
        smollm.generate_batch(["a"], lookup=17)


def test_a_draft_model_changes_no_token():
    # The fixture's weights in int8 drafting for themselves in float32.
    model = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    prompts = ["the cat sat, the cat sat", "Once upon"]
    with pytest.raises(xfmr.Error, match="need a draft model"):
        model.generate_batch(prompts, draft=3)
    model.load_draft(SMOLLM, precision="int8", tokenizer=TOKENIZER)
    for temperature in [0.0, 0.8]:
        plain = model.generate_batch(prompts, max_tokens=24, temperature=temperature, seed=4, ignore_eos=True)
        fast = model.generate_batch(prompts, max_tokens=24, temperature=temperature, seed=4, ignore_eos=True, draft=3)
        assert [c.ids for c in fast] == [c.ids for c in plain]
    with pytest.raises(xfmr.Error, match="lookup 2 or draft 3"):
        model.generate_batch(prompts, lookup=2, draft=3)
    with pytest.raises(xfmr.Error, match="draft 17 outside"):
        model.generate_batch(prompts, draft=17)


def test_a_lora_adapter_moves_the_logits():
    # fixtures/lora/smollm2: a peft adapter written by plain PyTorch (test_engine checks its logits).
    model = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    ids = [72, 101, 108, 108, 111]
    base = model.logits(ids)
    model.load_adapter(os.path.join(FIXTURES, "lora", "smollm2"))
    adapted = model.logits(ids)
    assert np.abs(adapted - base).max() > 1e-2
    with pytest.raises(xfmr.Error, match="LoRA adapters already"):
        model.load_adapter(os.path.join(FIXTURES, "lora", "smollm2"))
    with pytest.raises(xfmr.Error, match="fan_in_fan_out is for GPT-2"):
        xfmr.load(SMOLLM, tokenizer=TOKENIZER).load_adapter(os.path.join(FIXTURES, "lora", "gpt2-ctx2048"))


def test_adapters_beside_the_model_decode_in_one_batch():
    # add_adapter: a generation names its adapter; the model and two adapters in one batch each give
    # what they give alone, and a named adapter alone what load_adapter's gives.
    lora = os.path.join(FIXTURES, "lora", "smollm2")
    model = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    model.add_adapter("one", lora)
    model.add_adapter("three", lora, scale=3.0)
    names = ["one", None, "three"]
    alone = [model.generate("Once", max_tokens=10, temperature=0, ignore_eos=True, adapter=n).ids for n in names]
    assert alone[0] != alone[1] and alone[2] != alone[1]
    batch = model.generate_batch(["Once"] * 3, max_tokens=10, temperature=0, ignore_eos=True, adapters=names)
    assert [c.ids for c in batch] == alone
    own = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    own.load_adapter(lora)
    assert own.generate("Once", max_tokens=10, temperature=0, ignore_eos=True).ids == alone[0]
    with pytest.raises(xfmr.Error, match="no LoRA adapter named 'two'"):
        model.generate("Once", adapter="two")
    with pytest.raises(xfmr.Error, match="3 names for 2 prompts"):
        model.generate_batch(["a", "b"], adapters=names)


def test_a_trainer_trains_lora_adapters_alone(tmp_path):
    # Trainer(lora=...): the adapters alone train (the loss falls) on the frozen model, which generates with them;
    # the checkpoint is a peft directory load_adapter reads (xfmr.load refuses it alone, naming the model it was
    # trained on) and resumes bit for bit.
    batch = np.array([[1, 7, 42, 9, 3, 11, 5, 8, 2], [4, 4, 6, 10, 12, 1, 7, 42, 9]])
    ids = [1, 7, 42, 9, 3]

    def trainer(model, **kw):
        return xfmr.Trainer(model, lora="r=4,alpha=8", lr=1e-2, schedule="constant", steps=20, **kw)
    model = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    base = model.logits(ids)
    t = trainer(model)
    losses = [t.step(batch) for _ in range(8)]
    assert losses[-1] < losses[0] - 0.05
    assert np.abs(model.logits(ids) - base).max() > 1e-3
    t.save(tmp_path / "ck")
    assert (tmp_path / "ck" / "adapter_config.json").exists()
    with pytest.raises(xfmr.Error, match="holds LoRA adapters") as refused:
        xfmr.load(tmp_path / "ck")
    assert f"load {os.path.normpath(os.path.abspath(SMOLLM))} with them as its adapter" in str(refused.value)
    fresh = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    fresh.load_adapter(tmp_path / "ck")
    assert np.abs(fresh.logits(ids) - model.logits(ids)).max() < 1e-5
    nxt = t.step(batch)
    again = trainer(xfmr.load(SMOLLM, tokenizer=TOKENIZER))
    assert again.resume(tmp_path / "ck") == 8
    assert again.step(batch) == nxt
    reordered = xfmr.Trainer(xfmr.load(SMOLLM, tokenizer=TOKENIZER), lora="alpha=8,r=4", lr=1e-2, schedule="constant",
                             steps=20)
    assert reordered.resume(tmp_path / "ck") == 8  # the same settings, written in another order
    with pytest.raises(xfmr.Error, match="lora trains as one shard"):
        trainer(xfmr.load(SMOLLM, tokenizer=TOKENIZER), shards=2)
    on_bf16 = trainer(xfmr.load(SMOLLM, tokenizer=TOKENIZER), precision="bf16")
    bf16 = [on_bf16.step(batch) for _ in range(8)]
    assert abs(bf16[0] - losses[0]) < 2e-2 * abs(losses[0]) and bf16[-1] < bf16[0] - 0.05
    on_int8 = trainer(xfmr.load(SMOLLM, tokenizer=TOKENIZER), precision="int8")
    int8 = [on_int8.step(batch) for _ in range(8)]
    assert int8[0] != losses[0] and abs(int8[0] - losses[0]) < 2e-2 * abs(losses[0]) and int8[-1] < int8[0] - 0.05
    on_q4 = trainer(xfmr.load(SMOLLM, tokenizer=TOKENIZER), precision="q4")
    q4 = [on_q4.step(batch) for _ in range(8)]
    assert q4[0] != losses[0] and abs(q4[0] - losses[0]) < 5e-2 * abs(losses[0]) and q4[-1] < q4[0] - 0.05
    xfmr.quantise(SMOLLM, tmp_path / "q4", tokenizer=TOKENIZER)  # a 4-bit checkpoint as the base (loaded in fp32)
    with pytest.raises(xfmr.Error, match=r"with lora, Trainer\(precision='q4'\) holds it so"):
        trainer(xfmr.load(tmp_path / "q4"), precision="q4")
    on_q4_file = trainer(xfmr.load(tmp_path / "q4", precision="fp32"), precision="q4")
    q4_file = [on_q4_file.step(batch) for _ in range(8)]
    assert q4_file[-1] < q4_file[0] - 0.05
    unchanged = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    with pytest.raises(xfmr.Error, match="unknown Trainer: precision 'fp16'"):
        trainer(unchanged, precision="fp16")
    assert np.array_equal(unchanged.logits(ids), base)  # refused before any adapter was put on it


def test_a_stream_has_one_reader(smollm):
    # Two threads iterating one stream: each piece goes to one of them, the
    # second reader may get an xfmr.Error while the first waits, and neither hangs.
    whole = smollm.generate("a", max_tokens=40, temperature=0, ignore_eos=True).text
    for _ in range(5):
        stream = smollm.stream("a", max_tokens=40, temperature=0, ignore_eos=True)
        pieces, errors = [], []

        def read():
            while True:
                try:
                    pieces.append(next(stream))
                except StopIteration:
                    return
                except xfmr.Error as e:
                    errors.append(str(e))

        readers = [threading.Thread(target=read) for _ in range(2)]
        for r in readers:
            r.start()
        for r in readers:
            r.join(timeout=60)
        assert not any(r.is_alive() for r in readers), "a reader hung"
        assert all("read by another thread" in e for e in errors)
        assert len("".join(pieces)) == len(whole)


def test_trainer_settings_are_checked_and_a_resume_must_agree(tmp_path):
    m = fresh(dropout=0.0)
    for kwargs, pattern in [(dict(lr=float("nan")), "lr nan outside"), (dict(lr=0), "lr 0 outside"),
                            (dict(steps=-1), "steps -1 outside"), (dict(weight_decay=-1), "weight_decay -1 outside"),
                            (dict(beta1=1.0), r"beta1 1 outside \[0, 1\)"), (dict(eps=0), "eps 0 outside"),
                            (dict(clip=float("inf")), "clip inf outside"),
                            (dict(label_smoothing=1), "label_smoothing 1 outside"),
                            (dict(grad_accum=0), "grad_accum 0 outside"), (dict(data_seed=-1), "data_seed -1")]:
        with pytest.raises(xfmr.Error, match=pattern):
            xfmr.Trainer(m, **kwargs)
    batch = corpus_batches(m, 1)[0]
    with pytest.raises(xfmr.Error, match="batch must be integer ids, not float64"):
        xfmr.Trainer(m, steps=4).step(batch.astype(np.float64))
    with pytest.raises(xfmr.Error, match="targets holds -101"):
        xfmr.Trainer(m, steps=4).step(batch[:, :-1], np.full_like(batch[:, 1:], -101))
    settings = dict(lr=1e-3, steps=4, schedule="cosine")
    trainer = xfmr.Trainer(m, **settings)
    trainer.step(batch)
    trainer.save(tmp_path / "ck")
    for other, pattern in [(dict(lr=2e-3), "trained with lr=0.001; this Trainer has lr=0.002"),
                           (dict(schedule="constant"), 'schedule="cosine"'), (dict(steps=8), "steps=4"),
                           (dict(weight_decay=0.5), "weight_decay=0.1")]:
        with pytest.raises(xfmr.Error, match=pattern):
            xfmr.Trainer(fresh(dropout=0.0), **{**settings, **other}).resume(tmp_path / "ck")
    assert xfmr.Trainer(fresh(dropout=0.0), **settings).resume(tmp_path / "ck") == 1
    # A tokenizer edited in place (two ids swapped) is not the checkpoint's.
    tok = json.load(open(TOKENIZER))
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10], list(vocab)[11]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "swapped.json").write_text(json.dumps(tok))
    swapped = xfmr.create(xfmr.load(SMOLLM).config, seed=5, dropout=0.0, tokenizer=tmp_path / "swapped.json")
    with pytest.raises(xfmr.Error, match="tokenizer .* is not the one .* was trained with"):
        xfmr.Trainer(swapped, **settings).resume(tmp_path / "ck")


def test_configs_and_paths_that_are_refused_by_name(smollm, tmp_path):
    # A config.json with NaN (Python's json.dump writes it) names the field.
    config = json.load(open(os.path.join(SMOLLM, "config.json")))
    (tmp_path / "nan").mkdir()
    for f in os.listdir(SMOLLM):
        if f != "config.json":
            os.symlink(os.path.join(SMOLLM, f), tmp_path / "nan" / f)
    config["rope_theta"] = float("nan")
    (tmp_path / "nan" / "config.json").write_text(json.dumps(config))
    with pytest.raises(xfmr.Error, match="'rope_theta' is NaN"):
        xfmr.load(tmp_path / "nan")
    gpt2 = os.path.join(FIXTURES, "families", "gpt2-ctx2048")
    config = json.load(open(os.path.join(gpt2, "config.json")))
    config["scale_attn_by_inverse_layer_idx"] = True
    (tmp_path / "gpt2").mkdir()
    os.symlink(os.path.join(gpt2, "model.safetensors"), tmp_path / "gpt2" / "model.safetensors")
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(config))
    with pytest.raises(xfmr.Error, match="scale_attn_by_inverse_layer_idx true is not built"):
        xfmr.load(tmp_path / "gpt2", tokenizer=TOKENIZER)
    with pytest.raises(xfmr.Error, match="no directory named"):
        smollm.export_hf("")
    with pytest.raises(xfmr.Error, match="no file named"):
        smollm.export_gguf("")


def run_python(script):
    """script in a fresh interpreter (its own signals); its stdout."""
    env = dict(os.environ, SMOLLM=SMOLLM, TOKENIZER=TOKENIZER)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ctrl_c_ends_a_generation_at_the_next_token():
    # Uninterrupted, each would decode 10^8 tokens (hours): the timeout above
    # fails the test if Ctrl-C did not end them.
    out = run_python("""
        import os, signal, threading, xfmr
        m = xfmr.load(os.environ["SMOLLM"], tokenizer=os.environ["TOKENIZER"])
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            m.generate("a", max_tokens=10**8, ignore_eos=True)
        except KeyboardInterrupt:
            print("generate interrupted")
        try:
            for i, _ in enumerate(m.stream("a", max_tokens=10**8, ignore_eos=True)):
                if i == 5:
                    os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            print("stream interrupted")
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        s = m.stream("a", max_tokens=10**8, ignore_eos=True)
        try:
            while True:
                next(s)
        except KeyboardInterrupt:
            print("stream interrupted while waiting")
        print(len(m.generate("a", max_tokens=4, ignore_eos=True).ids))
        # A training loop stops at a step's end: every step taken is whole.
        import numpy as np
        trainer = xfmr.Trainer(m, steps=10**6)
        batch = np.ones((2, 9), dtype=np.int32)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            while True:
                trainer.step(batch)
        except KeyboardInterrupt:
            print("training interrupted", trainer.steps > 0, np.isfinite(trainer.evaluate(batch)))
    """)
    assert out.split("\n") == ["generate interrupted", "stream interrupted", "stream interrupted while waiting", "4",
                               "training interrupted True True", ""]


def test_export_then_load_is_the_same_model(smollm, tmp_path):
    out = tmp_path / "hf"
    smollm.export_hf(out)
    back = xfmr.load(out)  # its tokenizer comes with it
    ids = smollm.tokenizer.encode("Once upon a time")
    assert np.array_equal(back.logits(ids), smollm.logits(ids))
    assert back.generate("a", max_tokens=8, temperature=0).ids == smollm.generate("a", max_tokens=8, temperature=0).ids
    with pytest.raises(xfmr.Error, match="exists"):
        smollm.export_hf(out)  # never over what is there, unless asked
    smollm.export_hf(out, overwrite=True)


def test_an_xfmr_checkpoint_and_its_int8_copy(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world, this is a tiny corpus for a test. " * 40)
    ck = tmp_path / "ck"
    subprocess.run([XFMR_LM, "train", "--init", SMOLLM, "--tokenizer", TOKENIZER, "--data", str(corpus), "--steps", "2",
                    "--out", str(ck)], capture_output=True, check=True, cwd=tmp_path)  # (its log and report there)
    m = xfmr.load(ck)
    assert m.config["format"] == "xfmr" and m.config["precision"] == "fp32" and m.tokenizer is not None
    wrote = xfmr.quantise(ck, tmp_path / "ck8", precision="int8")
    assert wrote["matrices"] > 0 and wrote["quantised_bytes"] < wrote["float_bytes"]
    q = xfmr.load(tmp_path / "ck8")
    assert q.config["precision"] == "int8"  # the checkpoint's own
    # Its logits are the float32 model's, to int8's error (its embedding rows are dequantised too).
    ids = m.tokenizer.encode("hello world, this is")
    close_to(q.logits(ids), m.logits(ids).astype(np.float64), rel=0.1)
    assert len(q.generate("hello", max_tokens=12, temperature=0, ignore_eos=True).ids) == 12
    with pytest.raises(xfmr.Error, match="int8"):
        xfmr.quantise(tmp_path / "ck8", tmp_path / "again")


def test_a_published_model_quantised_to_4_bits(tmp_path):
    m = xfmr.load(SMOLLM, tokenizer=TOKENIZER)
    wrote = xfmr.quantise(SMOLLM, tmp_path / "q4", tokenizer=TOKENIZER)  # 4-bit by default
    assert wrote["matrices"] > 0 and wrote["quantised_bytes"] < 0.35 * wrote["float_bytes"]  # (its embedding bfloat16)
    q = xfmr.load(tmp_path / "q4")  # the checkpoint carries the tokenizer, and decodes in its precision
    assert q.config["precision"] == "q4"
    # The float model's logits to 4-bit's error (about ten times int8's on this tiny random model: 0.49 and
    # 0.04 of the largest logit), as those of 4-bit precision on the float model (whose embedding rows are
    # not quantised, where the checkpoint's are).
    ids = m.tokenizer.encode("Once upon a time")
    want = m.logits(ids).astype(np.float64)
    close_to(q.logits(ids), want, rel=0.7)
    close_to(xfmr.load(SMOLLM, precision="q4", tokenizer=TOKENIZER).logits(ids), want, rel=0.7)
    assert len(q.generate("hello", max_tokens=12, temperature=0, ignore_eos=True).ids) == 12


def corpus_batches(model, count, B=4, T=24, seed=0):
    text = "the cat sat on the mat, and the dog sat on the log. " * 30
    ids = np.array(model.tokenizer.encode(text), dtype=np.int32)
    rng = np.random.default_rng(seed)
    return [np.stack([ids[s : s + T + 1] for s in rng.integers(0, len(ids) - T - 1, B)]) for _ in range(count)]


def fresh(dropout=0.1):
    return xfmr.create(xfmr.load(SMOLLM).config, seed=5, dropout=dropout, tokenizer=TOKENIZER)


def test_training_2n_steps_equals_n_then_resumed_n_byte_for_byte(tmp_path):
    options = dict(lr=3e-3, steps=6, schedule="cosine", grad_accum=2, shards=2)
    batches = corpus_batches(fresh(), 6)
    whole = fresh()
    trainer = xfmr.Trainer(whole, **options)
    losses = [trainer.step(b) for b in batches]
    assert losses[-1] < losses[0] and trainer.steps == 6
    trainer.save(tmp_path / "whole")
    first = fresh()
    trainer = xfmr.Trainer(first, **options)
    for b in batches[:3]:
        trainer.step(b)
    trainer.save(tmp_path / "half")
    second = fresh()
    trainer = xfmr.Trainer(second, **options)
    assert trainer.resume(tmp_path / "half") == 3
    assert [trainer.step(b) for b in batches[3:]] == losses[3:]
    trainer.save(tmp_path / "resumed")
    for f in ["model.safetensors", "optimizer.safetensors"]:
        assert (tmp_path / "whole" / f).read_bytes() == (tmp_path / "resumed" / f).read_bytes()
    # The checkpoint loads as any model does, with its tokenizer; the trained model generates.
    back = xfmr.load(tmp_path / "whole")
    ids = whole.tokenizer.encode("the cat")
    assert np.array_equal(back.logits(ids), whole.logits(ids))
    assert back.generate("the cat", max_tokens=6, temperature=0).ids == whole.generate("the cat", max_tokens=6,
                                                                                        temperature=0).ids
    with pytest.raises(xfmr.Error, match="holds a checkpoint"):
        trainer.save(tmp_path / "whole")
    # xfmr-lm reads it as its own: the same greedy text.
    out = subprocess.run([XFMR_LM, "sample", "--model", str(tmp_path / "whole"), "--temperature", "0", "--tokens", "12",
                          "--prompt", "the cat"], capture_output=True, check=True).stdout
    assert out[len("the cat"):-1].decode("utf-8", errors="replace") == whole.generate(
        "the cat", max_tokens=12, temperature=0, ignore_eos=True).text


def test_decoding_after_a_training_step_reads_the_new_weights(tmp_path):
    # A head of 4200 x 32 weights is large enough for float32's decoding
    # panels (a copy made at the first product of a few rows): a training
    # step must leave none of the old weights' panels behind.
    m = xfmr.create("tiny", vocab=4200, seed=1, dropout=0.0)
    ids = [5, 17, 4000]
    before = m.logits(ids)
    trainer = xfmr.Trainer(m, lr=1e-2, steps=1)
    trainer.step(np.random.default_rng(0).integers(0, 4200, (2, 9)).astype(np.int32))
    after = m.logits(ids)
    assert not np.array_equal(before, after)
    trainer.save(tmp_path / "stepped")
    assert np.array_equal(xfmr.load(tmp_path / "stepped").logits(ids), after)


def test_evaluate_and_training_errors(tmp_path):
    m = fresh(dropout=0.0)
    trainer = xfmr.Trainer(m, steps=10)
    batch = corpus_batches(m, 1)[0]
    before = trainer.evaluate(batch)
    assert before == trainer.evaluate(batch) and trainer.steps == 0  # no step
    # Targets of their own: -100 is not counted.
    assert trainer.evaluate(batch[:, :-1], batch[:, 1:]) == before
    one = np.full_like(batch[:, 1:], -100)
    one[0, 3] = batch[0, 4]
    assert trainer.evaluate(batch[:, :-1], one) != before
    with pytest.raises(xfmr.Error, match=r"targets must have the batch's shape \(4, 24\)"):
        trainer.evaluate(batch[:, :-1], batch)
    with pytest.raises(xfmr.Error, match=r"a batch is \(B, T \+ 1\)"):
        trainer.step(batch[0])
    with pytest.raises(xfmr.Error, match="context is 64"):
        trainer.step(np.zeros((2, 70), dtype=np.int32))
    with pytest.raises(xfmr.Error, match="batch holds 999"):
        trainer.step(np.full((2, 5), 999, dtype=np.int32))
    with pytest.raises(xfmr.Error, match="grad_accum 3"):
        xfmr.Trainer(m, grad_accum=3).step(batch)
    with pytest.raises(xfmr.Error, match="int8"):
        xfmr.Trainer(xfmr.load(SMOLLM, precision="int8"))
    with pytest.raises(xfmr.Error, match="int8 is for decoding"):
        xfmr.Trainer(m, precision="int8")
    with pytest.raises(xfmr.Error, match="schedule"):
        xfmr.Trainer(m, schedule="sometimes")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("mine")
    with pytest.raises(xfmr.Error, match="not a checkpoint"):
        trainer.save(tmp_path / "notes")
    assert (tmp_path / "notes" / "mine.txt").read_text() == "mine"


def test_create_from_a_preset_or_a_config():
    assert "gpt2-small" in xfmr.presets()
    m = xfmr.create("tiny", vocab=100, seed=1)
    assert m.config["name"] == "tiny" and m.config["vocab"] == 100 and m.tokenizer is None
    same = xfmr.create("tiny", vocab=100, seed=1)
    other = xfmr.create("tiny", vocab=100, seed=2)
    assert np.array_equal(m.logits([1, 2, 3]), same.logits([1, 2, 3]))
    assert not np.array_equal(m.logits([1, 2, 3]), other.logits([1, 2, 3]))
    with pytest.raises(xfmr.Error, match="no-such-preset"):
        xfmr.create("no-such-preset", vocab=10)
    with pytest.raises(xfmr.Error, match="vocab"):
        xfmr.create("tiny")


def test_an_architecture_no_published_family_has(tmp_path):
    # Post-norm blocks, GeGLU and sinusoidal positions: one compiled model
    # (every part chosen at run time) builds it; it trains, saves, loads back
    # and samples the same, in Python and through xfmr-lm.
    arch = xfmr.create("tiny", vocab=257, seed=1).config
    arch["name"] = "post-geglu"
    arch["parts"] = {"pre_norm": False, "rms_norm": False, "activation": "geglu", "positions": "sinusoidal"}
    m = xfmr.create(arch, seed=3, dropout=0.0, tokenizer=TOKENIZER)
    assert m.config["parts"] == arch["parts"]
    trainer = xfmr.Trainer(m, lr=3e-3, steps=10)
    rng = np.random.default_rng(0)
    first = trainer.step(rng.integers(0, 257, size=(4, 17)))
    for _ in range(9):
        last = trainer.step(rng.integers(0, 257, size=(4, 17)))
    assert trainer.steps == 10 and np.isfinite(first) and np.isfinite(last)
    trainer.save(tmp_path / "ckpt")
    back = xfmr.load(tmp_path / "ckpt")
    assert back.config["parts"] == arch["parts"] and back.config["name"] == "post-geglu"
    ids = back.tokenizer.encode("the cat")
    assert np.array_equal(back.logits(ids), m.logits(ids))
    want = m.generate("the cat", max_tokens=10, temperature=0, ignore_eos=True)
    assert back.generate("the cat", max_tokens=10, temperature=0, ignore_eos=True).ids == want.ids
    out = subprocess.run([XFMR_LM, "sample", "--model", str(tmp_path / "ckpt"), "--temperature", "0", "--tokens",
                          "10", "--prompt", "the cat"], capture_output=True, check=True).stdout
    assert out[len("the cat"):-1].decode("utf-8", errors="replace") == want.text
