#!/usr/bin/env python3
"""Reads the per-rank logs of mpi4py's test suite (mpi4py-rank.sh) and
compares runs over btl's components with the reference runs.

  mpi4py_results.py summary LOG_DIR
      prints "passed=P failed=F skipped=S ranks=N" (a test counts as
      passed when it passed on every rank) and the failed tests.
  mpi4py_results.py compare REF_DIR OURS_DIR
      exits 1 (naming them) if a test that passed over the reference BTL
      did not pass over ours.
"""
import os
import re
import sys

# "test_x (test_mod.TestCase.test_x) ... ok" (Python 3.11); the outcome may
# follow on a later line when the test printed something.
LINE = re.compile(r"^(test\w*) \(([\w.]+)\)(?: \.\.\. (.*))?$")
OUTCOME = re.compile(r"^(ok|FAIL|ERROR|skipped .*|expected failure|unexpected success)$")


def read_rank(path):
    out = {}
    pending = None
    with open(path, errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = LINE.match(line)
            if m:
                name = m.group(2) if m.group(2).endswith(m.group(1)) else m.group(2) + "." + m.group(1)
                if m.group(3):
                    res = m.group(3).strip()
                    # output of the test itself may precede the outcome
                    tail = res.split(" ... ")[-1]
                    out[name] = kind(tail) if kind(tail) else "unknown"
                    pending = None if kind(tail) else name
                else:
                    pending = name
                continue
            if pending:
                tail = line.strip().split(" ... ")[-1]
                k = kind(tail)
                if k:
                    out[pending] = k
                    pending = None
    if pending:
        out[pending] = "unknown"
    return out


def kind(text):
    text = text.strip()
    if text == "ok" or text == "expected failure":
        return "passed"
    if text.startswith("skipped"):
        return "skipped"
    if text in ("FAIL", "ERROR", "unexpected success"):
        return "failed"
    return None


def load(d):
    ranks = sorted(f for f in os.listdir(d) if f.startswith("rank."))
    if not ranks:
        sys.exit(f"mpi4py_results: no rank logs in {d}")
    per = [read_rank(os.path.join(d, r)) for r in ranks]
    names = set()
    for p in per:
        names |= set(p)
    result = {}
    for n in names:
        ks = [p.get(n, "missing") for p in per]
        if all(k == "passed" for k in ks):
            result[n] = "passed"
        elif all(k in ("passed", "skipped") for k in ks) and "skipped" in ks:
            result[n] = "skipped"
        else:
            result[n] = "failed"
    return result, len(ranks)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "summary":
        res, n = load(sys.argv[2])
        c = {k: sum(1 for v in res.values() if v == k) for k in ("passed", "failed", "skipped")}
        print(f"passed={c['passed']} failed={c['failed']} skipped={c['skipped']} ranks={n}")
        for name in sorted(t for t, v in res.items() if v == "failed"):
            print(f"  failed: {name}")
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        ref, _ = load(sys.argv[2])
        ours, _ = load(sys.argv[3])
        lost = sorted(t for t, v in ref.items() if v == "passed" and ours.get(t) != "passed")
        for t in lost:
            print(f"  passes over the reference, not over btl: {t} ({ours.get(t, 'not run')})")
        if not ref:
            print("  the reference ran no test")
            return 1
        return 1 if lost else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
