#!/usr/bin/env python3
"""examples/attention_viewer writes a true, self-contained page: run on a PyTorch-twin checkpoint
(tests/data/model_twin/mlp_layer_learned) with the twin's first prompt, the page's data holds the model's shape,
the tokens, every layer's and head's pattern equal to the twin's blocks.L.attn.hook_pattern (to the 6 digits
written), each row summing to 1, and a logit lens of n_layer + 1 rows whose predictions are sorted probabilities;
the page loads nothing from elsewhere, and its inline script parses (node --check, when node is installed). Bad
input (an id out of range, two prompts) exits 2 and writes no page. Prints TAP.

    check_viewer.py SOURCE_ROOT PROGRAM
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
import read_safetensors  # noqa: E402

CASE = "mlp_layer_learned"


def main():
    root, program = sys.argv[1], sys.argv[2]
    data = os.path.join(root, "tests", "data", "model_twin")
    _, golden, _ = read_safetensors.read(os.path.join(data, CASE + "_golden.safetensors"))
    _, hooks, _ = read_safetensors.read(os.path.join(data, CASE + "_hooks.safetensors"))
    _, ids_shape, ids = golden["ids"]
    n = ids_shape[1]
    prompt = ids[:n]  # the first sequence of the batch
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        page_path = os.path.join(tmp, "page.html")
        run = subprocess.run([program, "--load", os.path.join(data, CASE + ".safetensors"), "--ids",
                              ",".join(str(i) for i in prompt), "--out", page_path], capture_output=True, text=True)
        checks.append((run.returncode == 0, "the viewer runs (exit %d, %s)" % (run.returncode, run.stderr.strip())))
        page = open(page_path, encoding="utf-8").read() if run.returncode == 0 else ""
        m = re.search(r'<script id="data" type="application/json">\n(.*?)</script>', page, re.S)
        d = json.loads(m.group(1)) if m else {}
        checks.append((d.get("n_layer") == 2 and d.get("n_head") == 3 and len(d.get("tokens", [])) == n,
                       "the data names 2 layers of 3 heads and the %d tokens" % n))
        worst, rows_ok = 0.0, True
        for l in range(2):
            _, shape, want = hooks["blocks.%d.attn.hook_pattern" % l]  # [B*H, n, n], batch 0 is rows 0..H-1
            for h in range(3):
                got = d["patterns"][l][h] if d else [[0] * n] * n
                for i in range(n):
                    rows_ok &= abs(sum(got[i]) - 1) < 1e-5
                    for j in range(n):
                        w = want[(h * n + i) * n + j]
                        worst = max(worst, abs(got[i][j] - w) / max(abs(w), 1e-300) if w else abs(got[i][j]))
        checks.append((bool(d) and worst < 1e-5 and rows_ok,
                       "every pattern is the twin's (worst relative error %.2g) and every row sums to 1" % worst))
        lens = d.get("lens", [])
        sorted_ok = len(lens) == 3 and all(len(row) == n and all(
            len(top) == 5 and all(0 <= p[1] <= 1 for p in top) and all(top[k][1] >= top[k + 1][1] for k in range(4))
            for top in row) for row in lens)
        checks.append((sorted_ok, "the logit lens has 3 rows of %d positions, each 5 predictions by probability" % n))
        outside = re.findall(r'(?:src|href)\s*=|https?://|@import|fetch\(', page)
        checks.append((page.startswith("<!DOCTYPE html>") and not outside and "<script>" in page,
                       "the page is self-contained (%s)" % (outside or "no external reference")))
        node = shutil.which("node")
        if node and m:
            script = page[page.rindex("<script>") + len("<script>"):page.rindex("</script>")]
            js = os.path.join(tmp, "page.js")
            open(js, "w", encoding="utf-8").write(script)
            parsed = subprocess.run([node, "--check", js], capture_output=True, text=True)
            checks.append((parsed.returncode == 0, "the inline script parses (node --check) %s" % parsed.stderr.strip()))
        else:
            checks.append((True, "# SKIP node is not installed"))
        bad_path = os.path.join(tmp, "bad.html")
        bad = subprocess.run([program, "--load", os.path.join(data, CASE + ".safetensors"), "--ids", "1,99",
                              "--out", bad_path], capture_output=True, text=True)
        checks.append((bad.returncode == 2 and "is not an id in [0, 13)" in bad.stderr and not os.path.exists(bad_path),
                       "an id out of range exits 2 naming it, and writes nothing (%s)" % bad.stderr.strip()))
        both = subprocess.run([program, "--load", os.path.join(data, CASE + ".safetensors"), "--ids", "1",
                               "--prompt", "x", "--out", bad_path], capture_output=True, text=True)
        checks.append((both.returncode == 2 and not os.path.exists(bad_path), "--ids with --prompt exits 2"))
    print("1..%d" % len(checks))
    for k, (ok, what) in enumerate(checks, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", k, what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
