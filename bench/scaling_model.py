#!/usr/bin/python3
"""How a data-parallel BERT step scales with GPUs: the single-GPU step measured on the H200, plus
the gradient all-reduce in buckets overlapped with backward (engine::GradReducer's schedule),
priced by ring and tree cost models at NCCL's published bandwidths. docs/distributed.md, "What to
expect at scale", shows its tables and states every input.

usage: scaling_model.py [--models base,large] [--gpus 1,8,16,64,256] [--gpus-per-node 8]
                        [--nics 8] [--bucket-mb 25] [--accumulation 1] [--grad-dtype f32|bf16]
                        [--step engine|pytorch] [--knobs]
       scaling_model.py --check-bench-comm FILE     (the miniature check, docs/distributed.md)

The model of one optimizer step on n GPUs (weak scaling: each GPU keeps its batch):
  step(n) = k * T_fb + exposed(n) + T_opt
  T_fb      forward + backward of one micro-batch, the measured single-GPU step less AdamW;
            backward is 2/3 of it (twice the forward's GEMM FLOPs);
  k         gradient accumulation: only the last micro-batch's backward reduces (as pretrain_app);
  exposed   the all-reduce time left after backward ends. The flat gradient slab (parameters in
            the engine's order: embeddings, positions, layers 0..L-1, MLM head) is cut into
            buckets of --bucket-mb from its end. A parameter's gradient is complete when backward
            has passed every use of it: the head's at its start, layer l's after layers L-1..l,
            the word embedding (tied to the decoder), the position tables and everything shared by
            all layers at its end. Backward time is spread over the head and the layers by their
            FLOPs. Buckets go to one communication stream in order, each when its last gradient
            is complete and the previous bucket is done; exposed = end of the last - end of
            backward.
  all-reduce of S bytes over n GPUs, N = n / gpus_per_node nodes (NCCL picks the faster):
    ring  t = a_ring + S * 2(n-1)/n / busbw,   a_ring = a_node + 2 (N - 1) a_hop
    tree  t = a_tree + S * 2(n-1)/n / busbw,   a_tree = a_node + 2 ceil(log2 N) a_hop
    busbw = 370 GB/s within a node (NVLink 4: NCCL's effective ring rate, 450 GB/s line);
            across nodes min(370, nics * 48.5 GB/s) (NDR 400 Gb/s: 48-49 GB/s per NIC).
  efficiency(n) = step(1) / step(n); throughput = n * k * batch / step(n).
"""
import argparse
import math
import re
import sys

# ---- inputs -------------------------------------------------------------------------------------
# ../shared/data/gpu/README.md (H200, bf16 autocast, batch 32, dropout on, one step; 5d401cc):
MEASURED = {
    # model: (seq, batch, engine TUPE-R step ms, PyTorch eager step ms, engine AdamW ms per step)
    "base": (128, 32, 95.5, 29.0, 1.8),
    "large": (512, 32, 1161.0, 111.8, 5.4),
}
SIZES = {"base": dict(layers=12, hidden=768, heads=12, vocab=32768, positions=512),
         "large": dict(layers=24, hidden=1024, heads=16, vocab=32768, positions=512)}
BUSBW_NVLINK = 370e9   # B/s: NCCL's effective NVLink4 ring bus bandwidth (nccl-tests#212)
NIC_BW = 48.5e9        # B/s: one NDR 400 Gb/s NIC as NCCL reaches it (nccl-tests#267)
A_NODE = 15e-6         # s: an all-reduce's fixed cost within a node
A_HOP = 5e-6           # s: one network hop of the ring or tree
MLM_MASKED = 0.15      # the share of tokens the MLM head's decoder runs on


