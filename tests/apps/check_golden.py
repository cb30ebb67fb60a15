#!/usr/bin/python3
"""Golden numerics: refactors of the model, the batches or the training step must not change a bit.

Runs pretrain_app (standard library only) and compares what it computes with
tests/golden/numerics.json, recorded before the refactor of issue 16 by the code as it was (and
re-recorded on purpose five times since, each time the numerics were changed deliberately:
sum_to's summation order, then gradients summed in place into the leaves' buffers
(docs/benchmarks.md), then attention's dropout rule, 16-bit draws, which changes the corpus runs'
masks (ops/dropout.h), then TUPE's [CLS] reset and the T5 bias as ops of their own
(ops/position_bias.h: the gradients of cls_theta and the relative table summed in another order,
the TUPE cases only), then TUPE's whole term as one pass over its product (untied_bias: theta1
and theta2 read off the diagonal of one GEMM instead of two dot products, the scale and the other
terms' sum applied in f32 before one rounding; the TUPE cases only, last-bit changes); the last
recording was made on an Intel Xeon with AVX-512):

  * single-batch mode, one case per positional preset (and cls_reset: code, pre-LN, no segments):
    the initial loss, the logits, every parameter's gradient (--dump), the losses of 5 AdamW steps
    and the weights after them (--save);
  * corpus pretraining (dropout on, 2 micro-batches per step, clipping, warmup, validation):
    every step's loss and gradient norm, the validation losses, and the final weights.

The tensors of a file are compared through one SHA-256 of their bytes (their sums and sums of
squares are kept too, to name what differs and for a tolerance check). Bit-for-bit equality is required on the kind of machine the file was
recorded on (the CPU model, its vector extensions and cache sizes, and the thread count make the
"fingerprint", with the GEMM library the app reports; its kernels and blocking depend on them); on another machine the
losses and norms are compared within 1e-4 relative and each tensor's sums within 1e-4 of its scale
(the weights after the AdamW steps through those steps' losses), and the script says so.

usage: check_golden.py PRETRAIN_APP WORKDIR [--update]   (--update rewrites the golden file)
"""
import array
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tiny_corpus import make_corpus  # noqa: E402

GOLDEN = os.path.join(HERE, "..", "golden", "numerics.json")
THREADS = "2"

SINGLE_PRESETS = ["no_pe", "bert_a", "sin_ape", "learnable_sin_ape", "bert_r", "learned_rpe", "sin_rpe",
                  "learnable_sin_rpe", "tupe_a", "tupe_r", "tupe_a_tie_cls", "bert_a_d", "bert_a+learned_rpe",
                  "bert_a+sin_rpe", "bert_a+learnable_sin_rpe", "learnable_sin_ape+learned_rpe",
                  "learnable_sin_ape+sin_rpe", "learnable_sin_ape+learnable_sin_rpe"]
# (name, preset, options)
SINGLE_CASES = [(p, p, {}) for p in SINGLE_PRESETS] + [
    ("tupe_r:cls_reset=code", "tupe_r", {"cls_reset": "code"}),
    ("tupe_a:pre_ln", "tupe_a", {"pre_ln": True}),
    ("bert_r:pre_ln", "bert_r", {"pre_ln": True}),
    ("learned_rpe:type_vocab=0", "learned_rpe", {"type_vocab": 0}),
]
CORPUS_PRESETS = ["tupe_r", "bert_a", "learned_rpe"]


# ---- safetensors (the format: u64 header length, JSON header, raw little-endian data) ----------

