"""Weight portability: a model saved under one backend loads under every other.

A Functional model holding every keras_attn layer (encoder, decoder with
cross-attention, MultiHeadAttention, FFN) is saved as `.keras` and with
`save_weights` (`.weights.h5`) under tensorflow, jax and torch, each in its
own subprocess; each saved model is then loaded under tensorflow, jax, torch
and numpy (3 x 4 = 12 save/load pairs, both formats each), and must predict
the saving backend's numbers and the float64 reference's within the float32
tolerance.

These tests need all four backends installed, so they run in the `parity`
tox environment (which sets KERAS_ATTN_PARITY=1); elsewhere they are skipped
with that reason. With KERAS_ATTN_PARITY=1 a missing backend is an error,
not a skip.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "portability_worker.py"
SAVERS = ("tensorflow", "jax", "torch")
LOADERS = ("tensorflow", "jax", "torch", "numpy")

pytestmark = pytest.mark.skipif(
    os.environ.get("KERAS_ATTN_PARITY") != "1",
    reason="weight portability needs every backend: run in `tox -e parity` "
    "(KERAS_ATTN_PARITY=1)")


def _run(backend, *args):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(WORKER), *args], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, f"{backend} {args[0]} failed:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """(saver, loader) -> the loader's figures for both formats."""
    missing = [b for b in SAVERS if importlib.util.find_spec(b) is None]
    assert not missing, f"KERAS_ATTN_PARITY=1 but these backends are missing: {missing}"
    root = tmp_path_factory.mktemp("portability")
    dirs = [str(root / saver) for saver in SAVERS]
    for saver, directory in zip(SAVERS, dirs, strict=True):
        _run(saver, "save", directory)
    out = {}
    for loader in LOADERS:
        for item in json.loads(_run(loader, "load", *dirs).strip().splitlines()[-1]):
            out[(item["saved_on"], item["loaded_on"])] = item
    return out


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("saver", SAVERS)
def test_saved_model_loads_and_predicts_the_same(figures, saver, loader):
    item = figures[(saver, loader)]
    for fmt in ("keras", "weights_h5"):
        assert item[fmt]["ok"], (
            f"saved on {saver}, loaded on {loader} ({fmt}): {item[fmt]}")
