"""Data parallelism with each backend's own engine, against one device.

- torch: `torch.nn.parallel.DistributedDataParallel`, two gloo processes on
  localhost, set up as Keras's torch guide does (a torch optimizer and loop).
- tensorflow: `tf.distribute.MirroredStrategy` over two logical CPU devices
  and `model.fit`, with the blockwise path forced and with `auto`.
- jax: `keras.distribution` (tests/test_distribution.py, `tox -e multidevice`).

The model (tests/data_parallel_model.py) holds MHA on the fused, blockwise
and explicit paths, a GQA/RoPE attention, an encoder and a decoder layer.
After a few SGD steps on the same global batch the weights must equal one
device's within 1e-5, and the workers report which attention paths ran
during training. Every job runs in fresh processes: TensorFlow's logical
devices must be set before it starts, and a process group must not outlive
its test.
"""

import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests import data_parallel_model as dp
from tests.helpers import run_in_own_group

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "data_parallel_worker.py")
TOLERANCE = 1e-5
BACKEND = keras.backend.backend()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(*commands, timeout=180):
    """Run worker processes together; fail with their output unless all exit 0 cleanly."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, WORKER, *map(str, command)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for command in commands]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:  # on a timeout or a failure, leave nothing running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = [proc.returncode for proc in procs]
    output = "\n".join(f"--- worker {i} (exit {code}):\n{log[-4000:]}"
                       for i, (code, log) in enumerate(zip(codes, logs, strict=True)))
    # A worker that aborts after writing correct results (SIGABRT, "terminate called
    # without an active exception") is a failure too: issue 22.
    assert codes == [0] * len(procs) and "terminate called" not in output, output
    return output


def _max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def _arrays(data, start, count):
    return [data[f"arr_{i}"] for i in range(start, start + count)]


@pytest.fixture
def default_block_size():
    yield
    import keras_attn

    keras_attn.config.set_attention_block_size(None)  # build_model sets 8


@pytest.mark.skipif(BACKEND != "torch", reason="DistributedDataParallel is the torch "
                    "backend's engine (JAX: test_distribution.py, TF: MirroredStrategy below)")
def test_ddp_two_processes_train_like_one(tmp_path, default_block_size):
    import torch

    out = tmp_path / "ddp"
    port = _free_port()
    _run(*[("torch", port, 2, rank, 0.0, out) for rank in (0, 1)])
    ranks = [np.load(f"{out}.rank{rank}.npz") for rank in (0, 1)]

    torch.manual_seed(0)
    model = dp.build_model()
    start = dp.weights_of(model)
    tokens, targets = dp.make_data()
    dp.torch_train(model, tokens, targets)  # one process, the whole global batch
    single = dp.weights_of(model)
    n = len(single)
    for data in ranks:
        assert set(data["paths"]) == {"fused", "blockwise", "explicit"}, data["paths"]
        assert _max_difference(_arrays(data, 0, n), single) <= TOLERANCE

    # The comparison can fail: training leaves the start far behind, and training on
    # rank 0's rows alone (what each rank would do if DDP did not average gradients)
    # ends far from the global batch's weights.
    assert _max_difference(start, single) > 100 * TOLERANCE
    alone = dp.build_model()
    dp.torch_train(alone, tokens[:, : dp.GLOBAL_BATCH // 2], targets[:, : dp.GLOBAL_BATCH // 2])
    assert _max_difference(dp.weights_of(alone), single) > 10 * TOLERANCE


@pytest.mark.skipif(BACKEND != "torch", reason="DistributedDataParallel is the torch "
                    "backend's engine")
def test_ddp_with_dropout_keeps_the_replicas_in_sync(tmp_path):
    """Dropout draws its own masks in each process; DDP keeps the weights equal."""
    out = tmp_path / "ddp_dropout"
    port = _free_port()
    _run(*[("torch", port, 2, rank, 0.2, out) for rank in (0, 1)])
    first, second = (np.load(f"{out}.rank{rank}.npz") for rank in (0, 1))
    n = len([key for key in first.files if key.startswith("arr_")])
    weights = _arrays(first, 0, n)
    assert all(np.isfinite(w).all() for w in weights)
    assert _max_difference(weights, _arrays(second, 0, n)) <= TOLERANCE


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow's engine "
                    "(JAX: test_distribution.py, torch: DDP above)")
@pytest.mark.parametrize("implementation", ["blockwise", "auto"])
def test_mirrored_strategy_fit_matches_one_device(tmp_path, implementation, default_block_size):
    out = tmp_path / f"mirrored_{implementation}.npz"
    _run(("tensorflow", implementation, out), timeout=240)
    data = np.load(out)
    assert int(data["replicas"]) == 2
    n = (len(data.files) - 2) // 2
    mirrored, single = _arrays(data, 0, n), _arrays(data, n, n)
    assert {"fused", "blockwise", "explicit"} <= set(data["paths"]), data["paths"]
    assert _max_difference(mirrored, single) <= TOLERANCE
    # The comparison can fail: a wrongly scaled replica loss (each replica's mean
    # applied as the global one) would move the weights by about as much again.
    start = dp.weights_of(dp.build_model())
    assert _max_difference(start, single) > 100 * TOLERANCE



DEMO = ["--epochs", "1", "--num-train", "256", "--num-test", "16", "--max-length", "4",
        "--model-dim", "16", "--num-layers", "1", "--batch-size", "32", "--examples", "0"]


@pytest.mark.skipif(BACKEND not in ("torch", "tensorflow"),
                    reason="the JAX demo's --distribute is tested in test_distribution.py")
def test_demo_distribute_data(tmp_path):
    """`keras-attn demo --distribute data` in a fresh process, as a user runs it."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    result = run_in_own_group(
        [sys.executable, "-m", "keras_attn", "demo", *DEMO, "--distribute", "data",
         "--output", str(tmp_path)], cwd=tmp_path, env=env, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    expected = {"torch": "distribution: DistributedDataParallel over 2 process(es)",
                "tensorflow": "distribution: MirroredStrategy over 2 replica(s)"}[BACKEND]
    assert expected in output
    assert "epoch 1/1: loss" in output if BACKEND == "torch" else "loss:" in output
    assert "uncached: yes (16 of 16)" in output
    assert "reloaded model decodes identically: yes" in output
    assert "terminate called" not in output
