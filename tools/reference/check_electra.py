#!/usr/bin/python3
"""Checks the engine's ELECTRA objective against a PyTorch reference on one batch.

  1. writes a tiny config (objective: electra, any preset, an embedding width of its own so both
     models project) and a batch whose `replacements` are the generator's draws (fed in, so the
     comparison needs no sampler) into --workdir;
  2. runs `pretrain_app --steps 0 --save init --dump dump` and `--init init --steps N`;
  3. builds the reference from the same checkpoint: the generator and the discriminator are two
     bert_reference.Reference encoders over one set of leaves (the embeddings shared), the
     generator's sizes derived here from the discriminator's and electra.generator_size, the
     discriminator's input the original tokens with the draws at the masked positions, its labels
     (draw != original), the RTD head dense -> GELU -> out, the loss
     MLM + rtd_weight x mean-over-tokens BCE. Compares the loss and its two parts, the generator's
     logits, the discriminator's logits and labels, every gradient, then N AdamW steps' losses.
Exit 0 when every error is within --tol, 1 otherwise, 77 when PyTorch is missing.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: the PyTorch reference needs python3-torch and python3-numpy ({e}); "
          "tools/test.sh installs them")
    sys.exit(77)

import bert_reference as ref  # noqa: E402
import safetensors_io as st  # noqa: E402
from check_model import adamw, rel_err, report, run  # noqa: E402
from check_model import write_batch as write_model_batch  # noqa: E402


def write_config(path, args):
    lines = [
        f"seed: {args.seed}",
        "objective: electra",
        "electra:",
        f"  generator_size: {args.generator_size}",
        f"  rtd_weight: {args.rtd_weight}",
        "model:",
        f"  vocab_size: {args.vocab}",
        f"  hidden_size: {args.width}",
        f"  embedding_size: {args.embedding}",
        f"  num_layers: {args.layers}",
        f"  num_heads: {args.heads}",
        f"  ffn_size: {4 * args.width}",
        "  max_positions: 32",
        f"  type_vocab_size: {args.type_vocab}",
        "  layer_norm_eps: 1.0e-12",
        f"  pre_layer_norm: {'true' if args.pre_ln else 'false'}",
        "  position:",
        f"    preset: {args.preset}",
    ]
    if "rpe" in args.preset:
        lines.append("    rpe_clip: 6")
    lines += ["optim:", f"  lr: {args.lr}", "  weight_decay: 0.01", "  eps: 1.0e-6"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_batch(path, args):
    """check_model's batch (padding, segments, labels at ~30% of the tokens), plus `replacements`:
    the generator's draws, every third the original token (labelled "not replaced")."""
    batch = write_model_batch(path, args)
    labels = batch["labels"].numpy()
    sel = labels != -100
    draws = np.random.default_rng(args.seed + 1).integers(5, args.vocab, int(sel.sum()))
    draws[::3] = labels[sel][::3]
    tensors = {k: v.numpy() for k, v in batch.items()}
    tensors["replacements"] = draws
    st.write(path, tensors)
    return {k: torch.from_numpy(v) for k, v in tensors.items()}


def generator_config(cfg, size, layers=0):
    """ELECTRA's generator: hidden, heads and FFN scaled (rounded half away from zero)."""
    g = dict(cfg)
    scaled = lambda v: max(1, int(math.floor(v * size + 0.5)))  # noqa: E731
    g["hidden_size"] = scaled(cfg["hidden_size"])
    g["num_heads"] = scaled(cfg["num_heads"])
    g["ffn_size"] = scaled(cfg["ffn_size"])
    g["num_layers"] = layers or cfg["num_layers"]
    g["embedding_size"] = cfg.get("embedding_size", cfg["hidden_size"])
    return g


