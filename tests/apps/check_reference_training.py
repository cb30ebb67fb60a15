#!/usr/bin/python3
"""pretrain_app --export-batches and the PyTorch reference trained on what it exports
(tools/reference/train_reference.py), against the engine's own run of the same config:

  1. a small corpus and a tiny model without dropout (so both sides compute the same function);
  2. the engine trains it on the corpus (accumulation 2: the micro-batch weighting counts);
  3. --export-batches writes the initial weights and the batches the run read; the reference
     trains on them with PyTorch's AdamW, clipping and schedule;
  4. every step's loss, the gradient norm and each validation must agree (f32, relative 2e-4
     after 24 steps), for BERT-A and TUPE-R with AdamW and TUPE-R with LAMB (optim.name: lamb,
     against tools/reference/lamb_reference.py);
  5. the export's shapes and metadata, and bad uses refused with a message.

Exit 77 (skipped) when PyTorch is missing.

usage: check_reference_training.py PRETRAIN_APP REFERENCE_DIR WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
from tiny_corpus import make_corpus  # noqa: E402

app, ref_dir, work = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: the PyTorch reference needs python3-torch ({e}); tools/test.sh installs it")
    sys.exit(77)
sys.path.insert(0, ref_dir)
import safetensors_io as st  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
P = lambda *a: os.path.join(work, *a)  # noqa: E731
STEPS, BATCH, ACCUM, T = 24, 8, 2, 48


def run(args):
    return subprocess.run([app] + args, capture_output=True, text=True)


p = make_corpus(app, work)
check(p.returncode == 0, "prepare a corpus", p.stdout + p.stderr)


LR = {"adamw": 3e-3, "lamb": 2e-2}  # LAMB's step is lr x ||w|| / ||u||: rates of its own


def config(preset, optim="adamw"):
    path = P(f"{preset}_{optim}.yaml")
    with open(path, "w") as f:
        f.write(f"""seed: 3
model:
  hidden_size: 64
  num_layers: 2
  num_heads: 4
  ffn_size: 128
  max_positions: {T}
  hidden_dropout: 0
  attention_dropout: 0
  position:
    preset: {preset}
optim:
  name: {optim}
  lr: {LR[optim]}
  weight_decay: 0.01
data:
  corpus: {P("corpus")}
  seq_len: {T}
  batch_size: {BATCH}
train:
  steps: {STEPS}
  warmup_steps: 5
  accumulation: {ACCUM}
  clip_norm: 0.5
  log_every: 1
  valid_every: 8
  valid_batches: 3
  save_every: 0
  progress: false
