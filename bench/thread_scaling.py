#!/usr/bin/python3
"""Where a training step's threads go: the step at 1 and at N OpenMP threads, split by parallel
region. Runs pretrain_app (single-batch mode, the model and batch of bench/bench_step.py) under
build/lib/omp_regions.so (bench/omp_regions.cpp, LD_PRELOAD), which times every parallel region
the main thread starts and how long each team thread spent in its body. A run of 1 step counts
the regions of the set-up and the warm-up step; a run of 1 + --steps steps skips that many and
records the rest, so the figures are per timed step.

Prints, per thread count: the step (the app's --time), the time outside any region (the main
thread alone), the regions' wall time, the threads' wait at the regions' ends (the time a team
thread had finished its share and waited for the slowest: load imbalance, or a vCPU that ran
slower), and regions that ran on fewer threads than asked. Then the regions by their cost: calls
a step, wall ms a step at each thread count, their speed-up, and the wait. Last, the speed-up the
step would have if the waits vanished, and if the time outside regions also ran on all threads:
what remains is the regions' own scaling (the cores' shared memory bandwidth and clock).

usage: /usr/bin/python3 bench/thread_scaling.py [--model tiny|base] [--threads 2] [--steps 20]
           [--rounds 3] [--top 25] [--app build/bin/pretrain_app] [--preload LIB] [--workdir DIR]
"""
import argparse
import bisect
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))

import bench_step  # noqa: E402  (the model and batch, so both tools time the same step)


def read_profile(path):
    """-> (outermost regions, span s, outside s, {(lib, offset): (calls, wall, team, busy)})"""
    span = outside = outermost = None
    regions = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            p = line.split()
            if p[:1] == ["outermost"] and len(p) == 2:
                outermost = int(p[1])
            elif p[:1] == ["span"] and len(p) == 2:
                span = float(p[1])
            elif p[:1] == ["outside"] and len(p) == 2:
                outside = float(p[1])
            elif p[:1] == ["region"] and len(p) == 7:
                regions[(p[1], int(p[2], 16))] = (int(p[3]), float(p[4]), float(p[5]), float(p[6]))
            else:
                raise SystemExit(f"{path}:{n}: unexpected line {line.strip()!r} (expected "
                                 "outermost, span, outside or region <lib> <offset> <4 figures>)")
    if span is None or outside is None or outermost is None:
        raise SystemExit(f"{path}: no outermost/span/outside lines: the profiler did not run "
                         "(LD_PRELOAD?)")
    return outermost, span, outside, regions


