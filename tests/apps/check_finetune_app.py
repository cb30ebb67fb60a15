#!/usr/bin/python3
"""finetune_app from the outside (standard library only), on small tasks written here in the
official GLUE / SQuAD layouts that a tiny randomly initialised encoder can learn:

  - glue/RTE: a 2 learning rate x 2 seed sweep; dev accuracy must reach 0.9; results.json and
    results.md agree with the runs (median per learning rate, best learning rate, best run); the
    submission file has every test index and valid labels;
  - glue/STS-B (regression), glue/CoLA (no header), glue/MNLI (two dev splits, MNLI-m/-mm and
    AX from the MNLI model), squad/v1.1 and squad/v2.0: the outputs each must write;
  - bad inputs end with one clear message (file:line, key, expected) and exit 1 or 2, never a
    crash.

Usage: check_finetune_app.py FINETUNE_APP PRETRAIN_APP WORKDIR [--mpirun MPIEXEC]
With --mpirun, the RTE run goes through `MPIEXEC -np 2` and must give the dev accuracy of the
1-rank run (the same global batches, so the same training up to float summation order)."""
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys

args = sys.argv[1:]
mpirun = None
if "--mpirun" in args:
    i = args.index("--mpirun")
    mpirun = args[i + 1]
    del args[i:i + 2]
app, pretrain_app, work = args
shutil.rmtree(work, ignore_errors=True)  # outputs of an earlier run must not pass for this one's
os.makedirs(work)
failures = []


def path(*names):
    return os.path.join(work, *names)


def check(cond, label):
    print(("ok   " if cond else "FAIL ") + label)
    if not cond:
        failures.append(label)


def run(argv, expect_rc=0, expect_text="", label="", prefix=()):
    p = subprocess.run(list(prefix) + [app] + argv, capture_output=True, text=True)
    out = p.stdout + p.stderr
    ok = p.returncode == expect_rc and expect_text in out and 0 <= p.returncode < 128
    print(("ok   " if ok else "FAIL ") + label + f" (exit {p.returncode})")
    if not ok:
        failures.append(label)
        print("     expected", repr(expect_text), "exit", expect_rc, "in:\n     " + out.strip()[-3000:].replace("\n", "\n     "))
    return out


def write(name, text):
    p = path(name)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)
    return p


# ---- a vocabulary and a random tiny checkpoint ----------------------------------------------------
WORDS = ["the", "a", "cat", "dog", "bird", "sat", "ran", "flew", "on", "mat", "tree", "road", "big", "small",
         "red", "blue", "yes", "no", "is", "was", "who", "where", "what", "paris", "rome", "oslo", "lives", "in",
         "city", "of", ".", ",", "?"]
