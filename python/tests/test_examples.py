"""python/examples/train_sample_plot.py in quick mode: it trains (the loss falls), samples, and plots the loss when
matplotlib is installed (a PNG file), saying so when it is not."""
import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(ROOT, "python", "examples", "train_sample_plot.py")


def test_train_sample_plot_quick(tmp_path):
    plot = tmp_path / "loss.png"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, EXAMPLE, "--quick", "--plot", str(plot)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    losses = [float(x) for x in re.findall(r"train (\d+\.\d+)", run.stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1.0, run.stdout  # from ln 256 = 5.55 down
    sample = re.search(r"^sample: (['\"])(qkv is .*)\1$", run.stdout, re.M)  # a repr
    assert sample and len(sample.group(2)) > 60, run.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert f"plot: {plot}" in run.stdout and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib is not installed: no plot" in run.stdout and not plot.exists()


def test_train_sample_plot_refuses_a_short_text(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("too short")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, EXAMPLE, "--quick", "--text", str(short)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert run.returncode != 0 and "too short" in run.stderr
