#!/usr/bin/env python3
"""docs/patching.md is true of this tree: its ```c blocks, joined by blank lines, are examples/patching.c verbatim
(which the suite builds as build/examples/patching), and its ```text block is what that program prints now, each
number within two units of its last quoted digit (check_extending.py's rule, reused from there). Prints TAP.

    check_patching.py SOURCE_ROOT PROGRAM
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_extending import same_output  # noqa: E402


def main():
    root, program = sys.argv[1], sys.argv[2]
    page = open(root + "/docs/patching.md", encoding="utf-8").read()
    source = open(root + "/examples/patching.c", encoding="utf-8").read()
    blocks = re.findall(r"^```c\n(.*?)^```", page, re.S | re.M)
    texts = re.findall(r"^```text\n(.*?)^```", page, re.S | re.M)
    print("1..2")
    joined = "\n".join(blocks)
    if joined == source:
        print("ok 1 - the ```c blocks of docs/patching.md are examples/patching.c verbatim (%d blocks)" % len(blocks))
    else:
        at = next((i for i, (a, b) in enumerate(zip(joined, source)) if a != b), min(len(joined), len(source)))
        print("not ok 1 - the ```c blocks of docs/patching.md differ from examples/patching.c at character %d: "
              "page %r, file %r" % (at, joined[at:at + 60], source[at:at + 60]))
    run = subprocess.run([program], capture_output=True, text=True, timeout=600)
    why = "exit status %d: %s" % (run.returncode, run.stderr.strip()) if run.returncode else None
    if not why:
        why = "the page has %d ```text blocks, not 1" % len(texts) if len(texts) != 1 else same_output(texts[0], run.stdout)
    print("ok 2 - the program runs and prints what the page shows" if not why else "not ok 2 - %s" % why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