def bert_parameters(layers, hidden, heads, vocab, positions, preset="tupe_r"):
    """(name, numel, ready) in the engine's slab order; ready = the fraction of backward (0..1)
    after which the gradient is complete, and each part's share of backward's FLOPs."""
    d, f = hidden, 4 * hidden
    # backward FLOPs per token (proportional): a layer's GEMMs and attention at T = positions/4
    # (the FLOP split barely moves with T); the head: transform + decoder on the masked tokens
    layer_w = 12 * d * d + 2 * (positions // 4) * d
    head_w = d * d + MLM_MASKED * d * vocab
    total_w = layers * layer_w + head_w
    head_end = head_w / total_w

    def layer_end(l):  # backward reaches layer l after the head and layers L-1 .. l
        return head_end + (layers - l) * layer_w / total_w

    params = [("bert.embeddings.token", vocab * d, 1.0), ("bert.embeddings.norm.weight", d, 1.0),
              ("bert.embeddings.norm.bias", d, 1.0)]
    if preset.startswith("tupe"):
        params += [("bert.position.table", (positions + 2) * d, 1.0), ("bert.position.norm.weight", d, 1.0),
                   ("bert.position.norm.bias", d, 1.0), ("bert.position.uq.weight", d * d, 1.0),
                   ("bert.position.uq.bias", d, 1.0), ("bert.position.uk.weight", d * d, 1.0),
                   ("bert.position.uk.bias", d, 1.0)]
        if preset == "tupe_r":
            params.append(("bert.position.relative_bias", 32 * heads, 1.0))
    else:
        params.append(("bert.embeddings.position", positions * d, 1.0))
    for l in range(layers):
        r = layer_end(l)
        params += [(f"layer.{l}.attention.qkv.weight", 3 * d * d, r), (f"layer.{l}.attention.qkv.bias", 3 * d, r),
                   (f"layer.{l}.attention.out.weight", d * d, r), (f"layer.{l}.attention.out.bias", d, r),
                   (f"layer.{l}.attention_norm.weight", d, r), (f"layer.{l}.attention_norm.bias", d, r),
                   (f"layer.{l}.ffn.fc1.weight", f * d, r), (f"layer.{l}.ffn.fc1.bias", f, r),
                   (f"layer.{l}.ffn.fc2.weight", d * f, r), (f"layer.{l}.ffn.fc2.bias", d, r),
                   (f"layer.{l}.ffn_norm.weight", d, r), (f"layer.{l}.ffn_norm.bias", d, r)]
    params += [("mlm.transform.weight", d * d, head_end), ("mlm.transform.bias", d, head_end),
               ("mlm.norm.weight", d, head_end), ("mlm.norm.bias", d, head_end),
               ("mlm.decoder_bias", vocab, head_end)]
    return params


def buckets(params, bucket_bytes, elem_bytes):
    """GradReducer's buckets: from the slab's end, parameters added until a bucket reaches
    bucket_bytes. Returns [(bytes, ready)] in the order they are reduced."""
    out, cur_bytes, cur_ready = [], 0, 0.0
    for _, numel, ready in reversed(params):
        cur_bytes += numel * elem_bytes
        cur_ready = max(cur_ready, ready)
        if cur_bytes >= bucket_bytes:
            out.append((cur_bytes, cur_ready))
            cur_bytes, cur_ready = 0, 0.0
    if cur_bytes:
        out.append((cur_bytes, cur_ready))
    return out


def allreduce_s(nbytes, n, gpus_per_node=8, nics=8, busbw_node=BUSBW_NVLINK, nic_bw=NIC_BW,
                a_node=A_NODE, a_hop=A_HOP):
    """(seconds, algorithm) of one all-reduce of nbytes over n GPUs."""
    if n <= 1:
        return 0.0, "-"
    nodes = max(1, math.ceil(n / gpus_per_node))
    busbw = busbw_node if nodes == 1 else min(busbw_node, nics * nic_bw)
    traffic = nbytes * 2 * (n - 1) / n / busbw
    ring = a_node + 2 * (nodes - 1) * a_hop + traffic
    tree = a_node + 2 * math.ceil(math.log2(nodes)) * a_hop + traffic
    return (ring, "ring") if ring <= tree else (tree, "tree")


def overlap(bucket_list, backward_s, cost):
    """The communication stream's schedule: returns (exposed seconds, communication seconds)."""
    end, busy = 0.0, 0.0
    for nbytes, ready in bucket_list:
        t = cost(nbytes)
        end = max(end, ready * backward_s) + t
        busy += t
    return max(0.0, end - backward_s), busy


def step_model(model, n, args):
    seq, batch, engine_ms, torch_ms, adamw_ms = MEASURED[model]
    step_ms = engine_ms if args.step == "engine" else torch_ms
    t_opt = adamw_ms * 1e-3 if args.step == "engine" else adamw_ms * 1e-3 * torch_ms / engine_ms
    t_fb = step_ms * 1e-3 - t_opt
    backward = t_fb * 2 / 3
    elem = 4 if args.grad_dtype == "f32" else 2
    params = bert_parameters(**SIZES[model])
    bl = buckets(params, int(args.bucket_mb * 1048576), elem)
    cost = lambda b: allreduce_s(b, n, args.gpus_per_node, args.nics)[0]  # noqa: E731
    exposed, busy = overlap(bl, backward, cost) if n > 1 else (0.0, 0.0)
    k = args.accumulation
    one = k * t_fb + t_opt
    total = one + exposed
    algo = allreduce_s(25 << 20, n, args.gpus_per_node, args.nics)[1]
    return dict(model=model, seq=seq, batch=batch, n=n, step_s=total, exposed_s=exposed, comm_s=busy,
                efficiency=one / total, seq_per_s=n * k * batch / total, buckets=len(bl),
                grad_mb=sum(b for b, _ in bl) / 1048576, algorithm=algo)


def table(args):
    lines = []
    for model in args.models.split(","):
        if model not in MEASURED:
            sys.exit(f"scaling_model: --models: unknown model '{model}' (base, large)")
        seq, batch = MEASURED[model][:2]
        r1 = step_model(model, 1, args)
        lines.append(f"\n{model} s{seq}, batch {batch} per GPU x accumulation {args.accumulation}, "
                     f"{args.grad_dtype} gradients ({r1['grad_mb']:.0f} MiB, {r1['buckets']} buckets of "
                     f"{args.bucket_mb:g} MiB), single-GPU step: {args.step} ({r1['step_s'] * 1e3:.1f} ms)\n")
        lines.append("| GPUs | nodes | all-reduce | comm per step ms | exposed ms | step ms | efficiency | sequences/s |")
        lines.append("|---:|---:|---|---:|---:|---:|---:|---:|")
        for n in [int(x) for x in args.gpus.split(",")]:
            r = step_model(model, n, args)
            nodes = max(1, math.ceil(n / args.gpus_per_node))
            lines.append(f"| {n} | {nodes} | {r['algorithm']} | {r['comm_s'] * 1e3:.2f} | {r['exposed_s'] * 1e3:.2f} | "
                         f"{r['step_s'] * 1e3:.1f} | {100 * r['efficiency']:.1f}% | {r['seq_per_s']:,.0f} |")
    return "\n".join(lines)


def knobs(args):
    """Exposed communication and efficiency at 256 GPUs (and 16) as each knob changes."""
    out = ["| model | step | GPUs | NICs | bucket MiB | accumulation | gradients | exposed ms | efficiency |",
           "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    base = dict(vars(args))
    rows = []
    for model in ("base", "large"):
        for step in ("engine", "pytorch"):
            for n in (16, 256):
                for nics, mb, k, g in [(8, 25, 1, "f32"), (4, 25, 1, "f32"), (8, 4, 1, "f32"), (8, 100, 1, "f32"),
                                       (8, 25, 8, "f32"), (8, 25, 1, "bf16"), (4, 25, 1, "bf16")]:
                    a = argparse.Namespace(**dict(base, step=step, nics=nics, bucket_mb=mb, accumulation=k, grad_dtype=g))
                    r = step_model(model, n, a)
                    rows.append(f"| {model} | {step} | {n} | {nics} | {mb} | {k} | {g} | {r['exposed_s'] * 1e3:.2f} | "
                                f"{100 * r['efficiency']:.1f}% |")
    return "\n".join(out + rows)


# ---- the miniature check against bench_comm ------------------------------------------------------
def parse_bench_comm(text):
    m = re.search(r"bench_comm: (\d+) ranks?", text)
    if not m:
        sys.exit("scaling_model: --check-bench-comm: not bench_comm's output (no 'bench_comm: N ranks' line)")
    n = int(m.group(1))
    sweep = [(int(a), float(b)) for a, b in re.findall(r"^\s*(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s*$", text, re.M)]
    cfg = re.search(r"BERT step: (\d+) layers, hidden (\d+), (\d+) heads, batch (\d+) x (\d+) tokens, (\d+) "
                    r"parameters \([\d.]+ MiB of f32 gradients\), (\d+) buckets? of ([\d.]+) MiB", text)
    vocab = re.search(r"vocab (\d+)", text)
    rows = dict(re.findall(r"^(no communication|forward only|all-reduce in buckets, overlapped|one all-reduce after "
                           r"backward)\s+([\d.]+)", text, re.M))
    exposed = dict(re.findall(r"^(all-reduce in buckets, overlapped|one all-reduce after backward)\s+[\d.]+\s+([\d.]+)",
                              text, re.M))
    if not sweep or not cfg or "no communication" not in rows or len(exposed) < 2:
        sys.exit("scaling_model: --check-bench-comm: the output lacks the all-reduce sweep or the BERT step table "
                 "(run bench_comm without --skip-model)")
    return n, sweep, cfg, vocab, rows, exposed


def fit_alpha_beta(sweep, n):
    """Least squares of t = a + S * 2(n-1)/n / busbw over the sweep's sizes."""
    xs = [s * 2 * (n - 1) / n for s, _ in sweep]
    ys = [ms * 1e-3 for _, ms in sweep]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = max(0.0, my - slope * mx)
    return a, (1.0 / slope if slope > 0 else float("inf"))


def check_bench_comm(path):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"scaling_model: --check-bench-comm {path}: cannot read it ({e})")
    n, sweep, cfg, vocab, rows, exposed = parse_bench_comm(text)
    layers, hidden, heads, batch, seq, numel, nb, bucket_mb = cfg.groups()
    layers, hidden, heads, seq = int(layers), int(hidden), int(heads), int(seq)
    v = int(vocab.group(1)) if vocab else 8192
    params = bert_parameters(layers, hidden, heads, v, max(seq, 128))
    model_numel = sum(p for _, p, _ in params)
    bl = buckets(params, int(float(bucket_mb) * 1048576), 4)
    # the sizes a step reduces: fit over the sweep's points at or below the largest bucket
    biggest = max(b for b, _ in bl)
    near = [p for p in sweep if p[0] <= 4 * biggest] or sweep
    a, busbw = fit_alpha_beta(near, n)
    cost = lambda b: a + b * 2 * (n - 1) / n / busbw  # noqa: E731
    local_ms = float(rows["no communication"])
    fwd_ms = float(rows["forward only"]) if "forward only" in rows else local_ms / 3
    backward = (local_ms - fwd_ms) * 1e-3
    pred_over, busy = overlap(bl, backward, cost)
    pred_after, _ = overlap([(sum(b for b, _ in bl), 1.0)], backward, cost)
    meas_over = float(exposed["all-reduce in buckets, overlapped"])
    meas_after = float(exposed["one all-reduce after backward"])
    print(f"bench_comm: {n} ranks; the step's model: {layers} layers, hidden {hidden}, {model_numel:,} parameters "
          f"in {len(bl)} bucket(s) of {bucket_mb} MiB (bench_comm counted {int(numel):,} in {nb})")
    print(f"all-reduce fitted over {len(near)} sizes: a = {a * 1e3:.3f} ms, busbw = {busbw / 1e9:.2f} GB/s; "
          f"backward {backward * 1e3:.1f} ms (measured: step {local_ms:.1f} - forward {fwd_ms:.1f})")
    print("| mode | predicted exposed ms | measured exposed ms |")
    print("|---|---:|---:|")
    print(f"| buckets overlapped with backward | {pred_over * 1e3:.2f} | {meas_over:.2f} |")
    print(f"| one all-reduce after backward | {pred_after * 1e3:.2f} | {meas_after:.2f} |")
    return dict(n=n, alpha=a, busbw=busbw, backward=backward, predicted=(pred_over, pred_after),
                measured=(meas_over * 1e-3, meas_after * 1e-3), model_numel=model_numel, numel=int(numel))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="base,large")
    ap.add_argument("--gpus", default="1,8,16,64,256")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--nics", type=int, default=8, help="400 Gb/s NICs per node")
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--grad-dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--step", choices=("engine", "pytorch"), default="engine",
                    help="the single-GPU step: the engine's as measured, or PyTorch eager's")
    ap.add_argument("--knobs", action="store_true", help="the knobs' table instead")
    ap.add_argument("--check-bench-comm", metavar="FILE", help="bench_comm's output: predicted against measured")
    args = ap.parse_args()
    if args.bucket_mb <= 0 or args.accumulation < 1 or args.gpus_per_node < 1 or args.nics < 1:
        ap.error("--bucket-mb, --accumulation, --gpus-per-node and --nics must be positive")
    try:
        gpus = [int(x) for x in args.gpus.split(",")]
    except ValueError:
        ap.error(f"--gpus expects a comma-separated list of integers, got '{args.gpus}'")
    if any(g < 1 for g in gpus):
        ap.error("--gpus: every count must be >= 1")
    if args.check_bench_comm:
        check_bench_comm(args.check_bench_comm)
    elif args.knobs:
        print(knobs(args))
    else:
        print(table(args))


if __name__ == "__main__":
    main()
