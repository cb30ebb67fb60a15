#!/usr/bin/python3
"""Trains the independent PyTorch reference (bert_reference.py) on the batches a pretraining run
reads, for the same steps, so that its curve can be laid beside the engine's: a defect in the
engine's training (a gradient, the optimizer, the schedule, the data it feeds) that the one-batch
checks miss shows as curves that part.

  pretrain_app --config CFG [--set ...] --export-batches DIR      # init + batches of the run
  tools/reference/train_reference.py --export DIR --lr 1e-3 --warmup 200 --out ref.jsonl

What it shares with the engine is only what it reads: the initial weights (DIR/init.safetensors)
and the batches (DIR/train.safetensors: train.steps x train.accumulation micro-batches in the
order the run reads them; DIR/valid.safetensors: the run's validation batches). Everything else is
PyTorch's: torch.optim.AdamW (betas 0.9/0.999, eps 1e-6, weight decay on every tensor but biases
and LayerNorms; --optim lamb: lamb_reference.Lamb with the same groups), torch.nn.utils.clip_grad_norm_, the linear warmup/decay of
transformers.get_linear_schedule_with_warmup (step k, counted from 1, uses lr(k - 1): the first
step's rate is 0 when there is a warmup), F.dropout at the model's rates (its masks are not the
engine's; with --no-dropout there is none, as with the config's dropouts at 0) and micro-batches
weighted by their share of the step's predicted tokens (the engine's rule).

Writes one JSON line per logged or validated step to --out, in the engine's metrics.jsonl keys
(step, loss, lr, grad_norm, tokens; valid_loss, valid_accuracy over every predicted token of the
validation batches), and prints them; name it RUN/metrics.jsonl for tools/plot_curves.py.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: the PyTorch reference needs python3-torch ({e})")
    sys.exit(77)

import bert_reference as ref  # noqa: E402
import lamb_reference  # noqa: E402
import safetensors_io as st  # noqa: E402


def die(msg):
    print(f"train_reference.py: {msg}", file=sys.stderr)
    sys.exit(2)


def linear_schedule(peak, warmup, total):
    def lr(s):
        if s < warmup:
            return peak * s / warmup
        return peak * max(0.0, (total - s) / max(1, total - warmup))
    return lr


def load_batches(path, what):
    if not os.path.exists(path):
        die(f"{path}: missing (write it with pretrain_app --export-batches)")
    tensors, meta = st.read(path)
    for k in ("input_ids", "labels", "attention_mask"):
        if k not in tensors:
            die(f"{path}: no tensor '{k}' ({what} batches of pretrain_app --export-batches)")
    if "batch_size" not in meta:
        die(f"{path}: no batch_size in its metadata")
    return tensors, meta


def rows(tensors, begin, end):
    ids = tensors["input_ids"][begin:end].long()
    mask = tensors["attention_mask"][begin:end].long()
    labels = tensors["labels"][begin:end].long()
    types = tensors["token_type_ids"][begin:end].long() if "token_type_ids" in tensors else None
    return ids, mask, types, labels


def validate(model, valid, batch_size):
    model.native_dropout = False
    n = valid["input_ids"].shape[0]
    loss_sum, correct, predicted = 0.0, 0, 0
    with torch.no_grad():
        for b in range(0, n, batch_size):
            ids, mask, types, labels = rows(valid, b, b + batch_size)
            loss, logits = model.mlm(ids, mask, types, labels)
            m = logits.shape[0]
            target = labels.reshape(-1)[labels.reshape(-1) != -100]
            loss_sum += loss.item() * m
            correct += int((logits.argmax(-1) == target).sum())
            predicted += m
    return loss_sum / predicted, correct / predicted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True, help="the directory pretrain_app --export-batches wrote")
    ap.add_argument("--lr", type=float, required=True, help="the peak learning rate (optim.lr)")
    ap.add_argument("--warmup", type=int, required=True, help="train.warmup_steps")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps to train (default: all exported); the schedule's length is always "
                         "the exported run's train.steps")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--optim", default="adamw", choices=["adamw", "lamb"],
                    help="optim.name: torch.optim.AdamW or lamb_reference.Lamb (apex's rule)")
    ap.add_argument("--clip", type=float, default=1.0, help="train.clip_norm (0: none)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--valid-every", type=int, default=500)
    ap.add_argument("--no-dropout", action="store_true", help="train without dropout")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1, help="torch's seed (its dropout masks)")
    ap.add_argument("--out", required=True, help="metrics, one JSON line per logged step")
    a = ap.parse_args()
    if a.lr <= 0 or a.warmup < 0 or a.steps < 0 or a.clip < 0 or a.log_every < 1 or a.valid_every < 0:
        die("--lr must be > 0; --warmup, --steps, --clip, --valid-every >= 0; --log-every >= 1")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    init = os.path.join(a.export, "init.safetensors")
    if not os.path.exists(init):
        die(f"{init}: missing (write it with pretrain_app --export-batches)")
    params, meta = st.read(init)
    if "engine.model_config" not in meta:
        die(f"{init}: no engine.model_config in its metadata (not an engine checkpoint)")
    cfg = json.loads(meta["engine.model_config"])
    train, tmeta = load_batches(os.path.join(a.export, "train.safetensors"), "training")
    valid, _ = load_batches(os.path.join(a.export, "valid.safetensors"), "validation")
    batch = int(tmeta["batch_size"])
    total = int(tmeta["steps"])
    accum = int(tmeta["accumulation"])
    steps = a.steps or total
    if steps > total:
        die(f"--steps {steps}: the export holds {total} steps")
    if "sentence_labels" in train:
        die("the export is of an mlm_sop run; this trainer replays masked-LM runs")

    model = ref.Reference(cfg, params)
    decay = [p for n, p in model.P.items() if not ref.no_weight_decay(n)]
    no_decay = [p for n, p in model.P.items() if ref.no_weight_decay(n)]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if a.optim == "lamb":
        opt = lamb_reference.Lamb(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-6)
    else:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-6)
    lr_at = linear_schedule(a.lr, a.warmup, total)
    everything = list(model.P.values())
    out = open(a.out, "w")
    t0 = time.time()
    tokens = 0  # non-padding tokens seen, as the engine's metrics count them
    for k in range(1, steps + 1):
        model.native_dropout = not a.no_dropout
        opt.zero_grad(set_to_none=True)
        micro = [rows(train, ((k - 1) * accum + m) * batch, ((k - 1) * accum + m + 1) * batch)
                 for m in range(accum)]
        counts = [int((mb[3] != -100).sum()) for mb in micro]
        loss_step = 0.0
        tokens += sum(int(mb[1].sum()) for mb in micro)
        for mb, c in zip(micro, counts):
            loss, _ = model.mlm(*mb)
            w = c / sum(counts)
            (loss * w).backward()
            loss_step += loss.item() * w
        norm = torch.nn.utils.clip_grad_norm_(everything, a.clip if a.clip > 0 else float("inf"))
        lr = lr_at(k - 1)
        for g in opt.param_groups:
            g["lr"] = lr
        if math.isfinite(float(norm)):
            opt.step()
        rec = None
        if k % a.log_every == 0 or k == steps:
            rec = {"step": k, "loss": loss_step, "lr": lr, "grad_norm": float(norm), "tokens": tokens}
        if a.valid_every and (k % a.valid_every == 0 or k == steps):
            vl, va = validate(model, valid, batch)
            rec = rec or {"step": k, "tokens": tokens}
            rec.update({"valid_loss": vl, "valid_accuracy": va})
        if rec:
            rec["seconds"] = round(time.time() - t0, 1)
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(json.dumps(rec), flush=True)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
