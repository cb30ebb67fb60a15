#!/usr/bin/python3
"""pretrain_app under storage faults, end to end (standard library only):

  1. damaged checkpoints: a flipped byte in a weight (--init) is refused naming the file and the
     tensor; with --resume, a newest checkpoint with a flipped byte in its optimizer state, or
     truncated, is refused with a warning naming it, and the run continues from the one before,
     bit for bit;
  2. a file-size limit (RLIMIT_FSIZE, standing in for a full disk) hit while writing a checkpoint:
     exit 1 naming the checkpoint and "File too large" and the last good checkpoint, the earlier
     checkpoints byte-identical, no temporary left; --resume then finishes bit for bit;
  3. the same limit during `prepare --overwrite`, in the shards and in meta.json: the previous
     corpus byte-identical, no temporary directory left, a clear error;
  4. train.bin truncated while a run reads it (mapped: SIGBUS): exit 1 naming the shard and the
     checkpoint to resume from; restored, --resume finishes bit for bit. train.bin missing at
     --resume: a clear error. train.bin renamed away mid-run: the run (holding the mapping)
     finishes unaffected.

"Bit for bit": the losses of every step and the final model.safetensors equal those of an
uninterrupted run (run A).

usage: check_storage_faults.py PRETRAIN_APP WORKDIR
"""
import glob
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402
from tiny_corpus import make_corpus  # noqa: E402

app, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
P = lambda *a: os.path.join(work, *a)  # noqa: E731


def limited(max_bytes):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return set_limit


def run(args, limit=None, **kw):
    return subprocess.run([app] + args, capture_output=True, text=True,
                          preexec_fn=limited(limit) if limit else None, **kw)


def digest(paths):
    out = {}
    for p in sorted(paths):
        with open(p, "rb") as f:
            out[os.path.basename(p)] = hashlib.sha256(f.read()).hexdigest()
    return out


def checkpoints(d):
    return sorted(glob.glob(os.path.join(d, "checkpoints", "step_*.safetensors")))


def losses(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def header(file):
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return 8 + n, json.loads(f.read(n))


p = make_corpus(app, work)
check(p.returncode == 0, "prepare a corpus", p.stdout + p.stderr)
STEPS, SAVE = 24, 4
with open(P("cfg.yaml"), "w") as f:
    f.write(f"""seed: 7
model:
  hidden_size: 64
  num_layers: 2
  num_heads: 4
  ffn_size: 128
  max_positions: 64
  position:
    preset: tupe_r
optim:
  lr: 2.0e-3
data:
  corpus: {P("corpus")}
  seq_len: 64
  batch_size: 8
train:
  steps: {STEPS}
  warmup_steps: 2
  log_every: 1
  valid_every: 8
  valid_batches: 2
  save_every: {SAVE}
  keep_last: 10
  progress: false
""")


def train(out, *extra, limit=None, **kw):
    return run(["--config", P("cfg.yaml"), "--out", out] + list(extra), limit=limit, **kw)


def resume_copy(name, keep_until):
    """A copy of run A's directory holding only the checkpoints up to step `keep_until`."""
    d = P(name)
    shutil.copytree(P("a"), d)
    for c in checkpoints(d):
        if int(os.path.basename(c)[5:13]) > keep_until:
            os.remove(c)
    with open(os.path.join(d, "metrics.jsonl")) as f:  # as if the run had stopped there
        kept = [line for line in f if json.loads(line)["step"] <= keep_until]
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(kept)
    return d


def same_as_a(d, label):
    got, want = losses(d), losses(P("a"))
    check(got == want, f"{label}: every step's loss equals the uninterrupted run's",
          f"differ at steps {[s for s in want if got.get(s) != want[s]]}")
    check(digest([os.path.join(d, "model.safetensors")]) == digest([P("a", "model.safetensors")]),
          f"{label}: model.safetensors is byte-identical to the uninterrupted run's")


def no_temporaries(d):
    return [f for f in os.listdir(os.path.join(d, "checkpoints")) if ".tmp." in f]


# ---- run A: uninterrupted -----------------------------------------------------------------------
p = train(P("a"))
check(p.returncode == 0, "uninterrupted run", p.stdout + p.stderr)
if p.returncode != 0:
    sys.exit(1)
check(len(checkpoints(P("a"))) == STEPS // SAVE, "a checkpoint every 4 steps")

# ---- 1. damaged checkpoints -----------------------------------------------------------------------


def flip(file, tensor, at):
    """Flips a bit of byte `at` of `tensor`'s data in `file`, in place."""
    start, h = header(file)
    with open(file, "r+b") as f:
        f.seek(start + h[tensor]["data_offsets"][0] + at)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x20]))


