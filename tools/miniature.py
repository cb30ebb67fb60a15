#!/usr/bin/python3
"""The seeds' comparisons in miniature: several positional presets, each pretrained from several
seeds, then finetuned on GLUE from every checkpoint and from a random initialisation, reported as
mean +- std over the seeds beside the majority-class baseline (docs/results.md, issue 22).

usage: miniature.py --bin DIR --corpus DIR --glue DIR --out DIR [options]

Stages (--stage all runs them all, pretrain the first two, report only the last; work already
done in --out is skipped, so an interrupted sweep continues where it stopped — a pretraining run
resumes from its last checkpoint, every --save-every steps, or starts again if it has none):
  pretrain   pretrain_app --config CONFIG --set model.position.preset=P --set seed=S ... for every
             preset P and seed S = 1..--seeds (OUT/pre_P_sS, log OUT/pre_P_sS.log);
  scratch    the random-initialisation models of --scratch presets: the same config, one step at a
             learning rate of 1e-30 (OUT/init_P_sS);
  finetune   finetune_app glue/TASK from every model, seed S (the model's), one learning rate per
             run (OUT/ft/<model>/<TASK>_lr<LR>), --epochs and --max-train for every task;
  report     OUT/curves.png (MLM validation loss, mean and a band of +- one std over seeds),
             OUT/table.md and OUT/table.json: per model and task, the learning rate with the best
             mean dev score over seeds, its mean +- std (x 100; GLUE's score: the mean of the task's
             metrics), the majority class's score (n/a for STS-B: a constant has no correlation),
             and the final validation MLM loss (mean +- std over seeds).
Jobs run --jobs at a time with OMP_NUM_THREADS=--threads each; all learning rates' first runs go
before the second learning rate's, so a stopped sweep still has one complete grid point.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading

PRESETS = ("tupe_r", "tupe_a", "bert_a", "bert_r", "learned_rpe")
TASKS = ("RTE", "MRPC", "STS-B", "CoLA", "SST-2", "QNLI")


def die(msg):
    sys.exit(f"miniature: {msg}")


class Job:
    def __init__(self, name, argv, log, done_file, deps=()):
        self.name, self.argv, self.log, self.done_file, self.deps = name, argv, log, done_file, list(deps)
        self.state = "done" if os.path.exists(done_file) else "todo"


def run_jobs(jobs, workers, threads):
    """Runs the jobs `workers` at a time in list order, each after its dependencies; a failed job
    stops the sweep with its log's name (running jobs are let finish)."""
    cv = threading.Condition()
    failed = []
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))

    def next_job():
        for j in jobs:
            if j.state == "todo" and all(d.state == "done" for d in j.deps):
                return j
        return None

    def worker():
        while True:
            with cv:
                while True:
                    if failed or all(j.state != "todo" for j in jobs):
                        return
                    j = next_job()
                    if j:
                        j.state = "running"
                        break
                    cv.wait()
            try:
                os.makedirs(os.path.dirname(j.log), exist_ok=True)
                with open(j.log, "w") as log:
                    rc = subprocess.run(j.argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
            except OSError as e:
                print(f"miniature: {j.name}: {e}", file=sys.stderr)
                rc = -1
            with cv:
                if rc == 0 and os.path.exists(j.done_file):
                    j.state = "done"
                    print(f"miniature: {j.name} done", flush=True)
                else:
                    j.state = "failed"
                    failed.append(f"{j.name} failed (exit {rc}); see {j.log}")
                cv.notify_all()

    pending = sum(j.state == "todo" for j in jobs)
    print(f"miniature: {len(jobs) - pending} of {len(jobs)} jobs already done, {pending} to run", flush=True)
    ts = [threading.Thread(target=worker) for _ in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if failed:
        die(failed[0])


def mean_std(xs):
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"{path}: {e}")


def valid_curve(run):
    path = os.path.join(run, "metrics.jsonl")
    curve = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                m = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{path}:{n}: not JSON ({e})")
            # The MLM part when the objective has more (mlm_sop: MLM + SOP), so that the
            # curves of every objective are MLM losses.
            if "valid_mlm_loss" in m:
                curve[m["step"]] = m["valid_mlm_loss"]
            elif "valid_loss" in m:
                curve[m["step"]] = m["valid_loss"]
    return curve


def report(args, models, tasks, lrs):
    table = {"protocol": {k: getattr(args, k) for k in ("steps", "warmup", "seeds", "epochs", "max_train",
                                                          "config")},
             "lrs": lrs, "tasks": tasks, "rows": []}
    table["protocol"]["set"] = args.set
    baseline = {}
    for label, kind, runs in models:
        row = {"model": label, "kind": kind, "tasks": {}}
        if kind == "pretrained":
            curves = [valid_curve(r) for r in runs]
            final = [c[max(c)] for c in curves if c]
            if len(final) == len(runs):
                row["valid_loss"] = mean_std(final)
            row["curves"] = curves
        for task in tasks:
            best = None
            for lr in lrs:
                scores = []
                for r in runs:
                    res = os.path.join(args.out, "ft", os.path.basename(r), f"{task}_lr{lr}", "results.json")
                    if not os.path.exists(res):
                        break
                    j = read_json(res)
                    baseline[task] = j["baseline"]
                    scores.append(100 * j["by_lr"][0]["scores"][0])
                if len(scores) == len(runs):
                    m, s = mean_std(scores)
                    if best is None or m > best["mean"]:
                        best = {"lr": lr, "mean": m, "std": s, "scores": scores}
            if best:
                row["tasks"][task] = best
        table["rows"].append(row)
    table["baseline"] = baseline

    def base_cell(task):  # a regression task has no majority class: its baseline is null
        m = (baseline.get(task) or {}).get("metrics")
        return f"{100 * sum(m.values()) / len(m):.1f}" if m else ("n/a" if task in baseline else "")

    lines = ["| model | valid MLM loss | " + " | ".join(tasks) + " | mean |",
             "|---|---|" + "---|" * (len(tasks) + 1)]
    cells = [base_cell(t) for t in tasks]
    mean = f"{sum(float(c) for c in cells) / len(cells):.1f}" if all(c not in ("", "n/a") for c in cells) else ""
    lines.append("| majority class | | " + " | ".join(cells) + f" | {mean} |")
    for row in table["rows"]:
        cells = []
        for t in tasks:
            b = row["tasks"].get(t)
            cells.append(f"{b['mean']:.1f} ± {b['std']:.1f}" if b else "")
        done = [row["tasks"][t]["mean"] for t in tasks if t in row["tasks"]]
        mean = f"{sum(done) / len(done):.1f}" if len(done) == len(tasks) else ""
        vl = f"{row['valid_loss'][0]:.3f} ± {row['valid_loss'][1]:.3f}" if "valid_loss" in row else ""
        lines.append(f"| {row['model']} | {vl} | " + " | ".join(cells) + f" | {mean} |")
    lines.append("")
    lines.append("Learning rate chosen per row and task (best mean over seeds): " + "; ".join(
        f"{row['model']}: " + ", ".join(f"{t} {row['tasks'][t]['lr']}" for t in tasks if t in row["tasks"])
        for row in table["rows"]))
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "table.json"), "w") as f:
        json.dump(table, f, indent=1)
    print(md, end="")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("miniature: no matplotlib (apt-get install python3-matplotlib): curves.png not drawn")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in table["rows"]:
        if "curves" not in row:
            continue
        steps = sorted(set.intersection(*[set(c) for c in row["curves"]]))
        if not steps:
            continue
        ms = [mean_std([c[s] for c in row["curves"]]) for s in steps]
        line, = ax.plot(steps, [m for m, _ in ms], label=f"{row['model']} ({len(row['curves'])} seeds)")
        ax.fill_between(steps, [m - s for m, s in ms], [m + s for m, s in ms], color=line.get_color(), alpha=0.25)
    ax.set_xlabel("pre-training step")
    ax.set_ylabel("MLM validation loss")
    ax.set_title("MLM validation loss, mean ± std over seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "curves.png"), dpi=120)
    print(f"miniature: curves -> {os.path.join(args.out, 'curves.png')}")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the folder of pretrain_app and finetune_app (build/bin)")
    ap.add_argument("--corpus", required=True, help="a corpus prepared by pretrain_app prepare")
    ap.add_argument("--glue", required=True, help="the GLUE download (DIR/<task>/train.tsv, dev.tsv)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=os.path.join(root, "configs", "tiny_bert_a.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more pretraining overrides (repeatable)")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--scratch", default="bert_a", help="presets finetuned from a random initialisation too")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--valid-every", type=int, default=250)
    ap.add_argument("--valid-batches", type=int, default=16)
    ap.add_argument("--save-every", type=int, default=0,
                    help="pretraining checkpoint interval (0: only at the last step); an interrupted run "
                         "resumes from its last checkpoint")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--lrs", default="1e-3,3e-4", help="finetuning learning rates, in the order they are run")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-train", type=int, default=8000)
    ap.add_argument("--finetune-args", default="", help="more finetune_app flags (space-separated)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stage", choices=("all", "pretrain", "report"), default="all")
    args = ap.parse_args()

    presets = [p for p in args.presets.split(",") if p]
    scratch = [p for p in args.scratch.split(",") if p]
    tasks = [t for t in args.tasks.split(",") if t]
    lrs = [x for x in args.lrs.split(",") if x]
    if args.seeds < 1 or args.steps < 1 or args.jobs < 1 or args.threads < 1 or args.epochs < 1:
        die("--seeds, --steps, --jobs, --threads and --epochs must be >= 1")
    for x in lrs:
        try:
            if float(x) <= 0:
                raise ValueError
        except ValueError:
            die(f"--lrs: '{x}' is not a positive number")
    pretrain_app, finetune_app = (os.path.join(args.bin, a) for a in ("pretrain_app", "finetune_app"))
    for path, what in ((pretrain_app, "pretrain_app"), (finetune_app, "finetune_app")):
        if not os.access(path, os.X_OK):
            die(f"--bin {args.bin}: no executable {what}")
    if not os.path.exists(os.path.join(args.corpus, "meta.json")):
        die(f"--corpus {args.corpus}: no meta.json (expected a corpus of pretrain_app prepare)")
    for t in tasks:
        for split in ("train.tsv", "dev.tsv"):
            if not os.path.exists(os.path.join(args.glue, t, split)):
                die(f"--glue {args.glue}: no {t}/{split} (expected the GLUE download)")
    if not os.path.exists(args.config):
        die(f"--config {args.config}: no such file")
    os.makedirs(os.path.join(args.out, "ft"), exist_ok=True)

    common = [pretrain_app, "--config", args.config, "--set", f"data.corpus={args.corpus}"]
    for kv in args.set:
        common += ["--set", kv]
    models, jobs = [], []
    groups = [(p, "pretrained") for p in presets] + [(p, "scratch") for p in scratch]
    for p, kind in groups:
        label = p if kind == "pretrained" else f"{p}, random init"
        models.append((label, kind, [os.path.join(args.out, f"{'pre' if kind == 'pretrained' else 'init'}_{p}_s{s}")
                                     for s in range(1, args.seeds + 1)]))
    for s in range(1, args.seeds + 1):  # every preset's first seed before any second seed
        for (p, kind), (_, _, runs) in zip(groups, models):
            d = runs[s - 1]
            if kind == "pretrained":
                sets = {"train.steps": args.steps, "train.warmup_steps": args.warmup,
                        "train.valid_every": args.valid_every, "train.valid_batches": args.valid_batches,
                        "train.save_every": args.save_every or args.steps, "train.keep_last": 1, "train.log_every": 100}
            else:
                sets = {"train.steps": 1, "train.warmup_steps": 0, "optim.lr": 1e-30, "train.valid_every": 1,
                        "train.valid_batches": 1, "train.save_every": 1, "train.keep_last": 1}
            argv = common + ["--set", f"model.position.preset={p}", "--set", f"seed={s}"]
            for k, v in sets.items():
                argv += ["--set", f"{k}={v}"]
            argv += ["--out", d]
            if os.path.isdir(d) and not os.path.exists(os.path.join(d, "model.safetensors")):
                ckpts = os.path.join(d, "checkpoints")
                if os.path.isdir(ckpts) and os.listdir(ckpts):
                    argv.append("--resume")  # an interrupted run continues from its last checkpoint
                else:
                    shutil.rmtree(d)  # interrupted before its first checkpoint: nothing to keep
            jobs.append(Job(os.path.basename(d), argv, d + ".log", os.path.join(d, "model.safetensors")))
    pre_jobs = list(jobs)
    by_run = {os.path.join(args.out, j.name): j for j in pre_jobs}
    for lr in lrs:
        for task in tasks:
            for _, _, runs in models:
                for r in runs:
                    s = r.rsplit("_s", 1)[1]
                    d = os.path.join(args.out, "ft", os.path.basename(r), f"{task}_lr{lr}")
                    argv = [finetune_app, f"glue/{task}", "--checkpoint", os.path.join(r, "model.safetensors"),
                            "--data-dir", args.glue, "--lr", lr, "--seed", s, "--epochs", str(args.epochs),
                            "--max-train", str(args.max_train), "--no-test", "--out", d, "--overwrite"]
                    argv += args.finetune_args.split()
                    jobs.append(Job(f"{os.path.basename(r)} {task} lr {lr}", argv, d + ".log",
                                    os.path.join(d, "results.json"), deps=[by_run[r]]))

    if args.stage in ("all", "pretrain"):
        run_jobs(pre_jobs, args.jobs, args.threads)
    if args.stage == "all":
        run_jobs(jobs, args.jobs, args.threads)
    report(args, models, tasks, lrs)


if __name__ == "__main__":
    main()
