#!/usr/bin/env python3
"""examples/attention_viewer's page in a real browser: headless Chromium loads the page the viewer writes for a
PyTorch-twin checkpoint (tests/data/model_twin/mlp_layer_learned, 2 layers of 3 heads) and its first prompt, and
the test fails on any message the page writes to the console (an uncaught exception included), unless the page
after its script ran shows every token and one heat map per layer and head, and unless a screenshot of it is a
PNG of the window's size. Without Chromium (chromium, chromium-browser or google-chrome on PATH) every case is
skipped; .ci/run installs it. Prints TAP.

    check_viewer_browser.py SOURCE_ROOT PROGRAM
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
import read_safetensors  # noqa: E402

CASE = "mlp_layer_learned"
LAYERS, HEADS = 2, 3
WIDTH, HEIGHT = 1200, 900
CASES = ["the viewer writes the page", "the page writes nothing to the console (no script error)",
         "the page shows every token", "the page shows one heat map per layer and head",
         "a screenshot is a %dx%d PNG with content" % (WIDTH, HEIGHT)]


def browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(exe, profile, args, url):
    """Chromium headless with a fresh profile; returns (stdout, stderr, exit status)."""
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--user-data-dir=" + profile,
           "--enable-logging=stderr", "--v=0"] + args + [url]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        return "", "timed out after 120 s", -1


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def main():
    root, program = sys.argv[1], sys.argv[2]
    print("1..%d" % len(CASES))
    exe = browser()
    if not exe:
        for i, name in enumerate(CASES, 1):
            print("ok %d - %s # SKIP no Chromium on PATH" % (i, name))
        return 0
    data = os.path.join(root, "tests", "data", "model_twin")
    _, golden, _ = read_safetensors.read(os.path.join(data, CASE + "_golden.safetensors"))
    _, ids_shape, ids = golden["ids"]
    n = ids_shape[1]
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "page.html")
        run = subprocess.run([program, "--load", os.path.join(data, CASE + ".safetensors"), "--ids",
                              ",".join(str(i) for i in ids[:n]), "--out", page], capture_output=True, text=True)
        checks.append((run.returncode == 0 and os.path.exists(page), "%s (exit %d %s)" % (CASES[0], run.returncode,
                                                                                          run.stderr.strip())))
        url = "file://" + page
        dom, log, status = run_browser(exe, os.path.join(tmp, "profile-dom"), ["--dump-dom"], url)
        console = [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
        checks.append((status == 0 and not console and dom.strip() != "",
                       "%s (exit %d; %s)" % (CASES[1], status, "; ".join(console)[:400] or "no console lines")))
        tokens = len(set(re.findall(r'id="tok(\d+)"', dom)))
        checks.append((tokens == n, "%s: %d of %d" % (CASES[2], tokens, n)))
        maps = len(re.findall(r'<canvas class="head"', dom))
        layer_rows = len(re.findall(r'class="layer"', dom))
        checks.append((maps == LAYERS * HEADS and layer_rows == LAYERS,
                       "%s: %d maps in %d layer rows, want %d in %d" % (CASES[3], maps, layer_rows, LAYERS * HEADS,
                                                                       LAYERS)))
        shot = os.path.join(tmp, "page.png")
        _, _, status = run_browser(exe, os.path.join(tmp, "profile-shot"),
                                   ["--screenshot=" + shot, "--window-size=%d,%d" % (WIDTH, HEIGHT)], url)
        size = png_size(shot) if os.path.exists(shot) else None
        nbytes = os.path.getsize(shot) if os.path.exists(shot) else 0
        checks.append((size == (WIDTH, HEIGHT) and nbytes > 5000,
                       "%s: %s, %d bytes" % (CASES[4], size, nbytes)))
    failed = 0
    for i, (ok, text) in enumerate(checks, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", i, text))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
