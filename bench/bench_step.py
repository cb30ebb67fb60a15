#!/usr/bin/python3
"""Side-by-side training-step benchmark: the engine (build/bin/pretrain_app, single-batch mode)
against PyTorch CPU (the reference model of tools/reference/bert_reference.py with PyTorch's own
dropout and torch.optim.AdamW) on the same model, the same batch, the same initial weights, the
same number of threads, f32, dropout on. Prints tokens/s for both, the ratio (> 1: the engine is
faster) and the peak resident memory of each process, plus which GEMM library each side loaded.

usage: /usr/bin/python3 bench/bench_step.py [--models tiny,base] [--threads N] [--rounds R]
           [--tiny-steps N] [--base-steps N] [--base-batch B] [--app build/bin/pretrain_app]
           [--workdir DIR]

Models: tiny = configs/tiny_tupe_r.yaml's model (2 layers, width 128, 4 heads, FFN 512) on a batch
of 16 x 128 with BERT's vocabulary (30522); base = BERT-Base (12 layers, width 768, 12 heads,
FFN 3072) with TUPE-R on a batch of --base-batch x 128. The timed steps follow one warm-up step;
15% of the tokens are predicted. Each round runs the engine, then PyTorch, each in its own process
(peak RSS from wait4); with several rounds the table gives the median.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, HERE)

MODELS = {
    # name: (hidden, layers, heads, ffn, max_positions, type_vocab, batch, seq)
    "tiny": (128, 2, 4, 512, 128, 0, 16, 128),
    "base": (768, 12, 12, 3072, 512, 2, 8, 128),
}
VOCAB = 30522


def write_config(path, model):
    d, layers, heads, ffn, maxpos, types, _, _ = MODELS[model]
    text = f"""seed: 1
model:
  vocab_size: {VOCAB}
  hidden_size: {d}
  num_layers: {layers}
  num_heads: {heads}
  ffn_size: {ffn}
  max_positions: {maxpos}
  type_vocab_size: {types}
  hidden_dropout: 0.1
  attention_dropout: 0.1
  position:
    preset: tupe_r
    cls_reset: paper
optim:
  lr: 1.0e-4
  weight_decay: 0.01
  eps: 1.0e-6