class ElectraReference:
    def __init__(self, cfg, electra, params):
        self.disc = ref.Reference(cfg, params)
        self.gen = ref.Reference(generator_config(cfg, electra["generator_size"],
                                                  electra["generator_layers"]),
                                 None, prefix="generator.bert.", head="generator.mlm.",
                                 shared=self.disc.P)
        self.P = self.disc.P
        self.rtd_weight = electra["rtd_weight"]

    def loss(self, ids, mask, types, labels, draws):
        mlm_loss, logits = self.gen.mlm(ids, mask, types, labels)
        sel = labels != -100
        original = torch.where(sel, labels, ids)
        dids = original.clone()
        dids[sel] = draws
        replaced = (dids != original).float()
        h = self.disc.encode(dids, mask, types)
        x = ref.linear(F.gelu(ref.linear(h, self.P, "rtd.dense")), self.P, "rtd.out")[..., 0]
        w = mask.float()
        bce = F.binary_cross_entropy_with_logits(x, replaced, reduction="none")
        rtd_loss = (bce * w).sum() / w.sum()
        labels_out = torch.where(mask != 0, replaced.long(), torch.full_like(ids, -100))
        return mlm_loss + self.rtd_weight * rtd_loss, mlm_loss, rtd_loss, logits, x, labels_out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", required=True, help="path to pretrain_app")
    ap.add_argument("--preset", default="tupe_r")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--embedding", type=int, default=48, help="model.embedding_size")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--generator-size", type=float, default=0.5)
    ap.add_argument("--rtd-weight", type=float, default=50.0)
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--type-vocab", type=int, default=2)
    ap.add_argument("--pre-ln", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda name: os.path.join(args.workdir, name)  # noqa: E731
    write_config(w("config.yaml"), args)
    batch = write_batch(w("batch.safetensors"), args)
    dev = ["--device", args.device]
    run([args.app, "--config", w("config.yaml"), "--batch-file", w("batch.safetensors"),
         "--steps", "0", "--save", w("init.safetensors"), "--dump", w("dump.safetensors")] + dev)
    out = run([args.app, "--config", w("config.yaml"), "--init", w("init.safetensors"),
               "--batch-file", w("batch.safetensors"), "--steps", str(args.steps)] + dev)
    engine_losses = [float(m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M)]
    if len(engine_losses) != args.steps:
        print(f"FAILED: expected {args.steps} 'step k loss v' lines, got:\n{out}")
        return 1

    params, meta = st.read(w("init.safetensors"))
    if meta.get("engine.model") != "electra":
        print(f"FAILED: the checkpoint's engine.model is {meta.get('engine.model')!r}, not 'electra'")
        return 1
    cfg = json.loads(meta["engine.model_config"])
    electra = json.loads(meta["engine.electra_config"])
    dump, _ = st.read(w("dump.safetensors"))
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    types, draws = batch.get("token_type_ids"), batch["replacements"]

    model = ElectraReference(cfg, electra, params)
    loss, mlm_loss, rtd_loss, logits, rtd_logits, rtd_labels = model.loss(
        ids, mask, types, labels, draws)
    loss.backward()
    errors = [("loss", rel_err(dump["loss"].reshape(()), loss)),
              ("mlm_loss", rel_err(dump["mlm_loss"].reshape(()), mlm_loss)),
              ("rtd_loss", rel_err(dump["rtd_loss"].reshape(()), rtd_loss)),
              ("generator logits", rel_err(dump["logits"], logits)),
              ("discriminator logits", rel_err(dump["rtd_logits"], rtd_logits))]
    problems = []
    if not torch.equal(dump["rtd_labels"].long(), rtd_labels):
        problems.append("the discriminator's labels differ")
    if not torch.equal(dump["sampled"].long(), draws.long()):
        problems.append("the engine did not use the replacements given")
    replaced = int((rtd_labels == 1).sum())
    if not 0 < replaced < int((labels != -100).sum()):
        problems.append(f"the batch should have replaced and kept draws, got {replaced} replaced")
    missing = []
    for name, p in model.P.items():
        g = dump.get("grad." + name)
        if g is None:
            missing.append(name)
            continue
        errors.append(("grad." + name, rel_err(g, p.grad if p.grad is not None else torch.zeros_like(p))))
    extra = [n for n in dump if n.startswith("grad.") and n[5:] not in model.P]
    shared = [n for n in model.P if (n.startswith("bert.embeddings.") and ".project." not in n)
              or n in ("bert.position.table", "bert.position.freq")]
    gen_own = [n for n in model.P if n.startswith("generator.")]

    model = ElectraReference(cfg, electra, params)
    opt = adamw(model.P, args.lr)
    ref_losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        l = model.loss(ids, mask, types, labels, draws)[0]
        l.backward()
        ref_losses.append(float(l))
        opt.step()
    for k, (a, b) in enumerate(zip(engine_losses, ref_losses), 1):
        errors.append((f"step {k} loss", abs(a - b) / abs(b)))

    print(f"ELECTRA {args.preset}: {len(model.P)} parameters ({len(gen_own)} the generator's, "
          f"{len(shared)} shared embeddings: {', '.join(shared)}); {replaced} of "
          f"{int((labels != -100).sum())} draws replace their token")
    print(f"loss engine {dump['loss'].item():.7f} reference {loss.item():.7f} "
          f"(MLM {mlm_loss.item():.5f} + {electra['rtd_weight']:g} x RTD {rtd_loss.item():.5f})")
    print("losses engine   :", " ".join(f"{v:.7f}" for v in engine_losses))
    print("losses reference:", " ".join(f"{v:.7f}" for v in ref_losses))
    if missing or extra:
        problems.append(f"gradient names differ; missing in the engine's dump: {missing}, extra: {extra}")
    return report(errors, problems, args.tol)

if __name__ == "__main__":
    sys.exit(main())