write("vocab.txt", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
VOCAB = 5 + len(WORDS)
write("tiny.yaml", f"""seed: 3
model:
  vocab_size: {VOCAB}
  hidden_size: 32
  num_layers: 2
  num_heads: 2
  ffn_size: 64
  max_positions: 64
  type_vocab_size: 2
  hidden_dropout: 0.0
  attention_dropout: 0.0
  position:
    preset: tupe_r
""")


def write_batch(file):
    ids, mask, labels = [2, 5, 6, 3], [1, 1, 1, 1], [-100, 5, -100, -100]
    header, blob = {}, b""
    for name, values in (("input_ids", ids), ("attention_mask", mask), ("labels", labels)):
        data = struct.pack("<%dq" % len(values), *values)
        header[name] = {"dtype": "I64", "shape": [1, 4], "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


write_batch(path("batch.st"))
p = subprocess.run([pretrain_app, "--config", path("tiny.yaml"), "--batch-file", path("batch.st"), "--steps", "0",
                    "--save", path("init.safetensors")], capture_output=True, text=True)
if p.returncode != 0:
    print(p.stdout, p.stderr)
    sys.exit(1)
CKPT = ["--checkpoint", path("init.safetensors"), "--tokenizer", path("vocab.txt")]
FAST = ["--batch-size", "16", "--max-len", "40", "--warmup-ratio", "0.1"]

# ---- GLUE files ---------------------------------------------------------------------------------
rng = random.Random(5)
NOUNS = ["cat", "dog", "bird", "tree", "road", "mat"]


def sentence(n=None):
    n = n or rng.randint(3, 8)
    return " ".join(rng.choice(WORDS[:16]) for _ in range(n))


def rte_rows(n):
    """entailment iff sentence2 contains "yes"."""
    rows = []
    for i in range(n):
        ent = i % 2 == 0
        s2 = sentence().split()
        s2.insert(rng.randint(0, len(s2)), "yes" if ent else "no")
        rows.append((i, sentence(), " ".join(s2), "entailment" if ent else "not_entailment"))
    return rows


def tsv(rows, header):
    return "\t".join(header) + "\n" + "".join("\t".join(str(c) for c in r) + "\n" for r in rows)


write("glue/RTE/train.tsv", tsv(rte_rows(192), ["index", "sentence1", "sentence2", "label"]))
write("glue/RTE/dev.tsv", tsv(rte_rows(64), ["index", "sentence1", "sentence2", "label"]))
write("glue/RTE/test.tsv", tsv([r[:3] for r in rte_rows(21)], ["index", "sentence1", "sentence2"]))

if mpirun:
    # 1 rank vs 2 ranks: the same global batches, so the same run up to summation order.
    one = path("out_rte_1")
    two = path("out_rte_2")
    common = ["glue/RTE", *CKPT, "--data-dir", path("glue"), "--lr", "2e-3", "--seed", "1", "--epochs", "2",
              "--no-test", "--log-every", "1", *FAST]
    for d in (one, two):
        shutil.rmtree(d, ignore_errors=True)
    run(common + ["--out", one], 0, "best learning rate", "1 rank")
    out = run(common + ["--out", two], 0, "(2 ranks)", "mpirun -np 2", prefix=(mpirun, "-np", "2"))
    try:
        a = json.load(open(os.path.join(one, "results.json")))["runs"][0]
        b = json.load(open(os.path.join(two, "results.json")))["runs"][0]
        la = [json.loads(l) for l in open(os.path.join(a["dir"], "metrics.jsonl"))]
        lb = [json.loads(l) for l in open(os.path.join(b["dir"], "metrics.jsonl"))]
        loss_a = [l["loss"] for l in la if "loss" in l]
        loss_b = [l["loss"] for l in lb if "loss" in l]
        check(len(loss_a) == len(loss_b) and all(abs(x - y) <= 1e-4 * max(1, abs(x)) for x, y in zip(loss_a, loss_b)),
              f"2 ranks: the training losses of 1 rank ({loss_a} vs {loss_b})")
        check(abs(a["best"]["acc"] - b["best"]["acc"]) <= 1 / 64 + 1e-9, "2 ranks: the dev accuracy of 1 rank")
    except Exception as e:  # noqa: BLE001
        check(False, f"2-rank results readable ({e})")
    if failures:
        print(f"\n{len(failures)} check(s) failed: " + "; ".join(failures))
        sys.exit(1)
    print("\nall checks passed")
    sys.exit(0)

# ---- finetuning from an ELECTRA checkpoint: the discriminator's encoder (embeddings of their own
# width, projected) is what finetune_app takes -------------------------------------------------------
with open(path("tiny.yaml")) as f:
    tiny = f.read()
write("electra.yaml", tiny.replace("model:\n", "objective: electra\nelectra:\n  generator_size: 0.5\nmodel:\n"
                                   "  embedding_size: 24\n", 1))
p = subprocess.run([pretrain_app, "--config", path("electra.yaml"), "--batch-file", path("batch.st"), "--steps", "0",
                    "--save", path("electra.safetensors")], capture_output=True, text=True)
check(p.returncode == 0, "an ELECTRA checkpoint (pretrain_app --save)" + ("" if p.returncode == 0 else p.stderr))
el_out = path("out_rte_electra")
run(["glue/RTE", "--checkpoint", path("electra.safetensors"), "--tokenizer", path("vocab.txt"), "--data-dir",
     path("glue"), "--out", el_out, "--lr", "4e-3", "--seed", "1", "--epochs", "8", "--no-test", *FAST], 0,
    "best learning rate", "glue/RTE from an ELECTRA checkpoint")
try:
    el = json.load(open(os.path.join(el_out, "results.json")))
    acc = el["best_run"]["metrics"]["acc"]
    check(acc >= 0.75, f"glue/RTE from ELECTRA's discriminator learns: dev accuracy {acc}")
except Exception as e:  # noqa: BLE001
    check(False, f"glue/RTE from ELECTRA: results.json readable ({e})")

# ---- glue/RTE: the sweep ------------------------------------------------------------------------
rte_out = path("out_rte")
out = run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--out", rte_out, "--lr", "2e-3,4e-3", "--seeds", "2",
           "--epochs", "8", *FAST], 0, "best learning rate", "glue/RTE sweep: 2 learning rates x 2 seeds")
