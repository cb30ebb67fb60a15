#!/usr/bin/python3
"""tools/glue_dev_split.py on a small QNLI-format task (standard library only): the split's row
counts and order, the header on both sides, no question on both sides with --group-column, the
other tasks linked; bad --train, a bad group column and a missing dev.tsv end with one clear
message naming the file or flag.

usage: check_glue_dev_split.py WORKDIR
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

work = sys.argv[1]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                    "glue_dev_split.py")


def run(*args):
    return subprocess.run([sys.executable, tool] + list(args), capture_output=True, text=True)


def rows(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


glue = os.path.join(work, "glue")
os.makedirs(os.path.join(glue, "QNLI"))
os.makedirs(os.path.join(glue, "RTE"))
with open(os.path.join(glue, "RTE", "train.tsv"), "w") as f:
    f.write("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
header = "index\tquestion\tsentence\tlabel"
# 9 rows, questions q0 x3, q1 x2, q2 x1, q3 x3 (dev.tsv keeps a question's rows together).
questions = ["q0", "q0", "q0", "q1", "q1", "q2", "q3", "q3", "q3"]
body = [f"{i}\t{q}\tsentence {i}\t{'entailment' if i % 2 else 'not_entailment'}"
        for i, q in enumerate(questions)]
with open(os.path.join(glue, "QNLI", "dev.tsv"), "w") as f:
    f.write("\n".join([header] + body) + "\n")

# Plain split: the first 4 rows, then the other 5, in file order.
out = os.path.join(work, "plain")
p = run("--glue", glue, "--task", "QNLI", "--train", "4", "--out", out)
check(p.returncode == 0, "plain split runs", p.stderr)
if p.returncode == 0:
    tr, dv = rows(os.path.join(out, "QNLI", "train.tsv")), rows(os.path.join(out, "QNLI", "dev.tsv"))
    check(tr == [header] + body[:4], "train.tsv = header + the first 4 rows", "\n".join(tr))
    check(dv == [header] + body[4:], "dev.tsv = header + the other 5 rows", "\n".join(dv))
    check(os.path.islink(os.path.join(out, "RTE"))
          and rows(os.path.join(out, "RTE", "train.tsv"))[1].startswith("0\ta"),
          "the other tasks are linked unchanged")
    check("train.tsv 4 rows, dev.tsv 5 rows" in p.stdout, "it says how many rows went where",
          p.stdout)

# Grouped by question: q0 (3 rows) + q1 (2) reach --train 4, so train.tsv has 5 rows.
out = os.path.join(work, "grouped")
p = run("--glue", glue, "--task", "QNLI", "--train", "4", "--group-column", "1", "--out", out)
check(p.returncode == 0, "grouped split runs", p.stderr)
if p.returncode == 0:
    tr, dv = rows(os.path.join(out, "QNLI", "train.tsv")), rows(os.path.join(out, "QNLI", "dev.tsv"))
    check(tr == [header] + body[:5] and dv == [header] + body[5:],
          "whole question groups: train.tsv rows 0-4, dev.tsv rows 5-8", "\n".join(tr + dv))
    qs = lambda lines: {line.split("\t")[1] for line in lines[1:]}  # noqa: E731
    check(not (qs(tr) & qs(dv)), "no question on both sides")

# Bad inputs: one clear message each, nothing half-written for the task.
for args, expect, label in [
        (["--train", "9"], "--train 9: expected 1 .. 8", "--train as large as dev.tsv"),
        (["--train", "0"], "--train 0: expected 1 .. 8", "--train 0"),
        (["--train", "3", "--group-column", "7"], "dev.tsv:2: --group-column 7", "a bad group column"),
        (["--train", "8", "--group-column", "1"], "no group is left for dev.tsv",
         "groups that leave dev.tsv empty")]:
    out = os.path.join(work, "bad")
    shutil.rmtree(out, ignore_errors=True)
    p = run("--glue", glue, "--task", "QNLI", "--out", out, *args)
    check(p.returncode != 0 and expect in p.stderr and "Traceback" not in p.stderr
          and not os.path.exists(os.path.join(out, "QNLI")), label + " is refused", p.stderr)
p = run("--glue", glue, "--task", "MNLI", "--train", "3", "--out", os.path.join(work, "bad2"))
check(p.returncode != 0 and "MNLI/dev.tsv: no such file" in p.stderr and "Traceback" not in p.stderr,
      "a task without dev.tsv is refused, naming the file", p.stderr)

finish("glue_dev_split")
