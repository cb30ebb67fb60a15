#!/usr/bin/python3
"""Checks poscorr_app's dumps against the PyTorch reference, preset by preset.

For each preset: a tiny checkpoint (pretrain_app, a few steps on a random batch so the weights
are not at their initial values), then `poscorr_app --checkpoint ... --probe-ids ...`; then

  - every .npy opens with numpy.load, with the documented shape;
  - its values equal the reference's (bert_reference.Reference): TUPE's term after the [CLS]
    reset, the T5 bias per offset, P P^T, the first layer's (p W^Q)(p W^K) / sqrt(d_h), bert_a_d's
    (p U^Q)(p U^K) / sqrt(4 d_h), Shaw's a_r . a_s, and the identical-word probe (the reference's
    first-layer logits for the same token ids, averaged);
  - summary.json's properties and patterns equal an independent numpy implementation of the
    definitions in docs/poscorr.md.

Exit 0 when all agree, 1 otherwise, 77 without PyTorch/numpy (the test is then skipped).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: the PyTorch reference needs python3-torch and python3-numpy ({e}); tools/test.sh installs them")
    sys.exit(77)

import bert_reference as ref  # noqa: E402
import check_model  # noqa: E402  (its config and batch writers)
import safetensors_io as st  # noqa: E402

CASES = ["tupe_a", "tupe_r", "tupe_r:code", "tupe_a_tie_cls", "bert_a", "bert_r:pre_ln", "bert_a_d", "sin_ape",
         "learned_rpe", "learnable_sin_rpe", "bert_a+learned_rpe", "no_pe", "rope", "alibi"]
T = 24
PROBE = [5, 17, 42, 99]


# ---- the definitions of docs/poscorr.md, written again with numpy ------------------------------
def offsets_of(n):
    i = np.arange(n)
    return i[None, :] - i[:, None]  # r = j - i


def properties(m, first):
    s = m[first:, first:].astype(np.float64)
    n = s.shape[0]
    r = offsets_of(n)
    diag = {k: s[r == k].mean() for k in range(-(n - 1), n)}
    f = np.vectorize(diag.get)(r)
    c = s - s.mean()
    total = (c ** 2).sum()
    flat = total <= 1e-20 * max(1.0, abs(s.mean())) ** 2 * n * n
    ti = 1.0 if flat else min(max(1 - ((s - f) ** 2).sum() / total, 0.0), 1.0)
    sym = 1.0 if flat else min(max((((c + c.T) / 2) ** 2).sum() / total, 0.0), 1.0)
    peak = 0
    for k in (-1, 1):
        if abs(k) < n and diag[k] > diag[peak]:
            peak = k
    hi = lo = peak
    while hi + 1 < n and diag[hi + 1] < diag[hi]:
        hi += 1
    while lo - 1 > -n and diag[lo - 1] < diag[lo]:
        lo -= 1
    return {"translation_invariance": ti, "symmetry": sym, "profile_peak_offset": peak,
            "monotonic_window_forward": max(hi, 0), "monotonic_window_backward": max(-lo, 0),
            "min": s.min(), "max": s.max()}


def pattern(m, first):
    s = m[first:, first:].astype(np.float64)
    n = s.shape[0]
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ent = (-(p * np.log(np.where(p > 0, p, 1))).sum(1) / math.log(n)).mean() if n > 1 else 1.0
    r = offsets_of(n)
    local = (p * (np.abs(r) <= 2)).sum(1).mean()
    best, peak = -1.0, 0
    for k in range(-(n - 1), n):
        if 2 * abs(k) >= max(n, 2):
            continue
        a = p[r == k].mean()
        if a > best + 1e-12:
            best, peak = a, k
    name = ("global" if ent >= 0.9 else "previous" if peak == -1 else "next" if peak == 1
            else "local" if local >= 0.5 else "broad")
    return {"pattern": name, "pattern_entropy": ent, "pattern_peak_offset": peak, "pattern_local_mass": local}


def toeplitz(row):
    n = (len(row) + 1) // 2
    return row[offsets_of(n) + n - 1]


# ---- one preset -------------------------------------------------------------------------------
def check_case(case, args, errors):
    preset, _, extra = case.partition(":")
    work = os.path.join(args.workdir, case.replace("+", "_plus_").replace(":", "_"))
    os.makedirs(work, exist_ok=True)
    w = lambda name: os.path.join(work, name)  # noqa: E731
    cfg_args = types.SimpleNamespace(seed=7, vocab=120, width=32, layers=2, heads=4, type_vocab=2,
                                     pre_ln=extra == "pre_ln", cls_reset="code" if extra == "code" else "paper",
                                     lr=3e-2, seq=T)
    check_model.write_config(w("config.yaml"), preset, cfg_args)
    check_model.write_batch(w("batch.safetensors"), cfg_args)
    check_model.run([args.pretrain_app, "--config", w("config.yaml"), "--batch-file", w("batch.safetensors"),
                     "--steps", "3", "--save", w("model.safetensors")])
    out = check_model.run([args.poscorr_app, "--checkpoint", w("model.safetensors"), "--out", w("dump"),
                           "--max-positions", str(T), "--probe-ids", ",".join(map(str, PROBE))])
    params, meta = st.read(w("model.safetensors"))
    cfg = json.loads(meta["engine.model_config"])
    R = ref.Reference(cfg, {k: v for k, v in params.items() if k.startswith("bert.")})
    H, d = cfg["num_heads"], cfg["hidden_size"]
    dh = d // H
    P = R.P
    with torch.no_grad():
        want = {"probe_logits": R.first_layer_logits(torch.tensor([[i] * T for i in PROBE])).mean(0)}
        if R.absolute == "untied":
            want["tupe_term"] = R._untied(T)
        if R.relative == "t5":
            nb, md = cfg["position"]["relative_buckets"], cfg["position"]["relative_max_distance"]
            idx = torch.tensor([ref.t5_bucket(r, nb, md) for r in range(-(T - 1), T)])
            want["relative_bias"] = P["bert.position.relative_table"][idx].t()
        pos = None
        if R.input == "learned" or R.absolute == "decomposed":
            pos = P["bert.position.table"][:T]
        elif R.input == "sin":
            pos = ref.sinusoid(torch.arange(T, dtype=torch.float32), ref.freqs_for(d))
        if pos is not None:
            want["ape_dot"] = pos @ pos.t()
        if R.input != "none":
            wq = P["bert.encoder.layer.0.attention.qkv.weight"][:d]
            wk = P["bert.encoder.layer.0.attention.qkv.weight"][d:2 * d]
            want["ape_qk"] = R._heads(pos @ wq.t()) @ R._heads(pos @ wk.t()).transpose(1, 2) / math.sqrt(dh)
        if R.absolute == "decomposed":
            pq = R._heads(ref.linear(pos, P, "bert.position.query"))
            pk = R._heads(ref.linear(pos, P, "bert.position.key"))
            want["decomposed_term"] = pq @ pk.transpose(1, 2) / math.sqrt(4 * dh)
        if R.relative.startswith("shaw"):
            a = R._shaw_table()
            want["rpe_dot"] = a @ a.t()
        if R.relative == "alibi":
            want["alibi_bias"] = R.positional(T)[0]
        if R.relative == "rope":  # mean over pairs of cos((j - i) theta_k), from the rotation itself
            e = torch.zeros(T, dh // 2, 2, dtype=torch.float64)
            e[..., 0] = 1.0  # the unit vector (1, 0) in every pair, at every position
            r = ref.rope(e.reshape(T, dh))
            want["rope_decay"] = r @ r.t() / (dh // 2)
    summary = json.load(open(w("dump/summary.json")))
    got_names = list(summary["matrices"])
    if sorted(got_names) != sorted(want):
        errors.append(f"{case}: matrices {got_names}, expected {sorted(want)}")
        return
    worst = 0.0
    for name, ref_value in want.items():
        arr = np.load(w(f"dump/{name}.npy"))
        expect = ref_value.double().numpy()
        entry = summary["matrices"][name]
        if arr.shape != expect.shape or list(arr.shape) != entry["shape"]:
            errors.append(f"{case}: {name}.npy has shape {arr.shape}, expected {expect.shape}")
            continue
        err = np.abs(arr - expect).max() / max(np.abs(expect).max(), 1e-6)
        worst = max(worst, err)
        if err > args.tol:
            errors.append(f"{case}: {name} differs from the reference by {err:.2e} (relative)")
        # The measures: per head (or the single matrix), against the numpy definitions.
        first = entry["measured_from_position"]
        mats = arr if arr.ndim == 3 else arr[:, None, :] if name == "relative_bias" else arr[None]
        got = entry.get("heads", [entry.get("properties")])
        logits = name not in ("ape_dot", "rpe_dot", "rope_decay")
        for h, m in enumerate(mats):
            m = toeplitz(m[0]) if name == "relative_bias" else m
            exp = properties(m, first)
            if logits:
                exp.update(pattern(m, first))
            for key, v in exp.items():
                g = got[h].get(key)
                ok = g == v if isinstance(v, (str, int)) else g is not None and abs(g - v) <= 1e-6 * max(1, abs(v))
                if not ok:
                    errors.append(f"{case}: {name} head {h} {key} = {g}, the definition gives {v}")
    if R.reset and not R.cls_code:  # the code form adds a bias to row 0
        th1 = summary.get("cls_theta1")
        tupe = np.load(w("dump/tupe_term.npy"))
        if th1 is None or np.abs(np.array(th1) - tupe[:, 0, 5]).max() > 1e-6:
            errors.append(f"{case}: cls_theta1 {th1} is not the term's row 0")
    print(f"{case:20s} {', '.join(want)}: worst relative error {worst:.1e}")
    print("    " + out.strip().replace("\n", "\n    "))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--poscorr-app", required=True)
    ap.add_argument("--pretrain-app", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    errors = []
    for case in CASES:
        check_case(case, args, errors)
    for e in errors:
        print("FAIL:", e)
    print("ok" if not errors else f"{len(errors)} failures")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
