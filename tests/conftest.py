"""Test configuration: backend header, TF32 off, the trainable-backend marker."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # hide TF's oneDNN/INFO notices

import keras  # noqa: E402
import pytest  # noqa: E402

from keras_attn import _device  # noqa: E402

BACKEND = keras.backend.backend()
TRAINABLE = BACKEND in ("tensorflow", "jax", "torch")

# Hypothesis profiles (tests/kernels/test_properties.py): `ci` is the default, reproducible and
# sized for <= 2 minutes per backend on 2 CPU cores; `pytest --hypothesis-profile=thorough`
# explores thousands of fresh examples. No deadline: JAX compiles per shape. (tox's
# parity and GPU environments do not install hypothesis and run no property test.)
try:
    from hypothesis import settings
except ImportError:  # pragma: no cover
    settings = None
if settings is not None:
    settings.register_profile("ci", derandomize=True, max_examples=20, deadline=None,
                              print_blob=True)
    settings.register_profile("thorough", max_examples=400, deadline=None, print_blob=True)
    settings.load_profile("ci")

# float32 must mean float32 on GPUs, as in Keras's own test suite.
_device.disable_tf32()


def pytest_report_header(config):
    info = _device.describe()
    return (f"keras_attn: backend={info['backend']} {info['backend_version']}, "
            f"keras={info['keras']}, device={info['device']}")


def pytest_terminal_summary(terminalreporter):
    from .helpers import WORST

    # worst/tol is the worst |actual - expected| / (atol + rtol * |expected|), as in the
    # parity report: <= 1 passes, so a large relative error where rtol allows it reads
    # as what it is.
    for (against, dtype, quantity), w in sorted(WORST.items()):
        terminalreporter.write_line(
            f"keras_attn [{BACKEND}] worst error vs {against} ({dtype} {quantity}): "
            f"worst/tol {w['ratio']:.2f} (tolerance atol={w['atol']:g}, rtol={w['rtol']:g}); "
            f"abs {w['abs']:.2e}, rel {w['rel']:.2e} (rel over |expected| >= 1e-3)")


def pytest_collection_modifyitems(config, items):
    # Tests marked `backend_independent` compute nothing with the live backend: tox runs
    # them once, in the numpy environment, and deselects them (not skips: they run
    # there) in the others with KERAS_ATTN_BACKEND_INDEPENDENT=deselect. A plain pytest
    # run keeps them.
    if os.environ.get("KERAS_ATTN_BACKEND_INDEPENDENT", "run") == "deselect":
        elsewhere = [i for i in items if "backend_independent" in i.keywords]
        if elsewhere:
            config.hook.pytest_deselected(items=elsewhere)
            items[:] = [i for i in items if "backend_independent" not in i.keywords]
    if TRAINABLE:
        return
    skip = pytest.mark.skip(reason=f"the {BACKEND} backend cannot train")
    for item in items:
        if "requires_trainable_backend" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_state():
    """Each test starts from float32 and a clean Keras name scope.

    `free_memory=False`: the default runs a full `gc.collect()` per test, which cost
    tests/kernels/test_policy.py 67.0 s against 1.58 s without it (541 tests, 2 cores); memory is
    collected once per module instead (`_collect_per_module`).
    """
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(autouse=True, scope="module")
def _collect_per_module():
    """What `clear_session()`'s default did per test, once per test module."""
    yield
    keras.backend.clear_session()
