#!/usr/bin/python3
"""bench/scaling_model.py (docs/distributed.md, "What to expect at scale"), on cases whose answers
are known (standard library only):

  - its BERT-Base and BERT-Large parameter lists hold exactly the parameters pretrain_app counts;
  - buckets are cut as engine::GradReducer cuts them (from the slab's end, closed at the size);
  - the all-reduce cost: ring and tree by hand, one node against several, NIC-bound bandwidth;
  - the overlap schedule: exposed time by hand for buckets ready before, at and after the end
    of backward;
  - accumulation, bf16 gradients and one GPU in the table; the bench_comm check on a made-up
    output (its fit and predictions by hand); bad input named.

usage: check_scaling_model.py PRETRAIN_APP CONFIG_DIR
"""
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
tool = os.path.join(here, "..", "..", "bench", "scaling_model.py")
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
import scaling_model as sm  # noqa: E402

pretrain_app, configs = sys.argv[1], sys.argv[2]
close = lambda a, b, tol=1e-9: abs(a - b) <= tol * max(1.0, abs(b))  # noqa: E731

# ---- the parameter lists against the engine's count ----------------------------------------------
for model, cfg in (("base", "bert_base_tupe_r.yaml"), ("large", "bert_large_tupe_r.yaml")):
    p = subprocess.run([pretrain_app, "--config", os.path.join(configs, cfg), "--count-params"],
                       capture_output=True, text=True)
    total = [line for line in p.stdout.splitlines() if line.strip().startswith("total")]
    engine = int(total[0].split()[1].replace(",", "")) if total else -1
    mine = sum(n for _, n, _ in sm.bert_parameters(**sm.SIZES[model]))
    check(p.returncode == 0 and engine == mine, f"{model}: the model's parameters are the engine's ({mine:,})",
          p.stdout + p.stderr)
params = sm.bert_parameters(**sm.SIZES["base"])
check(params[0][0] == "bert.embeddings.token" and params[0][2] == 1.0 and params[-1][0] == "mlm.decoder_bias",
      "slab order: embeddings first (ready last), the head last (ready first)")
layer_ready = [r for n, _, r in params if n.startswith("layer.") and n.endswith("qkv.weight")]
check(all(a > b for a, b in zip(layer_ready, layer_ready[1:])) and 0 < layer_ready[-1] < layer_ready[0] <= 1,
      "layer 0 completes after layer 11, both inside backward")

# ---- buckets -----------------------------------------------------------------------------------
toy = [("a", 10, 1.0), ("b", 3, 0.9), ("c", 3, 0.5), ("d", 2, 0.2)]
# from the end: d + c = 20 bytes closes the first bucket; b (12 bytes) stays open until a joins
check(sm.buckets(toy, 20, 4) == [(20, 0.5), (52, 1.0)],
      f"buckets from the end, closed at >= the size: {sm.buckets(toy, 20, 4)}")
check(sm.buckets(toy, 1000, 2) == [(36, 1.0)], "one bucket when the slab is smaller than the size")

# ---- all-reduce cost ---------------------------------------------------------------------------
S = 100e6
t, algo = sm.allreduce_s(S, 8)
check(close(t, sm.A_NODE + S * 2 * 7 / 8 / sm.BUSBW_NVLINK) and algo in ("ring", "tree"), f"8 GPUs, one node: {t}")
t16, _ = sm.allreduce_s(S, 16, nics=4)
check(close(t16, sm.A_NODE + 2 * sm.A_HOP + S * 2 * 15 / 16 / (4 * sm.NIC_BW)),
      f"16 GPUs, 4 NICs: NIC-bound, one hop each way: {t16}")
t256, algo256 = sm.allreduce_s(S, 256, nics=8)
ring = sm.A_NODE + 2 * 31 * sm.A_HOP + S * 2 * 255 / 256 / sm.BUSBW_NVLINK
tree = sm.A_NODE + 2 * 5 * sm.A_HOP + S * 2 * 255 / 256 / sm.BUSBW_NVLINK
check(close(t256, tree) and algo256 == "tree" and tree < ring, f"256 GPUs: the tree's log2 latency wins: {t256}")
check(sm.allreduce_s(S, 1) == (0.0, "-"), "one GPU: no communication")

# ---- overlap -----------------------------------------------------------------------------------
cost = lambda b: b * 1e-3  # noqa: E731  (1 ms per byte-unit)
# backward 10 s; bucket 1 ready at 2 s takes 3 s (ends 5), bucket 2 ready at 4 s waits, ends 9;
# bucket 3 ready at 10 s ends 12: exposed 2 s, communication 3 + 4 + 2 = 9 s
exposed, busy = sm.overlap([(3000, 0.2), (4000, 0.4), (2000, 1.0)], 10.0, cost)
check(close(exposed, 2.0) and close(busy, 9.0), f"the schedule by hand: exposed {exposed}, busy {busy}")
exposed, _ = sm.overlap([(3000, 0.2), (4000, 0.4)], 10.0, cost)
check(exposed == 0.0, "everything hidden: nothing exposed")

