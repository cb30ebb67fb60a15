#!/usr/bin/python3
"""Hugging Face BERT interop from the outside (docs/hf-interop.md).

A tiny BERT is written here in Hugging Face's layout (config.json, model.safetensors with
transformers' names -- BertForPreTraining: encoder, pooler, MLM and NSP heads, the tied decoder
copy -- vocab.txt, tokenizer_config.json) and run with HF BERT's arithmetic in plain torch (the
`transformers` package is not needed). Then:

  - `pretrain_app convert --from-hf` makes an engine checkpoint whose MLM logits (pretrain_app
    --dump) equal the HF model's within 1e-5;
  - `convert --to-hf` of that checkpoint gives back every tensor bit for bit, under the same names
    and dtype, and the same config.json; engine -> HF -> engine is bit-exact too, also for a model
    without segment embeddings;
  - finetune_app starts from the converted checkpoint with no other flag (the vocabulary beside
    it), also after the directory holding both has moved;
  - bad inputs (pytorch_model.bin only, another activation, a non-bert_a checkpoint, an existing
    output) end with one clear message.

Usage: check_hf_interop.py PRETRAIN_APP FINETUNE_APP WORKDIR. Exit 77 without PyTorch."""
import json
import math
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
try:
    import torch
    import torch.nn.functional as F
    import safetensors_io
except ImportError as e:
    print("skipped: PyTorch is not available:", e)
    sys.exit(77)

pretrain_app, finetune_app, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def path(*names):
    return os.path.join(work, *names)


def check(cond, label, detail=""):
    print(("ok   " if cond else "FAIL ") + label + (f" ({detail})" if detail else ""))
    if not cond:
        failures.append(label)


def run(app, argv, expect_rc=0, expect_text="", label=""):
    p = subprocess.run([app] + argv, capture_output=True, text=True)
    out = p.stdout + p.stderr
    ok = p.returncode == expect_rc and all(t in out for t in ([expect_text] if isinstance(expect_text, str) else expect_text))
    print(("ok   " if ok else "FAIL ") + label + f" (exit {p.returncode})")
    if not ok:
        failures.append(label)
        print("     expected", repr(expect_text), "exit", expect_rc, "in:\n     " + out.strip()[-3000:].replace("\n", "\n     "))
    return out


# ---- a tiny BERT in Hugging Face's layout ---------------------------------------------------------
WORDS = ["the", "a", "cat", "dog", "bird", "sat", "ran", "on", "mat", "tree", "yes", "no", "is", "was", "big",
         "small", "red", "blue", ".", ","]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
V, D, L, H, FF, P, TYPES, EPS = len(VOCAB), 16, 2, 2, 32, 24, 2, 1e-12
config = {
    "architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": V, "hidden_size": D,
    "num_hidden_layers": L, "num_attention_heads": H, "intermediate_size": FF, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": P,
    "type_vocab_size": TYPES, "initializer_range": 0.02, "layer_norm_eps": EPS, "pad_token_id": 0,
    "position_embedding_type": "absolute", "transformers_version": "4.40.0", "use_cache": True,
}
g = torch.Generator().manual_seed(7)


def rnd(*shape, std=0.3):
    return torch.randn(*shape, generator=g) * std


W = {}
W["bert.embeddings.word_embeddings.weight"] = rnd(V, D)
W["bert.embeddings.position_embeddings.weight"] = rnd(P, D)
W["bert.embeddings.token_type_embeddings.weight"] = rnd(TYPES, D)
W["bert.embeddings.LayerNorm.weight"] = 1 + rnd(D, std=0.1)
W["bert.embeddings.LayerNorm.bias"] = rnd(D, std=0.1)
for l in range(L):
    pre = f"bert.encoder.layer.{l}."
    for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
        W[pre + part + ".weight"] = rnd(D, D)
        W[pre + part + ".bias"] = rnd(D, std=0.1)
    W[pre + "attention.output.LayerNorm.weight"] = 1 + rnd(D, std=0.1)
    W[pre + "attention.output.LayerNorm.bias"] = rnd(D, std=0.1)
    W[pre + "intermediate.dense.weight"] = rnd(FF, D)
    W[pre + "intermediate.dense.bias"] = rnd(FF, std=0.1)
    W[pre + "output.dense.weight"] = rnd(D, FF)
    W[pre + "output.dense.bias"] = rnd(D, std=0.1)
    W[pre + "output.LayerNorm.weight"] = 1 + rnd(D, std=0.1)
    W[pre + "output.LayerNorm.bias"] = rnd(D, std=0.1)
