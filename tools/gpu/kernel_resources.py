#!/usr/bin/python3
"""What each CUDA kernel asks of an SM, without a GPU: ptxas's registers, spills and static shared
memory for sm_90 (H100 / H200), and the warps an SM can then hold by its registers.

The performance model (bench/perf_model.py) prices bytes, FLOPs and serial steps, not occupancy;
a kernel whose registers leave an SM few warps hides less latency than the model assumes. This
compiles the given .cu files (default: every ops/*.cu and engine/cuda/*.cu) for sm_90 with
`-Xptxas -v` (the CI builds PTX only, so ptxas never runs there) and prints one row per kernel
instantiation (its stack frame too: an array indexed at run time lives in local memory, not
registers). An SM has 65,536 registers and holds at most 64 warps; registers are given to a
warp in units of 256 (8 a thread), so a kernel of r registers a thread keeps at most
floor(65536 / (32 ceil(r / 8) 8)) warps an SM, fewer when its blocks do not divide that (the
"blocks of 4 warps" column: the flash kernels' 128 threads) or shared memory runs out first
(dynamic shared memory is not in ptxas's count: see each kernel's *_smem function).

usage: tools/gpu/kernel_resources.py [--match REGEX] [FILE.cu ...]
       (from the repository root; about 25 s a file on 2 cores)
"""
import argparse
import glob
import os
import re
import subprocess
import sys

NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
REGS_PER_SM, MAX_WARPS, UNIT = 65536, 64, 256


def warps_by_registers(regs):
    per_warp = -(-regs * 32 // UNIT) * UNIT
    return min(MAX_WARPS, REGS_PER_SM // per_warp) if per_warp else MAX_WARPS


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else names


def short(name):
    """void engine::cuda::(anonymous namespace)::flash_forward<__nv_bfloat16, 4>(...) ->
    flash_forward<bf16, 4> (namespaces dropped, in the template arguments too)."""
    name = name.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list: the first '(' outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    name = re.sub(r"\b[A-Za-z_]\w*::", "", name[:cut])
    name = re.sub(r"^void ", "", name)
    for long, s in (("__nv_bfloat16", "bf16"), ("__half", "f16"), ("float", "f32"),
                    ("double", "f64")):
        name = re.sub(r"\b" + long + r"\b", s, name)
    return name


def resources(path, root):
    cmd = [NVCC, "-std=c++20", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
           "-DENGINE_WITH_CUDA=1", "-I" + root, "-arch=sm_90", "-Xptxas", "-v", "-c", path,
           "-o", os.devnull]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"kernel_resources: nvcc failed on {path}:\n{run.stderr[-2000:]}")
    rows, cur = [], None
    for line in run.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_90'", line)
        if m:
            cur = {"mangled": m.group(1), "spill": 0, "stack": 0, "smem": 0, "regs": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            cur["stack"] = int(m.group(1))
            cur["spill"] = int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    for r, name in zip(rows, demangle([r["mangled"] for r in rows])):
        r["name"], r["file"] = short(name), os.path.relpath(path, root)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--match", default="", help="only kernels whose short name matches")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = a.files or sorted(glob.glob(os.path.join(root, "ops", "*.cu")) +
                              glob.glob(os.path.join(root, "engine", "cuda", "*.cu")))
    print("| kernel | file | registers | spill bytes | stack frame | static smem "
          "| warps an SM (registers) | blocks of 4 warps |")
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        for r in resources(os.path.abspath(f), root):
            if a.match and not re.search(a.match, r["name"]):
                continue
            w = warps_by_registers(r["regs"])
            print(f"| `{r['name']}` | {r['file']} | {r['regs']} | {r['spill']} | {r['stack']} | "
                  f"{r['smem']} | {w} | {w // 4} |")


if __name__ == "__main__":
    main()
