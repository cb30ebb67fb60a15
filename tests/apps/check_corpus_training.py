#!/usr/bin/python3
"""pretrain_app on a corpus, end to end (standard library only):

  1. writes a small text corpus and a WordPiece vocab.txt, prepares shards (`pretrain_app prepare`);
  2. trains a tiny model without interruption (run A) and records the loss of every step;
  3. trains the same config again (run B) while killing it with SIGKILL over and over — at random
     moments, and as soon as a checkpoint's temporary file appears (a kill during the write) — each
     time continuing with --resume, until it finishes;
  4. requires B's losses to equal A's bit for bit at every step, no temporary file to be used, and
     the last complete checkpoint to be the one resumed;
  5. bad inputs: an empty corpus, a vocabulary that does not match the model.

usage: check_corpus_training.py PRETRAIN_APP WORKDIR
"""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
from tiny_corpus import make_corpus  # noqa: E402

app, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
P = lambda *a: os.path.join(work, *a)  # noqa: E731


def run(args, **kw):
    return subprocess.run([app] + args, capture_output=True, text=True, **kw)


# ---- data: a vocabulary and text from it ------------------------------------------------------
rng = random.Random(5)
p = make_corpus(app, work)
check(p.returncode == 0, "prepare a corpus", p.stdout + p.stderr)

with open(P("cfg.yaml"), "w") as f:
    f.write(f"""seed: 4
model:
  hidden_size: 128
  num_layers: 2
  num_heads: 4
  ffn_size: 256
  max_positions: 64
  position:
    preset: tupe_r
optim:
  lr: 2.0e-3
data:
  corpus: {P("corpus")}
  seq_len: 64
  batch_size: 8
train:
  steps: 24
  warmup_steps: 4
  accumulation: 2
  log_every: 1
  valid_every: 6
  valid_batches: 2
  save_every: 3
  keep_last: 2
  progress: false
""")


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["loss"] for r in rows}, rows


# ---- run A: uninterrupted -----------------------------------------------------------------------
t0 = time.time()
p = run(["--config", P("cfg.yaml"), "--out", P("a")])
check(p.returncode == 0, "uninterrupted run", p.stdout + p.stderr)
duration = time.time() - t0
a_loss, a_rows = losses(P("a"))
check(sorted(a_loss) == list(range(1, 25)), "metrics.jsonl has every step", str(sorted(a_loss)))
valid = [r["valid_loss"] for r in a_rows if "valid_loss" in r]
check(len(valid) == 4 and valid[-1] < valid[0], f"validation loss falls: {valid}")
for key in ("step", "loss", "lr", "tokens_per_s", "loss_scale", "grad_norm"):
    check(all(key in r for r in a_rows), f"metrics.jsonl objects have '{key}'")


# ---- pretrain_app eval: the final model on the validation split gives the run's last valid loss ---
p = run(["eval", "--init", P("a", "model.safetensors"), "--corpus", P("corpus"), "--batches", "2", "--batch-size", "8",
         "--seq-len", "64"])
try:
    fields = p.stdout.split("loss ")[1].split()
    ev_loss, ev_ppl, ev_acc = float(fields[0]), float(fields[2]), float(fields[4])
    last = [r for r in a_rows if "valid_loss" in r][-1]
    check(p.returncode == 0 and abs(ev_loss - last["valid_loss"]) < 1e-4 and abs(ev_acc - last["valid_accuracy"]) < 1e-4
          and abs(ev_ppl - last["valid_ppl"]) < 1e-2 * last["valid_ppl"],
          f"eval gives the run's last validation: loss {ev_loss} vs {last['valid_loss']:.4f}, accuracy {ev_acc}", p.stdout + p.stderr)
except (IndexError, ValueError):
    check(False, "pretrain_app eval prints loss, perplexity and accuracy", p.stdout + p.stderr)
# --by-position: the mean loss of the predicted tokens at each position; their count-weighted mean is
# the loss above, and the counts add up to the predicted tokens.
p = run(["eval", "--init", P("a", "model.safetensors"), "--corpus", P("corpus"), "--batches", "2", "--batch-size", "8",
         "--seq-len", "64", "--by-position", P("by_position.csv")])
try:
    with open(P("by_position.csv")) as f:
        header = f.readline().strip()
        rows = [line.strip().split(",") for line in f]
    predicted = int(p.stdout.split(" predicted tokens")[0].split()[-1])
    n = sum(int(r[1]) for r in rows)
    mean = sum(int(r[1]) * float(r[2]) for r in rows if r[2]) / n
    ev = float(p.stdout.split("loss ")[1].split()[0])
    check(p.returncode == 0 and header == "position,predicted,loss" and len(rows) == 64 and n == predicted
          and abs(mean - ev) < 1e-3 and rows[0][1] == "0",
          f"eval --by-position: 64 rows, {n} predicted tokens (of {predicted}), weighted mean {mean:.4f} vs loss {ev}",
          p.stdout + p.stderr)
