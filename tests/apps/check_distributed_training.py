#!/usr/bin/python3
"""pretrain_app under mpirun (standard library only):

  1. equivalence: `mpirun -np 2` with per-rank batch b (and also b/2 with accumulation 2) ends
     with the same parameters after 5 steps as one process with batch 2b (f32, dropout off):
     relative error <= 1e-5 per tensor;
  2. a rank killed with SIGKILL mid-run ends the whole job non-zero within 60 s; the last
     checkpoint is intact, and `--resume` on 2 ranks continues from it to the same losses as an
     uninterrupted 2-rank run;
  3. a config error or a bad flag ends a 2-rank job with one message (no MPI_Abort);
  and LAMB (optim.name: lamb) on 2 ranks equals one process with the global batch likewise;
  train.grad_reduce_dtype: bf16 (bf16 all-reduce) follows the f32 run's losses within 5e-3.

With --device cuda (the emulation build's pretrain_app: the emulated GPU, gradients through the
NCCL shim's buckets on the communication stream) every run is on the device, and the 2-rank
device run must also end with the 2-rank CPU (MPI) run's parameters within 1e-5.

usage: check_distributed_training.py MPIRUN PRETRAIN_APP WORKDIR [--device cuda]
"""
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_corpus import make_corpus  # noqa: E402

mpirun, app, work = sys.argv[1], sys.argv[2], sys.argv[3]
device = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--device" else "cpu"
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
P = lambda *a: os.path.join(work, *a)  # noqa: E731
failures = []


def check(ok, label, detail=""):
    print(("ok   " if ok else "FAIL ") + label, flush=True)
    if not ok:
        failures.append(label)
        if detail:
            print("     " + detail.strip().replace("\n", "\n     "))


def launch(ranks, args, on=None, **kw):
    cmd = ([mpirun, "-np", str(ranks)] if ranks else []) + [app] + args + ["--device", on or device]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def read_safetensors(path):
    """{name: list of floats} of the f32 tensors of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        a, b = info["data_offsets"]
        values = array("f")
        values.frombytes(data[a:b])
        out[name] = values
    return out


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def write_config(name, batch_size, accumulation, steps, save_every, dropout, optim="adamw",
                 reduce_dtype="f32"):
    path = P(name)
    with open(path, "w") as f:
        f.write(f"""seed: 9
model:
  hidden_size: 64
  num_layers: 2
  num_heads: 4
  ffn_size: 128
  max_positions: 64
  hidden_dropout: {dropout}
  attention_dropout: {dropout}
  position:
    preset: tupe_r
optim:
  name: {optim}
  lr: {3e-3 if optim == "lamb" else 1e-3}
data:
  corpus: {P("corpus")}
  seq_len: 64
  batch_size: {batch_size}
train:
  steps: {steps}
  warmup_steps: 2
  accumulation: {accumulation}
  log_every: 1
  valid_every: 0
  valid_batches: 3
  save_every: {save_every}
  keep_last: 3
  progress: false
  grad_reduce_dtype: {reduce_dtype}
