"""The end-to-end check scripts' shared ledger: check() prints "ok" or "FAIL" and a failure's
detail (its last 3000 characters), finish() prints the count and exits non-zero on any failure."""
import sys

failures = []


def check(ok, label, detail=""):
    print(("ok   " if ok else "FAIL ") + label)
    if not ok:
        failures.append(label)
        if detail:
            print("     " + detail.strip()[-3000:].replace("\n", "\n     "))
    return ok


def finish(what):
    print(f"\n{len(failures)} failure(s)" if failures else f"\nall {what} checks passed")
    sys.exit(1 if failures else 0)
