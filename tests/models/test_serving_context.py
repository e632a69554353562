"""Issue 38 item 4: `CausalLM.generate` where a server calls it, under a
`tf.distribute` strategy and from several threads at once.

Both tests failed before the fix: under `MirroredStrategy` over two devices TensorFlow
returned `(2 B, L)` (every replica decoded the whole batch and Keras's predict
concatenated them), and a model built outside the scope raised "Trying to access resource
... located in device CPU:0 from device CPU:1"; on JAX, four threads generating with one
model raised "Buffer has been deleted or donated" (Keras's predict donates the weights'
buffers to its compiled function while the other threads read them).
"""

import os
import sys
import threading

import keras
import numpy as np
import pytest

import keras_attn

from ..helpers import run_in_own_group

BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V, D = 16, 8
PROMPTS = np.array([[1, 2, 3], [4, 5, 6]], "int32")


def make_lm(weights=None):
    block = keras_attn.TransformerDecoderLayer(
        intermediate_dim=12, num_heads=2, normalize_first=True, normalization="rms")
    lm = keras_attn.CausalLM(V, D, [block])
    lm(np.zeros((1, 3), "int32"))
    if weights is not None:
        lm.set_weights(weights)
    return lm


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow's")
def test_generate_under_mirrored_strategy_is_generate_without_it(tmp_path):
    out = tmp_path / "out.npz"
    done = run_in_own_group([sys.executable, os.path.join(ROOT, "tests", "serving_worker.py"),
                             str(out)], timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    results = dict(np.load(out))
    assert int(results["replicas"]) == 2
    for case in ("greedy", "greedy_graph", "sampled"):
        expected = results[f"unscoped/{case}"]
        assert expected.shape == (2, 9)
        for where in ("scoped", "outside_model_in_scope", "scoped_model_outside"):
            if where != "scoped" and case != "greedy":
                continue
            np.testing.assert_array_equal(results[f"{where}/{case}"], expected,
                                          err_msg=f"{where}/{case}")
    # The one-replica path ran for each of the scoped model's loops (made in the scope),
    # and for the outside model's greedy loop called in it (the same loop: its key is).
    assert int(results["one_replica_loops"]) == int(results["scoped_loops"]) == 3
    assert tuple(results["outside_loops"]) == (3, 3)
    assert int(results["outside_one_replica_loops"]) == 1


def _generate_at_once(lm, prompts):
    """`lm.generate(prompt, 10)` for each prompt, each in a thread, started together:
    the tokens and the errors raised (with the thread's index)."""
    start = threading.Barrier(len(prompts))
    results, errors = [None] * len(prompts), []

    def run(i):
        start.wait()
        try:
            results[i] = np.asarray(lm.generate(prompts[i], 10))
        except Exception as error:  # noqa: BLE001  (reported by the test, with its thread)
            errors.append((i, repr(error)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


@pytest.mark.skipif(BACKEND == "numpy", reason="NumPy keeps no compiled loop")
def test_generate_from_four_threads_is_generate_one_after_the_other():
    lm = make_lm()
    prompts = [np.array([[i, i + 1, i + 2]], "int32") for i in range(4)]
    expected = [np.asarray(lm.generate(p, 10)) for p in prompts]  # compiled once, here
    for _ in range(3):  # JAX failed from the second round (the first may race compiles)
        results, errors = _generate_at_once(lm, prompts)
        assert not errors, errors
        for got, want in zip(results, expected, strict=True):
            np.testing.assert_array_equal(got, want)