""")
    return path


p = make_corpus(app, work)
check(p.returncode == 0, "prepare a corpus", p.stdout + p.stderr)

# ---- 1. equivalence ------------------------------------------------------------------------------
runs = {
    "one rank, batch 8": (None, write_config("np1.yaml", 8, 1, 5, 0, 0.0)),
    "2 ranks, batch 4": (2, write_config("np2.yaml", 4, 1, 5, 0, 0.0)),
    "2 ranks, batch 2, accumulation 2": (2, write_config("np2acc.yaml", 2, 2, 5, 0, 0.0)),
}
def train_5(label, ranks, cfg):
    """Runs a 5-step config; -> (parameters, losses), or None when it failed (a check says so)."""
    out = P(label.replace(" ", "_").replace(",", ""))
    p = launch(ranks, ["--config", cfg, "--out", out])
    check(p.returncode == 0, f"{label}: 5 steps", p.stdout[-3000:] + p.stderr[-3000:])
    if p.returncode != 0:
        return None
    if ranks:
        check(f"global batch: 2 ranks x" in p.stdout, f"{label}: the global batch is reported", p.stdout[-1500:])
        if "OMP_NUM_THREADS" not in os.environ:
            # The node's cores shared by its ranks: no oversubscription, said at start.
            m = re.search(r"^threads: (\d+) per rank \((.*)\)", p.stdout, re.M)
            cores = len(os.sched_getaffinity(0))
            check(m is not None and 1 <= int(m.group(1)) <= max(1, cores // 2)
                  and "2 local ranks" in m.group(2),
                  f"{label}: threads per rank = cores / local ranks ({cores} cores), printed at start",
                  m.group(0) if m else p.stdout[-1500:])
    return read_safetensors(os.path.join(out, "model.safetensors")), losses(out)


params = {label: r for label, (ranks, cfg) in runs.items() if (r := train_5(label, ranks, cfg))}
# LAMB: the all-reduced gradient is the global batch's, so its per-tensor norms and update are too.
lamb_runs = {"LAMB, one rank, batch 8": (None, write_config("np1_lamb.yaml", 8, 1, 5, 0, 0.0, "lamb")),
             "LAMB, 2 ranks, batch 4": (2, write_config("np2_lamb.yaml", 4, 1, 5, 0, 0.0, "lamb"))}
lamb_params = {label: r for label, (ranks, cfg) in lamb_runs.items() if (r := train_5(label, ranks, cfg))}
if device != "cpu":
    # The same 2-rank run on the CPU: MPI all-reduce of CPU gradients instead of NCCL on the device.
    out = P("2_ranks_batch_4_cpu")
    p = launch(2, ["--config", runs["2 ranks, batch 4"][1], "--out", out], on="cpu")
    check(p.returncode == 0, "2 ranks, batch 4 on the CPU: 5 steps", p.stdout[-3000:] + p.stderr[-3000:])
    if p.returncode == 0:
        params["2 ranks, batch 4 (CPU, MPI)"] = (read_safetensors(os.path.join(out, "model.safetensors")),
                                                losses(out))
for ref_label, group in (("one rank, batch 8", params), ("LAMB, one rank, batch 8", lamb_params)):
    if ref_label not in group:
        continue
    ref, ref_loss = group[ref_label]
    for label, (got, got_loss) in group.items():
        if label == ref_label:
            continue
        worst, worst_name = 0.0, ""
        for name, r in ref.items():
            g = got[name]
            scale = max(max(abs(v) for v in r), 1e-7)
            err = max(abs(a - b) for a, b in zip(g, r)) / scale
            if err > worst:
                worst, worst_name = err, name
        check(worst <= 1e-5 and set(got) == set(ref),
              f"{label} vs {ref_label}: worst relative parameter error {worst:.2e} ({worst_name})")
        step_err = max(abs(got_loss[s] - ref_loss[s]) / abs(ref_loss[s]) for s in ref_loss)
        check(step_err <= 1e-5, f"{label}: step losses match (worst relative error {step_err:.2e})",
              f"{got_loss} vs {ref_loss}")

# ---- 1b. bf16 gradients on the wire train like f32 ---------------------------------------------
# train.grad_reduce_dtype: bf16 rounds each bucket to bf16 for the all-reduce (the slab, clipping
# and AdamW stay f32): not the f32 run's bits, but its training curve within a few per mille.
bf16_steps = 30 if device == "cpu" else 12
curves = {}
for dt in ("f32", "bf16"):
    out = P(f"reduce_{dt}")
    p = launch(2, ["--config", write_config(f"reduce_{dt}.yaml", 4, 1, bf16_steps, 0, 0.0, "adamw", dt),
                   "--out", out])
    check(p.returncode == 0, f"2 ranks, gradients all-reduced in {dt}: {bf16_steps} steps",
          p.stdout[-3000:] + p.stderr[-3000:])
    if p.returncode == 0:
        curves[dt] = (losses(out), read_safetensors(os.path.join(out, "model.safetensors")))
if len(curves) == 2:
    (lf, pf), (lb, pb) = curves["f32"], curves["bf16"]
    rel = max(abs(lb[s] - lf[s]) / abs(lf[s]) for s in lf)
    moved = any(a != b for n in pf for a, b in zip(pf[n], pb[n]))
    check(rel <= 5e-3 and lb[bf16_steps] < lb[1] - 0.05 and moved,
          f"bf16 all-reduce trains like f32: worst relative loss difference {rel:.2e} over "
          f"{bf16_steps} steps, loss {lb[1]:.4f} -> {lb[bf16_steps]:.4f} (f32 {lf[bf16_steps]:.4f}), "
          f"parameters {'differ' if moved else 'IDENTICAL (no rounding?)'}", f"{lb} vs {lf}")

# ---- 2. a killed rank ------------------------------------------------------------------------------
# Checkpoints every 4 steps; rank 1 dies once steps 4 and 8 are saved. The emulated device runs
# 12 steps (a step there takes ~1 s: the kill still lands mid-run), the CPU 24 (~20 ms a step).
kill_steps = 24 if device == "cpu" else 12
cfg = write_config("kill.yaml", 4, 1, kill_steps, 4, 0.1)
p = launch(2, ["--config", cfg, "--out", P("whole")])
check(p.returncode == 0, f"uninterrupted 2-rank run ({kill_steps} steps, dropout on)",
      p.stdout[-2000:] + p.stderr[-2000:])
whole = losses(P("whole")) if p.returncode == 0 else {}

kill_dir = P("killed")
proc = subprocess.Popen([mpirun, "-np", "2", app, "--config", cfg, "--out", kill_dir, "--device", device],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rank_pid(rank):
    """The pid of the pretrain_app process of `rank` (from its environment)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and os.path.basename(app).encode() in cmd
                and kill_dir.encode() in cmd):
            return int(pid)
    return None