def st_write(path, tensors):
    """tensors: name -> (dtype 'I64', shape, flat list of ints)."""
    header, blobs, offset = {}, [], 0
    for name, (dt, shape, values) in tensors.items():
        blob = struct.pack("<%dq" % len(values), *values)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def st_digest(path):
    """{"sha256": of every tensor's bytes in name order, "sums": name -> "sum sumsq"} (metadata ignored)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    sha, sums = hashlib.sha256(), {}
    for name, e in sorted(header.items()):
        b = data[e["data_offsets"][0]:e["data_offsets"][1]]
        code = {"F32": "f", "F64": "d", "I64": "q", "I32": "i"}.get(e["dtype"])
        vals = array.array(code, b) if code else array.array("B", b)
        sha.update(name.encode() + b"\0" + b)
        sums[name] = "%.9g %.9g %d" % (float(sum(vals)), float(sum(float(v) * float(v) for v in vals)), len(vals))
    return {"sha256": sha.hexdigest(), "sums": sums}


# ---- the machine ----------------------------------------------------------------------------------

def fingerprint():
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    caches = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    if os.path.isdir(base):
        for d in sorted(os.listdir(base)):
            try:
                with open(os.path.join(base, d, "level")) as f1, open(os.path.join(base, d, "size")) as f2, \
                        open(os.path.join(base, d, "type")) as f3:
                    caches.append(f"L{f1.read().strip()}{f3.read().strip()[0]}={f2.read().strip()}")
            except OSError:
                pass
    isa = [x for x in ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl") if x in flags]
    return f"{model} | {' '.join(isa)} | {' '.join(caches)} | threads {THREADS} | GEMMs {GEMM_LIBRARY[0]}"


# ---- the cases ----------------------------------------------------------------------------------

GEMM_LIBRARY = ["?"]  # what the app printed ("CPU GEMMs: oneDNN ..."): part of the fingerprint


def run(app, args, env):
    p = subprocess.run([app] + args, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join([app] + args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    m = re.search(r"CPU GEMMs: (.+)$", p.stdout, re.M)
    if m:
        GEMM_LIBRARY[0] = m.group(1).strip()
    return p.stdout


def single_batch_case(app, work, preset, opt, env):
    os.makedirs(work, exist_ok=True)
    seg = opt.get("type_vocab", 2)
    lines = ["seed: 7", "model:", "  vocab_size: 100", "  hidden_size: 32", "  num_layers: 2", "  num_heads: 4",
             "  ffn_size: 64", "  max_positions: 32", f"  type_vocab_size: {seg}", "  layer_norm_eps: 1.0e-12",
             f"  pre_layer_norm: {'true' if opt.get('pre_ln') else 'false'}", "  position:",
             f"    preset: {preset}", f"    cls_reset: {opt.get('cls_reset', 'paper')}"]
    if "rpe" in preset:
        lines.append("    rpe_clip: 6")
    lines += ["optim:", "  lr: 1.0e-3", "  weight_decay: 0.01"]
    cfg = os.path.join(work, "config.yaml")
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    rng = random.Random(11)
    B, T = 3, 16
    lens = [T, T - 5, T // 2]
    ids, mask, labels, types = [], [], [], []
    for n in lens:
        for t in range(T):
            real = t < n
            ids.append((1 if t == 0 else rng.randrange(5, 100)) if real else 0)
            mask.append(1 if real else 0)
            labels.append(rng.randrange(5, 100) if real and (t == 1 or rng.random() < 0.3) else -100)
            types.append(1 if real and t >= n // 2 else 0)
    tensors = {"input_ids": ("I64", [B, T], ids), "attention_mask": ("I64", [B, T], mask),
               "labels": ("I64", [B, T], labels)}
    if seg:
        tensors["token_type_ids"] = ("I64", [B, T], types)
    batch = os.path.join(work, "batch.safetensors")
    st_write(batch, tensors)
    out = run(app, ["--config", cfg, "--batch-file", batch, "--steps", "5", "--dump",
                    os.path.join(work, "dump.safetensors"), "--save", os.path.join(work, "final.safetensors")], env)
    losses = re.findall(r"^step \d+ loss (\S+)$", out, re.M)
    return {"losses": losses, "dump": st_digest(os.path.join(work, "dump.safetensors")),
            "final": st_digest(os.path.join(work, "final.safetensors"))}


def corpus_case(app, work, corpus, preset, env):
    os.makedirs(work, exist_ok=True)
    cfg = os.path.join(work, "cfg.yaml")
    with open(cfg, "w") as f:
        f.write(f"""seed: 3
model:
  hidden_size: 32
  num_layers: 2
  num_heads: 4
  ffn_size: 64
  max_positions: 64
  hidden_dropout: 0.1
  attention_dropout: 0.1
  position:
    preset: {preset}
optim:
  lr: 2.0e-3
data:
  corpus: {corpus}
  seq_len: 32
  batch_size: 4
train:
  steps: 6
  warmup_steps: 2
  accumulation: 2
  clip_norm: 0.5
  log_every: 1
  valid_every: 3
  valid_batches: 2
  save_every: 3
  progress: false
