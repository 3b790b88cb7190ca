#!/usr/bin/env python3
"""The tree's layers, checked (docs/architecture.md draws them): a file may include only its own layer and the
layers below it. Prints TAP, one case per layer.

    include (public headers) <- tensor <- autograd <- ops (+ ops/kernels) <- optim <- model <- examples, bench

tensor/ may not include autograd/, ops/, optim/ or model/ headers; ops/ may not include model/ or examples/;
nothing in the library includes examples/ or bench/.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ORDER = ["include", "tensor", "autograd", "ops", "optim", "model", "examples"]
# headers that live in one folder but are reached by name from others
HEADER_HOME = {}
for folder in ORDER + ["bench", "fuzz", "tests"]:
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for f in files:
            if f.endswith(".h"):
                HEADER_HOME.setdefault(f, os.path.relpath(dirpath, ROOT).split(os.sep)[0])
HEADER_HOME["qkv.h"] = "include"


def layer_of(folder):
    return ORDER.index(folder) if folder in ORDER else None


def main():
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    print("1..%d" % (len(ORDER) - 1))
    failed = 0
    for n, folder in enumerate(ORDER[1:], 1):
        bad = []
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                for line_no, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = include.match(line)
                    if not m:
                        continue
                    name = os.path.basename(m.group(1))
                    home = HEADER_HOME.get(name)
                    if home is None:
                        continue
                    if home in ("bench", "fuzz", "tests") or (layer_of(home) is not None and layer_of(home) > n):
                        bad.append("%s:%d includes %s (%s/)" % (os.path.relpath(path, ROOT), line_no, m.group(1), home))
        if bad:
            failed += 1
            print("not ok %d - %s/ includes a higher layer: %s" % (n, folder, "; ".join(bad[:5])))
        else:
            print("ok %d - %s/ includes only its own and lower layers" % (n, folder))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
