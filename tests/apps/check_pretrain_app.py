#!/usr/bin/python3
"""pretrain_app from the outside (standard library only): the single-batch mode end to end, and
bad inputs (command line, config, batch, checkpoint) that must end with one clear message and a
non-zero exit, never a crash. Usage: check_pretrain_app.py PRETRAIN_APP WORKDIR"""
import json
import os
import struct
import subprocess
import sys

app, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
failures = []


def path(name):
    return os.path.join(work, name)


def write_safetensors(file, tensors):
    """tensors: name -> (shape, list of ints) stored as I64."""
    header, blob = {}, b""
    for name, (shape, values) in tensors.items():
        data = struct.pack("<%dq" % len(values), *values)
        header[name] = {"dtype": "I64", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def run(args, expect_rc, expect_text, label):
    p = subprocess.run([app] + args, capture_output=True, text=True)
    out = p.stdout + p.stderr
    ok = (p.returncode == expect_rc if expect_rc is not None else p.returncode != 0) and expect_text in out
    if p.returncode < 0 or p.returncode >= 128:
        ok = False  # killed by a signal: a crash
    print(("ok   " if ok else "FAIL ") + label + f" (exit {p.returncode})")
    if not ok:
        failures.append(label)
        print("     expected", repr(expect_text), "in:\n     " + out.strip().replace("\n", "\n     "))
    return out


with open(path("tiny.yaml"), "w") as f:
    f.write("seed: 3\nmodel:\n  vocab_size: 40\n  hidden_size: 32\n  num_layers: 2\n  num_heads: 4\n"
            "  ffn_size: 64\n  max_positions: 16\n  position:\n    preset: tupe_r\noptim:\n  lr: 1.0e-3\n")
ids = [1, 5, 9, 12, 7, 3, 1, 8, 30, 2, 0, 0]
mask = [1] * 10 + [0, 0]
labels = [-100, 5, -100, 12, -100, -100, -100, 8, -100, 2, -100, -100]
write_safetensors(path("batch.st"), {"input_ids": ([2, 6], ids), "attention_mask": ([2, 6], mask),
                                     "labels": ([2, 6], labels)})

# The single-batch mode: falling loss, a checkpoint that reloads to the same loss.
out = run(["--config", path("tiny.yaml"), "--batch-file", path("batch.st"), "--steps", "8",
           "--save", path("after.st")], 0, "step 8 loss", "8 steps on one batch")
losses = [float(l.split()[3]) for l in out.splitlines() if l.startswith("step ")]
if not (len(losses) == 8 and losses[-1] < losses[0]):
    failures.append("loss falls over 8 steps")
    print("FAIL loss falls over 8 steps:", losses)
out = run(["--init", path("after.st"), "--batch-file", path("batch.st")], 0, "eval loss", "evaluate a checkpoint")
run(["--config", path("tiny.yaml"), "--count-params"], 0, "total", "--count-params")

# Bad command lines.
run([], 2, "--config (or --init) is required", "no arguments")
run(["--config", path("tiny.yaml")], 1, "data.corpus is not set", "no corpus and no batch")
run(["--config", path("tiny.yaml"), "--set", "data.corpus=" + path("nocorpus")], 1, "nocorpus", "missing corpus")
run(["--config", path("tiny.yaml"), "--steps", "3"], 2, "belong to the single-batch mode", "--steps without --batch-file")
run(["--config", path("tiny.yaml"), "--batch-file", path("batch.st"), "--resume"], 2, "belong to corpus pretraining",
    "--resume with --batch-file")
run(["--config", path("tiny.yaml"), "--batch-file", path("batch.st"), "--steps", "x"], 2, "--steps expects an integer >= 0, got 'x'", "--steps x")
run(["--config", path("tiny.yaml"), "--frobnicate"], 2, "unknown argument '--frobnicate'", "unknown flag")
run(["--config"], 2, "--config needs a value", "flag without value")
run(["--config", path("tiny.yaml"), "--batch-file", path("batch.st"), "--device", "gpu"], 2,
    "--device expects cpu, cuda or cuda:N, got 'gpu'", "bad --device")
run(["--config", path("tiny.yaml"), "--batch-file", path("batch.st"), "--device", "cuda:9"], 1,
    "cuda:9", "--device naming a GPU this machine does not have")
# ELECTRA's single-batch mode: draws fed from the batch file (4 predicted tokens), or refused.
el = ["--config", path("tiny.yaml"), "--set", "objective=electra", "--set", "electra.generator_size=0.5"]
write_safetensors(path("batch_draws.st"), {"input_ids": ([2, 6], ids), "attention_mask": ([2, 6], mask),
                                           "labels": ([2, 6], labels), "replacements": ([4], [5, 6, 12, 9])})
out = run(el + ["--batch-file", path("batch_draws.st"), "--steps", "3"], 0, "step 3 loss",
          "ELECTRA: 3 steps on a batch with the generator's draws")
run(el + ["--batch-file", path("batch.st"), "--steps", "2"], 0, "step 2 loss", "ELECTRA: 2 steps drawing")
run(["--config", path("tiny.yaml"), "--batch-file", path("batch_draws.st")], 1,
    "'replacements' is for objective: electra", "replacements for a masked LM")
write_safetensors(path("batch_short.st"), {"input_ids": ([2, 6], ids), "attention_mask": ([2, 6], mask),
                                           "labels": ([2, 6], labels), "replacements": ([3], [5, 6, 12])})
run(el + ["--batch-file", path("batch_short.st")], 1, "'replacements' must be (4) integers",
    "replacements of the wrong length")
write_safetensors(path("batch_bad.st"), {"input_ids": ([2, 6], ids), "attention_mask": ([2, 6], mask),
                                         "labels": ([2, 6], labels), "replacements": ([4], [5, 6, 40, 9])})
run(el + ["--batch-file", path("batch_bad.st")], 1, "replacements[2] = 40 is not a token id",
    "a replacement outside the vocabulary")
run(el + ["--set", "electra.generator_size=0.4", "--batch-file", path("batch.st")], 1, "do not divide",
    "an ELECTRA generator size that does not make a model")

# The shipped configs small enough to build here read and build (the Base and Large ones share
# their keys with these): every key known, the ELECTRA generator's sizes valid.
configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs")
for name in sorted(os.listdir(configs)):
    if name.endswith(".yaml") and (name.startswith("tiny_") or name.startswith("electra_small_")):
        run(["--config", os.path.join(configs, name), "--count-params", "--device", "cpu", "--set",
             "train.precision=f32", "--set", "model.vocab_size=1000"], 0, "total", f"configs/{name} builds")

# Bad configs.
run(["--config", path("missing.yaml")], 1, "missing.yaml: no such file", "missing config")
with open(path("device.yaml"), "w") as f:
    f.write("train:\n  device: tpu\n")
run(["--config", path("device.yaml"), "--batch-file", path("batch.st")], 1,
    "device.yaml:2: train.device: 'tpu' is not a device (expected cpu, cuda or cuda:N)", "bad train.device")
with open(path("typo.yaml"), "w") as f:
    f.write("model:\n  num_layer: 2\n")
run(["--config", path("typo.yaml")], 1, "typo.yaml:2: unknown key 'model.num_layer'", "unknown key")
with open(path("type.yaml"), "w") as f:
    f.write("model:\n  hidden_size: wide\n")
run(["--config", path("type.yaml")], 1, "type.yaml:2: model.hidden_size: expected an integer, got 'wide'", "wrong type")
with open(path("broken.yaml"), "w") as f:
    f.write("model: {hidden_size: 3\n")
run(["--config", path("broken.yaml")], 1, "not valid YAML", "malformed YAML")
run(["--config", path("tiny.yaml"), "--set", "model.position.preset=tupe", "--batch-file", path("batch.st")], 1,
    "model.position.preset: 'tupe' is not one of", "bad preset via --set")
run(["--config", path("tiny.yaml"), "--set", "optim.lr=fast", "--batch-file", path("batch.st")], 1,
    "optim.lr: expected a number, got 'fast'", "bad --set value")
# Bad batches.
run(["--config", path("tiny.yaml"), "--batch-file", path("nope.st")], 1, "nope.st", "missing batch")
write_safetensors(path("badids.st"), {"input_ids": ([2, 6], [1, 5, 99] + ids[3:]), "attention_mask": ([2, 6], mask),
                                      "labels": ([2, 6], labels)})
run(["--config", path("tiny.yaml"), "--batch-file", path("badids.st")], 1, "input_ids[0, 2] = 99", "token id out of range")
write_safetensors(path("nolabels.st"), {"input_ids": ([2, 6], ids), "attention_mask": ([2, 6], mask),
                                        "labels": ([2, 6], [-100] * 12)})
run(["--config", path("tiny.yaml"), "--batch-file", path("nolabels.st")], 1, "every label is -100", "nothing to predict")
with open(path("garbage.st"), "wb") as f:
    f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
run(["--config", path("tiny.yaml"), "--batch-file", path("garbage.st")], 1, "garbage.st", "corrupt batch")
# Bad checkpoints.
with open(path("after.st"), "rb") as f:
    data = f.read()
with open(path("truncated.st"), "wb") as f:
    f.write(data[: len(data) // 2])
run(["--init", path("truncated.st"), "--batch-file", path("batch.st")], 1, "truncated.st", "truncated checkpoint")
run(["--init", path("batch.st"), "--batch-file", path("batch.st")], 1, "not a checkpoint written by this engine",
    "a batch given as checkpoint")
run(["--config", path("tiny.yaml"), "--set", "model.num_layers=3", "--init", path("after.st"), "--batch-file",
     path("batch.st")], 1, "differs from", "checkpoint/config mismatch")
run(["--config", path("tiny.yaml"), "--set", "model.vocab_size=41", "--init", path("after.st")], 1,
    "model.vocab_size: 40 vs 41", "vocabulary mismatch")

# train-tokenizer reads .xz and .gz like prepare, and its errors name only its own flags.
import lzma, gzip, random  # noqa: E401,E402
r = random.Random(1)
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
text = "\n".join(" ".join(r.choice(words) for _ in range(8)) for _ in range(300)) + "\n"
with open(path("tok.txt"), "w") as f:
    f.write(text)
with lzma.open(path("tok.txt.xz"), "wt") as f:
    f.write(text)
with gzip.open(path("tok.txt.gz"), "wt") as f:
    f.write(text)
for name in ("tok.txt", "tok.txt.xz", "tok.txt.gz"):
    run(["train-tokenizer", "--input", path(name), "--out", path(name + ".spm"), "--vocab-size", "40"], 0,
        "(40 pieces)", f"train-tokenizer on {name}")
vocabs = []
for name in ("tok.txt", "tok.txt.xz", "tok.txt.gz"):
    with open(path(name + ".spm.vocab")) as f:
        vocabs.append(f.read())
check_ok = vocabs[0] == vocabs[1] == vocabs[2]
print(("ok   " if check_ok else "FAIL ") + "the compressed inputs give the plain text's vocabulary")
if not check_ok:
    failures.append("compressed tokenizer inputs")
out = run(["train-tokenizer", "--input", path("tok.txt.xz"), "--out", path("small"), "--vocab-size", "8"], 1,
          "Increase --vocab-size or decrease --character-coverage", "too small a vocabulary names real flags")
if "--character_coverage" in out or "trainer_spec" in out:
    failures.append("SentencePiece's own flag names leak")
    print("FAIL SentencePiece's own flag names leak:", out)
run(["train-tokenizer", "--input", path("tok.txt"), "--out", path("cc"), "--character-coverage", "1.5"], 2,
    "--character-coverage expects a number in (0, 1]", "--character-coverage out of range")

print(f"{len(failures)} failure(s)" if failures else "all pretrain_app checks passed")
sys.exit(1 if failures else 0)
