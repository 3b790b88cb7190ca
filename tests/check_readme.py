#!/usr/bin/env python3
"""The README's C snippets are the example programs, verbatim: each of examples/usage.c and
examples/model_usage.c must appear whole as a ```c block of README.md (those programs are built and run by the
suite, so the snippets compile and work). Prints TAP, one case per snippet.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SNIPPETS = ["examples/usage.c", "examples/model_usage.c"]


def main():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = [b.strip("\n") for b in re.findall(r"^```c\n(.*?)^```", readme, re.S | re.M)]
    print("1..%d" % len(SNIPPETS))
    failed = 0
    for n, path in enumerate(SNIPPETS, 1):
        text = open(os.path.join(ROOT, path), encoding="utf-8").read().strip("\n")
        if text in blocks:
            print("ok %d - README.md shows %s verbatim" % (n, path))
        else:
            failed += 1
            print("not ok %d - README.md has no ```c block equal to %s" % (n, path))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
