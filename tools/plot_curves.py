#!/usr/bin/python3
"""Draws the validation-loss curves of several pretraining runs into one PNG, as in the TUPE
paper's Figure 4a (Debian's python3-matplotlib).

usage: plot_curves.py OUT.png RUN_DIR[=LABEL] [RUN_DIR[=LABEL] ...] [--train] [--tokens] [--title T]

Each RUN_DIR holds the metrics.jsonl that pretrain_app writes (one JSON object per log step;
`valid_loss` on validation steps). The label defaults to the directory's name. --train adds the
training loss (thin lines). --tokens puts the tokens seen on the x axis instead of the step (runs
of different batch sizes side by side; each row's `tokens`).
"""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("runs", nargs="+")
ap.add_argument("--train", action="store_true", help="also draw the training loss")
ap.add_argument("--tokens", action="store_true", help="x axis: tokens seen (metrics' `tokens`)")
ap.add_argument("--title", default="MLM validation loss")
args = ap.parse_args()

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_curves: needs matplotlib (apt-get install python3-matplotlib)")

fig, ax = plt.subplots(figsize=(7, 4.5))
drawn = 0
for spec in args.runs:
    run, _, label = spec.partition("=")
    label = label or os.path.basename(os.path.normpath(run))
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        sys.exit(f"plot_curves: {path}: no such file (expected a run directory of pretrain_app)")
    steps, valid, tsteps, train = [], [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                m = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_curves: {path}:{n}: not JSON ({e})")
            x = m["step"]
            if args.tokens:
                if "tokens" not in m:
                    sys.exit(f"plot_curves: {path}:{n}: no `tokens` for --tokens")
                x = m["tokens"]
            if "valid_loss" in m:
                steps.append(x)
                valid.append(m["valid_loss"])
            if "loss" in m:
                tsteps.append(x)
                train.append(m["loss"])
    if not steps:
        print(f"plot_curves: warning: {path} has no validation step", file=sys.stderr)
        continue
    line, = ax.plot(steps, valid, marker="o", markersize=3, label=f"{label} (valid)")
    if args.train:
        ax.plot(tsteps, train, linewidth=0.6, alpha=0.5, color=line.get_color(), label=f"{label} (train)")
    drawn += 1
if not drawn:
    sys.exit("plot_curves: nothing to draw (no run has a validation step yet)")
ax.set_xlabel("tokens seen" if args.tokens else "pre-training step")
ax.set_ylabel("MLM loss")
ax.set_title(args.title)
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(args.out, dpi=120)
print(f"plot_curves: {drawn} run(s) -> {args.out}")
