"""`python tools/gpu_check.py`: the offline GPU check. Without a GPU
(GPUs are hidden here, so this holds on a GPU machine too) it must stop at once
with exit status 2 and a clear message; its summary writer is checked on fake
step results. Runs on every backend (the script starts its own subprocesses).

`tools/` is a folder of the checkout, not a package (no `__init__.py`, not in the
wheel): the script is loaded from its file."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("keras_attn_tools_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as info:
        gpu_check.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--backends", "--budget-s", "--skip-tests", "--skip-bench"):
        assert option in text
    assert text.startswith("usage: python tools/gpu_check.py ")


def test_bad_backend_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        gpu_check.main(["--out", str(tmp_path), "--backends", "numpy"])
    assert info.value.code == 2
    assert "tensorflow" in capsys.readouterr().err


def test_without_a_gpu_it_exits_2_with_a_clear_message(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
                   [str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                  if os.environ.get("PYTHONPATH") else [])))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"),
         "--backends", "jax,torch", "--budget-s", "60"],
        # From another folder: the checkout is found from the script's own path.
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no backend sees a GPU" in proc.stderr
    assert "Nothing was run" in proc.stderr
    assert seconds < 90
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| check-gpu | no GPU |" in summary
    # Nothing else was started.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary.json",
                                                                     "summary.md"]
    meta = json.loads((tmp_path / "out" / "summary.json").read_text())["meta"]
    assert meta["root"] == str(ROOT)
    assert meta["command"].startswith("python tools/gpu_check.py --out ")


def test_the_package_does_not_ship_it():
    """The check drives tests/ and benchmarks/, which the wheel does not ship; so it
    lives in the checkout's tools/, outside the package."""
    import keras_attn.parity

    assert importlib.util.find_spec("keras_attn.parity.gpu_check") is None
    assert not (pathlib.Path(keras_attn.parity.__file__).parent / "gpu_check.py").exists()
    assert not (ROOT / "tools" / "__init__.py").exists()


def _fake_compare(path):
    summary = {"float32": {"cross_backend": {
        "output": {"max_abs": 1.5e-6, "ratio": 0.1}, "gradient": {"max_abs": 3e-5, "ratio": 0.25}}},
        "bfloat16": {"cross_backend": {"output": {"max_abs": 0.02, "ratio": 0.4}}}}
    path.write_text(json.dumps({"summary": summary, "records": [], "ok": True}))


def test_summary_writer_on_fake_steps(tmp_path):
    _fake_compare(tmp_path / "parity-cpu-vs-gpu-jax.json")
    figures = gpu_check.compare_figures(tmp_path / "parity-cpu-vs-gpu-jax.json")
    assert figures == ("float32: out 1.5e-06 grad 3.0e-05 (x0.25 tol); "
                       "bfloat16: out 2.0e-02 (x0.40 tol)")
    results = [
        {"backend": "jax", "step": "check-gpu", "status": "ok", "seconds": None,
         "figures": "jax 0.4.30 sees gpu (NVIDIA H100)", "output": ""},
        {"backend": "jax", "step": "tests", "status": "ok", "seconds": 201.26,
         "figures": "800 passed, 3 skipped in 200s", "output": "tests-jax.log"},
        {"backend": "jax", "step": "compare", "status": "FAIL", "seconds": 3.0,
         "figures": figures, "output": "parity-cpu-vs-gpu-jax.json"},
        {"backend": "torch", "step": "bench", "status": "skipped", "seconds": None,
         "figures": "budget spent (3s left)", "output": ""},
    ]
    meta = {"started": "now", "budget_s": 480, "spent_s": 477.5, "command": "x",
            "devices": {"jax": "jax 0.4.30 sees gpu (NVIDIA H100)"}}
    text = gpu_check.write_summary(tmp_path, results, meta)
    assert text == (tmp_path / "summary.md").read_text()
    assert "| jax | tests | ok | 201.3 | 800 passed, 3 skipped in 200s | tests-jax.log |" in text
    assert f"| jax | compare | FAIL | 3.0 | {figures} |" in text
    assert "| torch | bench | skipped |  | budget spent (3s left) |" in text
    assert "Result: FAILED: jax compare (1 step(s) skipped, see the table)" in text
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["ok"] is False and len(saved["results"]) == 4


def test_summary_is_ok_when_nothing_failed(tmp_path):
    results = [{"backend": "torch", "step": "tests", "status": "ok", "seconds": 1.0,
                "figures": "a | b", "output": "tests-torch.log"}]
    text = gpu_check.write_summary(tmp_path, results, {"budget_s": 10, "spent_s": 1})
    assert "Result: ok" in text
    assert "a / b" in text  # a pipe would break the Markdown table
