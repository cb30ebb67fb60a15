#!/usr/bin/python3
"""tools/steps_to_loss.py on made-up curves whose answers are known (standard library only):

  - the first validation at or below the target, interpolated linearly in loss from the one
    before it; a first validation already below it counts as its own step; runs that never reach
    it are counted, not averaged;
  - --target-from LABEL: the mean of LABEL's final losses, and the share of its steps;
  - a resumed run's repeated steps keep the last row; training rows without valid_loss are skipped;
  - --at STEPS: the mean loss per label at given steps, the finals' mean ± std and each run's
    final, alone or beside a target table; a run without a validation at a step is named;
  - bad input (no file, no validation rows, a broken line, an unknown label) ends with one message
    naming the file, line or label, exit 1 or 2, never a traceback.

Usage: check_steps_to_loss.py WORKDIR"""
import json
import os
import shutil
import subprocess
import sys

work = sys.argv[1]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "steps_to_loss.py")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run_dir(name, curve, extra_lines=()):
    d = os.path.join(work, name)
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step, loss in curve:
            f.write(json.dumps({"step": step - 50, "loss": loss + 1.0}) + "\n")  # a training row
            f.write(json.dumps({"step": step, "loss": loss, "valid_loss": loss}) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return d


def tool_run(args, code, expect, what):
    p = subprocess.run([sys.executable, tool] + args, capture_output=True, text=True)
    text = p.stdout + p.stderr
    ok = p.returncode == code and expect in text and "Traceback" not in text
    check(ok, f"{what}: exit {p.returncode} (want {code}), output {text.strip()[-400:]!r} (want {expect!r})")
    return p


# The reference: final losses 4.0 and 3.0 -> target 3.5, 1,000 steps.
ref1 = run_dir("ref1", [(500, 6.0), (1000, 4.0)])
ref2 = run_dir("ref2", [(500, 5.0), (1000, 3.0)])
# fast: 4.5 at 200, 2.5 at 400 -> crosses 3.5 half-way, at step 300.
fast1 = run_dir("fast1", [(200, 4.5), (400, 2.5), (600, 2.0)])
# fast2: below the target at its first validation -> step 100.
fast2 = run_dir("fast2", [(100, 3.4), (200, 3.0)])
# slow: never below 3.5.
slow = run_dir("slow", [(500, 6.0), (1000, 3.6)])
# resumed: step 400 written twice, the last row (3.0) wins; 3.5 is reached between 200 (4.0) and
# 400 (3.0), at 300 -- with the first 400 row (5.0) it would be later.
resumed = run_dir("resumed", [(200, 4.0), (400, 5.0)], [json.dumps({"step": 400, "valid_loss": 3.0})])

out = os.path.join(work, "out.json")
p = tool_run(["--target-from", "ref", f"{ref1}=ref", f"{ref2}=ref", f"{fast1}=fast", f"{fast2}=fast", f"{slow}=slow",
              f"{resumed}=resumed", "--json", out], 0, "target validation loss 3.5000", "--target-from")
res = json.load(open(out))
rows = {r["label"]: r for r in res["rows"]}
check(abs(res["target"] - 3.5) < 1e-12 and res["target_steps"] == 1000, f"target {res['target']} {res['target_steps']}")
check(rows["fast"]["steps"] == [300.0, 100.0], f"fast steps {rows['fast']['steps']}")
check(abs(rows["fast"]["mean"] - 200) < 1e-9 and abs(rows["fast"]["std"] - 141.42135623730951) < 1e-9,
      f"fast mean/std {rows['fast']['mean']} {rows['fast']['std']}")
check(abs(rows["fast"]["share_of_target_steps"] - 0.2) < 1e-12, "share of the target's steps")
check(rows["slow"]["steps"] == [None] and rows["slow"]["never"] == 1 and rows["slow"]["mean"] is None, "never reached")
check(rows["resumed"]["steps"] == [300.0], f"resumed run: the last row of a step wins {rows['resumed']['steps']}")
# ref: 6.0 -> 4.0 never reaches 3.5; 5.0 -> 3.0 reaches it at 500 + 500 * 1.5 / 2 = 875
check(rows["ref"]["steps"] == [None, 875.0], f"ref steps {rows['ref']['steps']}")
check("| fast | 300, 100 | 200 ± 141 | 20% | 0 |" in p.stdout, f"table row {p.stdout}")
check("| slow | never | n/a | n/a | 1 |" in p.stdout, "table row of a run that never reached it")

p = tool_run(["--target", "2.5", os.path.join(fast1, "metrics.jsonl")], 0, "| metrics.jsonl | 400 | 400 | n/a | 0 |",
             "--target, a metrics.jsonl file")

# Bad input.
tool_run(["--target", "1", os.path.join(work, "nothing")], 1, "nothing: no metrics.jsonl", "missing run")
empty = run_dir("empty", [])
tool_run(["--target", "1", empty], 1, "no validation rows (valid_loss)", "no validation rows")
broken = run_dir("broken", [(100, 3.0)], ["{not json"])
tool_run(["--target", "1", broken], 1, "metrics.jsonl:3: not a JSON row", "broken line named")
tool_run(["--target-from", "zz", f"{ref1}=ref"], 1, "--target-from zz: no run has that label (labels: ref)", "unknown label")
tool_run(["--target", "1", ref1, "--json", os.path.join(work, "nowhere", "x.json")], 1, "cannot write it",
         "an unwritable --json")
# --at: ref's means at 500 and 1000 are (6+5)/2 and (4+3)/2; finals 4.0 and 3.0 -> 3.500 ± 0.707.
out_at = os.path.join(work, "at.json")
p = tool_run(["--at", "500,1000", f"{ref1}=ref", f"{ref2}=ref", "--json", out_at], 0,
             "| ref | 5.50 | 3.50 | 3.500 ± 0.707 | 4.0000, 3.0000 |", "--at alone")
check("target validation loss" not in p.stdout, "--at alone prints no target table")
at = json.load(open(out_at))
check("target" not in at and at["at"][0]["mean_loss"] == [5.5, 3.5] and at["at"][0]["final_losses"] == [4.0, 3.0],
      f"--at json {at}")
# beside a target, and a one-run label (no std); the resumed run's step 400 is its last row (3.0)
p = tool_run(["--target", "3.5", "--at", "200,400", f"{resumed}=resumed"], 0, "| resumed | 4.00 | 3.00 | 3.000 | 3.0000 |",
             "--at beside --target")
check("target validation loss 3.5000" in p.stdout, "--at beside --target keeps the target table")
# a run that ended before the others says so: fast2's last validation is at 200, fast1's at 600
tool_run(["--at", "200", f"{fast1}=fast", f"{fast2}=fast"], 0, "| fast | 3.75 | 2.500 ± 0.707 | 2.0000, 3.0000 (step 200) |",
         "--at, a run that ended earlier")
tool_run(["--at", "500,700", f"{ref1}=ref"], 1, "--at 700: " + ref1 + " has no validation at step 700 (its validations: 500 .. 1000)",
         "--at a step without a validation")
tool_run(["--at", "5x0", ref1], 2, "--at 5x0: expected comma-separated whole steps", "--at not steps")
tool_run(["--at", "-5", ref1], 2, "--at -5: expected comma-separated whole steps", "--at a negative step")

tool_run([ref1], 2, "one of the arguments --target --target-from --at is required", "no target")
tool_run(["--target", "1", "--target-from", "ref", ref1], 2, "not allowed with argument", "both targets")

print("ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
