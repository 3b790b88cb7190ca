#!/usr/bin/env python3
"""A page of docs/ that walks through one example program is true of this tree: its ```c blocks, joined by blank
lines, are the program's source verbatim, and its ```text block is what the built program prints now, each number
equal to the fresh run's within two units of its last quoted digit (f32 training may round differently on another
CPU; a page that quotes an older tree fails). Used for docs/extending.md (examples/extending.c) and
docs/patching.md (examples/patching.c). Prints TAP.

    check_page.py SOURCE_ROOT PROGRAM PAGE SOURCE      (PAGE and SOURCE relative to SOURCE_ROOT)
"""
import re
import subprocess
import sys

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def unit(text):
    """The value of one unit in the last digit of a number as written: 0.006 -> 0.001, 2e-16 -> 1e-16."""
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def same_output(page, fresh):
    """None when fresh matches page (text equal, numbers within two units of the page's last digit), else why."""
    page_lines, fresh_lines = page.strip("\n").split("\n"), fresh.strip("\n").split("\n")
    if len(page_lines) != len(fresh_lines):
        return "the page shows %d lines, the program printed %d" % (len(page_lines), len(fresh_lines))
    for a, b in zip(page_lines, fresh_lines):
        if NUMBER.sub("#", a) != NUMBER.sub("#", b):
            return "page line %r, program line %r" % (a, b)
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
            if abs(float(x) - float(y)) > 2 * unit(x) * (1 + 1e-9):
                return "page quotes %s where the program prints %s (line %r)" % (x, y, b)
    return None


def main():
    root, program, page_name, source_name = sys.argv[1:5]
    page = open(root + "/" + page_name, encoding="utf-8").read()
    source = open(root + "/" + source_name, encoding="utf-8").read()
    blocks = re.findall(r"^```c\n(.*?)^```", page, re.S | re.M)
    texts = re.findall(r"^```text\n(.*?)^```", page, re.S | re.M)
    print("1..2")
    joined = "\n".join(blocks)
    if joined == source:
        print("ok 1 - the ```c blocks of %s are %s verbatim (%d blocks)" % (page_name, source_name, len(blocks)))
    else:
        at = next((i for i, (a, b) in enumerate(zip(joined, source)) if a != b), min(len(joined), len(source)))
        print("not ok 1 - the ```c blocks of %s differ from %s at character %d: page %r, file %r"
              % (page_name, source_name, at, joined[at:at + 60], source[at:at + 60]))
    run = subprocess.run([program], capture_output=True, text=True, timeout=600)
    why = "exit status %d: %s" % (run.returncode, run.stderr.strip()) if run.returncode else None
    if not why:
        why = "the page has %d ```text blocks, not 1" % len(texts) if len(texts) != 1 else same_output(texts[0], run.stdout)
    print("ok 2 - the program runs and prints what the page shows" if not why else "not ok 2 - %s" % why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