except (OSError, IndexError, ValueError, ZeroDivisionError) as e:
    check(False, f"eval --by-position writes a CSV ({e})", p.stdout + p.stderr)
p = run(["eval", "--init", P("a", "model.safetensors"), "--corpus", P("corpus"), "--seq-len", "128"])
check(p.returncode == 2 and "exceeds the model's max_positions 64" in p.stderr,
      "eval beyond a learned position table: a usage error", p.stderr)
p = run(["eval", "--init", P("a", "model.safetensors"), "--corpus", P("nowhere")])
check(p.returncode == 1 and "nowhere" in p.stderr, "eval on a missing corpus: one clear error", p.stderr)
p = run(["eval", "--corpus", P("corpus")])
check(p.returncode == 2 and "--init" in p.stderr, "eval without --init: a usage error", p.stderr)

# ---- the run directory carries its tokenizer, recorded relative to each checkpoint --------------


def metadata(file):
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__", {})


shutil.copytree(P("a"), P("a_moved"))
for ckpt in [P("a_moved", "model.safetensors")] + glob.glob(P("a_moved", "checkpoints", "step_*.safetensors")):
    tok = metadata(ckpt).get("engine.tokenizer", "")
    where = os.path.join(os.path.dirname(ckpt), tok)
    check(tok and not os.path.isabs(tok) and os.path.realpath(where).startswith(os.path.realpath(P("a_moved")))
          and open(where, "rb").read() == open(P("vocab.txt"), "rb").read(),
          f"{os.path.relpath(ckpt, work)} records its tokenizer relative to itself, inside the run directory ({tok})")

# ---- run B: killed again and again --------------------------------------------------------------
b_dir = P("b")
kills = during_write = 0
finished = False
attempt = 0
while not finished and attempt < 40:
    attempt += 1
    args = ["--config", P("cfg.yaml"), "--out", b_dir]
    if glob.glob(os.path.join(b_dir, "checkpoints", "step_*.safetensors")):
        args.append("--resume")
    stale = set(glob.glob(os.path.join(b_dir, "checkpoints", "*.tmp.*")))  # left by the last kill
    proc = subprocess.Popen([app] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mode = (attempt + 1) % 2  # alternate, starting with a kill during a checkpoint write (0), then at a random moment (1)
    deadline = time.time() + rng.uniform(0.1, 0.6) * duration
    killed = False
    while proc.poll() is None:
        tmp = set(glob.glob(os.path.join(b_dir, "checkpoints", "*.tmp.*"))) - stale
        if (mode == 0 and tmp) or (mode == 1 and time.time() > deadline):
            proc.send_signal(signal.SIGKILL)
            killed = True
            kills += 1
            during_write += bool(tmp)
            break
        if mode == 1:
            time.sleep(0.002)
    out, err = proc.communicate()
    if not killed:
        finished = proc.returncode == 0
        if not finished:
            check(False, "a resumed run ends cleanly", out + err)
            break
check(finished, f"run B finished after {kills} SIGKILLs ({during_write} during a checkpoint write)")
check(during_write >= 1, "at least one kill landed during a checkpoint write")
if finished:
    b_loss, _ = losses(b_dir)
    same = all(b_loss.get(s) == a_loss[s] for s in a_loss)
    diff = [(s, a_loss[s], b_loss.get(s)) for s in a_loss if b_loss.get(s) != a_loss[s]][:5]
    check(same and sorted(b_loss) == sorted(a_loss), "killed-and-resumed losses equal the uninterrupted run bit for bit",
          str(diff))
    check(not glob.glob(os.path.join(b_dir, "checkpoints", "*.tmp.*")), "no temporary file left behind")
    kept = sorted(os.path.basename(x) for x in glob.glob(os.path.join(b_dir, "checkpoints", "step_*.safetensors")))
    check(len(kept) == 2 and kept[-1] == "step_00000024.safetensors", f"keep_last 2: {kept}")
    # What a stop between a checkpoint's write and the removal of the ones past keep_last leaves:
    # one too many; the next --resume removes it.
    shutil.copy(os.path.join(b_dir, "checkpoints", kept[-1]), os.path.join(b_dir, "checkpoints", "step_00000003.safetensors"))
    p = run(["--config", P("cfg.yaml"), "--out", b_dir, "--resume"])
    kept2 = sorted(os.path.basename(x) for x in glob.glob(os.path.join(b_dir, "checkpoints", "step_*.safetensors")))
    check(p.returncode == 0 and kept2 == kept, f"--resume removes a checkpoint past keep_last: {kept2}", p.stdout + p.stderr)

# ---- tools/length_generalisation.py: a relative preset runs at twice its training length; the learned
# table of run A cannot (n/a); the table, the per-position data and (with matplotlib) the curve -----
p = run(["--config", P("cfg.yaml"), "--out", P("rel"), "--set", "model.position.preset=sin_rpe",
         "--set", "train.steps=6", "--set", "train.valid_every=0"])
check(p.returncode == 0, "a sin_rpe run on the corpus", p.stdout + p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("alibi"), "--set", "model.position.preset=alibi",
         "--set", "train.steps=6", "--set", "train.valid_every=0"])