check(re.search(r"step \d+/\d+ epoch [\d.]+ loss [\d.]+ lr \S+ grad_norm [\d.]+ [\d.]+ ex/s ETA \d+m\d\ds", out)
      is not None, "the progress line: step, epoch, loss, lr, grad_norm, examples/s, ETA")
try:
    res = json.load(open(os.path.join(rte_out, "results.json")))
except Exception as e:  # noqa: BLE001
    res = None
    check(False, f"results.json readable ({e})")
if res:
    check(res["task"] == "glue/RTE" and len(res["runs"]) == 4, "results.json: task and 4 runs")
    check([r["lr"] for r in res["by_lr"]] == [2e-3, 4e-3], "results.json: one row per learning rate")
    for row in res["by_lr"]:
        s = sorted(row["scores"])
        check(len(s) == 2 and abs(row["median_score"] - (s[0] + s[1]) / 2) < 1e-12, f"median of lr {row['lr']}")
        accs = sorted(r["best"]["acc"] for r in res["runs"] if r["lr"] == row["lr"])
        check(abs(row["median"]["acc"] - (accs[0] + accs[1]) / 2) < 1e-12, f"median accuracy of lr {row['lr']}")
    best_row = max(res["by_lr"], key=lambda r: r["median_score"])
    check(res["best_lr"] == best_row["lr"], "best_lr has the highest median")
    check(max(r["best"]["acc"] for r in res["runs"]) >= 0.9, "dev accuracy reaches 0.9 on the learnable task")
    for r in res["runs"]:
        check(len(r["history"]) == 8 and r["steps"] == 8 * 12, f"run {r['lr']}/{r['seed']}: 8 evaluations, 96 steps")
        check(r["best"]["acc"] == max(h["metrics"]["acc"] for h in r["history"]), "best = the best evaluation")
        check(os.path.exists(os.path.join(r["dir"], "metrics.jsonl")), "metrics.jsonl per run")
        dev_pred = open(os.path.join(r["dir"], "dev_predictions.tsv")).read().splitlines()
        check(len(dev_pred) == 65, "dev_predictions.tsv: header + 64 rows")
        # The written dev predictions give the best evaluation's accuracy (the best weights were restored).
        acc = sum(l.split("\t")[1] == l.split("\t")[2] for l in dev_pred[1:]) / 64
        check(abs(acc - r["best"]["acc"]) < 1e-9, "dev predictions come from the best weights")
    md = open(os.path.join(rte_out, "results.md")).read()
    check("| 0.002" in md and "| 0.004" in md and "**(best)**" in md, "results.md: the table")
    sub = open(os.path.join(rte_out, "submission", "RTE.tsv")).read().splitlines()
    check(sub[0] == "index\tprediction" and len(sub) == 22, "submission RTE.tsv: header + 21 rows")
    check([l.split("\t")[0] for l in sub[1:]] == [str(i) for i in range(21)], "submission: every test index in order")
    check(all(l.split("\t")[1] in ("entailment", "not_entailment") for l in sub[1:]), "submission: label names")
    # The majority-class baseline beside the metric (dev is 32/32, so 50%), and no one-class warning.
    check(res["baseline"] == {"predictor": "majority class", "prediction": "entailment", "metrics": {"acc": 0.5}},
          f"results.json: the majority-class baseline ({res.get('baseline')})")
    check("Baseline (majority class 'entailment') on dev: acc 50.00." in md and "Baseline (majority" in out,
          "results.md and the console show the baseline")
    check("Warning" not in md, "no one-class warning for models that learned the task")