weight = "bert.encoder.layer.1.ffn.fc1.weight"
shutil.copyfile(P("a", "model.safetensors"), P("damaged.safetensors"))
flip(P("damaged.safetensors"), weight, 5)
p = run(["eval", "--init", P("damaged.safetensors"), "--corpus", P("corpus"), "--batches", "1",
         "--batch-size", "8", "--seq-len", "64"])
check(p.returncode == 1 and P("damaged.safetensors") in p.stderr
      and f"tensor '{weight}' fails its checksum" in p.stderr and "the file is damaged" in p.stderr,
      "--init with a flipped byte in a weight: refused naming the file and the tensor", p.stderr)

_, h = header(checkpoints(P("a"))[-1])
optim = next(n for n in h if n.startswith("optim.") and h[n]["data_offsets"][1] > h[n]["data_offsets"][0])
d = resume_copy("damaged_optim", STEPS - SAVE)
last = checkpoints(d)[-1]
previous = checkpoints(d)[-2]
flip(last, optim, 3)
p = train(d, "--resume")
check(p.returncode == 0 and f"cannot resume from {last}" in p.stderr
      and f"tensor '{optim}' fails its checksum" in p.stderr and f"resumed from {previous}" in p.stdout,
      "--resume past a checkpoint with a flipped optimizer-state byte: a warning naming file and tensor, "
      "then the one before", p.stdout + p.stderr)
same_as_a(d, "resumed past the damaged checkpoint")

