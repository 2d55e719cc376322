#!/usr/bin/env python3
"""The summary scripts/test ends with: where the time went, the slowest tests, the
time per test binary, every failure by binary and case, and the totals on a line of
their own (`summary: N passed, N failed`). Exits 1 if anything failed or nothing ran.

Reads cargo-nextest's JUnit files (one per profile that ran), a tab-separated file of
other results (`binary<TAB>case<TAB>passed|failed<TAB>seconds`: the benchmarks'
smoke passes), and the doc tests' `cargo test --doc` output.

    python3 scripts/lib/test_summary.py --junit target/nextest/default/junit.xml \
        [--junit …] [--other F] [--doc F] [--times name=s,name=s] [--slowest 20]
"""

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET


def junit_results(path):
    """(binary, case, passed, seconds) for every test case of a nextest JUnit file."""
    if not os.path.exists(path):
        return []
    out = []
    for suite in ET.parse(path).getroot().iter("testsuite"):
        binary = suite.get("name", "?")
        for case in suite.iter("testcase"):
            failed = any(
                child.tag in ("failure", "error") for child in case
            )
            out.append((binary, case.get("name", "?"), not failed, float(case.get("time", "0"))))
    return out


def other_results(path):
    out = []
    if path and os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 4:
                out.append((parts[0], parts[1], parts[2] == "passed", float(parts[3])))
    return out


def doc_results(path):
    """(passed, failed, failing names) of `cargo test --doc` output."""
    passed = failed = 0
    names = []
    if not path or not os.path.exists(path):
        return passed, failed, names
    in_failures = False
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed", line)
        if m:
            passed += int(m.group(1))
            failed += int(m.group(2))
            in_failures = False
            continue
        if line.strip() == "failures:":
            in_failures = True
            continue
        if in_failures:
            m = re.match(r"^    (\S.* - .*\(line \d+\).*)$", line.rstrip("\n"))
            if m and m.group(1) not in names:
                names.append(m.group(1))
        # A crate whose doc tests did not build: cargo says so and counts nothing.
        if re.match(r"error: (doctest failed|could not compile|test failed)", line):
            if not any(n.startswith("(") for n in names):
                names.append("(" + line.strip() + ")")
    return passed, failed, names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", action="append", default=[])
    ap.add_argument("--other")
    ap.add_argument("--doc")
    ap.add_argument("--times", default="")
    ap.add_argument("--slowest", type=int, default=20)
    args = ap.parse_args()

    results = []
    for path in args.junit:
        results += junit_results(path)
    results += other_results(args.other)
    doc_passed, doc_failed, doc_names = doc_results(args.doc)

    print()
    print("==> where the time went (wall seconds)")
    if args.times:
        print("   " + ", ".join(f"{k} {v} s" for k, v in (t.split("=") for t in args.times.split(","))))

    print(f"==> the {args.slowest} slowest tests (seconds)")
    for binary, case, ok, secs in sorted(results, key=lambda r: -r[3])[: args.slowest]:
        print(f"  {secs:7.1f}  {binary}  {case}{'' if ok else '  FAILED'}")

    print("==> per test binary: tests, failed, summed and longest test time (seconds)")
    per = {}
    for binary, _, ok, secs in results:
        n, f, total, longest = per.get(binary, (0, 0, 0.0, 0.0))
        per[binary] = (n + 1, f + (not ok), total + secs, max(longest, secs))
    for binary, (n, f, total, longest) in sorted(per.items(), key=lambda kv: -kv[1][2]):
        print(f"  {binary:45} {n:5} {f:4} {total:9.1f} {longest:8.1f}")
    if doc_passed or doc_failed:
        print(f"  {'doc tests':45} {doc_passed + doc_failed:5} {doc_failed:4}")

    failures = [(b, c) for b, c, ok, _ in results if not ok]
    failures += [("doc tests", n) for n in doc_names]
    passed = sum(1 for r in results if r[2]) + doc_passed
    failed = sum(1 for r in results if not r[2]) + max(doc_failed, len(doc_names))
    if failures:
        print(f"==> {len(failures)} failed")
        for binary, case in failures:
            print(f"  FAILED {binary}  {case}")
    if passed + failed == 0:
        print("==> no test ran")
    print(f"summary: {passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
