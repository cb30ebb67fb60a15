#!/usr/bin/python3
"""How much a trained model uses its learned absolute positions: its MLM loss on a run's
validation batches (what `pretrain_app --export-batches DIR` wrote) as it is, and with the rows
of its position table (`bert.position.table`, the first T) shuffled — every position then gets
another position's vector. A model that reads word order through the table loses accuracy; a
bag-of-words model (or one whose order comes from elsewhere) does not. Computed with the PyTorch
reference (bert_reference.py), so it also checks the checkpoint against the engine's reported
validation loss.

usage: position_use.py CKPT EXPORT_DIR [--shuffles N] [--seed S]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: needs python3-torch ({e})")
    sys.exit(77)

import bert_reference as ref  # noqa: E402
import safetensors_io as st  # noqa: E402
from train_reference import validate  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("export")
    ap.add_argument("--shuffles", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    params, meta = st.read(a.ckpt)
    if "engine.model_config" not in meta:
        sys.exit(f"position_use.py: {a.ckpt}: not an engine checkpoint (no engine.model_config)")
    if "bert.position.table" not in params:
        sys.exit(f"position_use.py: {a.ckpt}: no learned position table (bert.position.table)")
    cfg = json.loads(meta["engine.model_config"])
    path = os.path.join(a.export, "valid.safetensors")
    if not os.path.exists(path):
        sys.exit(f"position_use.py: {path}: missing (pretrain_app --export-batches)")
    valid, vmeta = st.read(path)
    valid.pop("sentence_labels", None)
    batch = int(vmeta["batch_size"])
    T = valid["input_ids"].shape[1]
    torch.set_num_threads(1)
    base = validate(ref.Reference(cfg, params), valid, batch)[0]
    print(f"as trained:               valid loss {base:.4f}")
    g = torch.Generator().manual_seed(a.seed)
    for k in range(a.shuffles):
        p = dict(params)
        table = params["bert.position.table"].clone()
        table[:T] = table[torch.randperm(T, generator=g)]
        p["bert.position.table"] = table
        loss = validate(ref.Reference(cfg, p), valid, batch)[0]
        print(f"positions shuffled ({k + 1}/{a.shuffles}): valid loss {loss:.4f} ({loss - base:+.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
