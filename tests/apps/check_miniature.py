#!/usr/bin/python3
"""tools/miniature.py end to end on a tiny corpus and a small RTE-format task (standard library only):
2 presets x 2 seeds pretrained, a random-initialisation row, 2 finetuning learning rates; the table's
means, stds, chosen learning rates, validation losses and majority row must equal what the runs'
own files say; a second invocation runs nothing, one with a finetuning result removed runs just
that one; a pretraining run with --save-every stopped after a checkpoint resumes from it; a preset that does not exist and a missing GLUE folder end with one clear message.

usage: check_miniature.py BIN_DIR WORKDIR
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
from tiny_corpus import make_corpus  # noqa: E402

bin_dir, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
P = lambda *a: os.path.join(work, *a)  # noqa: E731
tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "miniature.py")


p = make_corpus(os.path.join(bin_dir, "pretrain_app"), work)
check(p.returncode == 0, "prepare a corpus", p.stdout + p.stderr)
with open(P("cfg.yaml"), "w") as f:
    f.write("""seed: 1
model:
  hidden_size: 32
  num_layers: 1
  num_heads: 2
  ffn_size: 64
  max_positions: 64
  type_vocab_size: 2
  position:
    preset: bert_a
optim:
  lr: 2.0e-3
data:
  corpus: unused
  seq_len: 64
  batch_size: 8
train:
  steps: 10