check(p.returncode == 0, "an alibi run on the corpus", p.stdout + p.stderr)
tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "length_generalisation.py")
p = subprocess.run([sys.executable, tool, "--app", app, "--corpus", P("corpus"), "--out", P("lengths"),
                    "--lengths", "64,128", "--train-length", "64", P("rel") + "=sin_rpe", P("a") + "=tupe_r",
                    P("alibi") + "=alibi"],
                   capture_output=True, text=True)
try:
    with open(P("lengths.json")) as f:
        lg = json.load(f)
    rel, learned, alibi = (lg["runs"][i]["lengths"] for i in range(3))
    with open(P("lengths.md")) as f:
        table = f.read()
    check(rel["64"] is not None and rel["128"] is not None and len(rel["128"]["by_position"]) == 128
          and learned["64"] is not None and learned["128"] is None
          and alibi["128"] is not None and len(alibi["128"]["by_position"]) == 128
          and "| sin_rpe |" in table and "| tupe_r |" in table and "| alibi |" in table and "n/a" in table,
          "length_generalisation.py: sin_rpe and alibi at 64 and 128, tupe_r's table only at 64",
          p.stdout + p.stderr)
except (OSError, KeyError, ValueError, IndexError) as e:
    check(False, f"length_generalisation.py writes its table and data ({e})", p.stdout + p.stderr)
# Runs sharing a label (seeds) make one row of mean ± std: the same model twice has std 0, and the
# mean of a model with a different one lies between them.
p2 = subprocess.run([sys.executable, tool, "--app", app, "--corpus", P("corpus"), "--out", P("grouped"),
                     "--lengths", "64,128", "--train-length", "64", P("rel") + "=twice", P("rel") + "=twice",
                     P("rel") + "=mixed", P("alibi") + "=mixed"], capture_output=True, text=True)
try:
    with open(P("grouped.md")) as f:
        table = f.read()
    twice = next(line for line in table.splitlines() if line.startswith("| twice (2 runs) |"))
    mixed = next(line for line in table.splitlines() if line.startswith("| mixed (2 runs) |"))
    a, b = rel["128"]["loss"], alibi["128"]["loss"]
    m = float(mixed.split("|")[3].split("±")[0])
    check(twice.split("|")[3].strip().startswith(f"{a:.3f} ± 0.000")
          and abs(m - (a + b) / 2) < 1e-3 and "±" in mixed.split("|")[5],
          "length_generalisation.py: runs of one label make one row of mean ± std", table)
except (OSError, StopIteration, ValueError, IndexError, NameError) as e:
    check(False, f"length_generalisation.py groups runs of one label ({e})", p2.stdout + p2.stderr)
try:
    import matplotlib  # noqa: F401
    check(p.returncode == 0 and os.path.getsize(P("lengths.png")) > 1000, "length_generalisation.py draws the curve",
          p.stdout + p.stderr)
except ImportError:
    print("skip length_generalisation.py's picture: no matplotlib")

# ---- ELECTRA (objective: electra) on the corpus: it trains, logs its two losses, evaluates ------
p = run(["--config", P("cfg.yaml"), "--out", P("electra"), "--set", "objective=electra",
         "--set", "electra.generator_size=0.25", "--set", "train.steps=12", "--set", "train.valid_every=6"])
check(p.returncode == 0 and "ELECTRA generator: 2 layers, width 32, 1 heads" in p.stdout,
      "an ELECTRA run on the corpus", p.stdout + p.stderr)