# An --out with results is refused, --overwrite replaces them.
run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--out", rte_out, *FAST], 1,
    "holds an earlier run's results (", "an earlier run's --out is refused")
check(os.path.exists(os.path.join(rte_out, "results.json")), "the refused run left the earlier results alone")

# A model that predicts one class is flagged: lr 0 keeps the random head, which (dev being balanced
# and the encoder untrained) must not pass; a constant-label dev set makes every model "one class".
write("glue_one/RTE/train.tsv", tsv(rte_rows(16), ["index", "sentence1", "sentence2", "label"]))
write("glue_one/RTE/dev.tsv", tsv([r[:3] + ("entailment",) for r in rte_rows(10)], ["index", "sentence1", "sentence2", "label"]))
one_out = path("out_one")
out = run(["glue/RTE", *CKPT, "--data-dir", path("glue_one"), "--out", one_out, "--lr", "1e-9", "--seed", "1",
           "--epochs", "1", "--no-test", "--save-model", *FAST], 0, "best learning rate", "glue/RTE, an untrainable run")
try:
    one = json.load(open(os.path.join(one_out, "results.json")))
    flagged = one["runs"][0]["best"].get("one_class")
    md1 = open(os.path.join(one_out, "results.md")).read()
    if flagged:
        check("**Warning**: run lr 1e-09 seed 1 (at its best evaluation) predicts " + flagged in md1,
              f"a one-class run is flagged in results.md ({flagged})")
    else:
        check("Warning" not in md1, "a run with two predicted classes is not flagged")
    check(one["baseline"]["metrics"]["acc"] == 1.0, "baseline on a one-label dev set is 100%")
except Exception as e:  # noqa: BLE001
    check(False, f"one-class results readable ({e})")

# ---- prediction only, from a finetuned model ------------------------------------------------------
best = res["best_run"] if res else None
if res:
    run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--out", rte_out, "--lr", str(best["lr"]), "--seed",
         str(best["seed"]), "--epochs", "8", "--save-model", "--overwrite", *FAST], 0, "best learning rate",
        "--overwrite: the best run again, with --save-model")
    model = os.path.join(rte_out, "runs", f"lr{best['lr']:g}_seed{best['seed']}", "model.safetensors")
    check(os.path.exists(os.path.join(rte_out, "vocab.txt")), "--save-model keeps the vocabulary in --out")
    shutil.copytree(rte_out, path("out_rte_moved"))  # the whole output directory moves
    model = os.path.join(path("out_rte_moved"), "runs", f"lr{best['lr']:g}_seed{best['seed']}", "model.safetensors")
    pred_out = path("out_rte_predict")
    out = run(["glue/RTE", "--init", model, "--data-dir", path("glue"), "--out", pred_out, "--predict-only"], 0,
              "prediction only", "--predict-only from the finetuned model (its vocabulary recorded in it)")
    try:
        pr = json.load(open(os.path.join(pred_out, "results.json")))
        again = json.load(open(os.path.join(rte_out, "results.json")))["best_run"]["metrics"]["acc"]
        check(pr["mode"] == "predict-only" and abs(pr["dev"]["acc"] - again) < 1e-9,
              f"--predict-only scores dev as the run did ({pr['dev']['acc']} vs {again})")
        check(pr["baseline"]["metrics"]["acc"] == 0.5 and "| acc |" in out, "--predict-only shows the baseline")
        sub = open(os.path.join(pred_out, "submission", "RTE.tsv")).read().splitlines()
        check(len(sub) == 22, "--predict-only writes the GLUE submission file")
        check(len(open(os.path.join(pred_out, "dev_predictions.tsv")).read().splitlines()) == 65,
              "--predict-only writes the dev predictions")
    except Exception as e:  # noqa: BLE001
        check(False, f"--predict-only results readable ({e})")
    run(["glue/RTE", "--init", path("init.safetensors"), "--tokenizer", path("vocab.txt"), "--data-dir",
         path("glue"), "--out", path("out_pred_bad"), "--predict-only"], 1,
        "is a pretraining checkpoint", "--predict-only of a pretraining checkpoint: one clear error")

