#!/usr/bin/env python3
"""Count individual test cases from meson's testlog.json (TAP output of every test executable).

Meson's own summary counts executables; this counts the cases inside them. A case is an "ok" or
"not ok" TAP line. A test whose plan ("1..N") promised more results than it printed (a crash, a
timeout) counts the missing ones as failed, and a failed executable with no failing case counts one.
Prints "N passed, M failed" and exits 1 if M > 0.
"""
import json
import re
import sys


def count(logfile):
    passed = failed = 0
    for line in open(logfile, encoding="utf-8"):
        test = json.loads(line)
        out = test.get("stdout") or ""
        ok = len(re.findall(r"^ok\b", out, re.M))
        bad = len(re.findall(r"^not ok\b", out, re.M))
        plan = re.search(r"^1\.\.(\d+)", out, re.M)
        missing = max(0, int(plan.group(1)) - ok - bad) if plan else 0
        if test.get("result") not in ("OK", "EXPECTEDFAIL", "SKIP") and bad + missing == 0:
            missing = 1
        passed += ok
        failed += bad + missing
    return passed, failed


if __name__ == "__main__":
    p, f = count(sys.argv[1] if len(sys.argv) > 1 else "build/meson-logs/testlog.json")
    print(f"{p} passed, {f} failed")
    sys.exit(1 if f else 0)
