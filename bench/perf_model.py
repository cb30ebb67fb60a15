#!/usr/bin/python3
"""The GPU performance model, calibrated on the kernels the engine ran on an H200.

A step record of bench/record_step (CSV: every op of one training step with its minimum bytes,
FLOPs, shapes and kernel launches as name:blocks:threads) -> the predicted time of every launch,
op family and the step on one H200, sequences/s and MFU.

Every launch of a kernel is timed as

    floor + max(bytes / BW[pattern],                 memory traffic at the pattern's bandwidth
                steps x t_step,                      a thread's serial accesses (too few threads)
                philox_blocks / R_philox)            dropout's random numbers

(the attention softmax's warp kernel adds its Philox time to its memory time: measured, the two do
not overlap there), and every cuBLASLt GEMM by the time the H200 measured for its shape (nearest
shape by FLOPs, scaled, when it was not measured). Launches run back to back on one stream. The
bandwidths per access pattern (this tree's kernels each have their own: the warp-per-row softmax
and LayerNorm, the column sums, AdamW), the serial-access time, the floor and the GEMM times are
fitted to ncu's kernel times of the commits measured on the H200 (5d401cc, and 3928985 with this
tree's kernels; bench/perf_data/, ../shared/data/gpu/): `--calibrate` refits them and `--check`
shows the fit. ncu times each kernel with cold caches; a step reuses
what the previous kernels left in the 50 MB L2, which the `step` mode models with an L2
bandwidth and serial-access time for launches whose bytes fit (fitted to the measured steps).

usage:
  perf_model.py STEP.csv --batch B [--label NAME] [--top N] [--mode step|cold] [--strict]
                 --strict: exit 1 when a launch of fewer than 32 threads is priced as carrying
                 its op's traffic (a serial walk: a kernel the model does not know as the small
                 pass it is); for this tree's records, whose kernels all fill a warp or are aux
  perf_model.py --calibrate      refit bench/perf_data/h200_fit.json from the measured commits
  perf_model.py --check          the measured commits: model against measurement, per family
  perf_model.py --import-ncu NCU.csv OUT.csv.xz   one step of an ncu run for bench/perf_data
"""
import argparse
import collections
import csv
import io
import json
import lzma
import math
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "perf_data")
FIT = os.path.join(DATA, "h200_fit.json")

PEAK_BF16 = 989e12      # H200 dense bf16 tensor-core peak (MFU denominator)
HBM = 4.8e12            # H200 HBM3e, the spec sheet
L2_BYTES = 50e6         # H100/H200 L2
PHILOX_WORDS = 4        # words per Philox block
ATTENTION_DRAWS = 8     # attention's dropout: 16-bit uniforms, 8 a block (ops/dropout.h)
# The fused attention kernels' tensor-core rate: an assumption until a GPU measures them (WMMA
# tiles through shared memory, no asynchronous copies: about a third of the dense peak)
FLASH_FLOPS = 330e12
# The fused kernels' products, as multiples of B H Tq Tk D (2 per product they compute):
# flash_backward_bias (only with a bias's gradient) makes S and dP_d again for dbias;
# flash_backward_q_bias (from 2026-12-06, where a bias's gradient is wanted) makes S, dP_d and dQ
# once for both: flash_backward_q's products, the bias kernel's none
FLASH_PRODUCTS = {"flash_forward": 4, "flash_backward_kv": 8, "flash_backward_q": 6,
                  "flash_backward_bias": 4, "flash_backward_q_bias": 6}
# ... and with Shaw's relative vectors A (R, D) (a 16-bit 2-D tensor among the launch's), as
# multiples of B H Tq R D: the forward's q A^T and W A, flash_backward_q's q A^T, dout A^T and
# drel A (the kv and bias kernels read the first two's rows); both terms assumed (Shaw's presets)
FLASH_REL_PRODUCTS = {"flash_forward": 4, "flash_backward_q": 6}

# The measured commits' steps (pretrain_app --time, bf16, B = 32, dropout on: 5d401cc's in
# ../shared/data/gpu/engine_steps.log, 3928985's in bench/perf_data/h200_3928985_steps.log) and
# ncu runs (5d401cc: one step in compact form; 3928985: ncu's own CSV of record_step's two steps,
# the recorded one aligned at its end).
MEASURED = {
    "5d401cc/base": {"record": "record_5d401cc_base.csv.xz", "ncu": "h200_5d401cc_base_ncu.csv.xz",
                     "step_ms": 95.489, "batch": 32, "label": "BERT-Base TUPE-R, s128"},
    "5d401cc/large": {"record": "record_5d401cc_large.csv.xz", "ncu": "h200_5d401cc_large_ncu.csv.xz",
                      "step_ms": 1161.322, "batch": 32, "label": "BERT-Large TUPE-R, s512"},
    "3928985/base": {"record": "record_3928985_base.csv.xz",
                     "ncu_raw": "h200_3928985_base_ncu_raw.csv.xz",
                     "step_ms": 12.147, "batch": 32, "label": "BERT-Base TUPE-R, s128"},
    "3928985/large": {"record": "record_3928985_large.csv.xz",
                      "ncu_raw": "h200_3928985_large_ncu_raw.csv.xz",
                      "step_ms": 114.212, "batch": 32, "label": "BERT-Large TUPE-R, s512"},
}