victim = None
deadline = time.time() + 300
while time.time() < deadline and proc.poll() is None:
    done = glob.glob(os.path.join(kill_dir, "checkpoints", "step_*.safetensors"))
    if len(done) >= 2:  # steps 4 and 8 written: kill mid-run
        victim = rank_pid(1)
        break
    time.sleep(0.05)
check(victim is not None, "found rank 1's process after two checkpoints")
if victim:
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    took = time.time() - t0
    check(proc.returncode != 0, f"killing rank 1 ends the job non-zero (exit {proc.returncode})", err[-2000:])
    check(took < 60, f"the job ended {took:.1f} s after the kill (limit 60 s)")
    ckpts = sorted(glob.glob(os.path.join(kill_dir, "checkpoints", "step_*.safetensors")))
    last = ckpts[-1] if ckpts else ""
    try:
        read_safetensors(last)
        intact = True
    except Exception as e:  # noqa: BLE001
        intact = False
        print(e)
    check(intact, f"the last checkpoint is intact: {os.path.basename(last)}")
    p = launch(2, ["--config", cfg, "--out", kill_dir, "--resume"])
    check(p.returncode == 0 and f"resumed from {last}" in p.stdout,
          "--resume on 2 ranks continues from the last checkpoint", p.stdout[-2000:] + p.stderr[-2000:])
    if p.returncode == 0 and whole:
        resumed = losses(kill_dir)
        diff = [(s, whole[s], resumed.get(s)) for s in whole if resumed.get(s) != whole[s]][:4]
        check(not diff and sorted(resumed) == sorted(whole),
              "killed-and-resumed 2-rank losses equal the uninterrupted 2-rank run bit for bit", str(diff))

# ---- 3. an error on every rank ends the job with one message, no MPI_Abort ------------------------
t0 = time.time()
p = launch(2, ["--config", cfg, "--out", P("bad"), "--set", "train.bucket_mb=0"])
check(p.returncode == 1 and p.stderr.count("bucket_mb") == 1 and "pretrain_app: [all 2 ranks]" in p.stderr
      and "MPI_ABORT" not in p.stderr and time.time() - t0 < 60,
      "a config error under mpirun: one message naming the ranks and the key, exit 1, no MPI_ABORT",
      p.stderr[-2000:])
p = launch(2, ["--config", cfg, "--frobnicate"])
check(p.returncode == 2 and p.stderr.count("unknown argument '--frobnicate'") == 1 and "MPI_ABORT" not in p.stderr,
      "a bad flag under mpirun: one message, exit 2, no MPI_ABORT", p.stderr[-2000:])

print(f"{len(failures)} failure(s)" if failures else "all distributed training checks passed")
sys.exit(1 if failures else 0)
