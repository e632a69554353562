"""The parity tool's comparison logic cannot pass silently (pure NumPy: runs
on every backend), plus its command-line behaviour: argument errors, and the
progress lines of one short run on the active backend."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from keras_attn.parity import arrays, cases, expected, report
from keras_attn.parity.cli import _list, installed_backends
from keras_attn.parity.compare import REFERENCE, compare_arrays, compare_backends
from keras_attn.testing.tolerances import TOLERANCES, tolerance

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _fake_run(perturb=None, nan=False):
    """Two backends and a reference for one small case; backend "b" perturbed."""
    g = np.random.default_rng(0)
    ref = {"output": g.standard_normal((2, 3)), "grad/x": g.standard_normal((2, 3))}
    results = {}
    for name in ("a", "b"):
        results[name] = {f"float32/case/{k}": v.astype(np.float32) for k, v in ref.items()}
    if perturb is not None:
        results["b"]["float32/case/output"] = results["b"]["float32/case/output"] + perturb
    if nan:
        results["b"]["float32/case/grad/x"][0, 0] = np.nan
    return results, {"case": ref}


def test_identical_results_pass():
    results, ref = _fake_run()
    records = compare_backends(results, ref, ["float32"], ["case"])
    assert records and all(r["ok"] for r in records)
    # a-b, a-ref, b-ref, for output and gradient
    assert {(r["a"], r["b"]) for r in records} == {("a", "b"), ("a", REFERENCE),
                                                   ("b", REFERENCE)}


def test_perturbed_result_fails():
    results, ref = _fake_run(perturb=1e-3)
    records = compare_backends(results, ref, ["float32"], ["case"])
    failed = {(r["a"], r["b"], r["name"]) for r in records if not r["ok"]}
    assert failed == {("a", "b", "output"), ("b", REFERENCE, "output")}
    assert "FAIL" in report.format_table(records)


def test_nan_fails_even_where_the_other_side_is_nan_too():
    results, ref = _fake_run(nan=True)
    records = compare_backends(results, ref, ["float32"], ["case"])
    assert any(not r["ok"] and "non-finite" in r["why"] for r in records)
    both = compare_arrays(np.array([np.nan]), np.array([np.nan]))
    assert not both["ok"] and "non-finite" in both["why"]
    assert not compare_arrays(np.array([np.inf]), np.array([1.0]))["ok"]


def test_missing_result_and_shape_mismatch_fail():
    assert compare_arrays(None, np.zeros(2))["why"] == "missing result"
    assert not compare_arrays(np.zeros(3), np.zeros(2))["ok"]
    results, ref = _fake_run()
    del results["b"]["float32/case/output"]
    records = compare_backends(results, ref, ["float32"], ["case"],
                               errors={"b": {"float32/case": "RuntimeError: boom"}})
    assert any(r["name"] == "run" and not r["ok"] and "boom" in r["why"] for r in records)
    assert any(r["name"] == "output" and r["why"] == "missing result" for r in records)


@pytest.mark.parametrize("dtype", sorted(TOLERANCES))
def test_tolerance_is_applied_per_dtype(dtype):
    tol = tolerance(dtype, "output")
    expected = np.array([1.0, -2.0, 0.0])
    allowed = tol["atol"] + tol["rtol"] * np.abs(expected)
    inside = compare_arrays(expected + 0.9 * allowed, expected, dtype)
    outside = compare_arrays(expected + 1.1 * allowed, expected, dtype)
    assert inside["ok"] and inside["ratio"] == pytest.approx(0.9)
    assert not outside["ok"] and outside["ratio"] == pytest.approx(1.1)
    assert (inside["atol"], inside["rtol"]) == (tol["atol"], tol["rtol"])


def test_same_error_passes_bfloat16_but_fails_float32():
    expected = np.ones(4)
    actual = expected + 1e-3
    assert compare_arrays(actual, expected, "bfloat16")["ok"]
    assert compare_arrays(actual, expected, "float16")["ok"]
    assert not compare_arrays(actual, expected, "float32")["ok"]


def test_gradient_and_device_keys_and_bad_keys():
    assert tolerance("float32", "gradient", "cpu")["atol"] >= tolerance("float32")["atol"]
    with pytest.raises(ValueError, match="Received: dtype='float64'"):
        tolerance("float64")
    with pytest.raises(ValueError, match="Received: quantity='loss'"):
        tolerance("float32", "loss")
    with pytest.raises(ValueError, match="Received: device='tpu'"):
        tolerance("float32", "output", "tpu")


def test_report_arrays_round_trip_and_summary():
    arrays = {"float32/c/output": np.arange(6, dtype=np.float32).reshape(2, 3)}
    back = report.decode_arrays(report.encode_arrays(arrays))
    np.testing.assert_array_equal(back["float32/c/output"], arrays["float32/c/output"])
    results, ref = _fake_run(perturb=1e-6)
    summ = report.summary(compare_backends(results, ref, ["float32"], ["case"]))
    assert summ["float32"]["cross_backend"]["output"]["max_abs"] == pytest.approx(1e-6, rel=0.2)


def test_report_load_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a keras-attn parity report"):
        report.load(str(path))


def test_cases_are_fixed_and_cover_every_layer():
    kinds = {c.kind for c in cases.CASES}
    assert kinds == {"sdpa", "mha", "ffn", "encoder", "decoder", "mla", "gdn"}
    first, second = arrays.case_arrays(cases.CASES[3]), arrays.case_arrays(cases.CASES[3])
    for a, b in zip(first, second, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    with pytest.raises(ValueError, match="Received: cases="):
        cases.get_cases(["nope"])


def test_reference_gradient_matches_a_hand_derivation():
    # FFN with linear activation: output = (x W1 + b1) W2 + b2, so
    # d sum(out * C) / d b2 = sum over positions of C.
    case = cases.Case("lin", "ffn", "", {"intermediate_dim": 3, "activation": "linear"},
                      {"inputs": (2, 2, 4)})
    inputs, masks, weights = arrays.case_arrays(case)
    result = expected.reference_result(case, inputs, masks, weights)
    cot = arrays.cotangent(case, result["output"].shape)
    np.testing.assert_allclose(result["grad/output/bias"], cot.sum(axis=(0, 1)), atol=1e-8)
    w2 = weights["output/kernel"].astype(np.float64)
    np.testing.assert_allclose(result["grad/inputs"],
                               cot @ w2.T @ weights["intermediate/kernel"].T, atol=1e-7)


def test_bad_list_arguments_name_the_argument():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="--dtypes .* Received: 'float64'"):
        _list("dtypes", tuple(TOLERANCES))("float64")


@pytest.mark.parametrize("missing, expected", [
    ((), ["tensorflow", "jax", "torch", "numpy"]),
    # Keras's NumPy backend imports jax and scipy: without either it cannot run.
    (("jax",), ["tensorflow", "torch"]),
    (("scipy",), ["tensorflow", "jax", "torch"]),
    (("jax", "tensorflow"), ["torch"]),
])
def test_installed_backends_counts_numpy_only_with_jax_and_scipy(monkeypatch, missing,
                                                                 expected):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in missing else object())
    assert installed_backends() == expected


def _cli(*args, timeout=120):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "keras_attn", "parity", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_bad_dtype_is_an_argparse_error():
    done = _cli("--dtypes", "float64")
    assert done.returncode == 2
    assert "--dtypes" in done.stderr and "Received: 'float64'" in done.stderr


def test_device_gpu_fails_fast_without_a_gpu():
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU path cannot be exercised")
    trainable = [b for b in installed_backends() if b != "numpy"]
    if not trainable:
        pytest.skip("no trainable backend installed to ask for a GPU")
    done = _cli("--device", "gpu", "--backends", trainable[0], "--cases", "ffn_relu")
    assert done.returncode == 2, done.stderr
    assert "--device gpu was requested" in done.stderr
    assert "sees no GPU" in done.stderr


def test_progress_per_backend_and_case_with_a_running_count(tmp_path):
    """One line per (backend, dtype, case) on stderr while the workers run; the report
    (stdout table and JSON) is what it was."""
    import keras

    backend = keras.backend.backend()
    report = tmp_path / "parity.json"
    done = _cli("--backends", backend, "--cases", "ffn_relu,sdpa_mask_bias", "--repeat", "1",
                "--json", str(report), timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("[parity] ")]
    assert lines[0] == f"[parity] {backend}: running 2 cases x 1 dtype(s) on cpu ..."
    assert re.fullmatch(rf"\[parity\] 1/2 {backend} float32/ffn_relu \d+\.\d\ds", lines[1])
    assert re.fullmatch(rf"\[parity\] 2/2 {backend} float32/sdpa_mask_bias \d+\.\d\ds", lines[2])
    assert lines[3].startswith(f"[parity] {backend}: done in ")
    assert "keras-attn-parity-progress" not in done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("case ")
    assert "parity: ok" in done.stdout
    saved = json.loads(report.read_text())
    assert set(saved) == {"environment", "device", "dtypes", "cases", "backends", "tolerances",
                          "ok", "seconds", "determinism", "summary", "records", "arrays"}
