#!/usr/bin/python3
"""bench/openblas_core.py, the benchmarks' fair-OpenBLAS setting (standard library only): with
OpenBLAS's answer and the CPU's flags stubbed, an SSE3 fallback on an AVX-512 CPU gets
OPENBLAS_CORETYPE=SkylakeX (Haswell on AVX2), a core OpenBLAS knows is left alone, a user's own
setting is kept (with a warning when it leaves an AVX-512 CPU on older kernels), a libblas.so.3
that is not OpenBLAS is said so; the real probe runs without an
error on this machine.

usage: check_openblas_core.py
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
from checks import check, finish  # noqa: E402
import openblas_core  # noqa: E402


def fair(core, flags, env=None):
    openblas_core.corename = lambda env=None: core
    openblas_core._cpu_flags = lambda: set(flags)
    return openblas_core.fair_env(env if env is not None else {})


real_corename, real_flags = openblas_core.corename, openblas_core._cpu_flags
env, note = fair("Prescott", {"avx2", "avx512f"})
check(env.get("OPENBLAS_CORETYPE") == "SkylakeX" and "detected Prescott" in note,
      "an SSE3 fallback on an AVX-512 CPU runs SkylakeX", f"{env} {note}")
env, note = fair("Prescott", {"avx2"})
check(env.get("OPENBLAS_CORETYPE") == "Haswell", "on an AVX2 CPU, Haswell", f"{env} {note}")
env, note = fair("SkylakeX", {"avx2", "avx512f"})
check("OPENBLAS_CORETYPE" not in env and "its own detection" in note,
      "a core OpenBLAS knows is left alone", f"{env} {note}")
env, note = fair("Prescott", {"sse3"})
check("OPENBLAS_CORETYPE" not in env, "a CPU without AVX2 keeps OpenBLAS's choice", f"{env} {note}")
env, note = fair("Prescott", {"avx512f"}, {"OPENBLAS_CORETYPE": "Zen"})
check(env.get("OPENBLAS_CORETYPE") == "Zen" and "set by the user" in note,
      "the user's own OPENBLAS_CORETYPE is kept", f"{env} {note}")
env, note = fair("Cooperlake", {"avx2", "avx512f"}, {"OPENBLAS_CORETYPE": "Haswell"})
check(env.get("OPENBLAS_CORETYPE") == "Haswell" and "WARNING" in note and "AVX-512" in note,
      "a user's AVX2 core on an AVX-512 CPU is kept, with a warning", f"{env} {note}")
env, note = fair("Cooperlake", {"avx2", "avx512f"}, {"OPENBLAS_CORETYPE": "SKYLAKEX"})
check(env.get("OPENBLAS_CORETYPE") == "SKYLAKEX" and "WARNING" not in note,
      "a user's AVX-512 core (any case) has no warning", f"{env} {note}")
env, note = fair("Haswell", {"avx2"}, {"OPENBLAS_CORETYPE": "Haswell"})
check("WARNING" not in note, "no warning on a CPU without AVX-512", f"{env} {note}")
env, note = fair(None, {"avx512f"})
check("OPENBLAS_CORETYPE" not in env and "not OpenBLAS" in note,
      "a libblas.so.3 that is not OpenBLAS is said so", note)

openblas_core.corename, openblas_core._cpu_flags = real_corename, real_flags
try:
    core = openblas_core.corename()
    _, note = openblas_core.fair_env()
    ok, detail = (core is None or isinstance(core, str)) and note.startswith("OpenBLAS core:"), note
except Exception as e:  # noqa: BLE001 -- any error is the failure being checked
    ok, detail = False, repr(e)
check(ok, "the real probe answers on this machine", detail)
print("# " + (detail if ok else ""))
finish("openblas_core")
