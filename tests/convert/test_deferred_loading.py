"""A converted model's variables are made without values; the checkpoint's are their first.

`convert._common.deferred_variables` (Keras's `StatelessScope(initialize_variables=False)`)
around the model's construction, then `_common.assign`: every variable of the weight plan
is initialised once, from its checkpoint array, and Keras's own (random) initializers never
run for them. That is what cut the peak host memory of loading a 0.92 GiB folder from 1.9x
to 1.3x its size on JAX (benchmarks/loading.py). Observed here: the loader initializer ran
for every planned variable, no uninitialised variable is left behind (also after a refused
checkpoint), and the values are the checkpoint's.
"""

import os

import keras
import numpy as np
import pytest

from keras_attn import convert
from keras_attn.convert import _common, pretrained

pytest.importorskip("safetensors")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDER = os.path.join(ROOT, "tests", "assets", "pretrained", "llama")


def _uninitialised_left():
    """Variables Keras still holds for deferred initialisation (its registry)."""
    from keras.src.backend.common import global_state

    return list(global_state.get_global_attribute("uninitialized_variables") or [])


def test_planned_variables_take_the_checkpoint_as_their_first_value(monkeypatch):
    loaded = []
    loader = _common._loader

    def counting_loader(array):
        initializer = loader(array)

        def initialise(shape, dtype=None):
            loaded.append(tuple(shape))
            return initializer(shape, dtype)
        return initialise

    monkeypatch.setattr(_common, "_loader", counting_loader)
    lm = convert.causal_lm_from_pretrained(FOLDER, dtype="float32")
    state = pretrained.read_state_dict(FOLDER)
    # Every checkpoint tensor reached a variable through the deferred path (the llama
    # fixture has one variable per tensor), and nothing waits for initialisation.
    assert len(loaded) == len(state) == len(lm.weights)
    assert not _uninitialised_left()
    embedding = keras.ops.convert_to_numpy(lm.token_embedding.embeddings)
    np.testing.assert_array_equal(embedding, np.asarray(state["model.embed_tokens.weight"]))
    stored = np.load(os.path.join(FOLDER, "reference.npz"), allow_pickle=False)
    logits = keras.ops.convert_to_numpy(lm(stored["token_ids"]))
    assert np.abs(logits - stored["logits"]).max() / np.abs(stored["logits"]).max() < 1e-4


def test_a_refused_checkpoint_leaves_no_variable_waiting(tmp_path):
    state = dict(pretrained.read_state_dict(FOLDER))
    state["model.layers.0.self_attn.q_proj.weight"] = np.zeros((3, 3), "float32")
    import json

    with open(os.path.join(FOLDER, "config.json")) as handle:
        config = json.load(handle)
    with pytest.raises(ValueError, match="q_proj"):
        convert.causal_lm_from_transformers(config, state)
    assert not _uninitialised_left()
    # A later model is made and initialised as usual.
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    assert keras.ops.convert_to_numpy(layer.kernel).shape == (3, 2)


def test_nothing_is_deferred_under_a_distribution():
    """A layout may shard a variable at initialisation in a compiled initializer, which would
    embed the array: under a distribution the variables are made and assigned as before."""
    if keras.backend.backend() != "jax":
        pytest.skip("keras.distribution is JAX's")
    devices = keras.distribution.list_devices()
    distribution = keras.distribution.DataParallel(devices=devices)
    with distribution.scope():
        with _common.deferred_variables() as scope:
            assert scope._scope is None
            layer = keras.layers.Dense(2)
            layer.build((None, 3))
        assert layer.kernel._value is not None
