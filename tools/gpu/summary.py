#!/usr/bin/python3
"""The side-by-side table of a tools/gpu/gpu_check.sh run: each stage's result, the engine's bf16
step beside PyTorch + HF BERT (eager, masked-only head, torch.compile) on the same GPU, and, where
ncu ran, every op family's measured kernel time beside the performance model's prediction.
usage: summary.py OUT_DIR"""
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import perf_model as pm  # noqa: E402


def engine_steps(path):
    """'== bert_base_tupe_r' then 'timing: 11 steps 95.489 ms/step' -> {name: ms}."""
    out, name = {}, None
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        if line.startswith("== "):
            name = line[3:].strip()
        m = re.search(r"timing: \d+ steps ([\d.]+) ms/step", line)
        if m and name:
            out[name] = float(m.group(1))
    return out


def hf_steps(path):
    out = {}
    for line in open(path, errors="replace") if os.path.exists(path) else []:
        if line.startswith("HF "):
            r = json.loads(line[3:])
            if "ms" in r:
                out[(r["size"], r["variant"])] = r["ms"]
    return out


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: summary.py OUT_DIR")
    out = sys.argv[1]
    print("## gpu_check\n")
    print("| stage | result | seconds |")
    print("|---|---|---|")
    for line in open(os.path.join(out, "status.txt")) if os.path.exists(os.path.join(out, "status.txt")) else []:
        f = line.split()
        if len(f) == 3 and f[0] != "done":
            res = {"0": "passed", "skipped": "skipped", "124": "TIMED OUT", "137": "TIMED OUT",
                   "no_time": "not run (GPU_CHECK_BUDGET spent)"}.get(f[1], f"FAILED ({f[1]})")
            print(f"| {f[0]} | {res} | {f[2]} |")
    eng, hf = engine_steps(os.path.join(out, "steps.log")), hf_steps(os.path.join(out, "hf.log"))
    fit = pm.load_fit()
    print("\n## One bf16 training step, batch 32, dropout on (ms; sequences/s in brackets)\n")
    print("| model | engine TUPE-R | TUPE-R, graph | engine BERT-A | BERT-A, graph | PyTorch eager "
          "| eager, masked head | torch.compile | best PyTorch / best engine TUPE-R | "
          "best engine TUPE-R / BERT-A |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size, seq in (("base", 128), ("large", 512)):
        t, a = eng.get(f"bert_{size}_tupe_r"), eng.get(f"bert_{size}_bert_a")
        tg, ag = eng.get(f"bert_{size}_tupe_r graph"), eng.get(f"bert_{size}_bert_a graph")
        full, masked, comp = hf.get((size, "full")), hf.get((size, "masked")), hf.get((size, "compiled"))
        cell = lambda ms: f"{ms:.1f} ({32000 / ms:,.0f})" if ms else "-"  # noqa: E731
        best = lambda *v: min([x for x in v if x], default=None)  # noqa: E731
        bt, ba, bp = best(t, tg), best(a, ag), best(full, comp)
        vs_torch = f"{bp / bt:.2f}x" if bt and bp else "-"
        vs_bert_a = f"{bt / ba:.3f}" if bt and ba else "-"
        print(f"| BERT-{size.capitalize()} s{seq} | {cell(t)} | {cell(tg)} | {cell(a)} | {cell(ag)} "
              f"| {cell(full)} | {cell(masked)} | {cell(comp)} | {vs_torch} | {vs_bert_a} |")
    if eng.get("bert_base_learned_rpe graph"):
        print(f"\nBERT-Base s128 learned_rpe (Shaw), graph: {eng['bert_base_learned_rpe graph']:.2f} ms")
    for size in ("base", "large"):  # the two-kernel dQ / dbias backward beside the cluster kernel
        off, on = eng.get(f"bert_{size}_tupe_r graph clusters off"), eng.get(f"bert_{size}_tupe_r graph")
        if off and on:
            print(f"\nBERT-{size.capitalize()} TUPE-R, graph: {on:.2f} ms with the cluster kernel, "
                  f"{off:.2f} ms without (ENGINE_ATTENTION_CLUSTERS=off)")
    mdl = pm.Model(fit)
    for size in ("base", "large"):
        ncu = os.path.join(out, f"ncu_{size}.csv.xz")
        rec_path = os.path.join(out, f"record_{size}.csv")
        if not (os.path.exists(ncu) and os.path.exists(rec_path)):
            continue
        record = pm.read_record(rec_path)
        aligned = pm.align_tail(record, pm.read_ncu_raw(ncu))
        if aligned is None:
            print(f"\n(ncu {size}: the record and the kernels did not align)")
            continue
        meas, pred, gemm = collections.defaultdict(float), collections.defaultdict(float), 0.0
        for r in aligned:
            ls = r["launch_list"]
            meas[r["op"]] += sum(l["ns"] for l in ls)
            gemm += sum(l["ns"] for l in ls if l["kernel"] == "cublasLtMatmul")
            r2 = dict(r, launch_list=[dict(l) for l in ls])
            pred[r["op"]] += mdl.op_ns(r2, "cold")
        total = sum(meas.values())
        print(f"\n## ncu, BERT-{size.capitalize()} TUPE-R, one step: kernels {total / 1e6:.2f} ms "
              f"(model {sum(pred.values()) / 1e6:.2f}); GEMMs {gemm / 1e6:.2f} ms, the rest "
              f"{(total - gemm) / 1e6:.2f} ms ({(total - gemm) / max(gemm, 1):.2f}x the GEMMs)\n")
        print("| op family | measured (ms) | model (ms) | model / measured |")
        print("|---|---|---|---|")
        for fam in sorted(meas, key=lambda k: -meas[k])[:16]:
            print(f"| {fam} | {meas[fam] / 1e6:.3f} | {pred[fam] / 1e6:.3f} | "
                  f"{pred[fam] / meas[fam] if meas[fam] else 0:.2f} |")


if __name__ == "__main__":
    main()
