#!/usr/bin/env python3
"""Write docs/api.md, the reference of every public function, from the public headers' own comments.

    python3 docs/make_api.py            rewrite docs/api.md
    python3 docs/make_api.py --check    TAP: not ok (exit 1) if docs/api.md is not what the headers give

The headers are the source of truth: each QKV_API declaration is listed under the section banner it sits in,
with the comment block just above it (or the run of declarations that comment covers). tests/meson.build runs
--check, so the reference cannot drift from the headers.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HEADERS = ["include/qkv.h", "include/qkv/optim.h", "include/qkv/safetensors.h", "include/qkv/model.h"]
OUT = os.path.join(ROOT, "docs", "api.md")

BANNER = re.compile(r"^/\* -{3,}.*?\*/$|^/\* (.+?) \s*\*/$")


def clean_comment(lines):
    text = []
    for line in lines:
        line = line.strip()
        line = re.sub(r"^/\*+ ?", "", line)
        line = re.sub(r" ?\*+/$", "", line)
        line = re.sub(r"^\* ?", "", line)
        text.append(line)
    while text and not text[0]:
        text.pop(0)
    while text and not text[-1]:
        text.pop()
    return "\n".join(text)


def parse(path):
    """[(section, comment, [declaration, ...])] in file order."""
    lines = open(os.path.join(ROOT, path)).read().split("\n")
    out, section, comment, i = [], None, "", 0
    pending = None
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if line.startswith("/* ---") and s.endswith("*/"):
            # a banner is three lines: rule, title, rule
            if i + 2 < len(lines) and lines[i + 2].strip().startswith("/* ---"):
                section = lines[i + 1].strip().strip("/*").strip()
                i += 3
                comment, pending = "", None
                continue
            m = re.match(r"/\* -+ (.*?) -+ \*/", s)
            if m:
                section = m.group(1)
            i += 1
            comment, pending = "", None
            continue
        if s.startswith("/*") and not s.startswith("/* ---"):
            block = [line]
            while "*/" not in lines[i]:
                i += 1
                block.append(lines[i])
            comment = clean_comment(block)
            pending = None
            i += 1
            continue
        if s.startswith("QKV_API"):
            decl = [s]
            while not decl[-1].rstrip().endswith(";"):
                i += 1
                decl.append(lines[i].strip())
            text = re.sub(r"\s+", " ", " ".join(decl)).replace("QKV_API ", "")
            text = text.replace("( ", "(").replace(" )", ")")
            if pending is not None and comment == pending[1]:
                pending[2].append(text)
            else:
                pending = (section or os.path.basename(path), comment, [text])
                out.append(pending)
            i += 1
            continue
        if s == "":
            # a blank line ends the reach of a comment over following declarations
            if pending is None:
                comment = ""
            else:
                comment, pending = "", None
        elif not s.startswith("#") and not s.startswith("//"):
            if not s.startswith("QKV_API"):
                comment, pending = "", None
        i += 1
    return out


def render():
    parts = ["# qkv API reference", "",
             "Every public function, grouped as the headers group them, with the header's own comment. Made by "
             "`python3 docs/make_api.py` from " + ", ".join("`%s`" % h for h in HEADERS) +
             " (the test suite checks it is current); types, enums and macros are documented in the headers.", ""]
    count = 0
    for header in HEADERS:
        parts += ["## `%s`" % header, ""]
        last_section = None
        for section, comment, decls in parse(header):
            if section != last_section:
                parts += ["### %s" % section, ""]
                last_section = section
            parts.append("```c")
            parts += decls
            parts.append("```")
            count += len(decls)
            if comment:
                parts += ["", comment]
            parts.append("")
    return "\n".join(parts).rstrip() + "\n", count


def main():
    text, count = render()
    if "--check" in sys.argv:  # TAP, one case
        have = open(OUT).read() if os.path.exists(OUT) else ""
        print("1..1")
        if have != text:
            print("not ok 1 - docs/api.md is out of date: run python3 docs/make_api.py")
            return 1
        print("ok 1 - docs/api.md lists all %d public functions as the headers document them" % count)
        return 0
    with open(OUT + ".tmp", "w") as f:
        f.write(text)
    os.replace(OUT + ".tmp", OUT)
    print("wrote docs/api.md: %d functions" % count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
