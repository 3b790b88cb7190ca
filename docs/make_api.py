#!/usr/bin/env python3
"""Write docs/api.md, the reference of the public API, from the public headers' own comments.

    python3 docs/make_api.py              rewrite docs/api.md
    python3 docs/make_api.py --check      TAP: not ok (exit 1) if docs/api.md is not what the headers give
    python3 docs/make_api.py --content    TAP: every public function, type and enum constant of the headers
                                          appears in docs/api.md with a non-empty description

The headers are the source of truth: include/qkv.h and every header under include/qkv/. Each public function
(QKV_API), type (typedef) and enum is listed under the section banner it sits in, with the comment block just
above it, which covers the run of declarations that follows it up to a blank line; a typedef or enum inside
that run (a flags enum between a comment and its function) does not end it. A declaration with no block
comment takes its trailing comment (`...; /* ... */`). An enum constant's description is its own trailing
comment, else the enum's. tests/meson.build runs --check and --content, so the reference can neither drift
from the headers nor leave a public name undocumented.
"""
import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HEADERS = ["include/qkv.h"] + sorted(os.path.relpath(p, ROOT).replace(os.sep, "/")
                                     for p in glob.glob(os.path.join(ROOT, "include", "qkv", "*.h")))
OUT = os.path.join(ROOT, "docs", "api.md")


def clean_comment(text):
    """The words of a /* ... */ block, without its frame and leading stars."""
    out = []
    for line in text.split("\n"):
        line = line.strip()
        line = re.sub(r"^/\*+ ?", "", line)
        line = re.sub(r" ?\*+/$", "", line)
        line = re.sub(r"^\* ?", "", line)
        out.append(line)
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


def strip_comments(code):
    return re.sub(r"/\*.*?\*/", " ", code, flags=re.S)


def read_statement(lines, i):
    """Lines i.. up to the ';' that ends a declaration at brace depth 0, outside comments. Returns (text, next i)."""
    depth, in_comment, text = 0, False, []
    while i < len(lines):
        line = lines[i]
        text.append(line)
        j = 0
        done = False
        while j < len(line):
            if in_comment:
                if line.startswith("*/", j):
                    in_comment, j = False, j + 2
                    continue
            elif line.startswith("/*", j):
                in_comment, j = True, j + 2
                continue
            elif line.startswith("//", j):
                break
            elif line[j] == "{":
                depth += 1
            elif line[j] == "}":
                depth -= 1
            elif line[j] == ";" and depth == 0:
                done = True
            j += 1
        i += 1
        if done and not in_comment:
            break
    return "\n".join(text), i


def trailing_comment(text):
    """The comment after the final ';' of a declaration, if any."""
    last = text.rstrip().split("\n")[-1]
    m = re.search(r";\s*(/\*.*\*/)\s*$", last)
    return clean_comment(m.group(1)) if m else ""


def type_names(code):
    """(typedef'd names, enum constants [(name, own comment)]) of one typedef/enum statement (with comments)."""
    names, constants = [], []
    flat = strip_comments(code)
    if flat.lstrip().startswith("typedef"):
        m = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", flat)  # a function pointer type
        if m:
            names.append(m.group(1))
        else:
            m = re.search(r"(\w+)\s*;\s*$", flat.strip())
            if m:
                names.append(m.group(1))
    if re.match(r"\s*(typedef\s+)?enum\b", flat) and "{" in flat:
        body = code[code.index("{") + 1: code.rindex("}")]
        for line in body.split("\n"):
            own = ""
            m = re.search(r"/\*(.*?)\*/", line)
            if m:
                own = m.group(1).strip()
            for c in re.findall(r"\b(QKV_[A-Z0-9_]+)\b\s*(?:=[^,}]*)?(?:,|$)", strip_comments(line).strip()):
                constants.append((c, own))
    return names, constants


