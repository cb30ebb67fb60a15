#!/usr/bin/python3
"""The step at which each pretraining run first reaches a validation MLM loss: the TUPE paper's
"TUPE-A reaches BERT's final loss in 30% of the steps" claim, per run and as mean ± std per label.

usage: steps_to_loss.py [--target LOSS | --target-from LABEL] [--at STEPS] [--json FILE] RUN[=LABEL] ...

RUN is a pretrain_app run directory (its metrics.jsonl) or a metrics.jsonl file; RUNs given the
same LABEL (the seeds of one preset) form one row. --target-from LABEL takes as the target the
mean of that label's final validation losses (each run's last valid_loss). A run reaches the
target at the first validation whose loss is <= the target; the step is interpolated linearly in
loss between that validation and the one before it (the step itself when the first validation
already reaches it). The row gives each run's step, the mean ± std over runs that reached it (n - 1
in the denominator), that as a share of the target label's steps (its runs' last step), and how
many never did. Prints a Markdown table; --json writes every figure.

--at STEP,STEP,... prints a table (after the target's, when one is given): per label, the mean
validation loss at each of those steps over its runs (every run must have a validation at each),
then the mean ± std of the runs' final losses and each run's final loss, in the order given (a
run whose last validation comes before the others' says at which step).
"""
import argparse
import json
import math
import os
import sys


def read_curve(run):
    path = os.path.join(run, "metrics.jsonl") if os.path.isdir(run) else run
    if not os.path.exists(path):
        sys.exit(f"steps_to_loss: {run}: no metrics.jsonl")
    curve = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"steps_to_loss: {path}:{n}: not a JSON row ({e})")
            if "valid_loss" in row:
                if "step" not in row:
                    sys.exit(f"steps_to_loss: {path}:{n}: a validation row without 'step'")
                curve.append((int(row["step"]), float(row["valid_loss"])))
    if not curve:
        sys.exit(f"steps_to_loss: {path}: no validation rows (valid_loss)")
    # a resumed run may repeat steps: keep the last row of each step, in step order
    return sorted(dict(curve).items())


def reach_step(curve, target):
    prev = None
    for step, loss in curve:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return float(step)
            s0, l0 = prev
            return s0 + (step - s0) * (l0 - target) / (l0 - loss)
        prev = (step, loss)
    return None


def mean_std(xs):
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None)


def target_table(groups, target_loss, target_from):
    if target_from is not None:
        if target_from not in groups:
            sys.exit(f"steps_to_loss: --target-from {target_from}: no run has that label "
                     f"(labels: {', '.join(groups)})")
        target = sum(c[-1][1] for _, c in groups[target_from]) / len(groups[target_from])
        ref_steps = max(c[-1][0] for _, c in groups[target_from])
    else:
        target, ref_steps = target_loss, None

    rows = []
    for label, runs in groups.items():
        steps = [reach_step(c, target) for _, c in runs]
        reached = [s for s in steps if s is not None]
        m, sd = mean_std(reached)
        rows.append({"label": label, "runs": [r for r, _ in runs], "steps": steps,
                     "final_losses": [c[-1][1] for _, c in runs], "last_steps": [c[-1][0] for _, c in runs],
                     "mean": m, "std": sd, "never": len(steps) - len(reached),
                     "share_of_target_steps": (m / ref_steps if (m is not None and ref_steps) else None)})

    head = f"target validation loss {target:.4f}" + (f" (the mean final loss of {target_from}, "
                                                      f"{ref_steps} steps)" if ref_steps else "")
    print(head + "\n")
    print("| label | step per run | mean ± std | share of the target's steps | never reached |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        per = ", ".join("never" if s is None else f"{s:.0f}" for s in r["steps"])
        ms = "n/a" if r["mean"] is None else (f"{r['mean']:.0f}" + (f" ± {r['std']:.0f}" if r["std"] is not None else ""))
        share = "n/a" if r["share_of_target_steps"] is None else f"{100 * r['share_of_target_steps']:.0f}%"
        print(f"| {r['label']} | {per} | {ms} | {share} | {r['never']} |")
    return {"target": target, "target_from": target_from, "target_steps": ref_steps, "rows": rows}


def loss_at_table(groups, at):
    """Per label: the mean validation loss at each step of `at`, the runs' final losses."""
    rows = []
    for label, runs in groups.items():
        by_step = [(run, dict(c), c) for run, c in runs]
        means = []
        for step in at:
            vals = []
            for run, d, c in by_step:
                if step not in d:
                    sys.exit(f"steps_to_loss: --at {step}: {run} has no validation at step {step} "
                             f"(its validations: {c[0][0]} .. {c[-1][0]})")
                vals.append(d[step])
            means.append(sum(vals) / len(vals))
        finals = [c[-1][1] for _, c in runs]
        m, sd = mean_std(finals)
        rows.append({"label": label, "runs": [r for r, _ in runs], "steps": at, "mean_loss": means,
                     "final_losses": finals, "last_steps": [c[-1][0] for _, c in runs],
                     "final_mean": m, "final_std": sd})
    last = max(x for r in rows for x in r["last_steps"])
    print(f"\nmean validation loss per label at the given steps; final (step {last:,}): mean ± std over runs, "
          "then per run (a run that ended earlier says at which step)\n")
    print("| label | " + " | ".join(f"{s:,}" for s in at) + " | final | final per run |")
    print("|---|" + "---:|" * (len(at) + 1) + "---|")
    for r in rows:
        fin = f"{r['final_mean']:.3f}" + (f" ± {r['final_std']:.3f}" if r["final_std"] is not None else "")
        print(f"| {r['label']} | " + " | ".join(f"{x:.2f}" for x in r["mean_loss"]) + f" | {fin} | "
              + ", ".join(f"{x:.4f}" + (f" (step {n:,})" if n != last else "")
                          for x, n in zip(r["final_losses"], r["last_steps"])) + " |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN[=LABEL]")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--target", type=float, help="the validation loss to reach")
    g.add_argument("--target-from", metavar="LABEL", help="the mean final validation loss of LABEL's runs")
    ap.add_argument("--at", metavar="STEPS", help="comma-separated steps: the mean validation loss at each, per label")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    at = None
    if args.at is not None:
        try:
            at = [int(x) for x in args.at.split(",")]
        except ValueError:
            ap.error(f"--at {args.at}: expected comma-separated whole steps, e.g. 1000,2000,4000")
        if not at or any(x < 0 for x in at):
            ap.error(f"--at {args.at}: expected comma-separated whole steps, e.g. 1000,2000,4000")
    if args.target is None and args.target_from is None and at is None:
        ap.error("one of the arguments --target --target-from --at is required")

    groups = {}
    for spec in args.runs:
        run, _, label = spec.partition("=")
        groups.setdefault(label or os.path.basename(os.path.normpath(run)), []).append((run, read_curve(run)))
    out = {}
    if args.target is not None or args.target_from is not None:
        out.update(target_table(groups, args.target, args.target_from))
    if at is not None:
        out["at"] = loss_at_table(groups, at)
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        except OSError as e:
            sys.exit(f"steps_to_loss: --json {args.json}: cannot write it ({e})")


if __name__ == "__main__":
    main()
