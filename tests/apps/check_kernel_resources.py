#!/usr/bin/python3
"""tools/gpu/kernel_resources.py (standard library only):

  - the warps an SM holds by a kernel's registers (65,536 a SM, 8 a thread at a time, 64 warps at
    most), by hand;
  - demangled names shortened (namespaces dropped, in template arguments too; the dtypes named);
  - with nvcc at hand (/usr/local/cuda, or $NVCC): a made-up .cu of two kernels compiled for
    sm_90, each found with its registers (the one that keeps 64 accumulators live uses more) and
    the table printed; a source that does not compile ends with one message, exit 1.

Usage: check_kernel_resources.py WORKDIR"""
import importlib.util
import os
import shutil
import subprocess
import sys

work = sys.argv[1]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
path = os.path.join(root, "tools", "gpu", "kernel_resources.py")
spec = importlib.util.spec_from_file_location("kernel_resources", path)
kr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kr)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


for regs, warps in ((32, 64), (72, 28), (97, 19), (128, 16), (151, 13), (168, 12), (222, 9), (255, 8)):
    check(kr.warps_by_registers(regs) == warps,
          f"{regs} registers: {kr.warps_by_registers(regs)} warps an SM, want {warps}")
for long, want in (
        ("void engine::cuda::(anonymous namespace)::flash_forward<__nv_bfloat16, 4>"
         "(engine::cuda::(anonymous namespace)::Args<__nv_bfloat16>)", "flash_forward<bf16, 4>"),
        ("void engine::cuda::column_sums_kernel<1, 3, engine::cuda::(anonymous namespace)::"
         "PartSums<float, double> >(long, long)", "column_sums_kernel<1, 3, PartSums<f32, f64> >"),
        ("void engine::cuda::(anonymous namespace)::flash_bias_sum(float const*, float*, long, "
         "long, bool)", "flash_bias_sum"),
        ("void engine::cuda::adamw_vec4<__half>(float*)", "adamw_vec4<f16>")):
    check(kr.short(long) == want, f"short({long!r}) = {kr.short(long)!r}, want {want!r}")

nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
if os.path.exists(nvcc):
    src = os.path.join(work, "two.cu")
    with open(src, "w") as f:
        f.write("""
namespace demo {
__global__ void small_kernel(float* x) { x[threadIdx.x] *= 2.f; }
template <class T>
__global__ void wide_kernel(const T* x, T* y, int n) {
  T acc[64];
#pragma unroll
  for (int k = 0; k < 64; ++k) acc[k] = x[threadIdx.x + k * n];
  for (int it = 0; it < n; ++it)
#pragma unroll
    for (int k = 0; k < 64; ++k) acc[k] = acc[k] * acc[(k + 1) % 64] + T(1);
#pragma unroll
  for (int k = 0; k < 64; ++k) y[threadIdx.x + k * n] = acc[k];
}
template __global__ void wide_kernel<float>(const float*, float*, int);
}  // namespace demo
""")
    rows = {r["name"]: r for r in kr.resources(src, root)}
    check(set(rows) == {"small_kernel", "wide_kernel<f32>"}, f"kernels found: {sorted(rows)}")
    if set(rows) == {"small_kernel", "wide_kernel<f32>"}:
        check(0 < rows["small_kernel"]["regs"] < 32, f"small_kernel: {rows['small_kernel']}")
        check(rows["wide_kernel<f32>"]["regs"] >= 64, f"wide_kernel: {rows['wide_kernel<f32>']}")
    out = subprocess.run([sys.executable, path, src], capture_output=True, text=True)
    check(out.returncode == 0 and "| `wide_kernel<f32>` |" in out.stdout,
          f"the table: rc {out.returncode}\n{out.stdout}{out.stderr}")
    bad = os.path.join(work, "bad.cu")
    with open(bad, "w") as f:
        f.write("__global__ void broken( {\n")
    out = subprocess.run([sys.executable, path, bad], capture_output=True, text=True)
    check(out.returncode == 1 and "kernel_resources: nvcc failed on" in out.stderr and
          "Traceback" not in out.stderr, f"a bad source: rc {out.returncode}\n{out.stderr[-500:]}")
else:
    print(f"no nvcc at {nvcc}: the compile checks skipped (the arithmetic and names checked)")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("kernel_resources: all checks passed")