# ---- the other GLUE layouts ---------------------------------------------------------------------
SHORT = ["--lr", "2e-3", "--seed", "1", "--epochs", "1", *FAST]
stsb_h = ["genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
stsb = lambda n: [("main", "f", "2012", i, "s", "s", sentence(), sentence(), f"{rng.uniform(0, 5):.3f}") for i in range(n)]  # noqa: E731
write("glue/STS-B/train.tsv", tsv([(i,) + r for i, r in enumerate(stsb(40))], ["index"] + stsb_h))
write("glue/STS-B/dev.tsv", tsv([(i,) + r for i, r in enumerate(stsb(20))], ["index"] + stsb_h))
write("glue/STS-B/test.tsv", tsv([(i,) + r[:-1] for i, r in enumerate(stsb(7))], ["index"] + stsb_h[:-1]))
run(["glue/STS-B", *CKPT, "--data-dir", path("glue"), "--out", path("out_stsb"), *SHORT], 0, "pearson", "glue/STS-B")
sub = open(path("out_stsb", "submission", "STS-B.tsv")).read().splitlines() if os.path.exists(path("out_stsb", "submission", "STS-B.tsv")) else []
check(len(sub) == 8 and all(float(l.split("\t")[1]) == float(l.split("\t")[1]) for l in sub[1:]), "STS-B.tsv: 7 scores")
# LAMB from the command line: trains (its own numbers: not AdamW's) and a wrong name is refused.
run(["glue/STS-B", *CKPT, "--data-dir", path("glue"), "--out", path("out_stsb_lamb"), "--optim", "lamb",
     *SHORT], 0, "pearson", "glue/STS-B with --optim lamb")
adam_res = open(path("out_stsb", "results.json")).read() if os.path.exists(path("out_stsb", "results.json")) else ""
lamb_res = open(path("out_stsb_lamb", "results.json")).read() if os.path.exists(path("out_stsb_lamb", "results.json")) else ""
check(lamb_res != "" and lamb_res != adam_res, "--optim lamb: results of its own")
run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--optim", "sgd"], 2, "--optim expects adamw or lamb, got 'sgd'",
    "bad --optim")

cola = lambda n: [("src", i % 2, "", sentence()) for i in range(n)]  # noqa: E731
write("glue/CoLA/train.tsv", "".join("\t".join(map(str, r)) + "\n" for r in cola(40)))
write("glue/CoLA/dev.tsv", "".join("\t".join(map(str, r)) + "\n" for r in cola(20)))
write("glue/CoLA/test.tsv", tsv([(i, sentence()) for i in range(5)], ["index", "sentence"]))
out = run(["glue/CoLA", *CKPT, "--data-dir", path("glue", "CoLA"), "--out", path("out_cola"), *SHORT], 0, "mcc",
          "glue/CoLA (no header; --data-dir the task folder)")
check(os.path.exists(path("out_cola", "submission", "CoLA.tsv")), "CoLA.tsv written")
if res:
    run(["glue/CoLA", "--init", model, "--data-dir", path("glue"), "--out", path("out_pred_bad2"), "--predict-only"],
        1, "was finetuned on 'glue/RTE', not glue/CoLA", "--predict-only on another task: one clear error")

mnli_train_h = ["index", "promptID", "pairID", "genre", "s1bp", "s2bp", "s1p", "s2p", "sentence1", "sentence2",
                "label1", "gold_label"]
mnli_dev_h = mnli_train_h[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]
mnli_labels = ["contradiction", "entailment", "neutral"]
mnli = lambda n, dev: [(i, 0, 0, "g", "", "", "", "", sentence(), sentence(), "x") + (("x",) * 4 if dev else ()) +  # noqa: E731
                       (mnli_labels[i % 3],) for i in range(n)]