""")
    run(app, ["--config", cfg, "--out", os.path.join(work, "run")], env)
    rows = []
    with open(os.path.join(work, "run", "metrics.jsonl")) as f:
        for line in f:
            # The printed numbers as text (%.9g): losses and norms of f32 math to its precision.
            m = {k: v for k, v in re.findall(r'"(\w+)": ([-0-9.e+naif]+)', line)}
            rows.append({k: m[k] for k in ("step", "loss", "grad_norm", "lr", "valid_loss") if k in m})
    return {"metrics": rows, "final": st_digest(os.path.join(work, "run", "model.safetensors"))}


# ---- comparison -------------------------------------------------------------------------------------

# Away from the recording machine: printed numbers (losses, norms) within TOL relative, and each
# tensor's sum and sum of squares within TOL of its own scale. A sum may cancel to almost nothing
# (the segment embedding's gradient sums to ~1e-8 exactly because LayerNorm follows it), so it is
# compared against the bound of its L1 norm, sqrt(n sumsq), not against itself; FLOOR covers
# gradients that are zero in exact arithmetic and come out as float noise on both sides.
TOL = 1e-4
FLOOR = 1e-7


def close(a, b, tol=TOL):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-30) or abs(a - b) < 1e-12


def tensor_close(got, want):
    """got, want: "sum sumsq [n]" (n from got when the golden file predates it)."""
    g, w = got.split(), want.split()
    n = float(g[2]) if len(g) > 2 else 1.0
    gs, gq, ws, wq = float(g[0]), float(g[1]), float(w[0]), float(w[1])
    q = max(gq, wq, 0.0)
    return (abs(gs - ws) <= TOL * math.sqrt(n * q) + FLOOR * n and
            abs(gq - wq) <= 2 * TOL * q + FLOOR * FLOOR * n)


def compare(name, got, want, exact, problems):
    if isinstance(want, dict) and "sha256" in want:  # a file's tensors
        if exact and got["sha256"] == want["sha256"]:
            return
        if not exact and name.endswith(".final"):
            # Weights after AdamW steps away from the recording machine: a gradient that is zero in
            # exact arithmetic (a positional key bias: a constant added to every softmax row) is
            # float noise whose sign differs between machines, and AdamW turns it into a full
            # +-lr step; the losses of those steps are compared instead.
            return
        differ = [k for k in want["sums"] if k not in got["sums"] or
                  (got["sums"][k].split()[:2] != want["sums"][k].split()[:2] if exact else
                   not tensor_close(got["sums"][k], want["sums"][k]))]
        differ += [k for k in got["sums"] if k not in want["sums"]]
        if exact:
            problems.append(f"{name}: bytes differ" + (f"; sum/sumsq differ in {differ[:6]}" if differ else ""))
        elif differ:
            problems.append(f"{name}: sum/sumsq beyond {TOL:g} of their scale in {differ[:6]}")
        return
    if isinstance(want, dict):
        if sorted(got) != sorted(want):
            problems.append(f"{name}: entries {sorted(set(got) ^ set(want))} differ")
        for k in want:
            if k in got:
                compare(f"{name}.{k}", got[k], want[k], exact, problems)
        return
    if isinstance(want, list):
        if len(got) != len(want):
            problems.append(f"{name}: {len(got)} entries, golden {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            compare(f"{name}[{i}]", g, w, exact, problems)
        return
    if got != want and (exact or not close(float(got), float(want))):
        problems.append(f"{name}: {got} vs golden {want}")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    app, work = sys.argv[1], sys.argv[2]
    update = "--update" in sys.argv[3:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, OMP_NUM_THREADS=THREADS)
    results = {"single_batch": {}, "corpus": {}}
    for name, preset, opt in SINGLE_CASES:
        results["single_batch"][name] = single_batch_case(app, os.path.join(work, re.sub(r"\W", "_", name)),
                                                          preset, opt, env)
    p = make_corpus(app, work, documents=200)
    if p.returncode != 0:
        print("FAILED: prepare the corpus\n", p.stdout, p.stderr)
        return 1
    for preset in CORPUS_PRESETS:
        results["corpus"][preset] = corpus_case(app, os.path.join(work, "corpus_" + preset),
                                                os.path.join(work, "corpus"), preset, env)
    fp = fingerprint()
    if update:
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            json.dump({"fingerprint": fp, "cases": results}, f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"wrote {os.path.normpath(GOLDEN)} ({len(SINGLE_CASES)} single-batch cases, "
              f"{len(CORPUS_PRESETS)} corpus runs) on: {fp}")
        return 0
    with open(GOLDEN) as f:
        golden = json.load(f)
    exact = golden["fingerprint"] == fp
    if not exact:
        print(f"NOTE: this machine ({fp}) is not the one the golden file was recorded on "
              f"({golden['fingerprint']}): comparing losses and norms within {TOL:g} and tensor sums "
              f"within {TOL:g} of their scale instead of bytes (final weights: through the losses)")
    problems = []
    compare("cases", results, golden["cases"], exact, problems)
    n = len(SINGLE_CASES) + len(CORPUS_PRESETS)
    if problems:
        print(f"FAILED: {len(problems)} differences from the golden numerics:")
        for line in problems[:40]:
            print("  " + line)
        return 1
    print(f"OK: {n} cases {'bit for bit' if exact else f'within {TOL:g}'} equal to the golden numerics "
          f"({len(SINGLE_CASES)} single-batch: initial loss, logits, every gradient, 5 AdamW losses, final "
          f"weights; {len(CORPUS_PRESETS)} corpus runs: every step's loss and norm, validation, final weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
