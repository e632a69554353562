"""Every layer case of `tests/harness.py` through the same checks, on every backend.

Keras checks its layers with `keras.src.testing.TestCase.run_layer_test`: the
weight counts, `get_config` / `from_config` and JSON round trips, symbolic
against eager calls (output shapes and dtypes), a training step, and the mixed
precision policies. The same harness runs here for each case, then the float64
reference (with the attention path observed), a `.keras` round trip, and cached
decoding against the uncached forward.
"""

import keras
import numpy as np
import pytest
from keras.src.testing import TestCase

import keras_attn
from keras_attn._policy import observe_paths
from keras_attn.testing.weights import reference_params

from ..harness import CASES, functional_model
from ..helpers import UNCACHED, assert_close, to_numpy

BACKEND = keras.backend.backend()
TRAINS = BACKEND != "numpy"
PATHS = {"explicit", "fused", "blockwise"}


class _Harness(TestCase):
    def runTest(self):  # a TestCase instance needs one test method
        pass


@pytest.mark.filterwarnings("ignore:`shuffle=True` was passed")  # the harness's own fit call
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.keras_shapes))
def test_keras_run_layer_test(name):
    case = CASES[name]
    shapes = case.keras_shapes
    harness = _Harness()
    harness.run_layer_test(
        case.cls, init_kwargs=case.kwargs,
        input_shape=shapes if len(shapes) > 1 else next(iter(shapes.values())),
        expected_output_shape=case.expected_shape,
        expected_num_trainable_weights=case.trainable_weights,
        expected_num_non_trainable_weights=case.non_trainable_weights,
        supports_masking=True,
        run_training_check=TRAINS and len(shapes) == 1,  # as Keras tests its own MHA
    )


WITH_REFERENCE = sorted(n for n, c in CASES.items() if c.reference is not None)


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_case_matches_the_float64_reference_and_a_path_ran(name):
    case = CASES[name]
    layer, arrays = case.build(seed=3)
    with observe_paths() as taken:
        out = layer(**arrays, **case.call)
    assert_close(out, case.reference(reference_params(layer), arrays), what=name)
    ran = set(taken) & PATHS
    if case.attends:
        assert ran, f"{name}: no attention path recorded ({dict(taken)})"
    else:
        assert not ran, f"{name}: has no attention, yet recorded {dict(taken)}"


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_case_predicts_the_same_after_a_keras_file_round_trip(name, tmp_path):
    case = CASES[name]
    layer, arrays = case.build(seed=4)
    model = functional_model(layer, arrays, case.call)
    before = to_numpy(model.predict_on_batch(arrays))
    path = tmp_path / f"{name}.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(reloaded.predict_on_batch(arrays)), before)
    assert_close(before, case.reference(reference_params(layer), arrays), what=f"{name} saved")


def _cached_call(case, layer, x, cache, start):
    if case.cache == "mha":
        return layer(x, cache=cache, cache_update_index=start, **case.call)
    return layer(x, self_attention_cache=cache, self_attention_cache_update_index=start,
                 **case.call)


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.cache))
def test_cached_decoding_equals_the_uncached_forward(name):
    """A prefill of 2 tokens then one-token steps: each step's rows are the uncached
    forward's, and the path taken over the cache is observed."""
    case = CASES[name]
    layer, arrays = case.build(seed=5)
    (x,) = arrays.values()
    full = to_numpy(layer(**arrays, **case.call))
    B, T = x.shape[:2]
    cache = keras_attn.empty_cache(layer, B, T + 1)
    start = 0
    with observe_paths() as taken:
        for stop in (2, *range(3, T + 1)):
            out, cache = _cached_call(case, layer, x[:, start:stop], cache, start)
            assert_close(out, full[:, start:stop], what=f"{name} rows {start}:{stop}",
                         against=UNCACHED)
            start = stop
    assert taken["cached"] == T - 1, dict(taken)
