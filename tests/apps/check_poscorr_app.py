#!/usr/bin/python3
"""poscorr_app from the outside (standard library only):

  - a tiny tupe_a checkpoint: tupe_term and probe_logits as .npy (NumPy's layout, the documented
    shapes) and .png (valid PNG files, the grid's size), summary.json with every head's measures;
  - --checkpoints: the evolution of one head over two checkpoints of a run, whose frames are the
    single dumps' matrices;
  - tools/poscorr_table.py: the measures of several checkpoints per label, mean and std over
    them against the single dumps' summary.json, the patterns counted, bad labels and runs;
  - malformed or mismatched checkpoints and bad command lines end with one clear message naming
    the file, key or flag, exit 1 or 2, never a crash.

Usage: check_poscorr_app.py POSCORR_APP PRETRAIN_APP WORKDIR"""
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

app, pretrain_app, work = sys.argv[1:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def path(name):
    return os.path.join(work, name)


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def write_safetensors(file, tensors, metadata):
    """tensors: name -> (dtype, shape, bytes)."""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def read_safetensors(file):
    raw = open(file, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    if meta is not None:  # without the engine's checksums (docs/checkpoint.md): the tests edit files
        meta = {k: v for k, v in meta.items() if not k.startswith("engine.crc32.") and k != "engine.header_crc32"}
    data = raw[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}, meta


def read_npy(file):
    raw = open(file, "rb").read()
    assert raw[:8] == b"\x93NUMPY\x01\x00", file
    (n,) = struct.unpack("<H", raw[8:10])
    header = raw[10:10 + n].decode()
    assert (10 + n) % 64 == 0 and header.endswith("\n"), header
    meta = eval(header)  # a Python dict literal, as NumPy writes it
    count = 1
    for s in meta["shape"]:
        count *= s
    assert meta["descr"] == "<f4" and not meta["fortran_order"], meta
    values = struct.unpack("<%df" % count, raw[10 + n:])
    return meta["shape"], values


def png_size(file):
    raw = open(file, "rb").read()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", file
    length, kind = struct.unpack(">I4s", raw[8:16])
    assert kind == b"IHDR" and length == 13
    w, h, depth, color = struct.unpack(">IIBB", raw[16:26])
    assert zlib.crc32(raw[12:29]) == struct.unpack(">I", raw[29:33])[0]
    return w, h, depth, color


def config(preset, vocab=50):
    return f"""seed: 3
model:
  vocab_size: {vocab}
  hidden_size: 32
  num_layers: 2
  num_heads: 4
  ffn_size: 64
  max_positions: 32
  type_vocab_size: 0
  hidden_dropout: 0.0
  attention_dropout: 0.0
  position:
    preset: {preset}
optim:
  lr: 0.05
"""


def make_checkpoint(name, preset, steps):
    with open(path(name + ".yaml"), "w") as f:
        f.write(config(preset))
    ids, mask, labels = [2, 5, 6, 7, 8, 3], [1] * 6, [-100, 5, -100, 9, -100, -100]
    tensors = {k: ("I64", [1, 6], struct.pack("<6q", *v)) for k, v in
               (("input_ids", ids), ("attention_mask", mask), ("labels", labels))}
    write_safetensors(path("batch.st"), tensors, None)
    p = subprocess.run([pretrain_app, "--config", path(name + ".yaml"), "--batch-file", path("batch.st"),
                        "--steps", str(steps), "--save", path(name + ".safetensors")], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(1)
    return path(name + ".safetensors")


def run(args, code, expect, what):
    p = subprocess.run([app] + args, capture_output=True, text=True)
    text = p.stdout + p.stderr
    ok = p.returncode == code and expect in text and "terminate" not in text and "Segmentation" not in text
    check(ok, f"{what}: exit {p.returncode} (want {code}), output {text.strip()[-400:]!r} (want {expect!r})")
    if ok and code != 0:
        print(f"ok  {what}: {text.strip().splitlines()[0]}")
    return p


a = make_checkpoint("a", "tupe_a", 0)
b = make_checkpoint("b", "tupe_a", 4)
r = make_checkpoint("r", "bert_r", 0)

# ---- one checkpoint ----------------------------------------------------------------------------
run(["--checkpoint", a, "--out", path("dump_a"), "--probe-tokens", "3"], 0, "wrote 2 matrices", "tupe_a dump")
summary = json.load(open(path("dump_a/summary.json")))
check(summary["preset"] == "tupe_a" and summary["positions"] == 32 and summary["cls_reset"] == "paper",
      f"summary header {summary}")
check(len(summary["probe_token_ids"]) == 3 and len(summary["cls_theta1"]) == 4, "probe ids and thetas")
check(list(summary["matrices"]) == ["tupe_term", "probe_logits"], f"matrices {list(summary['matrices'])}")
for name, entry in summary["matrices"].items():
    shape, values = read_npy(path(f"dump_a/{name}.npy"))
    check(list(shape) == [4, 32, 32] == entry["shape"], f"{name}.npy shape {shape}")
    check(entry["measured_from_position"] == 1, f"{name} measured from [CLS] + 1")
    check(len(entry["heads"]) == 4, f"{name}: 4 heads")
    for h in entry["heads"]:
        check(0 <= h["translation_invariance"] <= 1 and 0 <= h["symmetry"] <= 1, f"{name} measures in [0, 1]: {h}")
        check(h["pattern"] in ("global", "local", "broad", "previous", "next"), f"{name} pattern {h['pattern']}")
        check(h["min"] <= h["max"], f"{name} min <= max")
    w, h, depth, color = png_size(path(f"dump_a/{name}.png"))
    check(w >= 4 * 256 and h >= 256 and depth == 8 and color == 2, f"{name}.png is an RGB grid of 4 panels: {w}x{h}")
tupe_a_values = read_npy(path("dump_a/tupe_term.npy"))[1]

run(["--checkpoint", r, "--out", path("dump_r"), "--max-positions", "20"], 0, "wrote 4 matrices", "bert_r dump")
sr = json.load(open(path("dump_r/summary.json")))
check(list(sr["matrices"]) == ["ape_dot", "ape_qk", "relative_bias", "probe_logits"], f"bert_r {list(sr['matrices'])}")
check(read_npy(path("dump_r/relative_bias.npy"))[0] == (4, 39), "relative_bias is (H, 2T - 1)")
check(read_npy(path("dump_r/ape_dot.npy"))[0] == (20, 20), "ape_dot is (T, T)")
check("properties" in sr["matrices"]["ape_dot"] and "pattern" not in sr["matrices"]["ape_dot"]["properties"],
      "a single dot-product matrix has properties and no pattern")
check(sr["matrices"]["relative_bias"]["heads"][0]["translation_invariance"] > 0.999999,
      "the relative bias is translation invariant by construction")

# A finetuned model (a classification head beside the encoder) dumps the same encoder matrices.
tensors, meta = read_safetensors(a)
tensors["classifier.out.weight"] = ("F32", [2, 32], struct.pack("<64f", *([0.5] * 64)))
write_safetensors(path("finetuned.safetensors"), tensors, dict(meta, **{"engine.model": "bert_classification"}))
run(["--checkpoint", path("finetuned.safetensors"), "--out", path("dump_ft"), "--probe-tokens", "3"], 0,
    "wrote 2 matrices", "finetuned checkpoint")
check(open(path("dump_ft/tupe_term.npy"), "rb").read() == open(path("dump_a/tupe_term.npy"), "rb").read(),
      "the finetuned model's encoder gives the same term")

# One colour scale for every picture: the pictures change, the matrices do not.
run(["--checkpoint", a, "--out", path("dump_range"), "--probe-tokens", "3", "--range", "-1,1"], 0, "wrote 2 matrices",
    "fixed colour range")
png_size(path("dump_range/tupe_term.png"))
check(open(path("dump_range/tupe_term.npy"), "rb").read() == open(path("dump_a/tupe_term.npy"), "rb").read(),
      "--range changes the picture only")

# ---- evolution -------------------------------------------------------------------------------
run(["--checkpoints", a, b, "--out", path("evo"), "--head", "2"], 0, "evolution_tupe_term_head2", "evolution")
shape, frames = read_npy(path("evo/evolution_tupe_term_head2.npy"))
check(shape == (2, 32, 32), f"evolution shape {shape}")
check(list(frames[:1024]) == list(tupe_a_values[2 * 1024:3 * 1024]), "frame 0 is head 2 of the single dump")
check(frames[1024:] != frames[:1024], "training moved the matrix")
evo = json.load(open(path("evo/evolution.json")))
check([e["checkpoint"] for e in evo["checkpoints"]] == [a, b] and evo["matrix"] == "tupe_term", f"evolution.json {evo}")
png_size(path("evo/evolution_tupe_term_head2.png"))
run(["--checkpoints", r, r, "--out", path("evo_r"), "--matrix", "relative_bias", "--head", "3"], 0,
    "evolution_relative_bias_head3", "evolution of a bias row")
check(read_npy(path("evo_r/evolution_relative_bias_head3.npy"))[0] == (2, 1, 63), "bias evolution frames (1, 2T - 1)")

# ---- tools/poscorr_table.py: the measures per label over checkpoints -------------------------
table_tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "poscorr_table.py")


def table(args, code, expect, what):
    p = subprocess.run([sys.executable, table_tool, "--app", app] + args, capture_output=True, text=True)
    text = p.stdout + p.stderr
    ok = p.returncode == code and expect in text and "Traceback" not in text
    check(ok, f"poscorr_table {what}: exit {p.returncode} (want {code}), output {text.strip()[-400:]!r} (want {expect!r})")
    return p


table(["--out", path("table"), f"{a}=tupe", f"{b}=tupe", f"{r}=bert_r", "--max-positions", "20"], 0,
      "| tupe | tupe_term | 2 x 4 |", "two seeds and one")
tj = json.load(open(path("table/table.json")))
rows = {(row["label"], row["matrix"]): row for row in tj["rows"]}
check(sorted(rows) == sorted([("tupe", "tupe_term"), ("tupe", "probe_logits"), ("bert_r", "ape_dot"),
                              ("bert_r", "ape_qk"), ("bert_r", "relative_bias"), ("bert_r", "probe_logits")]),
      f"poscorr_table rows {sorted(rows)}")
dumps = [json.load(open(path(f"table/tupe_{k}/summary.json"))) for k in (1, 2)]
check([d["checkpoint"] for d in dumps] == [a, b] and dumps[0]["positions"] == 20, "poscorr_table dumps each checkpoint")
for key in ("translation_invariance", "symmetry", "monotonic_window_forward", "pattern_local_mass"):
    per = [sum(h[key] for h in d["matrices"]["tupe_term"]["heads"]) / 4 for d in dumps]
    m = (per[0] + per[1]) / 2
    sd = abs(per[0] - per[1]) / 2 ** 0.5  # n - 1 = 1
    got = rows[("tupe", "tupe_term")]["measures"][key]
    check(abs(got["mean"] - m) < 1e-12 and abs(got["std"] - sd) < 1e-12, f"poscorr_table {key}: {got} vs {m}, {sd}")
pats = rows[("tupe", "tupe_term")]["patterns"]
want = {}
for d in dumps:
    for h in d["matrices"]["tupe_term"]["heads"]:
        want[h["pattern"]] = want.get(h["pattern"], 0) + 1
check(pats == want and sum(pats.values()) == 8, f"poscorr_table pattern counts {pats} vs {want}")
check(rows[("bert_r", "ape_dot")]["heads_per_checkpoint"] == 1 and rows[("bert_r", "ape_dot")]["patterns"] == {},
      "a single matrix is one 'head' without a pattern")
check(rows[("bert_r", "relative_bias")]["measures"]["translation_invariance"]["std"] is None,
      "one checkpoint has no std")
table(["--out", path("table_f"), f"{a}=tupe", "--matrices", "tupe_term"], 0, "| tupe | tupe_term | 1 x 4 |",
      "--matrices")
check("probe_logits" not in open(path("table_f/table.md")).read(), "--matrices keeps only the named matrix")
table(["--out", path("table_x"), f"{a}=mixed", f"{r}=mixed"], 1, "missing from some of its checkpoints",
      "a label over two presets")
table(["--out", path("table_x"), path("nothing") + "=x"], 1, "no such run directory or checkpoint", "missing run")
table(["--out", path("table_x"), work + "=x"], 1, "no model.safetensors in this run directory", "a folder without a model")
table(["--out", path("table_x"), f"{a}=a/b"], 1, "the label may hold only", "bad label")
table(["--out", os.path.join(a, "sub"), a], 1, "cannot create it", "an --out under a file")
table(["--out", path("table_x"), "--app", path("nothing"), a], 1, "not an executable", "bad --app")

# ---- malformed and mismatched checkpoints ----------------------------------------------------
out = ["--out", path("bad")]
run(["--checkpoint", path("missing.safetensors"), *out], 1, "missing.safetensors: no such checkpoint file", "missing")
with open(path("text.safetensors"), "w") as f:
    f.write("this is not a checkpoint\n")
run(["--checkpoint", path("text.safetensors"), *out], 1, "text.safetensors", "not safetensors")
raw = open(a, "rb").read()
with open(path("cut.safetensors"), "wb") as f:
    f.write(raw[:len(raw) // 2])
run(["--checkpoint", path("cut.safetensors"), *out], 1, "cut.safetensors", "truncated")
tensors, meta = read_safetensors(a)
write_safetensors(path("noconfig.safetensors"), tensors, {"format": "pt"})
run(["--checkpoint", path("noconfig.safetensors"), *out], 1, "no 'engine.model_config'", "no config")
cfg = json.loads(meta["engine.model_config"])
for key, value, expect, what in (
        ("hidden_size", 64, "bert.embeddings.token", "config width differs from the weights"),
        ("num_layers", 3, "bert.encoder.layer.2", "config has more layers than the weights"),
        ("preset", "bert_a", "is not part of the model its config describes", "TUPE weights under a bert_a config"),
        ("num_heads", 5, "num_heads", "invalid config")):
    bad = dict(cfg)
    if key == "preset":
        bad["position"] = dict(cfg["position"], preset=value)
    else:
        bad[key] = value
    write_safetensors(path("mismatch.safetensors"), tensors, dict(meta, **{"engine.model_config": json.dumps(bad)}))
    run(["--checkpoint", path("mismatch.safetensors"), *out], 1, expect, what)
del tensors["bert.position.cls_theta"]
write_safetensors(path("lacking.safetensors"), tensors, meta)
run(["--checkpoint", path("lacking.safetensors"), *out], 1, "bert.position.cls_theta", "a missing tensor")
run(["--checkpoints", a, r, *out], 1, "another model than", "--checkpoints of two models")
run(["--checkpoint", a, "--max-positions", "64", *out], 1, "--max-positions 64 exceeds the checkpoint's max_positions 32",
    "too many positions")
run(["--checkpoint", a, "--probe-ids", "3,50", *out], 1, "probe token id 50 is outside the vocabulary [0, 50)",
    "probe id")
run(["--checkpoints", a, "--head", "4", *out], 1, "--head 4 but the model has 4 heads", "head out of range")
run(["--checkpoints", a, "--matrix", "rpe_dot", *out], 1, "preset tupe_a has tupe_term, probe_logits", "unknown matrix")

# ---- bad command lines -----------------------------------------------------------------------
run(["--out", path("x")], 2, "--checkpoint or --checkpoints is required", "no checkpoint")
run(["--checkpoint", a], 2, "--out is required", "no out")
run(["--checkpoint", a, "--checkpoints", b, *out], 2, "not both", "both modes")
run(["--checkpoint", a, "--head", "1", *out], 2, "--matrix and --head go with --checkpoints", "head without evolution")
run(["--checkpoint", a, "--max-positions", "x", *out], 2, "--max-positions expects an integer >= 2, got 'x'", "bad int")
run(["--checkpoint", a, "--bogus", *out], 2, "unknown argument '--bogus'", "unknown flag")
run(["--checkpoints", "--out", path("x")], 2, "--checkpoints needs at least one value", "empty --checkpoints")
run(["--checkpoint", a, "--range", "1,0", *out], 2, "--range expects MIN < MAX, got '1,0'", "empty range")
run(["--checkpoint", a, "--range", "0.5", *out], 2, "--range expects MIN,MAX, got '0.5'", "one-sided range")
run(["--checkpoint", a, "--range", "x,1", *out], 2, "--range expects a number", "range not a number")
run(["--help"], 0, "identical-word probing", "help")

print("ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