W["bert.pooler.dense.weight"] = rnd(D, D)
W["bert.pooler.dense.bias"] = rnd(D, std=0.1)
W["cls.predictions.bias"] = rnd(V, std=0.1)
W["cls.predictions.transform.dense.weight"] = rnd(D, D)
W["cls.predictions.transform.dense.bias"] = rnd(D, std=0.1)
W["cls.predictions.transform.LayerNorm.weight"] = 1 + rnd(D, std=0.1)
W["cls.predictions.transform.LayerNorm.bias"] = rnd(D, std=0.1)
W["cls.predictions.decoder.weight"] = W["bert.embeddings.word_embeddings.weight"].clone()  # tied
W["cls.predictions.decoder.bias"] = W["cls.predictions.bias"].clone()
W["cls.seq_relationship.weight"] = rnd(2, D)
W["cls.seq_relationship.bias"] = rnd(2, std=0.1)
W["bert.embeddings.position_ids"] = torch.arange(P).reshape(1, P)  # older transformers save it

HF = path("hf")
os.makedirs(HF)
safetensors_io.write(os.path.join(HF, "model.safetensors"), W, {"format": "pt"})
with open(os.path.join(HF, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
with open(os.path.join(HF, "vocab.txt"), "w") as f:
    f.write("\n".join(VOCAB) + "\n")
with open(os.path.join(HF, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)


def hf_mlm_logits(W, ids, mask, types):
    """BertForMaskedLM's forward as transformers computes it (eval mode), logits at every position."""
    B, T = ids.shape
    pre = "bert."
    x = W[pre + "embeddings.word_embeddings.weight"][ids] + W[pre + "embeddings.position_embeddings.weight"][:T][None] \
        + W[pre + "embeddings.token_type_embeddings.weight"][types]
    x = F.layer_norm(x, (D,), W[pre + "embeddings.LayerNorm.weight"], W[pre + "embeddings.LayerNorm.bias"], EPS)
    ext = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min  # HF's additive mask
    dh = D // H
    for l in range(L):
        p = f"{pre}encoder.layer.{l}."
        lin = lambda y, n: F.linear(y, W[p + n + ".weight"], W[p + n + ".bias"])
        split = lambda y: y.view(B, T, H, dh).permute(0, 2, 1, 3)
        q, k, v = (split(lin(x, "attention.self." + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh) + ext
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, T, D)
        x = F.layer_norm(lin(ctx, "attention.output.dense") + x, (D,), W[p + "attention.output.LayerNorm.weight"],
                         W[p + "attention.output.LayerNorm.bias"], EPS)
        ff = lin(F.gelu(lin(x, "intermediate.dense")), "output.dense")
        x = F.layer_norm(ff + x, (D,), W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], EPS)
    t = F.gelu(F.linear(x, W["cls.predictions.transform.dense.weight"], W["cls.predictions.transform.dense.bias"]))
    t = F.layer_norm(t, (D,), W["cls.predictions.transform.LayerNorm.weight"],
                     W["cls.predictions.transform.LayerNorm.bias"], EPS)
    return F.linear(t, W["cls.predictions.decoder.weight"], W["cls.predictions.decoder.bias"])


# A batch: [CLS] a b [SEP] c d [SEP] with segments, the second row padded.
ids = torch.tensor([[2, 7, 9, 3, 12, 13, 3, 0], [2, 8, 10, 11, 3, 0, 0, 0]])
mask = (ids != 0).long()
types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
labels = torch.full_like(ids, -100)
for b, t in ((0, 1), (0, 4), (0, 6), (1, 2), (1, 4)):
    labels[b, t] = ids[b, t]
batch = path("batch.safetensors")
safetensors_io.write(batch, {"input_ids": ids, "attention_mask": mask, "labels": labels, "token_type_ids": types})
Wd = {k: v.double() if v.is_floating_point() else v for k, v in W.items()}
with torch.no_grad():
    ref = hf_mlm_logits(Wd, ids, mask, types)[labels != -100]  # (M, V) in float64

# ---- HF -> engine: the MLM logits ---------------------------------------------------------------
CKPT = path("engine", "bert.safetensors")
out = run(pretrain_app, ["convert", "--from-hf", HF, "--out", CKPT], 0, "preset bert_a", "convert --from-hf")
check(os.path.exists(path("engine", "bert.vocab.txt")), "the vocabulary is written beside the checkpoint")
dump = path("dump.safetensors")
run(pretrain_app, ["--init", CKPT, "--batch-file", batch, "--dump", dump], 0, "dump:", "pretrain_app --dump")
if os.path.exists(dump):
    got = safetensors_io.read(dump)[0]["logits"].double()
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    check(got.shape == ref.shape and err < 1e-5, "MLM logits of the converted checkpoint equal HF BERT's",
          f"max error {err:.2e} of the largest logit")

# ---- round trips ----------------------------------------------------------------------------------


def same_tensors(a_file, b_file, label, skip=()):
    a, _ = safetensors_io.read(a_file)
    b, _ = safetensors_io.read(b_file)
    a = {k: v for k, v in a.items() if k not in skip}
    b = {k: v for k, v in b.items() if k not in skip}
    bad = [k for k in a if k not in b or a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
           or not torch.equal(a[k].view(-1).view(torch.uint8) if a[k].is_floating_point() else a[k],
                              b[k].view(-1).view(torch.uint8) if b[k].is_floating_point() else b[k])]
    missing = sorted(set(b) - set(a))
    check(not bad and not missing, label, f"{len(a)} tensors" if not bad and not missing
          else f"differ: {bad[:3]}, only in the second: {missing[:3]}")


HF2 = path("hf2")
run(pretrain_app, ["convert", "--to-hf", CKPT, "--out", HF2], 0, "config.json", "convert --to-hf")
if os.path.exists(os.path.join(HF2, "model.safetensors")):
    same_tensors(os.path.join(HF, "model.safetensors"), os.path.join(HF2, "model.safetensors"),
                 "HF -> engine -> HF: every tensor bit for bit, same names and dtypes")
    check(json.load(open(os.path.join(HF2, "config.json"))) == config, "HF -> engine -> HF: the same config.json")
    check(open(os.path.join(HF2, "vocab.txt")).read() == open(os.path.join(HF, "vocab.txt")).read(),
          "HF -> engine -> HF: the same vocab.txt")
    CKPT2 = path("engine2", "bert.safetensors")
    run(pretrain_app, ["convert", "--from-hf", HF2, "--out", CKPT2], 0, "preset bert_a", "convert the HF copy back")
    if os.path.exists(CKPT2):
        same_tensors(CKPT, CKPT2, "engine -> HF -> engine: every tensor bit for bit")

# An engine-native bert_a model without segment embeddings (RoBERTa style, this engine's default).
with open(path("native.yaml"), "w") as f:
    f.write(f"""seed: 5
model:
  vocab_size: {V}
  hidden_size: 16
  num_layers: 2
  num_heads: 2
  ffn_size: 32
  max_positions: 24
  position:
    preset: bert_a
""")
native_batch = path("native_batch.safetensors")
safetensors_io.write(native_batch, {"input_ids": ids, "attention_mask": mask, "labels": labels})
NATIVE = path("native.safetensors")
run(pretrain_app, ["--config", path("native.yaml"), "--batch-file", native_batch, "--steps", "1", "--save", NATIVE],
    0, "saved", "a native bert_a checkpoint")
run(pretrain_app, ["convert", "--to-hf", NATIVE, "--out", path("native_hf")], 0,
    ["config.json", "no vocab.txt"], "convert --to-hf without segments and without a recorded vocabulary")
NATIVE2 = path("native2.safetensors")
run(pretrain_app, ["convert", "--from-hf", path("native_hf"), "--out", NATIVE2], 0, "preset bert_a",
    "and back")
if os.path.exists(NATIVE2):
    same_tensors(NATIVE, NATIVE2, "engine -> HF -> engine without segment embeddings: bit for bit")
    d1, d2 = path("native_dump1.safetensors"), path("native_dump2.safetensors")
    run(pretrain_app, ["--init", NATIVE, "--batch-file", native_batch, "--dump", d1], 0, "dump:", "dump native")
    run(pretrain_app, ["--init", NATIVE2, "--batch-file", native_batch, "--dump", d2], 0, "dump:", "dump round trip")
    if os.path.exists(d1) and os.path.exists(d2):
        same_tensors(d1, d2, "the round-tripped model computes the same loss, logits and gradients")

# ---- finetune_app from the converted checkpoint, no other flag -----------------------------------
rows = ["index\tsentence1\tsentence2\tlabel"] + [
    f"{i}\tthe cat sat on the mat\tthe {'dog' if i % 2 else 'cat'} sat\t{'not_entailment' if i % 2 else 'entailment'}"
    for i in range(24)]
os.makedirs(path("glue", "RTE"))
for split in ("train", "dev"):
    with open(path("glue", "RTE", split + ".tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")
moved = path("moved")
shutil.copytree(path("engine"), moved)  # the checkpoint and its vocabulary, somewhere else
shutil.rmtree(path("engine"))
run(finetune_app, ["glue/RTE", "--checkpoint", os.path.join(moved, "bert.safetensors"), "--data-dir", path("glue"),
                   "--out", path("ft"), "--lr", "1e-4", "--seed", "1", "--epochs", "1", "--batch-size", "8",
                   "--max-len", "16", "--no-test"], 0, "best learning rate",
    "finetune_app from a converted checkpoint that moved, with no --tokenizer")

FT_DUMP = path("ft_dump.safetensors")
run(finetune_app, ["glue/RTE", "--checkpoint", os.path.join(moved, "bert.safetensors"), "--data-dir", path("glue"),
                   "--batch-size", "4", "--max-len", "16", "--dump", FT_DUMP], 0, "", "finetune_app --dump")
if os.path.exists(FT_DUMP):
    d = safetensors_io.read(FT_DUMP)[0]
    check(torch.equal(d["param.classifier.dense.weight"], W["bert.pooler.dense.weight"])
          and torch.equal(d["param.classifier.dense.bias"], W["bert.pooler.dense.bias"]),
          "the classifier starts from HF's pretrained pooler (dense + tanh)")
    check(torch.equal(d["param.bert.encoder.layer.1.ffn.fc1.weight"], W["bert.encoder.layer.1.intermediate.dense.weight"]),
          "the finetuned encoder starts from the HF weights")

# ---- bad inputs -------------------------------------------------------------------------------------
BIN = path("hf_bin")
os.makedirs(BIN)
shutil.copy(os.path.join(HF, "config.json"), BIN)
open(os.path.join(BIN, "pytorch_model.bin"), "wb").write(b"\x80\x02")
run(pretrain_app, ["convert", "--from-hf", BIN, "--out", path("x.safetensors")], 1,
    ["pytorch_model.bin", "save_file"], "pytorch_model.bin only: how to convert it")
RELU = path("hf_relu")
shutil.copytree(HF, RELU)
with open(os.path.join(RELU, "config.json"), "w") as f:
    json.dump(dict(config, hidden_act="relu"), f)
run(pretrain_app, ["convert", "--from-hf", RELU, "--out", path("y.safetensors")], 1,
    ["config.json", "hidden_act 'relu'"], "another activation: the key is named")
EXTRA = path("hf_extra")
shutil.copytree(HF, EXTRA)
safetensors_io.write(os.path.join(EXTRA, "model.safetensors"), dict(W, **{"bert.encoder.layer.0.adapter.weight": rnd(2, 2)}))
run(pretrain_app, ["convert", "--from-hf", EXTRA, "--out", path("z.safetensors")], 1,
    ["bert.encoder.layer.0.adapter.weight", "is not part of"], "an unknown tensor is named")
run(pretrain_app, ["convert", "--from-hf", HF, "--out", NATIVE], 1, "already exists", "an existing output is refused")
with open(path("tupe.yaml"), "w") as f:
    f.write(open(path("native.yaml")).read().replace("bert_a", "tupe_r"))
TUPE = path("tupe.safetensors")
run(pretrain_app, ["--config", path("tupe.yaml"), "--batch-file", native_batch, "--save", TUPE], 0, "saved",
    "a tupe_r checkpoint")
run(pretrain_app, ["convert", "--to-hf", TUPE, "--out", path("tupe_hf")], 1,
    ["preset tupe_r has no Hugging Face BERT equivalent", "untied positional attention"],
    "to-hf of tupe_r names what has no HF equivalent")
run(pretrain_app, ["convert", "--to-hf", TUPE], 2, "--out is required", "convert without --out")

print(f"{len(failures)} failure(s)" if failures else "all HF interop checks passed")
sys.exit(1 if failures else 0)
