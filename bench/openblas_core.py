"""The OpenBLAS core type for a fair PyTorch peer.

Debian's OpenBLAS 0.3.21 picks its kernels by CPU model, and a CPU newer than it (Intel Sapphire
and Emerald Rapids) falls back to its SSE3 "Prescott" kernels: PyTorch's f32 GEMMs ran ~5x
slower there (31 against 134 GFLOP/s for BERT's (1024,768) x (768,3072)^T on 2 cores) than with
OPENBLAS_CORETYPE=SkylakeX. OpenBLAS reads the variable when it loads, so a benchmark sets it in
the environment of the process that will load it. Used by bench/bench_cpu.py and bench_step.py.
"""
import os
import subprocess

# OpenBLAS's fallbacks below AVX2 (what it runs on a CPU it does not recognise).
_OLD_CORES = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Northwood",
              "Banias", "Sandybridge"}

# OpenBLAS's core types with AVX-512 kernels (lower case; OPENBLAS_CORETYPE is case-blind).
_AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}

_PROBE = ("import ctypes\n"
          "lib = ctypes.CDLL('libblas.so.3')\n"
          "lib.openblas_get_corename.restype = ctypes.c_char_p\n"
          "print(lib.openblas_get_corename().decode())\n")


def corename(env=None):
    """The core OpenBLAS (the libblas.so.3 alternative) picks under env; None if not OpenBLAS."""
    try:
        p = subprocess.run(["/usr/bin/python3", "-c", _PROBE], env=env, capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def _cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def fair_env(env=None):
    """(env, note): env with OPENBLAS_CORETYPE set when OpenBLAS would run this CPU on kernels
    older than the CPU's vector units (SkylakeX for AVX-512, Haswell for AVX2), and a note saying
    what was detected and chosen. A user's own OPENBLAS_CORETYPE is kept."""
    env = dict(os.environ if env is None else env)
    if env.get("OPENBLAS_CORETYPE"):
        user = env["OPENBLAS_CORETYPE"]
        note = f"OpenBLAS core: {user} (OPENBLAS_CORETYPE, set by the user)"
        if "avx512f" in _cpu_flags() and user.lower() not in _AVX512_CORES:
            # A machine image may set it (one of this project's VMs had OPENBLAS_CORETYPE=Haswell
            # in every shell on an AVX-512 CPU: PyTorch's tiny step 11.1k against 12.1k tokens/s).
            note += (" -- WARNING: this CPU has AVX-512 and that core's kernels do not use it: "
                     "the PyTorch peer runs slower than it could; unset OPENBLAS_CORETYPE for a "
                     "fair comparison")
        return env, note
    core = corename(env)
    if core is None:
        return env, "OpenBLAS core: (libblas.so.3 is not OpenBLAS)"
    flags = _cpu_flags()
    want = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None
    if core in _OLD_CORES and want:
        env["OPENBLAS_CORETYPE"] = want
        return env, (f"OpenBLAS core: {want} (OPENBLAS_CORETYPE; it detected {core}, older "
                     f"kernels than this CPU's, on its own)")
    return env, f"OpenBLAS core: {core} (its own detection)"