""")
    return path


def close(a, b, tol=2e-4):
    return abs(a - b) <= tol * max(1.0, abs(b))


for preset, optim in (("bert_a", "adamw"), ("tupe_r", "adamw"), ("tupe_r", "lamb")):
    cfg = config(preset, optim)
    if optim != "adamw":  # the same checks, the labels and files named by the optimizer
        preset = f"{preset}+{optim}"
    p = run(["--config", cfg, "--out", P(f"eng_{preset}")])
    if not check(p.returncode == 0, f"{preset}: the engine trains", p.stdout + p.stderr):
        continue
    with open(P(f"eng_{preset}", "metrics.jsonl")) as f:
        eng = [json.loads(line) for line in f]
    exp = P(f"exp_{preset}")
    p = run(["--config", cfg, "--export-batches", exp])
    if not check(p.returncode == 0 and "exported to" in p.stdout, f"{preset}: --export-batches",
                 p.stdout + p.stderr):
        continue
    train, meta = st.read(os.path.join(exp, "train.safetensors"))
    valid, vmeta = st.read(os.path.join(exp, "valid.safetensors"))
    check(tuple(train["input_ids"].shape) == (STEPS * ACCUM * BATCH, T)
          and train["labels"].shape == train["input_ids"].shape
          and str(train["attention_mask"].dtype) == "torch.uint8"
          and meta.get("steps") == str(STEPS) and meta.get("accumulation") == str(ACCUM)
          and meta.get("batch_size") == str(BATCH),
          f"{preset}: train.safetensors holds steps x accumulation x batch rows, with its counts",
          f"{ {k: tuple(v.shape) for k, v in train.items()} } {meta}")
    vrows = valid["input_ids"].shape[0]  # the valid split is small: its last batch is partial
    check(vmeta.get("rows") == str(vrows) and 0 < vrows <= 3 * BATCH
          and vmeta.get("batches") == str(min(3, -(-vrows // BATCH))),
          f"{preset}: valid.safetensors holds the run's validation batches", str(vmeta))
    masked = train["labels"] != -100
    check(0.08 < float(masked.float().mean()) < 0.22 and bool((train["attention_mask"][:, 0] == 1).all()),
          f"{preset}: about 15% of the exported tokens are predicted")

    out = P(f"ref_{preset}.jsonl")
    p = subprocess.run([sys.executable, os.path.join(ref_dir, "train_reference.py"), "--export", exp,
                        "--lr", str(LR[optim]), "--warmup", "5", "--clip", "0.5", "--log-every", "1",
                        "--valid-every", "8", "--no-dropout", "--optim", optim, "--out", out],
                       capture_output=True, text=True)
    if not check(p.returncode == 0, f"{preset}: the reference trains on the export", p.stdout + p.stderr):
        continue
    with open(out) as f:
        ref = {r["step"]: r for r in map(json.loads, f)}
    bad = [(r["step"], r["loss"], ref.get(r["step"], {}).get("loss")) for r in eng
           if "loss" in r and not close(r["loss"], ref.get(r["step"], {}).get("loss", 1e9))]
    check(len([r for r in eng if "loss" in r]) == STEPS and not bad,
          f"{preset}: every step's loss equals the reference's", str(bad[:5]))
    bad = [(r["step"], r["tokens"], ref.get(r["step"], {}).get("tokens")) for r in eng
           if "loss" in r and r["tokens"] != ref.get(r["step"], {}).get("tokens")]
    check(not bad, f"{preset}: the tokens seen agree at every step", str(bad[:5]))
    bad = [(r["step"], r["grad_norm"], ref[r["step"]]["grad_norm"]) for r in eng
           if "grad_norm" in r and not close(r["grad_norm"], ref[r["step"]]["grad_norm"], 1e-3)]
    check(not bad, f"{preset}: every step's gradient norm equals the reference's", str(bad[:5]))
    ev = [(r["step"], r["valid_loss"]) for r in eng if "valid_loss" in r]
    bad = [(s, v, ref.get(s, {}).get("valid_loss")) for s, v in ev
           if not close(v, ref.get(s, {}).get("valid_loss", 1e9))]
    check(len(ev) == 3 and not bad, f"{preset}: every validation equals the reference's", str(ev) + str(bad))
    # tools/reference/position_use.py: the model as trained scores the engine's last validation
    # loss; with its position rows shuffled, something else.
    if preset == "bert_a":
        p = subprocess.run([sys.executable, os.path.join(ref_dir, "position_use.py"),
                            P(f"eng_{preset}", "model.safetensors"), exp, "--shuffles", "1"],
                           capture_output=True, text=True)
        try:
            lines = p.stdout.splitlines()
            trained = float(lines[0].split("valid loss ")[1])
            shuffled = float(lines[1].split("valid loss ")[1].split()[0])
            check(p.returncode == 0 and close(trained, ev[-1][1]) and shuffled != trained,
                  "position_use.py: the trained model scores the engine's last validation loss",
                  p.stdout + p.stderr)
        except (IndexError, ValueError):
            check(False, "position_use.py prints both losses", p.stdout + p.stderr)
    # The curves must move: a test of two frozen models would pass too.
    check(eng[-1]["loss"] < eng[0]["loss"] - 0.1, f"{preset}: the loss falls over the run",
          f"{eng[0]['loss']} -> {eng[-1]['loss']}")

# ---- bad uses -----------------------------------------------------------------------------------
cfg = config("bert_a")
for args, want in ((["--export-batches", P("x"), "--resume"], "--export-batches"),
                   (["--export-batches", P("x"), "--batch-file", P("nope")], "--export-batches"),
                   (["--export-batches", P("x"), "--set", "data.corpus=" + P("missing")], "missing")):
    p = run(["--config", cfg] + args)
    check(p.returncode != 0 and want in p.stderr and "Traceback" not in p.stderr,
          f"refused: {' '.join(a for a in args if not a.startswith('/'))}", p.stdout + p.stderr)
p = subprocess.run([sys.executable, os.path.join(ref_dir, "train_reference.py"), "--export", P("nowhere"),
                    "--lr", "1e-3", "--warmup", "0", "--out", P("x.jsonl")], capture_output=True, text=True)
check(p.returncode == 2 and "init.safetensors" in p.stderr, "the reference names a missing export",
      p.stderr)
finish("reference training")
