#!/usr/bin/python3
"""Length generalisation: pretrained models evaluated on masked-LM at longer sequences than they
were trained on (the second paper's experiment), as a table and a curve of loss against position.

usage: length_generalisation.py --app PRETRAIN_APP --corpus DIR --out PREFIX
                                [--lengths 128,256,512] [--batch-size 8] [--bucket 32]
                                [--train-length 128] RUN[=LABEL] [RUN[=LABEL] ...]

RUN is a pretrain_app run directory (its model.safetensors) or a checkpoint file. RUNs given the
same LABEL (the seeds of one preset) form one row: the mean ± the standard deviation over them
(n - 1 in the denominator) of every figure, and one curve, their mean, with a band of ± one
standard deviation. Each model is
evaluated with `pretrain_app eval --seq-len T --by-position` on the corpus's validation split
(every batch, the fixed validation masks) at every length; a model with a learned position table
shorter than T refuses it (a usage error), shown as "n/a". Writes
  PREFIX.md    the table: MLM loss (perplexity) per model and length, and at T = the longest
               length, the loss over positions [0, train) and [train, T);
  PREFIX.png   the loss of the predicted tokens against their position at the longest length,
               averaged over buckets of --bucket positions (Debian's python3-matplotlib);
  PREFIX.json  every figure, and each model's per-position (predicted, loss) at every length.
"""
import argparse
import json
import math
import os
import subprocess
import sys


def evaluate(app, model, corpus, length, batch_size, csv):
    p = subprocess.run([app, "eval", "--init", model, "--corpus", corpus, "--seq-len", str(length),
                        "--batch-size", str(batch_size), "--by-position", csv],
                       capture_output=True, text=True)
    if p.returncode == 2 and "exceeds the model's max_positions" in p.stderr:
        return None  # a learned table shorter than the length: cannot represent it
    if p.returncode != 0:
        sys.exit(f"length_generalisation: {model} at {length}: pretrain_app eval failed:\n{p.stderr}")
    rows = []
    with open(csv) as f:
        if f.readline().strip() != "position,predicted,loss":
            sys.exit(f"length_generalisation: {csv}: not pretrain_app's --by-position output")
        for line in f:
            pos, n, loss = line.strip().split(",")
            rows.append((int(n), float(loss) if loss else None))
    fields = p.stdout.split("loss ")[1].split()
    return {"loss": float(fields[0]), "perplexity": float(fields[2]), "accuracy": float(fields[4]),
            "by_position": rows}


def span_loss(rows, lo, hi):
    n = sum(rows[t][0] for t in range(lo, min(hi, len(rows))))
    if n == 0:
        return None
    return sum(rows[t][0] * rows[t][1] for t in range(lo, min(hi, len(rows))) if rows[t][0]) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--app", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="128,256,512")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--bucket", type=int, default=32)
    ap.add_argument("--train-length", type=int, default=128)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    longest, train = max(lengths), args.train_length
    work = args.out + "_csv"
    os.makedirs(work, exist_ok=True)

    results = []
    for i, spec in enumerate(args.runs):
        run, _, label = spec.partition("=")
        model = os.path.join(run, "model.safetensors") if os.path.isdir(run) else run
        if not os.path.exists(model):
            sys.exit(f"length_generalisation: {model}: no such file (a run directory or a checkpoint)")
        label = label or os.path.basename(os.path.normpath(run))
        r = {"label": label, "model": model, "lengths": {}}
        for t in lengths:
            e = evaluate(args.app, model, args.corpus, t, args.batch_size,
                         os.path.join(work, f"{i:02d}_{label}_{t}.csv".replace("/", "_")))
            r["lengths"][t] = e
            print(f"{label:40s} T={t:4d} " + ("n/a (learned position table)" if e is None else
                  f"loss {e['loss']:.4f} ppl {e['perplexity']:.2f}"), flush=True)
        results.append(r)

    with open(args.out + ".json", "w") as f:
        json.dump({"lengths": lengths, "train_length": train, "corpus": args.corpus, "runs": results}, f)

    groups = {}  # label -> its runs, in the order first given
    for r in results:
        groups.setdefault(r["label"], []).append(r)

    def stats(values):
        """'m' or 'm ± s' (3 decimals) of the defined values; None when there are none."""
        v = [x for x in values if x is not None]
        if not v:
            return None
        m = sum(v) / len(v)
        if len(v) == 1:
            return f"{m:.3f}"
        s = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
        return f"{m:.3f} ± {s:.3f}"

    def cell(runs, t):
        es = [r["lengths"][t] for r in runs]
        if any(e is None for e in es):
            return "n/a"
        m = sum(e["loss"] for e in es) / len(es)
        return f"{stats([e['loss'] for e in es])} ({math.exp(m):.0f})"

    lines = ["| model | " + " | ".join(f"T = {t}" for t in lengths) +
             f" | T = {longest}: positions < {train} | ≥ {train} |",
             "|---|" + "---|" * (len(lengths) + 2)]
    for label, runs in groups.items():
        inside = outside = "n/a"
        if all(r["lengths"][longest] is not None for r in runs):
            rows = [r["lengths"][longest]["by_position"] for r in runs]
            inside = stats([span_loss(x, 0, train) for x in rows]) or "-"
            outside = stats([span_loss(x, train, longest) for x in rows]) or "-"
        name = label if len(runs) == 1 else f"{label} ({len(runs)} runs)"
        lines.append(f"| {name} | " + " | ".join(cell(runs, t) for t in lengths) +
                     f" | {inside} | {outside} |")
    with open(args.out + ".md", "w") as f:
        f.write("MLM loss (perplexity) on the validation split; n/a: a learned position table "
                "cannot represent the length; several runs of one label: mean ± std.\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("length_generalisation: the picture needs matplotlib (apt-get install python3-matplotlib)")
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for label, runs in groups.items():
        curves = []
        for r in runs:
            e = r["lengths"][longest]
            if e is None:
                e = max((v for v in r["lengths"].values() if v is not None),
                        key=lambda v: len(v["by_position"]), default=None)
                if e is None:
                    continue
            rows = e["by_position"]
            curve = {}
            for lo in range(0, len(rows), args.bucket):
                v = span_loss(rows, lo, lo + args.bucket)
                if v is not None:
                    curve[lo + args.bucket / 2] = v
            curves.append(curve)
        xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not xs:
            continue
        ys = [sum(c[x] for c in curves) / len(curves) for x in xs]
        line, = ax.plot(xs, ys, label=label if len(curves) == 1 else f"{label} (mean of {len(curves)})",
                        linewidth=1.4)
        if len(curves) > 1:
            sd = [math.sqrt(sum((c[x] - y) ** 2 for c in curves) / (len(curves) - 1)) for x, y in zip(xs, ys)]
            ax.fill_between(xs, [y - d for y, d in zip(ys, sd)], [y + d for y, d in zip(ys, sd)],
                            color=line.get_color(), alpha=0.2, linewidth=0)
    ax.axvline(train, color="gray", linestyle="--", linewidth=1)
    ax.text(train, ax.get_ylim()[0], f" trained at T = {train}", va="bottom", fontsize=8, color="gray")
    ax.set_xlabel(f"position in the sequence (mean over buckets of {args.bucket})")
    ax.set_ylabel("MLM loss of the masked tokens")
    ax.set_title(f"Length generalisation: evaluated at T = {longest}")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.md, {args.out}.png, {args.out}.json")


if __name__ == "__main__":
    main()