"""
    with open(path, "w") as f:
        f.write(text)


def write_batch(path, model, batch):
    import numpy as np
    import safetensors_io as st

    _, _, _, _, _, types, _, T = MODELS[model]
    g = np.random.default_rng(0)
    ids = g.integers(5, VOCAB, (batch, T)).astype(np.int64)
    ids[:, 0] = 2  # a [CLS]-like first token
    mask = np.ones((batch, T), np.int64)
    labels = np.full((batch, T), -100, np.int64)
    pick = g.random((batch, T)) < 0.15
    pick[:, 0] = False
    labels[pick] = g.integers(5, VOCAB, int(pick.sum()))
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if types:
        tensors["token_type_ids"] = np.zeros((batch, T), np.int64)
    st.write(path, tensors)


def run_measured(cmd, env, log):
    """Runs cmd with stdout+stderr to `log`; -> (exit status, output, peak RSS in MB)."""
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    with open(log) as f:
        text = f.read()
    return p.returncode, text, ru.ru_maxrss / 1024.0


def parse_timing(text):
    m = re.search(r"^timing: (\d+) steps (\S+) ms/step (\S+) tokens/s", text, re.M)
    return (float(m.group(2)), float(m.group(3))) if m else None


# ---- the PyTorch side (a process of its own) ---------------------------------------------------
def torch_worker(args):
    import torch

    torch.set_num_threads(args.threads)
    import bert_reference as ref
    import safetensors_io as st

    params, meta = st.read(args.init)
    cfg = json.loads(meta["engine.model_config"])
    batch, _ = st.read(args.batch_file)
    model = ref.Reference(cfg, params)
    model.native_dropout = True
    decay = [p for n, p in model.P.items() if not ref.no_weight_decay(n)]
    no_decay = [p for n, p in model.P.items() if ref.no_weight_decay(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-6, foreach=True)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    types = batch.get("token_type_ids")
    t0 = None
    for k in range(1, args.steps + 1):
        if k == 2:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = model.mlm(ids, mask, types, labels)
        loss.backward()
        opt.step()
        print(f"step {k} loss {loss.item():.6f}", flush=True)
    s = time.perf_counter() - t0
    n = args.steps - 1
    print(f"timing: {n} steps {1e3 * s / n:.3f} ms/step {ids.numel() * n / s:.1f} tokens/s")
    blas = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if "blas" in line.split()[-1].lower()})
    print("blas: " + ", ".join(os.path.realpath(b) for b in blas))
    cfg_text = torch.__config__.show()
    info = re.search(r"BLAS_INFO=([^,\n]+)", cfg_text)
    print(f"torch: {torch.__version__}, BLAS_INFO={info.group(1) if info else '?'}, "
          f"threads {torch.get_num_threads()}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,base")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tiny-steps", type=int, default=20, help="timed steps (after one warm-up)")
    ap.add_argument("--base-steps", type=int, default=3)
    ap.add_argument("--base-batch", type=int, default=8)
    ap.add_argument("--app", default=os.path.join(ROOT, "build", "bin", "pretrain_app"))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--engine-only", action="store_true")
    # internal: the PyTorch worker
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--batch-file", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)

    for name in ("threads", "rounds", "tiny_steps", "base_steps", "base_batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected 1 or more, got {getattr(args, name)}")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model '{m}' (expected tiny, base)")
    if not os.access(args.app, os.X_OK):
        ap.error(f"--app {args.app}: not an executable (build first: tools/setup.sh)")
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_step.")
    os.makedirs(workdir, exist_ok=True)
    # Both sides under the same OpenBLAS core type (bench/openblas_core.py): PyTorch's GEMMs,
    # and the engine's when ENGINE_CPU_GEMM=openblas.
    import openblas_core
    env, blas_note = openblas_core.fair_env(dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    print(f"threads {args.threads} per side, f32, dropout 0.1, TUPE-R, vocab {VOCAB}; workdir {workdir}")
    print(blas_note)

    rows, info = [], {}
    for model in models:
        batch = args.base_batch if model == "base" else MODELS[model][6]
        timed = args.base_steps if model == "base" else args.tiny_steps
        w = lambda name: os.path.join(workdir, f"{model}.{name}")  # noqa: E731
        write_config(w("yaml"), model)
        write_batch(w("batch.safetensors"), model, batch)
        subprocess.run([args.app, "--config", w("yaml"), "--batch-file", w("batch.safetensors"),
                        "--steps", "0", "--save", w("init.safetensors")],
                       check=True, stdout=subprocess.DEVNULL, env=env)
        res = {"engine": [], "torch": []}
        for _ in range(args.rounds):
            rc, text, rss = run_measured(
                [args.app, "--config", w("yaml"), "--init", w("init.safetensors"), "--batch-file",
                 w("batch.safetensors"), "--steps", str(timed + 1), "--dropout", "--time"],
                env, w("engine.log"))
            t = parse_timing(text)
            if rc != 0 or not t:
                print(f"engine run failed ({rc}):\n{text}")
                return 1
            res["engine"].append((t[1], rss))
            m = re.search(r"^(threads: .*)$", text, re.M)
            info["engine"] = m.group(1) if m else "?"
            if args.engine_only:
                continue
            rc, text, rss = run_measured(
                [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(args.threads),
                 "--init", w("init.safetensors"), "--batch-file", w("batch.safetensors"),
                 "--steps", str(timed + 1)], env, w("torch.log"))
            t = parse_timing(text)
            if rc != 0 or not t:
                print(f"PyTorch run failed ({rc}):\n{text}")
                return 1
            res["torch"].append((t[1], rss))
            info["torch"] = "; ".join(l for l in text.splitlines() if l.startswith(("blas:", "torch:")))
        rows.append((model, batch, timed, res))

    print(f"engine: {info.get('engine')}")
    if not args.engine_only:
        print(f"PyTorch: {info.get('torch')}")
    print()
    print("| model | batch | timed steps | engine tokens/s | PyTorch tokens/s | ratio | engine peak RSS MB | PyTorch peak RSS MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, batch, timed, res in rows:
        e = statistics.median(r[0] for r in res["engine"])
        erss = statistics.median(r[1] for r in res["engine"])
        if res["torch"]:
            t = statistics.median(r[0] for r in res["torch"])
            trss = statistics.median(r[1] for r in res["torch"])
            print(f"| {model} | {batch} x 128 | {timed} | {e:.0f} | {t:.0f} | {e / t:.2f}x | {erss:.0f} | {trss:.0f} |")
        else:
            print(f"| {model} | {batch} x 128 | {timed} | {e:.0f} | - | - | {erss:.0f} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