try:
    e_loss, e_rows = losses(P("electra"))
    ev = [r for r in e_rows if "valid_loss" in r]
    check(len(ev) == 2 and all("valid_mlm_loss" in r and "valid_rtd_loss" in r for r in ev)
          and all(abs(r["valid_loss"] - r["valid_mlm_loss"] - 50 * r["valid_rtd_loss"]) < 1e-3 * r["valid_loss"]
                  for r in ev)
          and ev[-1]["valid_loss"] < ev[0]["valid_loss"],
          f"ELECTRA validation: loss = MLM + 50 x RTD, and it falls: {[r['valid_loss'] for r in ev]}")
    with open(P("electra", "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__", {})
    check(meta.get("engine.model") == "electra" and "engine.electra_config" in meta,
          "the ELECTRA model records its kind and settings", str(meta.keys()))
except (OSError, ValueError) as e:
    check(False, f"ELECTRA run outputs ({e})")
p = run(["eval", "--init", P("electra", "model.safetensors"), "--corpus", P("corpus"), "--batches", "2",
         "--batch-size", "8", "--seq-len", "64"])
check(p.returncode == 0 and "loss" in p.stdout, "eval of an ELECTRA checkpoint", p.stdout + p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("electra"), "--resume", "--set", "train.steps=14"])
check(p.returncode == 1 and "holds a 'electra' model" in p.stderr,
      "resuming an ELECTRA run as a masked LM: one clear error", p.stderr)

# ---- MLM + sentence order (objective: mlm_sop) on the corpus: pairs, half swapped, three parts --
sop_args = ["--set", "objective=mlm_sop", "--set", "data.segment_pairs=true", "--set", "model.type_vocab_size=2",
            "--set", "train.steps=12", "--set", "train.valid_every=6"]
p = run(["--config", P("cfg.yaml"), "--out", P("sop")] + sop_args)
check(p.returncode == 0 and "half of them swapped (sentence order)" in p.stdout and "  sop " in p.stdout,
      "an MLM + SOP run on the corpus", p.stdout + p.stderr)
try:
    _, s_rows = losses(P("sop"))
    sv = [r for r in s_rows if "valid_loss" in r]
    check(len(sv) == 2 and all(abs(r["valid_loss"] - r["valid_mlm_loss"] - r["valid_sop_loss"])
                               < 1e-4 * r["valid_loss"] and 0 <= r["valid_sop_accuracy"] <= 1 for r in sv),
          "MLM + SOP validation: loss = MLM + SOP, an accuracy in [0, 1]: "
          f"{[(r['valid_loss'], r.get('valid_sop_accuracy')) for r in sv]}")
except (OSError, ValueError, KeyError) as e:
    check(False, f"MLM + SOP run outputs ({e})")
p = run(["eval", "--init", P("sop", "model.safetensors"), "--corpus", P("corpus"), "--batches", "2",
         "--batch-size", "8", "--seq-len", "64"])
check(p.returncode == 0 and "sop_accuracy" in p.stdout, "eval of an MLM + SOP checkpoint (on swapped pairs)",
      p.stdout + p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("sop_bad"), "--set", "objective=mlm_sop"])
check(p.returncode == 1 and "needs data.segment_pairs: true" in p.stderr and p.stderr.count("\n") <= 2,
      "mlm_sop without segment pairs: one clear error", p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("sop"), "--resume", "--set", "train.steps=14",
         "--set", "model.type_vocab_size=2"])
check(p.returncode == 1 and "holds a 'bert_mlm_sop' model" in p.stderr,
      "resuming an MLM + SOP run as a masked LM: one clear error", p.stderr)

# ---- bad inputs ----------------------------------------------------------------------------------
with open(P("empty.txt"), "w") as f:
    f.write("\n\n   \n")
p = run(["prepare", "--tokenizer", P("vocab.txt"), "--input", P("empty.txt"), "--out", P("empty")])
check(p.returncode == 1 and "empty" in (p.stdout + p.stderr).lower(), "an empty corpus is one clear error",
      p.stdout + p.stderr)
p = run(["prepare", "--tokenizer", P("vocab.txt"), "--input", P("missing.txt"), "--out", P("m")])
check(p.returncode == 1 and "missing.txt" in p.stderr, "a missing input file is one clear error", p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("c"), "--set", "model.vocab_size=500"])
check(p.returncode == 1 and "does not match the tokenizer" in p.stderr, "vocabulary/model mismatch", p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("a")])
check(p.returncode == 1 and "already holds checkpoints" in p.stderr, "refuses to overwrite a run", p.stderr)
p = run(["--config", P("cfg.yaml"), "--out", P("a"), "--resume", "--set", "model.num_layers=3"])
check(p.returncode == 1 and "differs" in p.stderr, "checkpoint/model mismatch on resume", p.stderr)

finish("corpus training")
