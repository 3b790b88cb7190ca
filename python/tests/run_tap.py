#!/usr/bin/env python3
"""Runs the Python package's pytest tests and prints one TAP line per test case on stdout (pytest's own
report goes to stderr), so that meson's TAP protocol and tests/count_cases.py count each case.

usage: run_tap.py [pytest arguments...]   (the package is imported from python/ next to this directory; the
library is the one QKV_LIBRARY names, see python/qkv/__init__.py)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pytest  # noqa: E402


class TapResults:
    def __init__(self):
        self.order = []
        self.result = {}

    def pytest_runtest_logreport(self, report):
        if report.nodeid not in self.result:
            self.order.append(report.nodeid)
            self.result[report.nodeid] = ("ok", "")
        state, _ = self.result[report.nodeid]
        if report.failed:
            self.result[report.nodeid] = ("not ok", "")
        elif report.skipped and state == "ok":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.result[report.nodeid] = ("ok", " # SKIP " + reason.replace("\n", " "))


def main():
    results = TapResults()
    stdout = os.dup(1)
    os.dup2(2, 1)  # pytest's report to stderr
    try:
        code = pytest.main(["-q", "-p", "no:cacheprovider", HERE] + sys.argv[1:], plugins=[results])
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
    print(f"1..{len(results.order) or 1}")
    for i, nodeid in enumerate(results.order, 1):
        state, directive = results.result[nodeid]
        print(f"{state} {i} {nodeid}{directive}")
    if not results.order:  # nothing collected (an import error): one failing case, not a silent pass
        print(f"not ok 1 pytest collected no test (exit code {int(code)})")
    return 0 if code in (0, 5) and results.order else 1


if __name__ == "__main__":
    sys.exit(main())
