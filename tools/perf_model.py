#!/usr/bin/python3
"""The GPU performance model: a step record of apps/record_step (CSV) -> predicted per-op and
per-step time on one H100 SXM, sequences/s and MFU. A MODEL, not a measurement (no GPU exists on
this project's machines): every op takes

    max(bytes / HBM bandwidth, flops / GEMM rate) + launches x launch cost

run back to back on one stream (no overlap between ops), with

    HBM bandwidth      3.35 TB/s   (H100 SXM, the spec sheet; achievable is ~90% of it)
    GEMM rate, bf16/f16 0.8 x 989 TFLOP/s = 791 TFLOP/s (a large bf16 GEMM measured 790-800)
    GEMM rate, f32      0.8 x 67 TFLOP/s (CUDA-core FMA; cuBLASLt COMPUTE_32F without TF32)
    launch cost        2 us per kernel or library GEMM (launch + ramp + tail, no CUDA graph)

usage: perf_model.py STEP.csv --batch B [--label NAME] [--top N]
"""
import argparse
import collections
import csv

BW = 3.35e12
PEAK = 989e12
GEMM_16 = 0.8 * PEAK
GEMM_32 = 0.8 * 67e12
LAUNCH = 2e-6


def op_time(r):
    bytes_, flops = float(r["bytes"]), float(r["flops"])
    rate = GEMM_32 if (flops and " f32" in r["shape"] and "bf16" not in r["shape"]
                       and "f16" not in r["shape"]) else GEMM_16
    t_mem = bytes_ / BW
    t_flop = flops / rate if flops else 0.0
    launches = int(r["launches"]) + int(r["gemms"])
    return max(t_mem, t_flop), launches * LAUNCH, t_mem, t_flop


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    by_op = collections.OrderedDict()
    total = {"work": 0.0, "launch": 0.0, "flops": 0.0, "bytes": 0.0, "launches": 0, "mem_bound": 0.0,
             "gemm": 0.0}
    for r in rows:
        work, launch, t_mem, t_flop = op_time(r)
        g = by_op.setdefault(r["op"], {"calls": 0, "work": 0.0, "launch": 0.0, "bytes": 0.0, "flops": 0.0,
                                       "launches": 0})
        g["calls"] += 1
        g["work"] += work
        g["launch"] += launch
        g["bytes"] += float(r["bytes"])
        g["flops"] += float(r["flops"])
        g["launches"] += int(r["launches"]) + int(r["gemms"])
        total["work"] += work
        total["launch"] += launch
        total["flops"] += float(r["flops"])
        total["bytes"] += float(r["bytes"])
        total["launches"] += int(r["launches"]) + int(r["gemms"])
        if float(r["flops"]) > 0:
            total["gemm"] += work
        else:
            total["mem_bound"] += work
    step = total["work"] + total["launch"]
    seqs = a.batch / step
    mfu = total["flops"] / step / PEAK
    print(f"### {a.label}\n")
    print(f"| predicted step | sequences/s | MFU | GEMM TFLOP | min. bytes | kernels + GEMMs |")
    print("|---|---|---|---|---|---|")
    print(f"| {step * 1e3:.2f} ms | {seqs:,.0f} | {100 * mfu:.1f}% | {total['flops'] / 1e12:.2f} | "
          f"{total['bytes'] / 1e9:.2f} GB | {total['launches']:,} |\n")
    print(f"Where the time goes: GEMMs {100 * total['gemm'] / step:.1f}%, bandwidth-bound ops "
          f"{100 * total['mem_bound'] / step:.1f}%, launch cost {100 * total['launch'] / step:.1f}%.\n")
    if a.top == 0:
        return
    print("| op | calls | launches | time (ms) | share | GB | TFLOP |")
    print("|---|---|---|---|---|---|---|")
    ranked = sorted(by_op.items(), key=lambda kv: -(kv[1]["work"] + kv[1]["launch"]))
    for name, g in ranked[: a.top]:
        t = g["work"] + g["launch"]
        print(f"| {name} | {g['calls']} | {g['launches']} | {t * 1e3:.3f} | {100 * t / step:.1f}% | "
              f"{g['bytes'] / 1e9:.2f} | {g['flops'] / 1e12:.3f} |")
    rest = ranked[a.top:]
    if rest:
        t = sum(g["work"] + g["launch"] for _, g in rest)
        print(f"| (the other {len(rest)} ops) | | | {t * 1e3:.3f} | {100 * t / step:.1f}% | | |")
    print()


if __name__ == "__main__":
    main()
