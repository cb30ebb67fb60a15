#!/usr/bin/python3
"""bench/bench_step.py and bench/bench_cpu.py refuse bad options before they run anything: one
line naming the option and what was expected, exit status 2, no traceback (standard library only:
the refusals come before PyTorch or a binary is needed).

usage: check_bench_options.py
"""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from checks import check, finish  # noqa: E402

bench = os.path.join(here, "..", "..", "bench")


def refused(tool, args, want):
    p = subprocess.run([sys.executable, os.path.join(bench, tool)] + args, capture_output=True,
                       text=True, timeout=120)
    out = p.stdout + p.stderr
    check(p.returncode == 2 and want in out and "Traceback" not in out,
          f"{tool} {' '.join(args)}: refused naming {want!r}", f"exit {p.returncode}\n{out}")


for opt in ("--rounds", "--threads", "--tiny-steps", "--base-steps", "--base-batch"):
    refused("bench_step.py", [opt, "0"], f"{opt}: expected 1 or more, got 0")
refused("bench_step.py", ["--models", "tiny,huge"], "--models: unknown model 'huge'")
refused("bench_step.py", ["--app", "/nonexistent/pretrain_app"], "--app /nonexistent/pretrain_app")
refused("bench_cpu.py", ["--rounds", "0"], "--threads and --rounds: expected 1 or more")
refused("bench_cpu.py", ["--threads", "-1"], "--threads and --rounds: expected 1 or more")
finish("bench_options")