def run_once(args, env, threads, steps, skip, w, out):
    env = dict(env, OMP_NUM_THREADS=str(threads), LD_PRELOAD=args.preload, OMP_REGIONS_OUT=out,
               OMP_REGIONS_SKIP=str(skip))
    cmd = [args.app, "--config", w("yaml"), "--init", w("init.safetensors"), "--batch-file",
           w("batch.safetensors"), "--steps", str(steps), "--dropout"] + (["--time"] if steps > 1 else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    m = re.search(r"^timing: (\d+) steps (\S+) ms/step", p.stdout + p.stderr, re.M)
    return (float(m.group(2)) if m else None), read_profile(out)


def per_step(args, env, threads, w):
    """One measurement at `threads`: (step ms, outside ms, {region: (calls, wall, team, busy)}),
    each a timed step's worth (the set-up's and the warm-up step's regions skipped)."""
    out = w(f"regions.{threads}.txt")
    _, (warm, _, _, _) = run_once(args, env, threads, 1, 0, w, out)
    step_ms, (_, _, outside, reg) = run_once(args, env, threads, args.steps + 1, warm, w, out)
    n = args.steps
    each = {key: (c / n, wall * 1e3 / n, team * 1e3 / n, busy * 1e3 / n)
            for key, (c, wall, team, busy) in reg.items()}
    return step_ms, outside * 1e3 / n, each


class Symbols:
    """Offsets in a library -> the enclosing function's demangled name (nm)."""

    def __init__(self):
        self.tables = {}

    def name(self, lib, offset):
        if lib not in self.tables:
            rows = []
            try:
                text = subprocess.run(["nm", "-C", "--defined-only", lib], capture_output=True,
                                      text=True).stdout
            except OSError:
                text = ""
            for line in text.splitlines():
                p = line.split(" ", 2)
                if len(p) == 3 and p[1] in "tTwW":
                    rows.append((int(p[0], 16), p[2]))
            rows.sort()
            self.tables[lib] = ([a for a, _ in rows], [s for _, s in rows])
        addrs, names = self.tables[lib]
        i = bisect.bisect_right(addrs, offset) - 1
        if i < 0:
            return f"{os.path.basename(lib)}+{offset:#x}"
        return re.sub(r"\s*\[clone \._omp_fn\.\d+\]$", "", names[i])


def short(sym):
    """A readable name for the function a region was outlined from: no argument lists, no
    lambdas; a lambda passed as a template argument shows as the function it is in
    (over_batch_entries<attention>, strided_for_parallel<2, CpuBackend::copy>)."""
    sym = sym.replace("(anonymous namespace)::", "").replace("engine::", "").replace("cpu::", "")
    sym = re.sub(r"^(void|auto) ", "", sym)
    prev = None
    while prev != sym:  # argument lists, innermost first
        prev = sym
        sym = re.sub(r"\([^()]*\)", "", sym)
    sym = re.sub(r"::\{lambda#\d+\}", "", sym)
    sym = re.sub(r"::operator(<[^<>]*>)?", "", sym)
    sym = re.sub(r"\s*\bconst\b", "", sym)
    prev = None
    while prev != sym:  # a template argument list that repeats its function's own: dropped
        prev = sym
        sym = re.sub(r"<([^<>]*)>(<[^<>]*>)+$", r"<\1>", sym)
    sym = re.sub(r"\b(\w+)<\1>", r"\1", sym)
    return re.sub(r"\s+", " ", sym).strip()[:72]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=sorted(bench_step.MODELS))
    ap.add_argument("--threads", type=int, default=2, help="compared with 1 thread")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating 1-thread and N-thread measurements; medians are printed")
    ap.add_argument("--top", type=int, default=25, help="regions listed")
    ap.add_argument("--base-batch", type=int, default=8)
    ap.add_argument("--app", default=os.path.join(ROOT, "build", "bin", "pretrain_app"))
    ap.add_argument("--preload", help="the profiler (default: <app>/../../lib/omp_regions.so)")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    if args.threads < 2:
        ap.error("--threads: expected 2 or more (compared with 1)")
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds: expected 1 or more")
    if not os.access(args.app, os.X_OK):
        ap.error(f"--app {args.app}: not an executable (build first: tools/setup.sh)")
    if args.preload is None:
        args.preload = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.app))),
                                    "lib", "omp_regions.so")
    if not os.path.isfile(args.preload):
        ap.error(f"--preload {args.preload}: no such file (build the omp_regions target)")

    workdir = args.workdir or tempfile.mkdtemp(prefix="thread_scaling.")
    os.makedirs(workdir, exist_ok=True)
    w = lambda name: os.path.join(workdir, f"{args.model}.{name}")  # noqa: E731
    batch = args.base_batch if args.model == "base" else bench_step.MODELS[args.model][6]
    bench_step.write_config(w("yaml"), args.model)
    bench_step.write_batch(w("batch.safetensors"), args.model, batch)
    env = dict(os.environ)
    env.setdefault("GOMP_SPINCOUNT", "10000")  # what the apps set when nothing is (apps/cli.cpp)
    subprocess.run([args.app, "--config", w("yaml"), "--batch-file", w("batch.safetensors"),
                    "--steps", "0", "--save", w("init.safetensors")],
                   check=True, stdout=subprocess.DEVNULL, env=env)

    counts = [1, args.threads]
    runs = {t: [] for t in counts}
    for _ in range(args.rounds):
        for t in counts:
            runs[t].append(per_step(args, env, t, w))

    def med(xs):
        return statistics.median(xs) if xs else 0.0

    # A function's region bodies (outlined #0, #1, ...) are one row: which of them runs depends
    # on the thread count (gemm_typed splits a product over the threads only when there are 2).
    syms = Symbols()
    summary = {}
    regions = {t: collections.defaultdict(list) for t in counts}
    for t in counts:
        for step_ms, outside, reg in runs[t]:
            by_fn = {}
            for key, (calls, wall, team, busy) in reg.items():
                c0, w0, t0, b0 = by_fn.get(syms.name(*key), (0, 0.0, 0.0, 0.0))
                by_fn[syms.name(*key)] = (max(c0, calls), w0 + wall, t0 + team, b0 + busy)
            for name, v in by_fn.items():
                regions[t][name].append(v)
        steps = [r[0] for r in runs[t] if r[0] is not None]
        walls = [sum(v[1] for v in r[2].values()) for r in runs[t]]
        waits = [sum(v[2] - v[3] for v in r[2].values()) for r in runs[t]]
        fewer = [sum(v[1] for v in r[2].values() if t > 1 and v[2] < (t - 0.5) * v[1])
                 for r in runs[t]]
        summary[t] = dict(step=med(steps), outside=med([r[1] for r in runs[t]]),
                          wall=med(walls), wait=med(waits), fewer=med(fewer))

    N = args.threads
    print(f"{args.model} model, batch {batch} x 128, {args.steps} timed steps, "
          f"{args.rounds} rounds (medians), f32, dropout 0.1; workdir {workdir}")
    print(f"{'threads':>8} {'step ms':>9} {'outside':>9} {'regions':>9} {'wait':>9} "
          f"{'on fewer':>9}   (ms a step; wait: thread-ms at regions' ends)")
    for t in counts:
        s = summary[t]
        print(f"{t:>8} {s['step']:9.1f} {s['outside']:9.1f} {s['wall']:9.1f} {s['wait']:9.1f} "
              f"{s['fewer']:9.1f}")

    rows = []
    for key in set(regions[1]) | set(regions[N]):
        a, b = regions[1].get(key, []), regions[N].get(key, [])
        calls = med([v[0] for v in (b or a)])
        w1, wn = med([v[1] for v in a]), med([v[1] for v in b])
        wait = med([v[2] - v[3] for v in b])
        rows.append((calls, w1, wn, wait, short(key)))
    rows.sort(key=lambda r: -r[1])
    print(f"\n{'calls':>6} {'1T ms':>8} {f'{N}T ms':>8} {'x':>6} {'wait':>7}  function the region is in")
    for calls, w1, wn, wait, name in rows[:args.top]:
        x = f"{w1 / wn:6.2f}" if wn > 0 else "     -"
        print(f"{calls:6.0f} {w1:8.2f} {wn:8.2f} {x} {wait:7.2f}  {name}")
    rest = rows[args.top:]
    if rest:
        print(f"{'':6} {sum(r[1] for r in rest):8.2f} {sum(r[2] for r in rest):8.2f} {'':6} "
              f"{sum(r[3] for r in rest):7.2f}  ({len(rest)} more regions)")

    s1, sn = summary[1], summary[N]
    pairs = [(a[0], b[0]) for a, b in zip(runs[1], runs[N]) if a[0] and b[0]]
    if len(pairs) > 1:
        print(f"\nrounds' speed-ups ({N} threads over 1, each round's own pair): "
              + " ".join(f"{a / b:.2f}x" for a, b in pairs))
    if s1["step"] and sn["step"]:
        no_wait = sn["step"] - sn["wait"] / N
        all_threads = no_wait - sn["outside"] * (1 - 1 / N) - sn["fewer"] * (1 - 1 / N)
        print(f"\nspeed-up {N} threads over 1: {s1['step'] / sn['step']:.2f}x measured; "
              f"{s1['step'] / no_wait:.2f}x if no thread waited at a region's end; "
              f"{s1['step'] / all_threads:.2f}x if the time outside regions (and in regions on "
              f"fewer threads) also ran on {N}; regions alone: {s1['wall'] / sn['wall']:.2f}x "
              f"(their {N}-thread wall time includes the wait)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
