"""Small shared helpers for the tests."""

import os
import re
import signal
import subprocess

import keras
import numpy as np

from keras_attn.testing.tolerances import tolerance


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


# Worst errors seen by assert_close, per (what it compared against, dtype, quantity):
# {"abs", "rel", "ratio", "atol", "rtol"}, where ratio is the worst
# |actual - expected| / (atol + rtol * |expected|) (<= 1 passes), as in the parity
# report. The conftest prints them at the end.
WORST = {}
FLOAT64 = "float64 reference"
UNCACHED = "uncached forward"  # cached decoding against the same layer without a cache


def assert_close(actual, expected, dtype="float32", what="output", quantity="output",
                 against=FLOAT64):
    """Compare against the float64 reference with the project's tolerance.

    `quantity` is "output" or "gradient" (see keras_attn.testing.tolerances).
    `against` names what `expected` is, for the worst-error summary: the
    float64 reference, or `UNCACHED` (the layer's own uncached forward, which
    cached decoding must reproduce).
    """
    actual = np.asarray(to_numpy(actual), np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    tol = tolerance(dtype, quantity)
    np.testing.assert_allclose(actual, expected, err_msg=what, **tol)
    if actual.size:
        abs_err = np.abs(actual - expected)
        rel_err = abs_err / np.maximum(np.abs(expected), 1e-3)
        ratio = abs_err / (tol["atol"] + tol["rtol"] * np.abs(expected))
        worst = WORST.setdefault((against, dtype, quantity),
                                 {"abs": 0.0, "rel": 0.0, "ratio": 0.0, **tol})
        worst["abs"] = max(worst["abs"], float(abs_err.max()))
        worst["rel"] = max(worst["rel"], float(rel_err.max()))
        worst["ratio"] = max(worst["ratio"], float(ratio.max()))


def keras_version():
    """The installed Keras's version as a tuple of ints: (3, 9, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", keras.__version__)[:3])


def requires_keras_mha_argument(name):
    """Skip a test of a `keras.layers.MultiHeadAttention` argument that the installed
    Keras does not have (`use_gate`, `sliding_window`: newer than the declared floor)."""
    return requires_keras_argument("MultiHeadAttention", name)


def requires_keras_argument(layer, name):
    """Skip a test of an argument of `keras.layers.<layer>` that the installed Keras does
    not have (for example GroupQueryAttention's `use_gate`, `sliding_window`)."""
    import inspect

    import pytest

    cls = getattr(keras.layers, layer, None)
    present = cls is not None and name in inspect.signature(cls.__init__).parameters
    return pytest.mark.skipif(
        not present, reason=f"keras.layers.{layer} in Keras {keras.__version__} has "
        f"no `{name}` argument")


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(generator, *shape):
    return generator.standard_normal(shape).astype("float32")


def run_in_own_group(command, *, timeout, **kwargs):
    """`subprocess.run(command, ...)` in a session of its own; on a timeout, kill the
    whole group before raising, so that no child it started (a DDP rank spawned by
    `torch.multiprocessing`) outlives the test holding a port."""
    with subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def assert_greedy_over_uncached(lm, tokens, prompt_length):
    """`tokens` `(B, L)` (a prompt of `prompt_length` and what `lm.generate` appended) are
    greedy decoding by full uncached forwards: token n is the argmax of the forward over
    the first n tokens, read from one causal forward over the first L - 1 (position n - 1
    sees exactly those; one forward per prefix compiles a shape each on JAX). For a
    model that is not prefix-consistent (longrope's switch) check per prefix instead."""
    tokens = np.asarray(tokens)
    logits = to_numpy(lm(tokens[:, :-1]))
    for n in range(prompt_length, tokens.shape[1]):
        np.testing.assert_array_equal(tokens[:, n], logits[:, n - 1].argmax(-1),
                                      err_msg=f"token {n}")
