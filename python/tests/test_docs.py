"""docs/python.md's Python blocks run: executed in order in one namespace (as a reader would paste them), with the
results the page states in its comments checked."""
import os
import re

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_python_page_blocks_run(capsys):
    page = open(os.path.join(ROOT, "docs", "python.md"), encoding="utf-8").read()
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    assert len(blocks) == 3
    ns = {}
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), ns)
    assert sorted(ns["cache"]) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert ns["patched"].shape == (1, 8, 11)
    np.testing.assert_array_equal(ns["x"].grad.numpy(), [2.0, -4.0])
    assert capsys.readouterr().out  # the first block prints the loss and the gradient


def test_every_package_file_is_installed():
    """meson.build's install_sources for the package lists every python/qkv/*.py (pip install . installs them)."""
    meson = open(os.path.join(ROOT, "meson.build"), encoding="utf-8").read()
    installed = set(re.findall(r"'python/qkv/([\w.]+\.py)'", meson))
    present = {f for f in os.listdir(os.path.join(ROOT, "python", "qkv")) if f.endswith(".py")}
    assert installed == present
