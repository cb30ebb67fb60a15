#!/usr/bin/python3
"""bench/thread_scaling.py end to end on a short run: the profiler (omp_regions.so) loads, every
region is accounted (the 1-thread step = time outside regions + the regions' time, within a
quarter), the model's GEMMs show as regions on both thread counts, and bad input is refused.

usage: check_thread_scaling.py PRETRAIN_APP OMP_REGIONS_SO WORKDIR
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "thread_scaling.py")


def main():
    app, preload, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    failures = []
    p = subprocess.run([sys.executable, TOOL, "--app", app, "--preload", preload, "--steps", "2",
                        "--rounds", "1", "--top", "40", "--workdir", workdir],
                       capture_output=True, text=True)
    out = p.stdout + p.stderr
    print(out)
    if p.returncode != 0:
        failures.append(f"exit {p.returncode}")
    rows = {int(m.group(1)): [float(x) for x in m.group(2).split()]
            for m in re.finditer(r"^\s+(\d+)((?:\s+-?\d+\.\d+){5})\s*$", out, re.M)}
    if sorted(rows) != [1, 2]:
        failures.append(f"summary rows for threads {sorted(rows)}, expected [1, 2]")
    else:
        step, outside, regions, wait, fewer = rows[1]
        if not (0.75 * step <= outside + regions <= 1.25 * step):
            failures.append(f"1 thread: outside {outside} + regions {regions} ms is not the step "
                            f"{step} ms within a quarter")
        if regions <= 0 or wait < 0 or rows[2][3] < 0:
            failures.append(f"regions {regions} ms, waits {wait} / {rows[2][3]}: expected > 0, >= 0")
    gemm = re.search(r"^\s*\d+\s+(\d+\.\d+)\s+(\d+\.\d+)\s.*gemm_typed<float", out, re.M)
    if not gemm or float(gemm.group(1)) <= 0 or float(gemm.group(2)) <= 0:
        failures.append("no gemm_typed<float, ...> row with time at 1 and 2 threads")
    if "speed-up 2 threads over 1:" not in out:
        failures.append("no speed-up line")

    # Bad input: one clear error naming the option.
    for args, expect in ((["--preload", os.path.join(workdir, "missing.so")], "--preload"),
                         (["--threads", "1"], "--threads"), (["--steps", "0"], "--steps")):
        q = subprocess.run([sys.executable, TOOL, "--app", app, "--preload", preload] + args,
                           capture_output=True, text=True)
        if q.returncode != 2 or expect not in q.stderr or "Traceback" in q.stderr:
            failures.append(f"{args}: exit {q.returncode}, stderr {q.stderr.strip()!r}")
    # A profile file the profiler did not write: the file and line named.
    bad = os.path.join(workdir, "bad_profile.txt")
    with open(bad, "w") as f:
        f.write("outermost 3\nspan 1.0\noutside 0.5\nregion x\n")
    q = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(TOOL)!r});"
                        f"import thread_scaling; thread_scaling.read_profile({bad!r})"],
                       capture_output=True, text=True)
    if q.returncode == 0 or f"{bad}:4:" not in q.stderr:
        failures.append(f"damaged profile: exit {q.returncode}, stderr {q.stderr.strip()!r}")

    for f in failures:
        print("FAIL:", f)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