""")

# An RTE-format task over the corpus's words: entailment iff sentence2 holds w1.
rng = random.Random(3)


def rows(n):
    out = []
    for i in range(n):
        s2 = [f"w{rng.randrange(2, 300)}" for _ in range(rng.randint(3, 8))]
        if i % 2 == 0:
            s2.insert(rng.randrange(len(s2) + 1), "w1")
        s1 = " ".join(f"w{rng.randrange(2, 300)}" for _ in range(rng.randint(3, 8)))
        out.append(f"{i}\t{s1}\t{' '.join(s2)}\t{'entailment' if i % 2 == 0 else 'not_entailment'}\n")
    return out


os.makedirs(P("glue", "RTE"))
os.makedirs(P("glue", "STS-B"))
for name, n in (("train.tsv", 256), ("dev.tsv", 41)):
    with open(P("glue", "RTE", name), "w") as f:
        f.write("index\tsentence1\tsentence2\tlabel\n" + "".join(rows(n)))
    with open(P("glue", "STS-B", name), "w") as f:  # a regression task: no majority class
        f.write("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n")
        for r in rows(n):
            i, s1, s2, label = r.rstrip("\n").split("\t")
            f.write(f"{i}\tg\tf\t2012\t{i}\ts\ts\t{s1}\t{s2}\t{5.0 if label == 'entailment' else 1.0}\n")

base = [sys.executable, tool, "--bin", bin_dir, "--corpus", P("corpus"), "--glue", P("glue"),
        "--config", P("cfg.yaml"), "--presets", "tupe_r,bert_a", "--scratch", "bert_a", "--seeds", "2",
        "--steps", "20", "--warmup", "2", "--valid-every", "10", "--valid-batches", "2", "--tasks", "RTE,STS-B",
        "--lrs", "3e-3,1e-3", "--epochs", "4", "--finetune-args", "--batch-size 16 --max-len 32"]
out = P("mini")


def sweep(extra=()):
    return subprocess.run(base + ["--out", out, *extra], capture_output=True, text=True)


p = sweep()
check(p.returncode == 0 and "0 of 6 jobs already done, 6 to run" in p.stdout
      and "6 of 30 jobs already done, 24 to run" in p.stdout,
      "the whole sweep runs (6 pretraining, then 24 finetuning jobs)",
      p.stdout + p.stderr)

# ---- the table against the runs' own files ----------------------------------------------------
try:
    table = json.load(open(os.path.join(out, "table.json")))
    md = open(os.path.join(out, "table.md")).read()
except (OSError, json.JSONDecodeError) as e:
    table, md = None, ""
    check(False, f"table.json and table.md written ({e})")


def check_table(table, md):
    check([r["model"] for r in table["rows"]] == ["tupe_r", "bert_a", "bert_a, random init"],
          "rows: the presets, then the random initialisation", str([r["model"] for r in table["rows"]]))
    ok, detail = True, ""
    for r in table["rows"]:
        runs = [os.path.join(out, f"{'init' if 'random' in r['model'] else 'pre'}_{r['model'].split(',')[0]}_s{s}")
                for s in (1, 2)]
        got = {}
        for task in ("RTE", "STS-B"):
            means = {}
            for lr in ("3e-3", "1e-3"):
                xs = [100 * json.load(open(os.path.join(out, "ft", os.path.basename(d), f"{task}_lr{lr}",
                                                         "results.json")))["runs"][0]["best"]["score"] for d in runs]
                m = sum(xs) / 2
                means[lr] = (m, math.sqrt(sum((x - m) ** 2 for x in xs)), xs)
            lr = max(means, key=lambda k: means[k][0])
            got[task] = r["tasks"][task]
            if (got[task]["lr"] != lr or abs(got[task]["mean"] - means[lr][0]) > 1e-9
                    or abs(got[task]["std"] - means[lr][1]) > 1e-9):
                ok, detail = False, f"{r['model']} {task}: table {got[task]}, runs {means}"
        if "random" not in r["model"]:
            finals = []
            for d in runs:
                v = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
                v = [m for m in v if "valid_loss" in m]
                finals.append(v[-1]["valid_loss"])
                ok = ok and v[-1]["step"] == 20 and [m["step"] for m in v] == [10, 20]
            m = sum(finals) / 2
            s = math.sqrt(sum((x - m) ** 2 for x in finals))
            if abs(r["valid_loss"][0] - m) > 1e-9 or abs(r["valid_loss"][1] - s) > 1e-9:
                ok, detail = False, f"{r['model']}: valid loss {r['valid_loss']} vs {finals}"
            cells = f"| {r['model']} | {m:.3f} ± {s:.3f} | " + " | ".join(
                f"{got[t]['mean']:.1f} ± {got[t]['std']:.1f}" for t in ("RTE", "STS-B"))
            ok = ok and cells in md
        elif "valid_loss" in r:
            ok, detail = False, "the random-initialisation row has a validation loss"
    check(ok, "per row: the learning rate of the best mean over seeds, its mean and std; the final valid loss",
          detail or md)
    ok = "| majority class | | 51.2 | n/a |  |" in md  # 21 of 41 RTE dev examples are entailment
    check(ok, "the majority-class row (RTE 21/41 = 51.2; STS-B none)", md)


if table:
    try:
        check_table(table, md)
    except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
        check(False, f"the table and the runs' files agree ({type(e).__name__}: {e})")
if subprocess.run([sys.executable, "-c", "import matplotlib"]).returncode == 0:
    png = os.path.join(out, "curves.png")
    check(os.path.exists(png) and os.path.getsize(png) > 1000, "curves.png drawn")

# ---- continuing: nothing to redo; one removed result is run again alone --------------------------
p = sweep()
check(p.returncode == 0 and "6 of 6 jobs already done, 0 to run" in p.stdout
      and "30 of 30 jobs already done, 0 to run" in p.stdout, "a second invocation runs nothing",
      p.stdout + p.stderr)
os.remove(os.path.join(out, "ft", "pre_bert_a_s2", "RTE_lr1e-3", "results.json"))
p = sweep()
check(p.returncode == 0 and "29 of 30 jobs already done, 1 to run" in p.stdout
      and "pre_bert_a_s2 RTE lr 1e-3 done" in p.stdout, "a removed result is run again, alone", p.stdout + p.stderr)

# ---- --save-every: a pretraining run stopped after its last checkpoint resumes from it ------------
res = P("resume")
rargs = base + ["--out", res, "--presets", "bert_a", "--scratch", "", "--seeds", "1", "--stage", "pretrain",
                "--save-every", "10"]
p = subprocess.run(rargs, capture_output=True, text=True)
run_dir = os.path.join(res, "pre_bert_a_s1")
ckpts = sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) if os.path.isdir(os.path.join(run_dir, "checkpoints")) else []
check(p.returncode == 0 and ckpts, "--save-every leaves the run's checkpoints", p.stdout + p.stderr + str(ckpts))
if p.returncode == 0 and ckpts:
    first = open(os.path.join(run_dir, "model.safetensors"), "rb").read()
    os.remove(os.path.join(run_dir, "model.safetensors"))  # as if killed after its last checkpoint
    p = subprocess.run(rargs, capture_output=True, text=True)
    log = open(run_dir + ".log").read()
    check(p.returncode == 0 and "resum" in log.lower(),
          "the interrupted run resumes from its checkpoint", p.stdout + p.stderr + log[-600:])
    check(os.path.exists(os.path.join(run_dir, "model.safetensors"))
          and open(os.path.join(run_dir, "model.safetensors"), "rb").read() == first,
          "the resumed run writes the same model")

# ---- bad input: one clear message ----------------------------------------------------------------
p = subprocess.run(base + ["--out", P("bad"), "--presets", "nosuch"], capture_output=True, text=True)
check(p.returncode == 1 and "miniature: pre_nosuch_s1 failed (exit 1); see " in p.stderr,
      "an unknown preset: the failed job and its log named", p.stdout + p.stderr)
log = p.stderr.rsplit("see ", 1)[-1].strip()
check(os.path.exists(log) and "nosuch" in open(log).read(), "that log says what was wrong with the preset")
p = subprocess.run(base + ["--out", P("bad2"), "--glue", P("nowhere")], capture_output=True, text=True)
check(p.returncode == 1 and "--glue" in p.stderr and "RTE/train.tsv" in p.stderr and "Traceback" not in p.stderr,
      "a missing GLUE folder: one message", p.stderr)

finish("miniature")
