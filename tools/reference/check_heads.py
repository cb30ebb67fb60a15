#!/usr/bin/python3
"""Checks the engine's finetuning heads against PyTorch, on top of the reference encoder:

  1. writes a tiny config and an initial checkpoint (pretrain_app --steps 0 --save), a WordPiece
     vocabulary, and one small task per head: glue/RTE (classification), glue/STS-B
     (regression), squad/v1.1 (span);
  2. runs `finetune_app TASK --dump` (dropout off: the first training batch's inputs, labels,
     logits, loss, every parameter and its gradient);
  3. recomputes the loss and logits with bert_reference.Reference.encode + the head written out
     here in PyTorch ([CLS] -> dense -> tanh -> out and cross-entropy / MSE; per-position start
     and end logits and the mean of their cross-entropies), and compares loss, logits and every
     gradient (relative error max|a - b| / max|b|). Exit 0 when all are within --tol, 1 if not,
     77 without PyTorch.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: the PyTorch reference needs python3-torch ({e}); tools/test.sh installs it")
    sys.exit(77)

import bert_reference as ref  # noqa: E402
import check_model  # noqa: E402  (rel_err, write_batch)
import safetensors_io as st  # noqa: E402

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "yes", "no", "where", "is", "paris", "rome", "lives", "in", "."]


def head_reference(kind, model, dump):
    P = model.P
    ids, mask = dump["input_ids"].long(), dump["attention_mask"].long()
    types = dump.get("token_type_ids")
    x = model.encode(ids, mask, types.long() if types is not None else None)
    labels = dump["labels"]
    if kind == "span":
        logits = F.linear(x, P["qa.out.weight"], P["qa.out.bias"])  # (B, T, 2)
        lab = labels.long()
        loss = (F.cross_entropy(logits[..., 0], lab[:, 0]) + F.cross_entropy(logits[..., 1], lab[:, 1])) / 2
        return loss, logits
    h = torch.tanh(F.linear(x[:, 0], P["classifier.dense.weight"], P["classifier.dense.bias"]))
    logits = F.linear(h, P["classifier.out.weight"], P["classifier.out.bias"])
    if kind == "regression":
        logits = logits[:, 0]
        return F.mse_loss(logits, labels.float()), logits
    return F.cross_entropy(logits, labels.long()), logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--finetune-app", required=True)
    ap.add_argument("--pretrain-app", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda *n: os.path.join(args.workdir, *n)  # noqa: E731

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    with open(w("vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    cfg_args = argparse.Namespace(seed=7, vocab=len(vocab), width=32, layers=2, heads=4, type_vocab=2,
                                  pre_ln=False, cls_reset="paper", lr=1e-3, seq=8)
    check_model.write_config(w("config.yaml"), args.preset, cfg_args)
    check_model.write_batch(w("batch.safetensors"), cfg_args)
    check_model.run([args.pretrain_app, "--config", w("config.yaml"), "--batch-file", w("batch.safetensors"),
                     "--steps", "0", "--save", w("init.safetensors")])

    def write(name, text):
        os.makedirs(os.path.dirname(w(name)), exist_ok=True)
        with open(w(name), "w") as f:
            f.write(text)

    rows = ["the cat sat\tyes the dog\tentailment", "no mat\tthe cat sat on the mat\tnot_entailment",
            "dog\tyes\tentailment"]
    write("glue/RTE/train.tsv", "index\tsentence1\tsentence2\tlabel\n" +
          "".join(f"{i}\t{r}\n" for i, r in enumerate(rows)))
    write("glue/RTE/dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tthe\tcat\tentailment\n")
    sts_h = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    write("glue/STS-B/train.tsv", sts_h + "".join(f"{i}\tg\tf\t1\t{i}\ts\ts\t{a}\t{b}\t{s}\n" for i, (a, b, s) in
                                                  enumerate([("the cat", "a cat", 4.2), ("dog on mat", "paris", 0.4),
                                                             ("yes", "no no", 2.5)])))
    write("glue/STS-B/dev.tsv", sts_h + "0\tg\tf\t1\t0\ts\ts\tthe\tcat\t1.0\n")
    ctx = "the cat lives in paris . the dog lives in rome ."
    squad = {"data": [{"paragraphs": [{"context": ctx, "qas": [
        {"id": "a", "question": "where is the cat", "answers": [{"text": "paris", "answer_start": ctx.index("paris")}]},
        {"id": "b", "question": "where is the dog", "answers": [{"text": "rome", "answer_start": ctx.index("rome")}]}]}]}]}
    write("squad/train-v1.1.json", json.dumps(squad))
    write("squad/dev-v1.1.json", json.dumps(squad))

    worst_all, ok = 0.0, True
    for task, kind, data in (("glue/RTE", "classification", "glue"), ("glue/STS-B", "regression", "glue"),
                             ("squad/v1.1", "span", "squad")):
        dump_path = w(f"dump_{kind}.safetensors")
        check_model.run([args.finetune_app, task, "--checkpoint", w("init.safetensors"), "--tokenizer", w("vocab.txt"),
                         "--data-dir", w(data), "--max-len", "32", "--max-query-len", "8", "--doc-stride", "4",
                         "--batch-size", "3", "--dump", dump_path])
        dump, meta = st.read(dump_path)
        cfg = json.loads(meta["engine.model_config"])
        params = {n[6:]: t for n, t in dump.items() if n.startswith("param.")}
        model = ref.Reference(cfg, params)
        loss, logits = head_reference(kind, model, dump)
        loss.backward()
        errors = [("loss", check_model.rel_err(dump["loss"].reshape(()), loss)),
                  ("logits", check_model.rel_err(dump["logits"], logits))]
        # Some gradients are zero in exact arithmetic: with the span head, every row's softmax minus
        # its one-hot sums to 0 over the positions, so the gradient of qa.out.bias and of the last
        # LayerNorm's bias is float noise (~1e-8) on both sides. Where the reference gradient is
        # below 1e-6 x the model's largest gradient, the engine's must be too (error: its size over
        # that bound); elsewhere the relative error as usual.
        scale = max(p.grad.abs().max().item() for p in model.P.values() if p.grad is not None)
        floor = 1e-6 * scale
        for name, p in model.P.items():
            g = dump.get("grad." + name)
            if g is None:
                errors.append(("missing grad." + name, float("inf")))
                continue
            r = p.grad if p.grad is not None else torch.zeros_like(p)
            if r.abs().max().item() <= floor:
                errors.append(("grad." + name + " (zero)", g.abs().max().item() / floor * args.tol))
            else:
                errors.append(("grad." + name, check_model.rel_err(g, r)))
        worst = max(errors, key=lambda e: e[1])
        worst_all = max(worst_all, worst[1])
        print(f"{args.preset} {kind}: loss engine {float(dump['loss']):.7f} reference {loss.item():.7f}; "
              f"{len(errors)} values, largest relative error {worst[1]:.2e} ({worst[0]})")
        bad = [(n, e) for n, e in errors if not e <= args.tol]
        if bad:
            ok = False
            print(f"FAILED: {len(bad)} values beyond {args.tol}: " + ", ".join(f"{n} ({e:.2e})" for n, e in bad[:8]))
    if ok:
        print(f"OK: every head within {args.tol} (largest {worst_all:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