DTYPE_BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "i32": 4, "i64": 8, "u8": 1}


def open_text(path):
    return io.TextIOWrapper(lzma.open(path), encoding="utf-8") if path.endswith(".xz") else open(path)


def tensors(shape):
    """'(32, 128, 768) bf16 (768) f32' -> [((32, 128, 768), 'bf16'), ((768,), 'f32')]."""
    out = []
    for dims, dt in re.findall(r"\(([^)]*)\)\s+(\w+)", shape):
        d = tuple(int(x) for x in dims.split(",") if x.strip())
        out.append((d, dt))
    return out


def numel(dims):
    return math.prod(dims) if dims else 1


def gemm_key(shape):
    """The GEMM's measured-shape key: m n k batch dtype transposes (beta, c_f32 left out)."""
    m = re.search(r"m(\d+) n(\d+) k(\d+) batch(\d+) (\w+)", shape)
    if not m:
        return None
    ta, tb = " Ta" in shape, " Tb" in shape
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5), ta, tb)


# ---- what each kernel does: its access pattern, its bytes, its serial steps, its latency class ---
# Patterns (fitted bandwidths): vec (16-byte vectors, coalesced), coalesced (one element a thread,
# coalesced), strided_contig / strided_perm (5d401cc's StridedIndexer with 64-bit divides per dim
# per element, on contiguous / permuted layouts), rowblock (a block of up to 256 threads per row,
# scalar loads: 5d401cc's softmax, layer_norm, and cross_entropy), dropout_old (4 scalar stores a
# thread), aux (a tiny second pass: the floor). Latency classes (fitted time per serial step of
# a thread): sum_to_old (5d401cc's sum_to: one thread per output over its whole extent, 64-bit
# index math per element), scatter_old (5d401cc's scatter: every thread walks the whole index),
# simple (a loop of independent coalesced loads: the fit's source is 5d401cc's column partials;
# this tree's kernels use it).
def describe(name, op_row, launch, n_main):
    """-> (pattern, bytes, serial steps, latency class, philox blocks, 5d401cc softmax elements)
    of one launch."""
    d = describe5(name, op_row, launch, n_main)
    return d if len(d) == 6 else d + (0,)


