#!/usr/bin/python3
"""An MLM batch for pretrain_app's single-batch mode (--batch-file): B sequences of T random
token ids in [5, vocab), every token real, 15% of them predicted (the label is the id itself), as
the step benchmarks use. usage: make_batch.py OUT.safetensors --batch B --seq T [--vocab V]"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_io as st  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for name, v, lo in (("--batch", a.batch, 1), ("--seq", a.seq, 2), ("--vocab", a.vocab, 6)):
        if v < lo:
            ap.error(f"{name} must be at least {lo}, got {v}")
    g = np.random.default_rng(a.seed)
    ids = g.integers(5, a.vocab, (a.batch, a.seq)).astype(np.int64)
    labels = np.where(g.random((a.batch, a.seq)) < 0.15, ids, -100).astype(np.int64)
    st.write(a.out, {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": labels})


if __name__ == "__main__":
    main()
