#!/usr/bin/python3
"""Checks the engine's BERT against the PyTorch reference for one positional preset.

  1. writes a tiny config and a batch (padding, segment ids, -100 labels) into --workdir;
  2. runs `pretrain_app --steps 0 --save init --dump dump` (initial model, loss, logits, every
     parameter's gradient) and `pretrain_app --init init --steps N` (the loss trajectory);
  3. loads the same checkpoint and batch into bert_reference.Reference and compares: loss,
     logits and every gradient (relative error max|a - b| / max|b| per tensor), then N AdamW
     (--optim lamb: LAMB, lamb_reference.py) steps' losses. Exit 0 when every error is within
     --tol, 1 otherwise, 77 when PyTorch is missing (CTest reports the test as skipped, with the
     reason printed).

With --dropout both sides train with dropout on (pretrain_app --dropout): the reference draws
its masks from its own re-derivation of the engine's stream (dropout_reference.py), the dump is
step 1's forward and backward over --micro-batches copies of the batch, and every dropout mask
the engine's graph holds (the hidden ones, and the attention probabilities' where Shaw's
relative term keeps them out of the fused attention op) must equal the reference's bit for bit.
When --seq equals --max-positions, the last row of the position table must get a gradient.
With --sop the objective is mlm_sop (MLM + sentence-order prediction): the batch carries
sentence_labels (one row swapped, one in order, one without a pair), and the MLM and SOP losses,
the SOP logits and the head's gradients are compared too.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: the PyTorch reference needs python3-torch and python3-numpy ({e}); "
          "tools/test.sh installs them")
    sys.exit(77)

import bert_reference as ref  # noqa: E402
import dropout_reference as dref  # noqa: E402
import lamb_reference  # noqa: E402
import safetensors_io as st  # noqa: E402


def write_config(path, preset, args):
    shaw = "rpe" in preset
    lines = [
        f"seed: {args.seed}",
        "model:",
        f"  vocab_size: {args.vocab}",
        f"  hidden_size: {args.width}",
        f"  num_layers: {args.layers}",
        f"  num_heads: {args.heads}",
        f"  ffn_size: {4 * args.width}",
        f"  embedding_size: {getattr(args, 'embedding_size', 0)}      # 0: hidden_size",
        f"  max_positions: {getattr(args, 'max_positions', 32)}",
        f"  type_vocab_size: {args.type_vocab}",
        "  layer_norm_eps: 1.0e-12",
        # Callers without these options (check_heads.py, check_poscorr.py) keep the defaults.
        f"  hidden_dropout: {getattr(args, 'hidden_dropout', 0.1)}"
        "      # off in single-batch mode unless --dropout",
        f"  attention_dropout: {getattr(args, 'attention_dropout', 0.1)}",
        f"  pre_layer_norm: {'true' if args.pre_ln else 'false'}",
        "  position:",
        f"    preset: {preset}",
        f"    cls_reset: {args.cls_reset}",
    ]
    if shaw:  # clip below T so that the clipping is exercised
        lines.append("    rpe_clip: 6")
    lines += ["optim:", f"  lr: {args.lr}", "  weight_decay: 0.01", "  eps: 1.0e-6"]
    if getattr(args, "optim", "adamw") != "adamw":
        lines.append(f"  name: {args.optim}")
    if getattr(args, "sop", False):
        lines = ["objective: mlm_sop"] + lines + ["data:", "  segment_pairs: true"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_batch(path, args):
    g = np.random.default_rng(args.seed)
    B, T = 3, args.seq
    lens = [T, T - 5, T // 2]
    ids = np.zeros((B, T), np.int64)
    mask = np.zeros((B, T), np.int64)
    labels = np.full((B, T), -100, np.int64)
    for b, n in enumerate(lens):
        ids[b, :n] = g.integers(5, args.vocab, n)
        ids[b, 0] = 1  # [CLS]-like first token
        mask[b, :n] = 1
        pick = g.random(n) < 0.3
        pick[1] = True
        labels[b, :n][pick] = g.integers(5, args.vocab, int(pick.sum()))
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if args.type_vocab > 0:
        types = np.zeros((B, T), np.int64)
        for b, n in enumerate(lens):
            types[b, n // 2:n] = 1
        tensors["token_type_ids"] = types
    if getattr(args, "sop", False):  # one row swapped, one in order, one without a pair
        tensors["sentence_labels"] = np.array([1, 0, -100], np.int64)
    st.write(path, tensors)
    return {k: torch.from_numpy(v) for k, v in tensors.items()}


# Gradients that are zero in exact arithmetic (the key bias of an untied or decomposed positional
# term adds a constant to every softmax row) come out as float noise of 1e-12..1e-9 on both
# sides; errors are taken relative to max(max|ref|, FLOOR) so such noise is not a "relative
# error of 100%". Every real gradient here is orders of magnitude above the floor.
FLOOR = 1e-7


def rel_err(a, b):
    """max|a - b| / max(max|b|, FLOOR), per tensor."""
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    return (a - b).abs().max().item() / max(b.abs().max().item(), FLOOR)


def adamw(P, lr, name="adamw"):
    """torch AdamW (or lamb_reference.Lamb) over the leaves P (name -> tensor) with the engine's
    decay groups and eps."""
    decay = [p for n, p in P.items() if not ref.no_weight_decay(n)]
    no_decay = [p for n, p in P.items() if ref.no_weight_decay(n)]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    if name == "lamb":
        return lamb_reference.Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


def report(errors, problems, tol):
    """Prints the largest relative errors and every problem; -> the exit status (0: all within tol)."""
    print("largest relative errors:")
    for name, e in sorted(errors, key=lambda e: -e[1])[:6]:
        print(f"  {e:.3e}  {name}")
    for p in problems:
        print("FAILED:", p)
    bad = [(n, e) for n, e in errors if not e <= tol]
    if bad:
        print(f"FAILED: {len(bad)} values beyond tolerance {tol}: " +
              ", ".join(f"{n} ({e:.2e})" for n, e in bad[:10]))
    if problems or bad:
        return 1
    print(f"OK: every value within {tol}")
    return 0


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("FAILED:", " ".join(cmd))
        print(p.stdout, p.stderr)
        sys.exit(1)
    return p.stdout


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", required=True, help="path to pretrain_app")
    ap.add_argument("--preset", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--max-positions", type=int, default=32)
    ap.add_argument("--embedding-size", type=int, default=0,
                    help="model.embedding_size (0: hidden size; another adds the projections)")
    ap.add_argument("--type-vocab", type=int, default=2)
    ap.add_argument("--cls-reset", default="paper", choices=["paper", "code"])
    ap.add_argument("--pre-ln", action="store_true")
    ap.add_argument("--dropout", action="store_true", help="train mode: dropout on, masks compared")
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--hidden-dropout", type=float, default=0.1)
    ap.add_argument("--attention-dropout", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optim", default="adamw", choices=["adamw", "lamb"],
                    help="optim.name: the N steps with AdamW or LAMB (lamb_reference.py)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sop", action="store_true",
                    help="objective mlm_sop: MLM + sentence-order prediction (the batch labelled)")
    ap.add_argument("--device", default="cpu", help="pretrain_app --device (cuda: the GPU, or the emulated one)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda name: os.path.join(args.workdir, name)  # noqa: E731
    write_config(w("config.yaml"), args.preset, args)
    batch = write_batch(w("batch.safetensors"), args)

    dev = ["--device", args.device, "--micro-batches", str(args.micro_batches)]
    if args.dropout:
        dev.append("--dropout")
    run([args.app, "--config", w("config.yaml"), "--batch-file", w("batch.safetensors"),
         "--steps", "0", "--save", w("init.safetensors"), "--dump", w("dump.safetensors")] + dev)
    out = run([args.app, "--config", w("config.yaml"), "--init", w("init.safetensors"),
               "--batch-file", w("batch.safetensors"), "--steps", str(args.steps)] + dev)
    engine_losses = [float(m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.M)]
    if len(engine_losses) != args.steps:
        print(f"FAILED: expected {args.steps} 'step k loss v' lines, got:\n{out}")
        return 1

    params, meta = st.read(w("init.safetensors"))
    cfg = json.loads(meta["engine.model_config"])
    dump, _ = st.read(w("dump.safetensors"))
    model = ref.Reference(cfg, params)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    types = batch.get("token_type_ids")
    order = batch.get("sentence_labels")
    parts = []  # mlm_sop: (MLM loss, SOP loss, SOP logits) of each micro-batch
    M = args.micro_batches

    def new_stream():  # pretraining's stream of rank 0, from its start
        return dref.DropoutStream(dref.pretrain_dropout_key(args.seed, 0)) if args.dropout else None

    def step_losses(model, stream):
        """Step 1's forward and backward: -> (loss, logits, masks), gradients accumulated."""
        total, all_logits, masks = 0.0, [], []
        for _ in range(M):
            if args.sop:
                l, lg, *sop_parts = model.mlm_sop(ids, mask, types, labels, order, stream)
                parts.append(sop_parts)
            else:
                l, lg = model.mlm(ids, mask, types, labels, stream)
            (l if M == 1 else l * (1.0 / M)).backward()
            total = total + (l if M == 1 else l.detach() * (1.0 / M))
            all_logits.append(lg)
            masks += model.masks
        return total, torch.cat(all_logits, 0), masks

    loss, logits, ref_masks = step_losses(model, new_stream())

    errors = [("loss", rel_err(dump["loss"].reshape(()), loss)),
              ("logits", rel_err(dump["logits"], logits))]
    if args.sop:  # the first micro-batch's parts
        mlm_loss, sop_loss, sop_logits = parts[0]
        errors += [("mlm_loss", rel_err(dump["mlm_loss"].reshape(()), mlm_loss)),
                   ("sop_loss", rel_err(dump["sop_loss"].reshape(()), sop_loss)),
                   ("sop_logits", rel_err(dump["sop_logits"], sop_logits))]
        print(f"SOP: loss engine {dump['sop_loss'].item():.7f} reference {sop_loss.item():.7f}")
    mask_problems = []
    if args.dropout:
        # The engine's graph holds the dropout ops' masks; the attention op keeps its own,
        # except on the Shaw path, which drops the probabilities with the dropout op.
        shaw = model.relative.startswith("shaw")
        want = [(site, m) for site, m in ref_masks if shaw or "attention probabilities" not in site]
        got = [dump[f"dropout_mask.{k}"] for k in range(len(dump)) if f"dropout_mask.{k}" in dump]
        if len(got) != len(want):
            mask_problems.append(f"the engine dumped {len(got)} dropout masks, the reference "
                                 f"expects {len(want)}")
        for k, ((site, m), g) in enumerate(zip(want, got)):
            g = g.numpy().astype(bool)
            if g.shape != m.shape:
                mask_problems.append(f"mask {k} ({site}): shape {g.shape} vs {m.shape}")
            elif (g != m).any():
                mask_problems.append(f"mask {k} ({site}): {(g != m).sum()} of {m.size} differ")
        kept = sum(int(m.sum()) for _, m in want)
        total = sum(m.size for _, m in want)
        print(f"dropout masks: {len(got)} from the engine's graph, {len(ref_masks)} drawn by the "
              f"reference; {total} elements, {total - kept} dropped, "
              f"{'identical' if not mask_problems else 'DIFFERENT'}")
    edge_problem = None
    if args.seq == args.max_positions and "bert.position.table" in model.P:
        g = dump["grad.bert.position.table"][args.seq - 1]
        print(f"T = max_positions = {args.seq}: |grad| of the position table's last row "
              f"{g.abs().max().item():.3e}")
        if not g.abs().max().item() > 0:
            edge_problem = "the position table's last row got no gradient"
    missing = []
    for name, p in model.P.items():
        g = dump.get("grad." + name)
        if g is None:
            missing.append(name)
            continue
        errors.append(("grad." + name, rel_err(g, p.grad if p.grad is not None else torch.zeros_like(p))))
    extra = [n for n in dump if n.startswith("grad.") and n[5:] not in model.P]

    # N AdamW (--optim lamb: LAMB) steps from the same start, decay groups by the same rule.
    model = ref.Reference(cfg, params)
    stream = new_stream()  # the steps continue one stream; the dump drew from a copy
    opt = adamw(model.P, args.lr, args.optim)
    ref_losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        l, _, _ = step_losses(model, stream)
        ref_losses.append(float(l))
        opt.step()
    for k, (a, b) in enumerate(zip(engine_losses, ref_losses), 1):
        errors.append((f"step {k} loss", abs(a - b) / abs(b)))

    print(f"preset {args.preset}: {len(model.P)} parameters, loss engine {dump['loss'].item():.7f} "
          f"reference {loss.item():.7f}")
    print("losses engine   :", " ".join(f"{v:.7f}" for v in engine_losses))
    print("losses reference:", " ".join(f"{v:.7f}" for v in ref_losses))
    problems = []
    if missing or extra:
        problems.append(f"gradient names differ; missing in the engine's dump: {missing}, extra: {extra}")
    if mask_problems:
        problems.append("dropout masks differ: " + "; ".join(mask_problems[:6]))
    if edge_problem:
        problems.append(edge_problem)
    return report(errors, problems, args.tol)


if __name__ == "__main__":
    sys.exit(main())