write("glue/MNLI/train.tsv", tsv(mnli(45, False), mnli_train_h))
write("glue/MNLI/dev_matched.tsv", tsv(mnli(12, True), mnli_dev_h))
write("glue/MNLI/dev_mismatched.tsv", tsv(mnli(9, True), mnli_dev_h))
test_h = mnli_train_h[:10]
write("glue/MNLI/test_matched.tsv", tsv([r[:10] for r in mnli(4, False)], test_h))
write("glue/MNLI/test_mismatched.tsv", tsv([r[:10] for r in mnli(3, False)], test_h))
write("glue/diagnostic/diagnostic.tsv", tsv([(i, sentence(), sentence()) for i in range(6)], ["index", "sentence1", "sentence2"]))
out = run(["glue/MNLI", *CKPT, "--data-dir", path("glue"), "--out", path("out_mnli"), *SHORT], 0, "acc_mm",
          "glue/MNLI: matched and mismatched dev")
for name, rows in (("MNLI-m.tsv", 4), ("MNLI-mm.tsv", 3), ("AX.tsv", 6)):
    f = path("out_mnli", "submission", name)
    lines = open(f).read().splitlines() if os.path.exists(f) else []
    check(len(lines) == rows + 1 and all(l.split("\t")[1] in mnli_labels for l in lines[1:]), f"{name}: {rows} predictions")

# ---- SQuAD --------------------------------------------------------------------------------------
def squad_file(n, v2):
    paragraphs = []
    for i in range(n):
        city = rng.choice(["paris", "rome", "oslo"])
        words = sentence(6).split()
        k = rng.randint(0, len(words))
        impossible = v2 and i % 3 == 2
        ctx_words = words[:k] + ([] if impossible else ["lives", "in", city]) + words[k:] + ["."]
        ctx = " ".join(ctx_words)
        qa = {"id": f"q{i}", "question": "where lives the cat ?", "answers": [], "is_impossible": impossible}
        if not impossible:
            qa["answers"] = [{"text": city, "answer_start": ctx.index("lives in " + city) + 9}]
        paragraphs.append({"context": ctx, "qas": [qa]})
    return {"version": "2.0" if v2 else "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


for version, v2 in (("v1.1", False), ("v2.0", True)):
    write(f"squad/train-{version}.json", json.dumps(squad_file(48, v2)))
    write(f"squad/dev-{version}.json", json.dumps(squad_file(15, v2)))
    o = path(f"out_squad_{version}")
    run([f"squad/{version}", *CKPT, "--data-dir", path("squad"), "--out", o, "--lr", "2e-3", "--seed", "1",
         "--epochs", "3", "--batch-size", "8", "--max-len", "24", "--max-query-len", "8", "--doc-stride", "4"],
        0, "f1", f"squad/{version}")
    try:
        r = json.load(open(os.path.join(o, "results.json")))
        run_dir = r["runs"][0]["dir"]
        preds = json.load(open(os.path.join(run_dir, "predictions.json")))
        check(sorted(preds) == sorted(f"q{i}" for i in range(15)), f"{version}: a prediction per question")
        check(0 <= r["runs"][0]["best"]["f1"] <= 100 and "exact" in r["runs"][0]["best"], f"{version}: EM and F1")
        if v2:
            check(os.path.exists(os.path.join(run_dir, "null_odds.json")) and "best_f1" in r["runs"][0]["best"],
                  "v2.0: null_odds.json and best_f1")
            # 5 of the 15 dev questions are unanswerable: answering "" everywhere scores 100 * 5/15.
            b = r["baseline"]
            check(b["predictor"] == 'every question answered with ""' and abs(b["metrics"]["f1"] - 100 / 3) < 1e-6
                  and abs(b["metrics"]["exact"] - 100 / 3) < 1e-6,
                  f"v2.0: the empty-answer baseline in results.json ({b})")
            md = open(os.path.join(o, "results.md")).read()
            check('Baseline (every question answered with "") on dev: exact 33.33 f1 33.33.' in md,
                  "v2.0: the empty-answer baseline in results.md")
        else:
            check(r["baseline"] is None, "v1.1: no baseline (no trivial answer)")
    except Exception as e:  # noqa: BLE001
        check(False, f"squad {version} outputs readable ({e})")

# ---- the dump mode ------------------------------------------------------------------------------
run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--dump", path("dump.st"), "--batch-size", "4",
     "--max-len", "40"], 0,
    "dump: classification head, batch 4", "--dump writes one batch")

