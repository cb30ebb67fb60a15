#!/usr/bin/python3
"""Runs several cases of one reference check in one Python process.

Importing PyTorch costs ~2.5 CPU seconds a process, as much as a tiny case's own work; the test
suite runs the reference cases in groups through this driver (tests/CMakeLists.txt), one CTest
entry per group, each case in a directory of its own under WORKDIR and reported on its own.

usage: run_cases.py SCRIPT WORKDIR [option ...] -- CASE [CASE ...]

SCRIPT is check_model.py or check_electra.py (anything with main(argv) -> exit status); the
options go to every case; a CASE is "preset[:option[:option ...]]", e.g. tupe_r:--pre-ln. Exit 0
when every case passed, 1 when one failed, 77 (CTest's "skipped") when PyTorch is missing.
"""
import importlib.util
import os
import re
import sys
import time
import traceback


def main(argv):
    if "--" not in argv or argv.index("--") < 2 or argv.index("--") == len(argv) - 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    split = argv.index("--")
    script, workdir, common, cases = argv[0], argv[1], argv[2:split], argv[split + 1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    spec = importlib.util.spec_from_file_location("reference_check", script)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # exits 77 without PyTorch
    except SystemExit as e:
        return e.code
    failed = []
    for case in cases:
        preset, *options = case.split(":")
        name = re.sub(r"[^A-Za-z0-9]+", "_", case).strip("_")
        args = ["--preset", preset, *options, *common, "--workdir", os.path.join(workdir, name)]
        print(f"==== {case}", flush=True)
        t0 = time.time()
        try:
            status = module.main(args)
        except SystemExit as e:  # argparse errors, run()'s failed command
            status = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - a crash fails the case, the others still run
            traceback.print_exc()
            status = 1
        print(f"==== {case}: {'passed' if status == 0 else f'FAILED (status {status})'} "
              f"in {time.time() - t0:.1f} s", flush=True)
        if status != 0:
            failed.append(case)
    if failed:
        print(f"{len(failed)} of {len(cases)} cases failed: {', '.join(failed)}")
        return 1
    print(f"all {len(cases)} cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
