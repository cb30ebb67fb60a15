#!/usr/bin/python3
"""Runs build/bin/bench_ops and the same cases in PyTorch (CPU, f32, same thread count) in one
run and prints a markdown table: our median ms, PyTorch's, and the ratio (>1: we are faster).
The GEMM rows also run with ENGINE_CPU_GEMM=openblas and =eigen (the other libraries behind the
CPU GEMM; the default is oneDNN's when the build found it), and the measured FMA peak is printed
with them. Prints which BLAS library PyTorch loaded (Debian's torch
calls the libblas.so.3 alternative: install libopenblas0-openmp so that it is OpenBLAS) and the
core type OpenBLAS runs: where it does not know the CPU and would fall back to older kernels,
OPENBLAS_CORETYPE is set for both sides (bench/openblas_core.py).

usage: /usr/bin/python3 bench/bench_cpu.py [--quick] [--threads N] [--rounds R]
           [--bin build/bin/bench_ops]
PyTorch is Debian's python3-torch; without it only our column is printed.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def time_ms(f):
    f()
    f()
    ms = []
    start = time.perf_counter()
    while len(ms) < 3 or (time.perf_counter() - start < 0.3 and len(ms) < 200):
        t0 = time.perf_counter()
        f()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def torch_cases(torch, quick):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    B, T, D, H, FF, V = (2 if quick else 8), 128, 768, 12, 3072, 30522
    rows = B * T

    def p(*s):
        return (torch.randn(*s, generator=g) * 0.02).requires_grad_()

    x = torch.randn(B, T, D, generator=g, requires_grad=True)
    w, b = p(FF, D), p(FF)
    q, k, v = (torch.randn(B, H, T, D // H, generator=g, requires_grad=True) for _ in range(3))
    pos = torch.randn(1, H, T, T, generator=g, requires_grad=True)
    lw, lb = torch.ones(D, requires_grad=True), torch.zeros(D, requires_grad=True)
    res = torch.randn(B, T, D, generator=g, requires_grad=True)
    b768 = p(D)
    s = torch.randn(B, H, T, T, generator=g)
    heads_view = x.detach().view(B, T, H, D // H).permute(0, 2, 1, 3)
    big = torch.randn(rows, FF, generator=g, requires_grad=True)
    b3072 = (torch.randn(FF, generator=g) * 0.02).requires_grad_()
    n = max(1, rows * 15 // 100)
    logits = torch.randn(n, V, generator=g, requires_grad=True)
    targets = torch.tensor([(i * 7919) % V for i in range(n)])
    SB = 2 if quick else 32
    g768 = torch.randn(SB * T, D, generator=g)
    g768t = torch.randn(D, SB * T, generator=g).t()
    g3072 = torch.randn(SB * T, FF, generator=g)
    heads = torch.randn(H, T, T, generator=g)
    tiny_bias = torch.randn(16 * T, 128, generator=g)
    sb = torch.randn(SB, H, T, T, generator=g)
    ga768, gw768 = torch.randn(rows, D, generator=g), torch.randn(D, D, generator=g)
    gw3072, ga3072 = torch.randn(FF, D, generator=g), torch.randn(rows, FF, generator=g)
    gdy = torch.randn(rows, FF, generator=g)
    gq, gk = torch.randn(B * H, T, D // H, generator=g), torch.randn(B * H, T, D // H, generator=g)
    gp = torch.randn(B * H, T, T, generator=g)
    # The tiny model's MLM decoder, tied to the word embedding: 15% of 16 x 128 tokens predicted.
    dh, de = torch.randn(307, 128, generator=g), torch.randn(V, 128, generator=g)
    dl = torch.randn(307, V, generator=g)
    gt, gt512, gt128 = (torch.randn(2048, 128, generator=g), torch.randn(512, 128, generator=g),
                        torch.randn(128, 128, generator=g))

    def attn():
        sc = q @ k.transpose(-1, -2) / (D // H) ** 0.5 + pos
        return torch.softmax(sc, -1) @ v

    def fwd(f):
        def run():
            with torch.no_grad():
                f()
        return run

    def fwd_bwd(f):
        def run():
            y = f()
            y.backward(torch.ones_like(y))
        return run

    return {
        "linear_fwd": fwd(lambda: F.linear(x, w, b)),
        "linear_fwd_bwd": fwd_bwd(lambda: F.linear(x, w, b)),
        "attention_fwd": fwd(attn),
        "attention_fwd_bwd": fwd_bwd(attn),
        "layer_norm_fwd": fwd(lambda: F.layer_norm(x, (D,), lw, lb, 1e-12)),
        "layer_norm_fwd_bwd": fwd_bwd(lambda: F.layer_norm(x, (D,), lw, lb, 1e-12)),
        "dropout_add_layer_norm_fwd_bwd": fwd_bwd(lambda: F.layer_norm(
            res + F.dropout(x + b768, 0.1, training=True), (D,), lw, lb, 1e-12)),
        "bias_dropout_add_layer_norm_fwd_bwd": fwd_bwd(lambda: F.layer_norm(
            res + F.dropout(x + b768, 0.1, training=True), (D,), lw, lb, 1e-12)),
        "permute_copy": fwd(lambda: heads_view.contiguous()),
        "softmax_fwd": fwd(lambda: torch.softmax(s, -1)),
        "gelu_fwd_bwd": fwd_bwd(lambda: F.gelu(big)),
        "dropout_fwd_bwd": fwd_bwd(lambda: F.dropout(big, 0.1, training=True)),
        "bias_gelu_fwd_bwd": fwd_bwd(lambda: F.gelu(big + b3072)),
        "bias_add_gelu_fwd_bwd": fwd_bwd(lambda: F.gelu(big + b3072)),
        "cross_entropy_fwd_bwd": fwd_bwd(lambda: F.cross_entropy(logits, targets)),
        # bench_ops' sum_to cases: the reductions of broadcast backwards, at B=32 (--quick: 2).
        "sum_to_bias768": fwd(lambda: g768.sum(0)),
        "sum_to_all": fwd(lambda: g768.sum()),
        "sum_to_bias768_t": fwd(lambda: g768t.sum(0)),
        "sum_to_bias3072": fwd(lambda: g3072.sum(0)),
        "sum_to_heads": fwd(lambda: heads.sum(0, keepdim=True)),
        "sum_to_tiny_bias": fwd(lambda: tiny_bias.sum(0)),
        "sum_to_batch": fwd(lambda: sb.sum(0, keepdim=True)),
        # bench_ops' GEMM cases (rows = B*T; attention: B*H matrices).
        "gemm (BT,768)x(768,768)^T": fwd(lambda: torch.mm(ga768, gw768.t())),
        "gemm (BT,768)x(768,3072)^T": fwd(lambda: torch.mm(ga768, gw3072.t())),
        "gemm (BT,3072)x(3072,768)^T": fwd(lambda: torch.mm(ga3072, gw3072.t().contiguous().t())),
        "gemm dW (3072,BT)x(BT,768)": fwd(lambda: torch.mm(gdy.t(), ga768)),
        "gemm dX (BT,3072)x(3072,768)": fwd(lambda: torch.mm(ga3072, gw3072)),
        "gemm QK^T (BH,128,64)x(64,128)": fwd(lambda: torch.bmm(gq, gk.transpose(1, 2))),
        "gemm PV (BH,128,128)x(128,64)": fwd(lambda: torch.bmm(gp, gq)),
        "gemm tiny (2048,128)x(128,512)^T": fwd(lambda: torch.mm(gt, gt512.t())),
        "gemm tiny (2048,128)x(128,128)^T": fwd(lambda: torch.mm(gt, gt128.t())),
        "gemm tiny decoder (307,128)x(30522,128)^T": fwd(lambda: torch.mm(dh, de.t())),
        "gemm tiny decoder dH (307,30522)x(30522,128)": fwd(lambda: torch.mm(dl, de)),
        "gemm tiny decoder dE (307,30522)^T x(307,128)": fwd(lambda: torch.mm(dl.t(), dh)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of both sides")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "bench_ops"))
    a = ap.parse_args()
    if a.threads is None or a.threads < 1 or a.rounds < 1:
        ap.error(f"--threads and --rounds: expected 1 or more, got {a.threads} and {a.rounds}")
    if not os.path.exists(a.bin):
        sys.exit(f"bench_cpu: {a.bin} not found; build first (tools/setup.sh)")
    # PyTorch loads OpenBLAS in this process, which reads OPENBLAS_CORETYPE as it loads: when
    # OpenBLAS would run this CPU on older kernels than it has (bench/openblas_core.py), start
    # again with the variable set; bench_ops' OpenBLAS columns run under the same setting.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import openblas_core
    if "BENCH_CPU_OPENBLAS_NOTE" not in os.environ:
        fair, note = openblas_core.fair_env()
        fair["BENCH_CPU_OPENBLAS_NOTE"] = note
        os.execve(sys.executable, [sys.executable] + sys.argv, fair)
    print("# " + os.environ["BENCH_CPU_OPENBLAS_NOTE"])
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    try:
        import torch
        torch.set_num_threads(a.threads)
        cases = torch_cases(torch, a.quick)
    except ImportError:
        torch, cases = None, {}
    # Rounds alternate the two sides (ours, then PyTorch's) so that both see the same minutes of a
    # VM whose speed drifts; the table gives each side's median and the median of the rounds'
    # ratios.
    outs, peers = [], []
    for _ in range(a.rounds):
        outs.append(subprocess.run([a.bin] + (["--quick"] if a.quick else []), env=env, check=True,
                                   capture_output=True, text=True).stdout)
        peers.append({k: time_ms(f) for k, f in cases.items()})
    other = {}  # library -> {gemm case: GFLOP/s}
    for lib in ("openblas", "eigen"):
        p = subprocess.run([a.bin, "--only", "gemm"] + (["--quick"] if a.quick else []),
                           env=dict(env, ENGINE_CPU_GEMM=lib), capture_output=True, text=True)
        other[lib] = {}
        if p.returncode != 0:  # a build without that library says so on stderr
            print(f"# ENGINE_CPU_GEMM={lib}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else 'failed'}")
            continue
        for line in p.stdout.splitlines():
            f = line.split("\t")
            if line.startswith("gemm") and len(f) >= 4:
                other[lib][f[0]] = float(f[2])
    def parse(text):  # bench_ops' rows in its order: {case: (ms, rate, unit, note)}; ms None: "-"
        rows = {}
        for line in text.splitlines():
            if not line.startswith("#") and not line.startswith("case\t"):
                f = line.split("\t")
                ms = None if f[1] == "-" else float(f[1])  # a ratio row (the small-GEMM kernel's)
                rows[f[0]] = (ms, float(f[2]), f[3], f[4].lstrip("# ") if len(f) > 4 else "")
        return rows
    per_round = [parse(text) for text in outs]
    for line in outs[-1].splitlines():
        if line.startswith("#"):
            print(line)

    def peer_key(name):  # PyTorch's case for ours: the same name, or its first word
        key = name if name in cases else name.split(" ")[0]
        return key if key in cases else None
    table = []  # (case, ours ms, ours rate, unit, note, PyTorch ms, speed-up)
    for name, (_, _, unit, note) in per_round[-1].items():
        rate = statistics.median(r[name][1] for r in per_round)
        if any(r[name][0] is None for r in per_round):
            table.append((name, None, rate, unit, note, None, None))
            continue
        ms = statistics.median(r[name][0] for r in per_round)
        key = peer_key(name)
        pm = statistics.median(p[key] for p in peers) if key else None
        # The speed-up: the median over the rounds of PyTorch ms / ours ms.
        q = statistics.median(p[key] / r[name][0] for p, r in zip(peers, per_round)) if key else None
        table.append((name, ms, rate, unit, note, pm, q))
    if torch is not None:
        peer_name = f"PyTorch {torch.__version__}"
        blas = sorted({os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps")
                       if "blas" in line.split()[-1].lower()})
        print(f"# PyTorch's BLAS: {', '.join(blas) or 'none loaded'}")
    else:
        peer_name = "PyTorch (not installed)"
    print(f"# threads: {a.threads}; rounds: {a.rounds}; peer: {peer_name}\n")
    print(f"| case | ours ms | ours rate | (OpenBLAS GEMM) | (Eigen GEMM) | {peer_name} ms | speed-up | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, ms, rate, unit, note, pm, q in table:
        ratio = f"{q:.2f}x" if q else "-"
        pms = f"{pm:.3f}" if pm else "-"
        o, e = (f"{other[lib][name]:.1f}" if name in other[lib] else "" for lib in ("openblas", "eigen"))
        rate_s = f"{rate:.3f} {unit}" if ms is None else f"{rate:.1f} {unit}"
        ms_s = "-" if ms is None else f"{ms:.3f}"
        print(f"| {name} | {ms_s} | {rate_s} | {o} | {e} | {pms} | {ratio} | {note} |")


if __name__ == "__main__":
    main()