# ---- the table's rows --------------------------------------------------------------------------
ns = lambda **kw: sm.argparse.Namespace(**dict(dict(gpus_per_node=8, nics=8, bucket_mb=25, accumulation=1,  # noqa: E731
                                                     grad_dtype="f32", step="engine"), **kw))
one = sm.step_model("base", 1, ns())
check(close(one["step_s"], 95.5e-3) and one["exposed_s"] == 0 and one["efficiency"] == 1.0, "one GPU: the measured step")
r = sm.step_model("base", 64, ns())
rk = sm.step_model("base", 64, ns(accumulation=8))
rb = sm.step_model("base", 64, ns(grad_dtype="bf16"))
check(close(rk["exposed_s"], r["exposed_s"]) and rk["efficiency"] > r["efficiency"],
      "accumulation: the same exposed time over a longer step")
check(rb["exposed_s"] < r["exposed_s"] and close(rb["grad_mb"] * 2, r["grad_mb"]), "bf16 gradients: half the bytes")
check(close(r["seq_per_s"], 64 * 32 / r["step_s"]), "throughput = GPUs x batch / step")

# ---- the bench_comm check on a made-up output --------------------------------------------------
# all-reduce of S bytes over 2 ranks costs exactly 0.1 ms + S / 1 GB/s (2(n-1)/n = 1)
sweep = "\n".join(f"{b:12d} {0.1 + b / 1e9 * 1e3:10.3f} {1.0:12.3f} {1.0:12.3f}" for b in (4096, 65536, 1048576, 16777216))
made_up = f"""bench_comm: 2 ranks, cpu tensors through mpi

       bytes    time_ms   algbw_GB/s   busbw_GB/s
{sweep}

BERT step: 1 layers, hidden 64, 2 heads, batch 2 x 128 tokens, {sum(n for _, n, _ in sm.bert_parameters(1, 64, 2, 512, 128))} parameters (0.3 MiB of f32 gradients), 1 bucket of 25 MiB, vocab 512
mode                                  step_ms   exposed_ms    exposed
no communication                       30.00            -          -
forward only                           10.00            -          -
all-reduce in buckets, overlapped      31.00         1.00       3.2%
one all-reduce after backward          31.00         1.10       3.5%
"""
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(made_up)
res = sm.check_bench_comm(f.name)
grad_bytes = 4 * sum(n for _, n, _ in sm.bert_parameters(1, 64, 2, 512, 128))
want = 1e-4 + grad_bytes / 1e9  # one bucket, ready at the end of backward: all of it exposed
check(close(res["alpha"], 1e-4, 0.05) and close(res["busbw"], 1e9, 0.02), f"the fit: {res['alpha']}, {res['busbw']}")
check(close(res["backward"], 0.020) and close(res["predicted"][0], want, 0.02) and close(res["predicted"][1], want, 0.02),
      f"the predictions: {res['predicted']} against {want}")
check(close(res["measured"][0], 1e-3) and close(res["measured"][1], 1.1e-3), "the measured figures read back")

with open(f.name, "w") as g:
    g.write("hello\n")
p = subprocess.run([sys.executable, tool, "--check-bench-comm", f.name], capture_output=True, text=True)
check(p.returncode == 1 and "not bench_comm's output" in p.stderr and "Traceback" not in p.stderr, "not bench_comm's output",
      p.stderr)
p = subprocess.run([sys.executable, tool, "--check-bench-comm", f.name + ".missing"], capture_output=True, text=True)
check(p.returncode == 1 and "cannot read it" in p.stderr and "Traceback" not in p.stderr, "a missing bench_comm file",
      p.stderr)
p = subprocess.run([sys.executable, tool, "--gpus", "8,x"], capture_output=True, text=True)
check(p.returncode == 2 and "--gpus expects a comma-separated list of integers" in p.stderr, "a bad --gpus", p.stderr)
p = subprocess.run([sys.executable, tool, "--models", "huge"], capture_output=True, text=True)
check(p.returncode == 1 and "unknown model 'huge'" in p.stderr, "an unknown model", p.stderr)
p = subprocess.run([sys.executable, tool, "--knobs"], capture_output=True, text=True)
check(p.returncode == 0 and "| base | engine | 256 | 4 | 25 | 1 | bf16 |" in p.stdout, "the knobs' table", p.stdout[-500:])
os.unlink(f.name)
finish("scaling_model")
