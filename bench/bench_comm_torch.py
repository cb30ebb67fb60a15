#!/usr/bin/python3
"""The peer of bench_comm's all-reduce sweep: torch.distributed (gloo on CPU, nccl with --cuda)
all_reduce over the same sizes, on N local processes. Prints the same columns.

  /usr/bin/python3 bench/bench_comm_torch.py [--ranks 2] [--max-mb 256] [--iters 9] [--cuda]
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    backend = "nccl" if args.cuda else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=args.ranks)
    device = torch.device("cuda", rank) if args.cuda else torch.device("cpu")
    n = args.ranks
    if rank == 0:
        print(f"torch {torch.__version__}: {n} ranks, {device.type} tensors through {backend}\n")
        print(f"{'bytes':>12} {'time_ms':>10} {'algbw_GB/s':>12} {'busbw_GB/s':>12}")
    size = 4096
    while size <= int(args.max_mb * 1048576):
        t = torch.ones(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(t)
        times = []
        for _ in range(args.iters):
            dist.barrier()
            if args.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if args.cuda:
                torch.cuda.synchronize()
            ms = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            times.append(ms.item())
        ms = statistics.median(times)
        algbw = size / (ms * 1e-3) / 1e9
        if rank == 0:
            print(f"{size:12d} {ms:10.3f} {algbw:12.3f} {algbw * 2 * (n - 1) / n:12.3f}", flush=True)
        size *= 4
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--max-mb", type=float, default=256)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--cuda", action="store_true")
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.ranks)


if __name__ == "__main__":
    main()
