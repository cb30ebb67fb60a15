#!/usr/bin/python3
"""PyTorch + Hugging Face transformers BERT MLM training steps on the GPU: the framework the
engine is measured against, in the same run (tools/gpu/gpu_check.sh). One step = bf16 autocast
forward, backward, global-norm clipping, fused AdamW, as the engine's step. Variants: full
(BertForMaskedLM as users run it: logits at every position), masked (the encoder, then the MLM
head on the predicted positions only: the engine's work), compiled (masked under torch.compile).
Prints one "HF {json}" line per run.
usage: hf_bench.py base128 large512 base128c ...   (a trailing c: the compiled variant only)"""
import json
import re
import sys
import time

import torch
from transformers import BertConfig, BertForMaskedLM


def run(size, seq, batch, variant, steps=20, warm=5):
    layers, d, heads, ffn = (12, 768, 12, 3072) if size == "base" else (24, 1024, 16, 4096)
    cfg = BertConfig(vocab_size=32768, hidden_size=d, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512,
                     type_vocab_size=1, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                     attn_implementation="sdpa")
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(5, 32768, (batch, seq), device="cuda", generator=gen)
    picked = torch.rand((batch, seq), device="cuda", generator=gen) < 0.15
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    pos = picked.flatten().nonzero().squeeze(1)
    targets = ids.flatten()[pos]

    def masked_loss():
        h = model.bert(input_ids=ids).last_hidden_state.reshape(batch * seq, d)
        return torch.nn.functional.cross_entropy(model.cls(h.index_select(0, pos)).float(), targets)

    def full_loss():
        return model(input_ids=ids, labels=labels).loss

    loss_fn = {"full": full_loss, "masked": masked_loss}.get(variant) or torch.compile(masked_loss)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(steps):
        loss = step()
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / steps
    r = dict(size=size, T=seq, B=batch, variant=variant, ms=round(ms, 3),
             seq_s=round(batch / ms * 1000, 1), loss=round(float(loss.detach()), 4),
             warm_s=round(warm_s, 1), peak_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2))
    print("HF", json.dumps(r), flush=True)
    del model, opt
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return r


def main():
    which = sys.argv[1:] or ["base128", "large512"]
    for w in which:
        m = re.match(r"(base|large)(\d+)(c?)$", w)
        if not m:
            sys.exit(f"hf_bench: '{w}' is not base<T>, large<T> or base<T>c")
        variants = ["compiled"] if m.group(3) else ["full", "masked"]
        for v in variants:
            try:
                run(m.group(1), int(m.group(2)), 32, v)
            except Exception as e:  # a variant that fails is reported, the others still run
                print("HF", json.dumps({"size": m.group(1), "T": int(m.group(2)), "variant": v,
                                        "failed": repr(e)[:300]}), flush=True)


if __name__ == "__main__":
    main()
