#!/usr/bin/env python3
"""A failing rank ends the whole MPI job, quickly, with a message naming it.

  check_failures.py MPIRUN DIST_TESTS

1. Rank 1 throws while rank 0 waits in a barrier: engine::fail_job prints "[rank 1/2]" and
   MPI_Abort ends both; the job must exit non-zero within 60 s.
2. Rank 1 stalls (alive, not taking part) while rank 0 waits: rank 0's watchdog ends the job after
   ENGINE_COMM_TIMEOUT_S (3 s here), naming the rank and the collective.
"""
import os
import subprocess
import sys
import time


def run(cmd, env, limit):
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        sys.exit(f"FAIL: {' '.join(cmd)} still running after {limit} s (a hang)")
    return p.returncode, p.stdout + p.stderr, time.monotonic() - start


def main():
    mpirun, dist_tests = sys.argv[1], sys.argv[2]
    failures = []
    cases = [  # mode, extra environment, what the output must contain
        ("--throw-on-rank", {}, "dist_tests: [rank 1/2] deliberate failure for the test"),
        ("--stall-on-rank", {"ENGINE_COMM_TIMEOUT_S": "3"}, "[rank 0/2] barrier has waited"),
    ]
    for mode, extra, expected in cases:
        rc, out, took = run([mpirun, "-np", "2", dist_tests, mode, "1"], dict(os.environ, **extra), 90)
        print(f"{mode} 1: exit {rc} after {took:.1f} s")
        if rc == 0:
            failures.append(f"{mode}: the job must end non-zero")
        if took >= 60:
            failures.append(f"{mode}: the job took {took:.0f} s to end (limit 60 s)")
        if expected not in out:
            failures.append(f"{mode}: the output must contain '{expected}':\n" + out[-2000:])

    if failures:
        print("FAIL:\n- " + "\n- ".join(failures))
        sys.exit(1)
    print("ok: both failures ended the job with a message naming the rank")


if __name__ == "__main__":
    main()