def parse(path):
    """[(section, comment, [entry, ...])] in file order, entries being dicts with kind, text, names."""
    lines = open(os.path.join(ROOT, path)).read().split("\n")
    out, section, comment, group, i = [], os.path.basename(path), "", None, 0
    while i < len(lines):
        s = lines[i].strip()
        if lines[i].startswith("/* ---") and s.endswith("*/"):
            if i + 2 < len(lines) and lines[i + 2].strip().startswith("/* ---"):  # rule, title, rule
                section = lines[i + 1].strip().strip("/*").strip()
                i += 3
            else:
                m = re.match(r"/\* -+ (.*?) -+ \*/", s)
                if m:
                    section = m.group(1)
                i += 1
            comment, group = "", None
            continue
        if s.startswith("/*"):
            block = [lines[i]]
            while "*/" not in lines[i]:
                i += 1
                block.append(lines[i])
            comment, group = clean_comment("\n".join(block)), None
            i += 1
            continue
        is_type = re.match(r"(typedef\b|enum\s*(\w+\s*)?\{)", s) is not None
        if s.startswith("QKV_API") or is_type:
            text, i = read_statement(lines, i)
            own = trailing_comment(text)
            if s.startswith("QKV_API"):
                flat = re.sub(r"\s+", " ", strip_comments(text)).replace("QKV_API ", "").strip()
                flat = flat.replace("( ", "(").replace(" )", ")")
                m = re.search(r"(\w+)\s*\(", flat)
                entry = {"kind": "function", "text": flat, "names": [m.group(1)], "constants": []}
            else:
                names, constants = type_names(text)
                body = "\n".join(l.rstrip() for l in text.split("\n"))
                entry = {"kind": "type", "text": body, "names": names, "constants": constants}
            entry["own"] = own
            if group is None or group[1] != comment or not comment:
                group = (section, comment, [entry])
                out.append(group)
            else:
                group[2].append(entry)
            continue
        if s == "":
            comment, group = "", None
        elif not s.startswith("#") and not s.startswith("//"):
            comment, group = "", None
        i += 1
    return out


def render():
    parts = ["# qkv API reference", "",
             "Every public function, type and enum, grouped as the headers group them, with the header's own "
             "comment. Made by `python3 docs/make_api.py` from " + ", ".join("`%s`" % h for h in HEADERS) +
             " (the test suite checks that it is current and that every public name has a description).", ""]
    count = 0
    for header in HEADERS:
        parts += ["## `%s`" % header, ""]
        last_section = None
        for section, comment, entries in parse(header):
            if section != last_section:
                parts += ["### %s" % section, ""]
                last_section = section
            parts.append("```c")
            parts += [e["text"] for e in entries]
            parts.append("```")
            count += sum(e["kind"] == "function" for e in entries)
            notes = [comment] if comment else []
            for e in entries:
                if e["own"] and e["kind"] == "function":
                    notes.append("`%s`: %s" % (e["names"][0], e["own"]))
            if notes:
                parts += [""] + notes
            parts.append("")
    return "\n".join(parts).rstrip() + "\n", count


def public_names():
    """{name: description} for every function, type and enum constant of the headers."""
    found = {}
    for header in HEADERS:
        for _, comment, entries in parse(header):
            for e in entries:
                for n in e["names"]:
                    found[n] = e["own"] or comment
                for c, own in e["constants"]:
                    found[c] = own or e["own"] or comment
    return found


def check_content():
    doc = open(OUT).read() if os.path.exists(OUT) else ""
    raw = "\n".join(open(os.path.join(ROOT, h)).read() for h in HEADERS)
    names = public_names()
    declared = set(re.findall(r"QKV_API[^;(]*?\b(qkv_\w+)\s*\(", strip_comments(raw), flags=re.S))
    problems = []
    for n in sorted(declared - set(names)):
        problems.append("%s is declared QKV_API but the generator did not find it" % n)
    for n, desc in sorted(names.items()):
        if not desc.strip():
            problems.append("%s has no description in its header" % n)
        elif not re.search(r"\b%s\b" % re.escape(n), doc):
            problems.append("%s does not appear in docs/api.md" % n)
    print("1..1")
    if problems:
        print("not ok 1 - %d public names undocumented" % len(problems))
        for p in problems:
            print("# " + p)
        return 1
    print("ok 1 - %d public names (functions, types, enum constants) documented in docs/api.md" % len(names))
    return 0


def main():
    if "--content" in sys.argv:
        return check_content()
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
