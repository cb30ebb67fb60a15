#!/usr/bin/python3
"""Makes a GLUE folder where one task is trained on part of its dev split and scored on the rest.

For a task whose training split is missing (the GLUE copy beside this repository has QNLI's dev
and test splits but no train.tsv), this is the only way to finetune and score it at all. The
first --train rows of DIR/TASK/dev.tsv (in file order) become OUT/TASK/train.tsv, the remaining
rows OUT/TASK/dev.tsv, both with dev.tsv's header; every other task of DIR is linked into OUT
unchanged. With --group-column C, rows with the same text in column C (0-based) stay on one side
(QNLI: column 1, the question, which dev.tsv pairs with several sentences): whole groups, in the
order of their first row, go to train.tsv until it has at least --train rows. Scores on such a split are not comparable with the papers' dev scores: say so
wherever they are reported (docs/results.md does).

usage: /usr/bin/python3 tools/glue_dev_split.py --glue DIR --task QNLI --train 4000
           [--group-column 1] --out OUT
"""
import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--glue", required=True, help="the GLUE download (DIR/<task>/dev.tsv)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--train", type=int, required=True, help="dev rows that become train.tsv")
    ap.add_argument("--group-column", type=int, default=None,
                    help="rows equal in this column (0-based) stay on one side")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    dev = os.path.join(a.glue, a.task, "dev.tsv")
    if not os.path.isfile(dev):
        sys.exit(f"glue_dev_split: {dev}: no such file (expected --glue DIR with DIR/{a.task}/dev.tsv)")
    with open(dev, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 3:
        sys.exit(f"glue_dev_split: {dev}: expected a header line and at least two rows")
    header, rows = lines[0], lines[1:]
    if not 0 < a.train < len(rows):
        sys.exit(f"glue_dev_split: --train {a.train}: expected 1 .. {len(rows) - 1} "
                 f"({dev} has {len(rows)} rows)")
    if a.group_column is None:
        train, held = rows[:a.train], rows[a.train:]
    else:
        groups = {}  # key -> rows, in the order of the key's first row
        for n, row in enumerate(rows, start=2):
            cols = row.split("\t")
            if a.group_column < 0 or a.group_column >= len(cols):
                sys.exit(f"glue_dev_split: {dev}:{n}: --group-column {a.group_column}: the row has "
                         f"{len(cols)} columns")
            groups.setdefault(cols[a.group_column], []).append(row)
        train, held = [], []
        for members in groups.values():
            (train if len(train) < a.train else held).extend(members)
        if not held:
            sys.exit(f"glue_dev_split: --train {a.train}: no group is left for dev.tsv")
    task_out = os.path.join(a.out, a.task)
    os.makedirs(task_out, exist_ok=True)
    for name, part in (("train.tsv", train), ("dev.tsv", held)):
        with open(os.path.join(task_out, name), "w", encoding="utf-8", newline="") as f:
            f.write("\n".join([header] + part) + "\n")
    for other in sorted(os.listdir(a.glue)):
        src, dst = os.path.join(a.glue, other), os.path.join(a.out, other)
        if other != a.task and os.path.isdir(src) and not os.path.lexists(dst):
            os.symlink(os.path.abspath(src), dst)
    print(f"glue_dev_split: {a.out}/{a.task}: train.tsv {len(train)} rows, dev.tsv {len(held)} "
          f"rows (from {dev}); other tasks linked from {a.glue}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
