#!/usr/bin/python3
"""pretrain_app's single-batch mode with train.cuda_graph on the (emulated) device: the step
losses equal the eager run's bit for bit (bf16, dropout on, 2 micro-batches: the captured graph
draws the eager step's masks), --time counts the steps after the capture, and the refusals are
one clear message each. Exits 77 (CTest's "skipped") without numpy and PyTorch, which the batch
file's writer (tools/reference/safetensors_io.py) imports.
usage: check_graph_app.py PRETRAIN_APP WORK_DIR"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "reference"))
try:
    import numpy as np
    import safetensors_io as st
except ImportError as e:
    print(f"check_graph_app: skipped ({e})")
    sys.exit(77)

CONFIG = """seed: 3
model:
  size: custom
  vocab_size: 64
  hidden_size: 64
  num_layers: 2
  num_heads: 2
  ffn_size: 128
  max_positions: 32
  type_vocab_size: 0
  hidden_dropout: 0.1
  attention_dropout: 0.1
  position:
    preset: tupe_r
optim:
  lr: 1.0e-3
train:
  precision: bf16
"""


def run(app, args):
    p = subprocess.run([app] + args, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    app, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    cfg, batch = os.path.join(work, "tiny.yaml"), os.path.join(work, "batch.safetensors")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    g = np.random.default_rng(0)
    ids = g.integers(5, 64, (4, 16)).astype(np.int64)
    labels = np.where(np.arange(64).reshape(4, 16) % 5 == 1, ids, -100).astype(np.int64)
    st.write(batch, {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": labels})
    base = ["--config", cfg, "--batch-file", batch, "--dropout", "--micro-batches", "2",
            "--device", "cuda", "--time"]
    failures = []

    def check(ok, what, out=""):
        if not ok:
            failures.append(what + ("\n" + out[-2000:] if out else ""))

    rc_e, eager = run(app, base + ["--steps", "5"])
    rc_g, graph = run(app, base + ["--steps", "5", "--set", "train.cuda_graph=true"])
    check(rc_e == 0, "the eager run failed", eager)
    check(rc_g == 0, "the graph run failed", graph)
    steps = lambda out: [l for l in out.splitlines() if l.startswith("step ")]  # noqa: E731
    check(len(steps(eager)) == 5, "the eager run printed 5 step lines", eager)
    check(steps(graph) == steps(eager),
          "the graph run's losses equal the eager run's bit for bit:\n" +
          "\n".join(steps(eager)) + "\n--\n" + "\n".join(steps(graph)))
    check("timing: 4 steps" in eager, "eager --time: the 4 steps after the warm-up", eager)
    check("timing: 3 steps" in graph, "graph --time: the 3 steps after the capture", graph)
    check("cuda graph: step 2 captured" in graph and "cuda graph" not in eager,
          "the graph run captured its step 2, the eager run nothing", graph)
    rc, out = run(app, base + ["--steps", "2", "--set", "train.cuda_graph=true"])
    check(rc != 0 and "--time with train.cuda_graph needs --steps 3 or more" in out,
          "--time with 2 graph steps is refused", out)
    rc, out = run(app, ["--config", cfg, "--batch-file", batch, "--steps", "2", "--set",
                        "train.cuda_graph=true"])
    check(rc != 0 and "train.cuda_graph: needs train.device: cuda" in out,
          "train.cuda_graph on the CPU is refused at the key", out)
    for f in failures:
        print("FAILED:", f)
    print(f"check_graph_app: {9 - len(failures)}/9 checks passed" if failures else
          "check_graph_app: the graph run equals the eager run; the refusals are clear")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
