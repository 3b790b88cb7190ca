"""docs/pytorch.md is true of this tree: its ```python blocks, joined by two blank lines (top-level Python's
separation), are python/examples/pytorch_ddp.py verbatim, and the program (qkv, then DistributedDataParallel on
two processes with gloo, then qkv again) prints the page's ```text block within 60 s, each number within two
units of its last quoted digit (tests/check_page.py's rule, imported from there)."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PAGE = os.path.join(ROOT, "docs", "pytorch.md")
PROGRAM = os.path.join(ROOT, "python", "examples", "pytorch_ddp.py")

_spec = importlib.util.spec_from_file_location("check_page", os.path.join(ROOT, "tests", "check_page.py"))
check_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_page)


def page_blocks(kind):
    return re.findall(r"^```%s\n(.*?)^```" % kind, open(PAGE, encoding="utf-8").read(), re.S | re.M)


def test_page_code_is_the_program():
    blocks = page_blocks("python")
    assert len(blocks) >= 2
    assert "\n\n".join(blocks) == open(PROGRAM, encoding="utf-8").read()


def test_page_output_is_what_the_program_prints(tmp_path):
    texts = page_blocks("text")
    assert len(texts) == 1
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, PROGRAM, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert run.returncode == 0, run.stderr
    why = check_page.same_output(texts[0], run.stdout)
    assert why is None, why
    # the checkpoint PyTorch wrote is a qkv checkpoint
    import qkv
    config, _ = qkv.checkpoint_metadata(tmp_path / "stage2.safetensors")
    assert config["dtype"] == "f64" and config["n_layer"] == 2