def describe5(name, op_row, launch, n_main):
    op, shape = op_row["op"], op_row["shape"]
    ts = tensors(shape)
    nbytes = float(op_row["bytes"])
    threads = max(1, launch["blocks"] * launch["threads"])
    base = re.sub(r"<.*", "", name)
    share = nbytes / max(1, n_main)

    def steps(b, width):
        return b / (threads * width)

    def elem(t):
        return DTYPE_BYTES.get(t[1], 4)

    # gathers and scatters touch the rows they name, not the whole table the record counts
    if op in ("gather_rows", "scatter_add_rows") and len(ts) >= 3:
        rows_bytes = numel(ts[2][0] if op == "gather_rows" else ts[0][0]) * elem(ts[0])
        share = (2 * rows_bytes + numel(ts[1][0]) * elem(ts[1])) / max(1, n_main)

    # 5d401cc's kernels (the measured commit)
    if base == "sum_to_kernel":
        n_red = numel(ts[0][0]) / max(1, numel(ts[1][0]))
        return "coalesced", nbytes, n_red, "sum_to_old", 0
    if base == "scatter_add_rows_cols":
        return "coalesced", share, ts[1][0][0] if ts[1][0] else 1, "scatter_old", 0
    if base in ("copy_kernel", "binary_strided", "unary_strided"):
        contig = base == "copy_kernel" and re.search(r"copy_kernel<(\w+), (\w+)>", name) and \
            re.search(r"copy_kernel<(\w+), (\w+)>", name).group(1) != re.search(
                r"copy_kernel<(\w+), (\w+)>", name).group(2)
        return ("strided_contig" if contig else "strided_perm"), share, 0, "simple", 0
    if base in ("fill_kernel", "add_kernel"):
        return "strided_contig", share, 0, "simple", 0
    if base in ("softmax_forward_rows", "softmax_backward_rows") and \
            op in ("attention_softmax", "attention_softmax_backward") and dropout_on(ts):
        # 5d401cc drew a whole Philox block per element and computed each logit three times:
        # timed by its elements (a rate of its own), not by the Philox rate of the others
        return "rowblock", share, 0, "simple", 0, numel(ts[0][0])
    if base in ("softmax_forward_rows", "softmax_backward_rows", "layer_norm_forward_rows",
                "layer_norm_backward_rows", "log_softmax_forward_rows", "log_softmax_backward_rows",
                "cross_entropy_rows", "cross_entropy_backward_rows"):
        return "rowblock", share, 0, "simple", 0
    if base == "philox_blocks":
        return "dropout_old", share, 0, "simple", numel(ts[0][0]) / PHILOX_WORDS
    if base in ("layer_norm_param_partials", "bias_gelu_backward_chunks"):
        x = ts[0][0]
        rows = numel(x) / max(1, x[-1])  # a thread: its column over rows / 64 rows, 2 loads a row
        return "coalesced", share, 2 * rows / min(rows, 64), "simple", 0
    if base == "sum_chunks_in_order":  # a thread: its column's 64 chunk sums
        return "aux", 0.0, 64, "simple", 0
    if base == "bias_gelu_rows":  # a thread per column, rows over the grid: scalar, coalesced
        return "coalesced", share, 0, "simple", 0
    if base in ("unscale_check_finish", "cross_entropy_total", "column_sums_chunks",
                "sum_to_chunks", "merge_key_runs", "adamw_resolve", "lamb_resolve"):
        # (the optimizers' *_resolve: one thread turning the step block's scalars into the
        # update's, before the update's grid)
        return "aux", 0.0, 0, "simple", 0
    # this tree's kernels (by the names record_step gives their launches)
    if base in FLASH_PRODUCTS:  # tensor-core work; the forward draws a Philox block per 8
        # elements (attention's rule: a 16-bit uniform each, ops/dropout.h) when it writes keep
        # bits (dropout on: the record lists mask_bits), the backward reads them
        q, k = ts[0][0], ts[1][0]
        elems = numel(q[:3]) * k[2]
        drawn = base == "flash_forward" and any(t[1] == "u8" for t in ts)
        nb = share
        kernels = op_row.get("kernels", "")
        if base == "flash_backward_q" and "flash_bias_sum" in kernels and \
                "flash_backward_bias" not in kernels:
            # records before 2026-12-06: dS added into the group's f32 partial of dbias, read and
            # written once per batch entry (the group's first only written)
            groups = launch["blocks"] / max(1, math.ceil(q[2] / 64) * q[1])
            nb += 8 * elems - 4 * groups * numel(q[1:3]) * k[2]
        steps = FLASH_PRODUCTS[base] * elems * q[3]
        rel = [t[0] for t in ts if len(t[0]) == 2 and t[1] in ("bf16", "f16")]
        if rel:
            steps += FLASH_REL_PRODUCTS.get(base, 0) * numel(q[:3]) * rel[0][0] * q[3]
        return "flash", nb, steps, "simple", elems / ATTENTION_DRAWS if drawn else 0
    if base == "binary_bcast":  # 16-byte vectors, the broadcast operand a row or a value
        return "vec", share, 0, "simple", 0
    if base in ("bucket_lookup_fwd", "cls_reset_fwd"):  # 16-byte stores, coalesced index reads
        return "vec", share, 0, "simple", 0
    if base == "bucket_lookup_partials":  # grad (C, N) and the index once. N % 4 == 0: a thread
        # step is 4 consecutive positions (their indices two 16-byte loads, their values one
        # vector, 16 bytes in f32), every 128th group of the piece: "vec"; else one position a
        # step, scalar coalesced. Steps: the groups a thread of a piece walks (the grid is pieces x
        # C x groups of 32 buckets; every block of a piece walks all of it)
        g, idx = ts[0], ts[1]
        n = numel(idx[0])
        nb = numel(g[0]) * elem(g) + n * elem(idx)
        width = 4 if n % 4 == 0 else 1
        table = ts[2][0] if len(ts) >= 3 and len(ts[2][0]) == 2 else None
        per_piece = table[1] * math.ceil(table[0] / 32) if table else 1
        pieces = max(1, launch["blocks"] // per_piece)
        return ("vec" if width == 4 else "coalesced"), nb, \
            math.ceil(n / (pieces * launch["threads"] * width)), "simple", 0
    if base == "bucket_lookup_sum":  # a warp per output over its pieces
        pieces = min(512, max(1, math.ceil(numel(ts[1][0]) / 2048)))
        return "aux", 0.0, math.ceil(pieces / 32), "simple", 0
    if base == "add_rows_vec":  # a distinct-row scatter: each gradient row read, its table row
        # read and written, 16-byte vectors
        g = ts[0]
        return "vec", 3 * numel(g[0]) * elem(g), 0, "simple", 0
    if base in ("untied_bias_fwd", "untied_bias_bwd"):  # T a multiple of 16 bytes of out's
        # (dout's) type: a thread per 16-byte vector of a (T, T) row, the big streams (add read and
        # out written; dout read and dadd written) 16-byte vectors, P's / dP's (T + 2)-long rows
        # scalar but coalesced (2 of 10 bytes an element in the bf16-product f32 runs): "vec";
        # else a thread an element, scalar coalesced
        big = ts[-1] if base == "untied_bias_fwd" else ts[0]
        width = max(1, 16 // elem(big))
        vec = bool(big[0]) and big[0][-1] % width == 0
        return ("vec" if vec else "coalesced"), share, 0, "simple", 0
    if base == "cls_reset_sums":  # a block per channel: its first row and column
        return "aux", 0.0, math.ceil(max(ts[0][0][1:]) / launch["threads"]), "simple", 0
    if base == "cross_entropy_online":  # a block per row, one pass in 8-element vectors with the
        # block reductions: the measured warp-per-row softmax's rate (the closest measured kernel;
        # 5d401cc's and 3928985's two-pass scalar cross_entropy_rows is "rowblock")
        return "softmax_warp", share, 0, "simple", 0
    if base == "cross_entropy_backward_vec":  # elementwise over (N, C), 16-byte vectors
        return "vec", share, 0, "simple", 0
    if base == "flash_bias_sum":  # the G groups' f32 partials of dbias (H, Tq, Tk) read, dbias
        # written (and read, when accumulating): G from flash_backward_bias's grid (Tk / 64,
        # Tq / 64, H G); the op's average share before 2026-12-06
        q = ts[0][0]
        dbias = [t[0] for t in ts if len(t[0]) == 3 and t[1] == "f32"][-1]
        tiles = math.ceil(q[2] / 64) * math.ceil(dbias[2] / 64) * q[1]
        bias_blocks = [l["blocks"] for l in op_row["launch_list"]
                       if l["kernel"].startswith("flash_backward_bias")]
        groups = max(1, bias_blocks[0] // tiles) if bias_blocks else 1
        nb = (groups + 2) * numel(dbias) * 4
        return "vec", nb, steps(nb, 4), "simple", 0
    if base == "flash_rowdot":  # records before 2026-12-06 (D_i is flash_backward_q's since)
        return "vec", share, steps(share, 4), "simple", 0
    if base in ("softmax_forward_warp", "softmax_backward_warp"):
        philox = numel(ts[0][0]) / PHILOX_WORDS if op == "attention_softmax" and dropout_on(ts) else 0
        return "softmax_warp", share, 0, "simple", philox
    if base == "layer_norm_backward_warp" and op == "layer_norm_backward" and len(ts) >= 6:
        # what it moves, not a share of the op: x, dy and the statistics read, dx written (the
        # parameter gradients are layer_norm_params', which reads x and dy a second time)
        x_b = numel(ts[0][0]) * elem(ts[0])
        return "ln_warp", 3 * x_b + 2 * numel(ts[2][0]) * elem(ts[2]), 0, "simple", 0
    if base == "layer_norm_params" and op == "layer_norm_backward" and len(ts) >= 6:
        # column sums of x and dy (with the statistics): both read again
        return "colsum", 2 * numel(ts[0][0]) * elem(ts[0]) + 2 * numel(ts[2][0]) * elem(ts[2]), \
            0, "simple", 0
    if base in ("layer_norm_forward_warp", "layer_norm_backward_warp"):
        return "ln_warp", share, 0, "simple", 0
    if base in ("dropout_add_layer_norm_warp", "dropout_add_layer_norm_backward_warp"):
        # the residual join: the warp-per-row LayerNorm's pattern (no measurement of its own yet)
        # and the hidden dropout's Philox blocks, one per 4 elements, drawn each way
        return "ln_warp", share, 0, "simple", numel(ts[0][0]) / PHILOX_WORDS
    if base == "dropout_add_layer_norm_params":  # the blocks' partial rows, summed per column
        return "aux", 0.0, 0, "simple", 0
    if base in ("sum_to_columns", "layer_norm_params", "column_sums_add") or \
            (base == "bias_gelu_backward" and op == "bias_gelu_backward"):
        return "colsum", share, 0, "simple", 0
    if base == "adamw_vec4":
        return "adamw", share, 0, "simple", 0
    if op == "dropout":
        return "vec", share, steps(share, 8), "simple", numel(ts[0][0]) / PHILOX_WORDS
    if base == "scatter_pieces":  # scatter_level from 2026-12-06: pieces of 32 gathered rows a
        # thread at the first level (8 rounds of dependent misses, 4 loads ahead), of 8 entries at
        # the later ones (2 rounds each); the measured level's time per round
        if launch.get("first", True):
            return "vec", share, 8, "scatter_level", 0
        return "aux", 0.0, 2, "scatter_level", 0
    if base == "scatter_level":  # pieces of 64 gathered rows a thread, 4 loads ahead: 16 rounds
        # of dependent misses (a key, then its row) a level; later levels are small
        if launch.get("first", True):
            return "vec", share, 16, "scatter_level", 0
        return "aux", 0.0, 16, "scatter_level", 0
    if base == "sort_key_tiles":  # 2048 keys a block through a bitonic network in shared memory:
        # the index read, a 64-bit key per entry written (the index is the op's second tensor,
        # after the gradient rows: until 2026-12-06 the rows' count was taken, 268 MB at
        # BERT-Large s512, 225 us for a launch the H200 ran in ~21 us)
        idx = ts[1] if len(ts) > 1 else ts[0]
        return "coalesced", (8.0 + elem(idx)) * numel(idx[0]), 66 * 2, "simple", 0
    if base in ("gather_rows_elems", "relative_gather_elems", "relative_scatter_elems",
                "adamw_elems", "unscale_check_partials", "copy_ids", "write_values",
                "relative_invert_index"):
        return "coalesced", share, steps(share, 4), "simple", 0
    return "vec", share, steps(share, 16), "simple", 0


def dropout_on(ts):
    """attention_softmax's record lists x, bias, mask, probs and, with dropout, dropped: three or
    more tensors of the scores' shape (the backward: probs, dpd, ds and dropped)."""
    return sum(1 for d, _ in ts if d == ts[0][0]) >= (3 if len(ts) > 3 else 99)


def parse_kernels(text):
    out = []
    for part in (text or "").split(";"):
        if not part:
            continue
        name, blocks, threads = part.rsplit(":", 2)
        out.append({"kernel": name, "blocks": int(blocks), "threads": int(threads)})
    return out


def read_record(path):
    rows = list(csv.DictReader(open_text(path)))
    for r in rows:
        r["launch_list"] = parse_kernels(r.get("kernels", ""))
    return rows


def read_ncu_raw(path):
    """ncu's own CSV (--metrics gpu__time_duration.sum --csv; .xz or plain) -> the kernels in
    launch order as read_ncu gives them: names without "void", "engine::" and arguments."""
    text = open_text(path).read()
    rows = list(csv.reader([l for l in text.splitlines() if l.startswith('"')]))
    hdr, data = rows[0], rows[1:]
    ik, iv, iu = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
    ig, ib = hdr.index("Grid Size"), hdr.index("Block Size")
    unit = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}

    def dims(s):
        return math.prod(int(x) for x in s.strip("()").split(","))

    out = []
    for x in data:
        name = x[ik].replace("void ", "").replace("engine::<unnamed>::", "").replace("engine::", "")
        out.append({"kernel": re.sub(r"\(.*", "", name), "blocks": dims(x[ig]), "threads": dims(x[ib]),
                    "ns": float(x[iv].replace(",", "")) * unit.get(x[iu], 1)})
    return out


def read_ncu(path):
    return [{"kernel": r["kernel"], "blocks": int(r["blocks"]), "threads": int(r["threads"]),
             "ns": float(r["ns"])} for r in csv.DictReader(open_text(path))]


def align(record, ncu):
    """Gives each op of the measured commit's record (which has launch counts, not names) its
    kernels from the ncu run of the same step, in order; a GEMM takes its nvjet kernel and any
    split-K reduction after it. Returns the record with launch_list and measured ns filled."""
    i = 0
    for r in record:
        ls = []
        for _ in range(int(r["launches"])):
            k = ncu[i]
            assert not is_gemm_kernel(k["kernel"]), f"op {r['op']} met GEMM kernel {k['kernel']} at {i}"
            ls.append(dict(k))
            i += 1
        for _ in range(int(r["gemms"])):
            k = ncu[i]
            assert is_gemm_kernel(k["kernel"]), f"GEMM of op {r['op']} met {k['kernel']} at {i}"
            g = dict(k, kernel="cublasLtMatmul")
            i += 1
            while i < len(ncu) and "splitKreduce" in ncu[i]["kernel"]:
                g["ns"] += ncu[i]["ns"]
                i += 1
            ls.append(g)
        r["launch_list"] = ls
    assert i == len(ncu), f"aligned {i} of {len(ncu)} kernels"
    return record


def align_tail(record, kernels):
    """A record_step record (launch names in its kernels column) against ncu's kernels of the run
    (a warm-up step, then the recorded one): the record aligned with a tail of the kernels, each
    launch keeping the record's name, blocks and threads with ncu's time. None if none aligns."""
    need = sum(int(r["launches"]) + int(r["gemms"]) for r in record)
    for extra in range(0, 200):  # split-K reductions after some GEMMs
        start = len(kernels) - need - extra
        if start < 0:
            return None
        try:
            rec = align([dict(r) for r in record], kernels[start:])
        except AssertionError:
            continue
        for r in rec:
            named = [l for l in parse_kernels(r.get("kernels", "")) if l["kernel"] != "cublasLtMatmul"]
            timed = [l for l in r["launch_list"] if l["kernel"] != "cublasLtMatmul"]
            if len(named) == len(timed):
                for l, n in zip(timed, named):
                    l.update(kernel=n["kernel"], blocks=n["blocks"], threads=n["threads"])
        return rec
    return None


def load_runs():
    """Every measured run: its record aligned with its ncu kernels."""
    runs = {}
    for key, m in MEASURED.items():
        rec = read_record(os.path.join(DATA, m["record"]))
        if "ncu" in m:
            runs[key] = align(rec, read_ncu(os.path.join(DATA, m["ncu"])))
        else:
            runs[key] = align_tail(rec, read_ncu_raw(os.path.join(DATA, m["ncu_raw"])))
            assert runs[key] is not None, f"{key}: the record and the ncu kernels do not align"
    return runs


def is_gemm_kernel(name):
    return name.startswith("nvjet") or "cublasLt" in name or "gemm" in name.lower()


# ---- the model -----------------------------------------------------------------------------------

class Model:
    def __init__(self, fit):
        self.f = fit
        self.gemm = {tuple(json.loads(k)): v for k, v in fit["gemm_ns"].items()}

    def gemm_ns(self, row):
        key = gemm_key(row["shape"])
        flops = float(row["flops"])
        if key in self.gemm:
            t = self.gemm[key]
        else:  # the measured shape nearest in FLOPs, at its rate
            best = min(self.gemm.items(), key=lambda kv: abs(math.log(max(1.0, gemm_flops(kv[0]))) -
                                                             math.log(max(1.0, flops))))
            t = best[1] * flops / max(1.0, gemm_flops(best[0]))
        # " bgrad" (cuBLASLt's bias-gradient epilogue: the sums over k of the operand its main
        # loop streams anyway, m f32 values out) is assumed to cost nothing measurable until a GPU
        # times it: the shape's measured time
        if " c_f32" in row["shape"] and key:  # C written in f32 instead of 16-bit once, and
            # read too with beta (added into a .grad; without: the step's first writer of it)
            m, n, _, b = key[:4]
            c_bytes = 8 if " beta" in row["shape"] else 4
            t += 1e9 * (m * n * b * (c_bytes - 2)) / (self.f["bw"]["vec"] * 1.0)
        elif " beta" in row["shape"] and key:  # C read (beta 1: added into) as well as written
            m, n, _, b = key[:4]
            t += 1e9 * (m * n * b * DTYPE_BYTES.get(key[4], 2)) / (self.f["bw"]["vec"] * 1.0)
        return max(t, self.f["floor_ns"])

    def launch_ns(self, row, launch, n_main, mode):
        if launch["kernel"] == "cublasLtMatmul":
            return self.gemm_ns(row)
        pattern, nbytes, steps, latency, philox, old_sm = describe(launch["kernel"], row, launch, n_main)
        warm = mode == "step" and nbytes <= L2_BYTES
        t_step = self.f["t_step_ns"][latency] * (self.f["l2_latency"] if warm else 1.0)
        if pattern == "aux":
            return self.f["floor_ns"] + steps * t_step
        if pattern == "flash":  # steps: the FLOPs; bytes at the vector rate
            return self.f["floor_ns"] + max(1e9 * nbytes / self.f["bw"]["vec"], 1e9 * steps / FLASH_FLOPS,
                                            1e9 * philox / self.f["philox_per_s"])
        bw = self.f["bw"][pattern] * (self.f["l2_speedup"] if warm else 1.0)
        if pattern == "softmax_warp":  # its Philox draws and its traffic add up (measured)
            return self.f["floor_ns"] + 1e9 * nbytes / bw + 1e9 * philox / self.f["philox_per_s"]
        t = max(1e9 * nbytes / bw, steps * t_step, 1e9 * philox / self.f["philox_per_s"],
                1e9 * old_sm / self.f["old_softmax_elems_per_s"])
        return self.f["floor_ns"] + t

    def memcpy_ns(self, row, mode):
        nbytes = float(row["bytes"])
        warm = mode == "step" and nbytes <= L2_BYTES
        return self.f["floor_ns"] + 1e9 * nbytes / (self.f["bw"]["vec"] * (self.f["l2_speedup"] if warm else 1))

    def op_ns(self, row, mode):
        ls = row["launch_list"]
        if not ls:
            return self.memcpy_ns(row, mode) if row["op"] == "copy" and float(row["bytes"]) > 0 else 0.0
        ls = mark_levels(ls)
        n_main = main_launches(row, ls)
        return sum(self.launch_ns(row, l, n_main, mode) for l in ls)


def mark_levels(ls):
    """The scatter's first level gathers the gradient rows; the later ones are small."""
    out, first = [], True
    for l in ls:
        if l["kernel"].startswith(("scatter_level", "scatter_pieces")):
            l = dict(l, first=first)
            first = False
        out.append(l)
    return out


def main_launches(row, ls):
    """The launches that share the op's bytes (not the small second passes)."""
    n = 0
    for l in ls:
        if l["kernel"] == "cublasLtMatmul":
            continue
        if describe(l["kernel"], row, l, 1)[0] != "aux":
            n += 1
    return max(1, n)


def gemm_flops(key):
    m, n, k, b = key[:4]
    return 2.0 * m * n * k * b


def family(row):
    return row["op"]


def fit_model():
    """Fits the model's constants to the measured commit's kernels (see the module doc)."""
    runs = load_runs()
    gemm = collections.defaultdict(list)
    floor_samples, serial = [], collections.defaultdict(list)
    launches = []  # (pattern, bytes, steps, latency class, philox, 5d401cc softmax elements, ns)
    for rec in runs.values():
        for r in rec:
            ls = mark_levels(r["launch_list"])
            n_main = main_launches(r, ls)
            for l in ls:
                if l["kernel"] == "cublasLtMatmul":
                    gemm[gemm_key(r["shape"])].append(l["ns"])
                    continue
                d = describe(l["kernel"], r, l, n_main)
                launches.append(d + (l["ns"],))
                if d[0] == "aux" and d[2] == 0 or d[1] < 64e3:
                    floor_samples.append(l["ns"])
    floor = statistics.median(floor_samples)
    # Serial steps: launches whose steps cannot all be in flight (a step each ~ one access
    # latency): time per step, by class.
    for pattern, nbytes, steps, latency, philox, old_sm, ns in launches:
        # steps that cannot be in flight together: 256 and more for the one-thread-per-output
        # kernels, 16 and more for the others
        if steps >= (256 if latency in ("sum_to_old", "scatter_old") else 16) and not philox \
                and not old_sm:
            serial[latency].append((ns - floor) / steps)
    t_step = {k: statistics.median(v) for k, v in serial.items()}
    # Philox: the fastest rate the measured dropout kernels show (a lower bound on the rate);
    # 5d401cc's softmax with dropout: its own rate per element.
    rates = [philox / ((ns - floor) * 1e-9) for pattern, *_, philox, _, ns in launches
             if philox > 1e5 and pattern != "softmax_warp"]
    philox_per_s = max(rates)
    sm = [(e, ns - floor) for *_, e, ns in launches if e > 0]
    old_softmax = sum(e for e, _ in sm) / (1e-9 * sum(t for _, t in sm))
    # Bandwidth per pattern over the launches that are neither latency nor Philox bound.
    by_pattern = collections.defaultdict(lambda: [0.0, 0.0])
    for pattern, nbytes, steps, latency, philox, old_sm, ns in launches:
        if pattern == "aux" or nbytes < 1e6 or old_sm:
            continue
        if pattern == "softmax_warp":  # memory time: what the Philox draws leave (they add up)
            by_pattern[pattern][0] += nbytes
            by_pattern[pattern][1] += max(0.1 * (ns - floor), ns - floor - 1e9 * philox / philox_per_s) * 1e-9
            continue
        t_other = max(steps * t_step.get(latency, 0.0), 1e9 * philox / philox_per_s)
        if t_other > 0.5 * (ns - floor):
            continue
        by_pattern[pattern][0] += nbytes
        by_pattern[pattern][1] += (ns - floor) * 1e-9
    bw = {p: b / t for p, (b, t) in by_pattern.items() if t > 0}
    # this tree's 16-byte kernels are timed at the bandwidth of 5d401cc's vectorised ones
    # (launch_elementwise): the only measured pattern of their kind.
    bw.setdefault("vec", bw.get("coalesced", 0.8 * HBM))
    for p in ("coalesced", "strided_contig", "strided_perm", "rowblock", "dropout_old",
              "softmax_warp", "ln_warp", "colsum", "adamw"):
        bw.setdefault(p, bw["vec"])
    fit = {
        "floor_ns": floor,
        "bw": bw,
        "t_step_ns": t_step,
        "philox_per_s": philox_per_s,
        "old_softmax_elems_per_s": old_softmax,
        "gemm_ns": {json.dumps(list(k)): statistics.median(v) for k, v in gemm.items()},
        "l2_speedup": 1.0,
        "l2_latency": 1.0,
    }
    # The warm step: an L2 bandwidth factor and serial-step factor for launches whose bytes fit
    # in L2, chosen to minimise the worst relative error of the two measured steps.
    best = None
    for speed in [1.0 + 0.1 * i for i in range(0, 31)]:
        for frac in [0.3 + 0.02 * i for i in range(0, 36)]:
            mdl = Model(dict(fit, l2_speedup=speed, l2_latency=frac))
            err = max(abs(sum(mdl.op_ns(r, "step") for r in runs[s]) / 1e6 / MEASURED[s]["step_ms"] - 1)
                      for s in runs)
            if best is None or err < best[0] - 1e-9:
                best = (err, speed, frac)
    fit["l2_speedup"] = best[1]
    fit["l2_latency"] = best[2]
    return fit, runs


def load_fit():
    if not os.path.exists(FIT):
        sys.exit(f"perf_model: no fit at {FIT}: run perf_model.py --calibrate")
    return json.load(open(FIT))


def check(fit, runs):
    mdl = Model(fit)
    worst_step, worst_family = 0.0, 0.0
    for key, rec in runs.items():
        m = MEASURED[key]
        measured = collections.defaultdict(float)
        predicted = collections.defaultdict(float)
        calls = collections.Counter()
        for r in rec:
            fam = family(r)
            measured[fam] += sum(l["ns"] for l in r["launch_list"])
            predicted[fam] += mdl.op_ns(r, "cold")
            calls[fam] += 1
        step = sum(mdl.op_ns(r, "step") for r in rec) / 1e6
        ncu_total = sum(measured.values()) / 1e6
        err = step / m["step_ms"] - 1
        worst_step = max(worst_step, abs(err))
        print(f"### {m['label']} at {key.split('/')[0]}: measured step {m['step_ms']:.1f} ms, model {step:.1f} ms "
              f"({100 * err:+.1f}%); ncu kernels {ncu_total:.1f} ms, model (cold) "
              f"{sum(predicted.values()) / 1e6:.1f} ms\n")
        print("| op family | calls | ncu (ms) | model, cold (ms) | error |")
        print("|---|---|---|---|---|")
        for fam in sorted(measured, key=lambda k: -measured[k]):
            if measured[fam] < 0.01 * ncu_total * 1e6 and fam not in ("sum_to",):
                continue  # families under 1% of the step: in the total only
            e = predicted[fam] / measured[fam] - 1 if measured[fam] else 0.0
            worst_family = max(worst_family, abs(e))
            print(f"| {fam} | {calls[fam]} | {measured[fam] / 1e6:.2f} | {predicted[fam] / 1e6:.2f} | "
                  f"{100 * e:+.0f}% |")
        print()
    print(f"worst step error {100 * worst_step:.1f}% (bound 25%), worst family error (families "
          f"of 1% of a step or more) {100 * worst_family:.1f}% (bound 40%)")
    return worst_step, worst_family


def serial_main_launches(rows):
    """The launches of a record's rows with fewer than 32 threads that the model prices as
    carrying their op's bytes (not aux): in this tree's kernels, always a kernel describe5 does
    not know."""
    bad = []
    for r in rows:
        ls = mark_levels(r["launch_list"])
        n_main = main_launches(r, ls)
        for l in ls:
            if l["kernel"] == "cublasLtMatmul" or l["blocks"] * l["threads"] >= 32:
                continue
            if describe(l["kernel"], r, l, n_main)[0] != "aux":
                bad.append(f"op {r['index']} ({r['op']}): {l['kernel']}:{l['blocks']}:{l['threads']}")
    return bad


def predict(rows, batch, label, top, mode, fit):
    mdl = Model(fit)
    by_op = collections.OrderedDict()
    total = {"ns": 0.0, "flops": 0.0, "bytes": 0.0, "launches": 0, "gemm_ns": 0.0}
    for r in rows:
        t = mdl.op_ns(r, mode)
        g = by_op.setdefault(r["op"], {"calls": 0, "ns": 0.0, "bytes": 0.0, "flops": 0.0, "launches": 0})
        g["calls"] += 1
        g["ns"] += t
        g["bytes"] += float(r["bytes"])
        g["flops"] += float(r["flops"])
        g["launches"] += len(r["launch_list"])
        total["ns"] += t
        total["flops"] += float(r["flops"])
        total["bytes"] += float(r["bytes"])
        total["launches"] += len(r["launch_list"])
        if r["op"] == "gemm":
            total["gemm_ns"] += t
    step = total["ns"] * 1e-9
    print(f"### {label} (predicted, {mode})\n")
    print("| predicted step | sequences/s | MFU | GEMM TFLOP | min. bytes | kernels + GEMMs | "
          "GEMMs | the rest |")
    print("|---|---|---|---|---|---|---|---|")
    rest = total["ns"] - total["gemm_ns"]
    print(f"| {step * 1e3:.2f} ms | {batch / step:,.0f} | {100 * total['flops'] / step / PEAK_BF16:.1f}% | "
          f"{total['flops'] / 1e12:.2f} | {total['bytes'] / 1e9:.2f} GB | {total['launches']:,} | "
          f"{total['gemm_ns'] / 1e6:.2f} ms | {rest / 1e6:.2f} ms ({rest / max(1.0, total['gemm_ns']):.2f}x) |\n")
    if top == 0:
        return step
    print("| op | calls | launches | time (ms) | share | GB |")
    print("|---|---|---|---|---|---|")
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1]["ns"])
    for name, g in ranked[:top]:
        print(f"| {name} | {g['calls']} | {g['launches']} | {g['ns'] / 1e6:.3f} | "
              f"{100 * g['ns'] / total['ns']:.1f}% | {g['bytes'] / 1e9:.2f} |")
    if ranked[top:]:
        t = sum(g["ns"] for _, g in ranked[top:])
        print(f"| (the other {len(ranked) - top} ops) | | | {t / 1e6:.3f} | {100 * t / total['ns']:.1f}% | |")
    print()
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--label", default="")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--mode", choices=("step", "cold"), default="step")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a launch of fewer than 32 threads is priced as its op's traffic")
    ap.add_argument("--import-ncu", nargs=2, metavar=("NCU_CSV", "OUT_CSV_XZ"),
                    help="the last step of an ncu run (from its last gradient-slab fill) in the "
                         "compact form of bench/perf_data")
    a = ap.parse_args()
    if a.import_ncu:
        raw = read_ncu_raw(a.import_ncu[0])
        starts = [i for i, k in enumerate(raw)  # the slab's fill: fill_kernel, or ConstOp since
                  if ("fill" in k["kernel"] or "ConstOp" in k["kernel"]) and k["blocks"] > 100000]
        if not starts:
            sys.exit(f"perf_model: {a.import_ncu[0]}: no gradient-slab fill marks a step's start")
        with lzma.open(a.import_ncu[1], "wt") as o:
            o.write("kernel,blocks,threads,ns\n")
            for k in raw[starts[-1]:]:
                o.write(f'"{k["kernel"]}",{k["blocks"]},{k["threads"]},{k["ns"]:.0f}\n')
        return
    if a.calibrate:
        fit, runs = fit_model()
        json.dump(fit, open(FIT, "w"), indent=1, sort_keys=True)
        print(f"wrote {FIT}: floor {fit['floor_ns']:.0f} ns, serial step "
              + ", ".join(f"{k} {v:.0f} ns" for k, v in sorted(fit["t_step_ns"].items()))
              + f" (x{fit['l2_latency']:.2f} in L2), Philox {fit['philox_per_s'] / 1e9:.1f} G blocks/s, "
              f"L2 bandwidth x{fit['l2_speedup']:.1f}, "
              + ", ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in sorted(fit["bw"].items()))
              + f", {len(fit['gemm_ns'])} GEMM shapes\n")
        check(fit, runs)
        return
    fit = load_fit()
    if a.check:
        ws, wf = check(fit, load_runs())
        sys.exit(0 if ws <= 0.25 and wf <= 0.40 else 1)
    if not a.csv or not a.batch:
        ap.error("give a step record and --batch (or --calibrate / --check)")
    if a.batch < 1:
        ap.error(f"--batch must be at least 1, got {a.batch}")
    rows = read_record(a.csv)
    predict(rows, a.batch, a.label, a.top, a.mode, fit)
    if a.strict:
        bad = serial_main_launches(rows)
        if bad:
            sys.exit(f"perf_model: {a.csv}: " + "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
                     + ": launches of fewer than 32 threads priced as their op's whole traffic (one thread "
                       "walking it); name such a kernel in describe5 (aux, or a pattern of its own)")


if __name__ == "__main__":
    main()
