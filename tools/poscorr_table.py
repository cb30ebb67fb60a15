#!/usr/bin/python3
"""The second paper's properties of learned positions, as a table per preset over seeds: runs
poscorr_app on every checkpoint and gathers its summary.json measures (docs/poscorr.md).

usage: poscorr_table.py --app POSCORR_APP --out DIR [--max-positions T] [--matrices a,b,...]
                        RUN[=LABEL] [RUN[=LABEL] ...]

RUN is a pretrain_app run directory (its model.safetensors) or a checkpoint file; RUNs given the
same LABEL (the seeds of one preset) form one row per matrix. For each checkpoint, each measure
(translation invariance, symmetry, the forward and backward monotonic windows, and for logit
matrices the pattern's entropy and local mass) is first averaged over the matrix's heads; the row
is the mean ± the standard deviation over the checkpoints (n - 1 in the denominator). Each
head's pattern (global / local / broad / previous / next) is counted over every head of every
checkpoint of the row. Writes
  DIR/<label>_<k>/   poscorr_app's output for the k-th checkpoint of LABEL (k = 1, 2, ...);
  DIR/table.md       one row per label and matrix;
  DIR/table.json     every figure, and every head's measures per checkpoint.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

MEASURES = [("translation_invariance", "translation invariance"), ("symmetry", "symmetry"),
            ("monotonic_window_forward", "monotonic window fwd"),
            ("monotonic_window_backward", "monotonic window bwd"),
            ("pattern_entropy", "pattern entropy"), ("pattern_local_mass", "local mass")]
PATTERNS = ["global", "local", "broad", "previous", "next"]


def mean_std(xs):
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def fmt(m, s, digits):
    if m is None:
        return "n/a"
    if s is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def checkpoint_of(run):
    if os.path.isdir(run):
        path = os.path.join(run, "model.safetensors")
        if not os.path.exists(path):
            sys.exit(f"poscorr_table: {run}: no model.safetensors in this run directory")
        return path
    if not os.path.exists(run):
        sys.exit(f"poscorr_table: {run}: no such run directory or checkpoint")
    return run


def heads_of(entry):
    """A matrix's per-head measures (a single-matrix family such as ape_dot has one 'head')."""
    if "heads" in entry:
        return entry["heads"]
    if "properties" in entry:
        return [entry["properties"]]
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN[=LABEL]")
    ap.add_argument("--app", required=True, help="poscorr_app (build/bin/poscorr_app)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-positions", type=int, default=0, help="poscorr_app --max-positions (default: its own)")
    ap.add_argument("--matrices", default="", help="only these matrices (comma-separated; default: every one)")
    args = ap.parse_args()
    if not os.access(args.app, os.X_OK):
        sys.exit(f"poscorr_table: --app {args.app}: not an executable")
    wanted = [m for m in args.matrices.split(",") if m]

    groups = {}  # label -> [checkpoint], in the order given
    for spec in args.runs:
        run, _, label = spec.partition("=")
        label = label or os.path.basename(os.path.normpath(run))
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label):
            sys.exit(f"poscorr_table: {spec}: the label may hold only letters, digits and _ . + -")
        groups.setdefault(label, []).append(checkpoint_of(run))

    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        sys.exit(f"poscorr_table: --out {args.out}: cannot create it ({e})")
    summaries = {}
    for label, ckpts in groups.items():
        summaries[label] = []
        for k, ckpt in enumerate(ckpts, 1):
            d = os.path.join(args.out, f"{label}_{k}")
            argv = [args.app, "--checkpoint", ckpt, "--out", d]
            if args.max_positions:
                argv += ["--max-positions", str(args.max_positions)]
            p = subprocess.run(argv, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"poscorr_table: {ckpt}: poscorr_app failed:\n{p.stderr}")
            with open(os.path.join(d, "summary.json")) as f:
                summaries[label].append(json.load(f))

    rows = []
    for label, sums in summaries.items():
        presets = sorted({s["preset"] for s in sums})
        names = []
        for s in sums:
            for name in s["matrices"]:
                if name not in names and (not wanted or name in wanted):
                    names.append(name)
        for name in names:
            per_ckpt = [s["matrices"][name] for s in sums if name in s["matrices"]]
            if len(per_ckpt) != len(sums):
                sys.exit(f"poscorr_table: {label}: matrix {name} is missing from some of its checkpoints "
                         "(a label's runs must share a preset)")
            row = {"label": label, "presets": presets, "matrix": name, "checkpoints": len(per_ckpt),
                   "heads_per_checkpoint": len(heads_of(per_ckpt[0])), "measures": {}, "patterns": {},
                   "per_checkpoint": [heads_of(e) for e in per_ckpt]}
            for key, _ in MEASURES:
                vals = []
                for e in per_ckpt:
                    hv = [h[key] for h in heads_of(e) if key in h and h[key] is not None]
                    if hv:
                        vals.append(sum(hv) / len(hv))
                m, sd = mean_std(vals)
                row["measures"][key] = {"mean": m, "std": sd, "per_checkpoint": vals}
            for e in per_ckpt:
                for h in heads_of(e):
                    if "pattern" in h:
                        row["patterns"][h["pattern"]] = row["patterns"].get(h["pattern"], 0) + 1
            rows.append(row)

    with open(os.path.join(args.out, "table.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    lines = ["| label | matrix | runs x heads | " + " | ".join(t for _, t in MEASURES) + " | patterns |",
             "|---|---|---|" + "---:|" * len(MEASURES) + "---|"]
    for r in rows:
        cells = []
        for key, _ in MEASURES:
            m = r["measures"][key]
            digits = 1 if key.startswith("monotonic") else 2
            cells.append(fmt(m["mean"], m["std"], digits))
        pats = ", ".join(f"{p} {r['patterns'][p]}" for p in PATTERNS if r["patterns"].get(p)) or "-"
        lines.append(f"| {r['label']} | {r['matrix']} | {r['checkpoints']} x {r['heads_per_checkpoint']} | "
                     + " | ".join(cells) + f" | {pats} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