# ---- bad inputs ---------------------------------------------------------------------------------
base = ["--data-dir", path("glue"), "--out", path("out_bad"), *SHORT]
run(["--checkpoint", path("init.safetensors")], 2, "TASK is required", "no task")
run(["glue/RTE", "--data-dir", path("glue")], 2, "--checkpoint (or --init) is required", "no checkpoint")
run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--lr", "fast"], 2, "--lr expects", "bad --lr")
run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--seeds", "0"], 2, "--seeds expects", "bad --seeds")
run(["glue/RTE", *CKPT, "--data-dir", path("glue"), "--bogus"], 2, "unknown argument '--bogus'", "unknown flag")
run(["imagenet", *CKPT, *base], 2, "TASK must be glue/<name>", "unknown task family")
run(["glue/XNLI", *CKPT, *base], 1, "unknown task 'XNLI'; known tasks: CoLA", "unknown GLUE task")
run(["squad/v3", *CKPT, *base], 2, "squad/v1.1 and squad/v2.0", "unknown SQuAD version")
run(["glue/AX", *CKPT, *base], 1, "MNLI model", "AX has no training data")
run(["glue/WNLI", *CKPT, *base], 1, "WNLI/train.tsv: no such file", "missing task folder")
run(["glue/RTE", "--checkpoint", path("nope.safetensors"), "--tokenizer", path("vocab.txt"), *base], 1,
    "nope.safetensors", "missing checkpoint")
run(["glue/RTE", "--checkpoint", path("init.safetensors"), *base], 1, "--tokenizer",
    "a checkpoint without a recorded tokenizer asks for --tokenizer")
write("small_vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
run(["glue/RTE", "--checkpoint", path("init.safetensors"), "--tokenizer", path("small_vocab.txt"), *base], 1,
    "has 6 tokens but the checkpoint", "tokenizer of another size")
run(["glue/RTE", *CKPT, *base[:-len(FAST)], "--max-len", "100"], 1, "exceeds the checkpoint's max_positions 64",
    "--max-len beyond the position table")
bad = open(path("glue/RTE/train.tsv")).read().splitlines()
bad[5] = bad[5] + "\textra"
write("badcols/RTE/train.tsv", "\n".join(bad) + "\n")
write("badcols/RTE/dev.tsv", open(path("glue/RTE/dev.tsv")).read())
run(["glue/RTE", *CKPT, "--data-dir", path("badcols"), "--out", path("out_bad"), *SHORT], 1, "train.tsv:6",
    "a row with an extra column names file:line")
bad = open(path("glue/RTE/dev.tsv")).read().splitlines()
bad[3] = bad[3].rsplit("\t", 1)[0] + "\tmaybe"
write("badlabel/RTE/train.tsv", open(path("glue/RTE/train.tsv")).read())
write("badlabel/RTE/dev.tsv", "\n".join(bad) + "\n")
run(["glue/RTE", *CKPT, "--data-dir", path("badlabel"), "--out", path("out_bad"), *SHORT], 1, "dev.tsv:4",
    "an unknown label names file:line")
write("badsquad/train-v1.1.json", '{"data": [{"paragraphs": [{"context": "x", "qas": 3}]}]}')
write("badsquad/dev-v1.1.json", '{"data": []}')
run(["squad/v1.1", *CKPT, "--data-dir", path("badsquad"), "--out", path("out_bad"), *SHORT], 1,
    "data[0].paragraphs[0].qas", "malformed SQuAD JSON names the JSON path")

if failures:
    print(f"\n{len(failures)} check(s) failed: " + "; ".join(failures))
    sys.exit(1)
print("\nall checks passed")