d = resume_copy("truncated", STEPS - SAVE)
last = checkpoints(d)[-1]
with open(last, "r+b") as f:
    f.truncate(os.path.getsize(last) * 2 // 3)
p = train(d, "--resume")
check(p.returncode == 0 and f"cannot resume from {last}" in p.stderr and "truncated file" in p.stderr,
      "--resume past a truncated checkpoint: a warning naming it, then the one before", p.stderr)
same_as_a(d, "resumed past the truncated checkpoint")

# ---- 2. the file-size limit while writing a checkpoint -------------------------------------------
d = resume_copy("fsize", 12)
before = digest(checkpoints(d))
size = os.path.getsize(checkpoints(d)[-1])
p = train(d, "--resume", limit=size // 2)
failed = os.path.join(d, "checkpoints", "step_00000016.safetensors")
good = os.path.join(d, "checkpoints", "step_00000012.safetensors")
check(p.returncode == 1 and f"cannot write the checkpoint {failed}" in p.stderr
      and "File too large" in p.stderr and f"the last good checkpoint is {good}" in p.stderr,
      "a checkpoint write over the file-size limit: exit 1 naming the file, the OS error and the last good "
      "checkpoint", p.stderr)
check(digest(checkpoints(d)) == before, "the earlier checkpoints are byte-identical, none added")
check(no_temporaries(d) == [], "no temporary file left behind", str(no_temporaries(d)))
p = train(d, "--resume")
check(p.returncode == 0 and f"resumed from {good}" in p.stdout, "--resume after the failed write",
      p.stdout + p.stderr)
same_as_a(d, "resumed after the failed write")

# ---- 3. the file-size limit during prepare --overwrite --------------------------------------------
corpus_files = glob.glob(P("corpus", "*"))
before = digest(corpus_files)
prepare = ["prepare", "--tokenizer", P("vocab.txt"), "--input", P("corpus.txt"), "--valid-ratio", "19",
           "--quiet", "--overwrite"]
p = run(prepare + ["--out", P("corpus")], limit=4096)
check(p.returncode == 1 and "[corpus]" in p.stderr and "train.bin: write failed (File too large)" in p.stderr,
      "prepare --overwrite over the file-size limit: exit 1 naming the shard and the OS error", p.stderr)
check(digest(glob.glob(P("corpus", "*"))) == before, "the previous corpus is byte-identical")
check(glob.glob(P("corpus.tmp*")) == [], "no temporary directory left", str(glob.glob(P("corpus.tmp*"))))

# A corpus whose shards are smaller than its meta.json: the limit hits meta.json, written last.
with open(P("small.txt"), "w") as f:
    f.write("w1 w2 w3 .\n\nw4 w5 .\n")
small = prepare[:]
small[small.index(P("corpus.txt"))] = P("small.txt")
p = run(small + ["--out", P("small")])
check(p.returncode == 0, "prepare a small corpus", p.stderr)
before = digest(glob.glob(P("small", "*")))
shards = max(os.path.getsize(f) for f in glob.glob(P("small", "*")) if not f.endswith("meta.json"))
meta = os.path.getsize(P("small", "meta.json"))
check(shards < 512 < meta, f"the small corpus's shards ({shards} bytes) are smaller than its meta.json ({meta})")
p = run(small + ["--out", P("small")], limit=512)
check(p.returncode == 1 and "meta.json: write failed (File too large)" in p.stderr,
      "prepare --overwrite failing at meta.json: exit 1 naming it", p.stderr)
check(digest(glob.glob(P("small", "*"))) == before, "... the previous corpus is byte-identical")
check(glob.glob(P("small.tmp*")) == [], "... and no temporary directory is left")

# ---- 4. a shard truncated, missing or renamed while training --------------------------------------
train_bin = P("corpus", "train.bin")
shutil.copyfile(train_bin, P("train.bin.saved"))


def during_run(d, action, after_step):
    """Starts `--resume` in d, waits for step `after_step` in metrics.jsonl, stops the process,
    applies `action`, continues it and returns (returncode, stdout, stderr)."""
    proc = subprocess.Popen([app, "--config", P("cfg.yaml"), "--out", d, "--resume"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    acted = False
    while proc.poll() is None and time.time() < deadline:
        try:
            if max(losses(d), default=0) >= after_step:
                proc.send_signal(signal.SIGSTOP)
                action()
                acted = True
                proc.send_signal(signal.SIGCONT)
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.002)
    out, err = proc.communicate(timeout=300)
    return acted, proc.returncode, out, err


d = resume_copy("sigbus", 8)
acted, rc, out, err = during_run(d, lambda: os.truncate(train_bin, 0), 10)
ckpt = os.path.join(d, "checkpoints", "step_000000")
check(acted and rc == 1 and f"[corpus] {train_bin}: reading the memory-mapped shard failed at byte" in err
      and "SIGBUS" in err and f"The last checkpoint is {ckpt}" in err and "--resume" in err,
      "train.bin truncated mid-run: exit 1 naming the shard and the checkpoint to resume from",
      f"acted {acted}, exit {rc}\n{err}")
shutil.copyfile(P("train.bin.saved"), train_bin)
p = train(d, "--resume")
check(p.returncode == 0, "--resume with the shard restored", p.stdout + p.stderr)
same_as_a(d, "resumed after the shard fault")

d = resume_copy("missing", 8)
os.rename(train_bin, train_bin + ".away")
p = train(d, "--resume")
check(p.returncode == 1 and f"[corpus] cannot open {train_bin}: No such file or directory" in p.stderr,
      "--resume with train.bin missing: a clear error naming it", p.stderr)
os.rename(train_bin + ".away", train_bin)

d = resume_copy("renamed", 8)
acted, rc, out, err = during_run(d, lambda: os.rename(train_bin, train_bin + ".away"), 10)
os.rename(train_bin + ".away", train_bin)
check(acted and rc == 0, "train.bin renamed away mid-run: the mapping holds it, the run finishes",
      f"acted {acted}, exit {rc}\n{err}")
same_as_a(d, "the run whose shard was renamed away")

finish("storage-fault")
