"""A `.keras` file saved by an earlier release loads and predicts the same.

`tests/assets/saved_by_0_1_0.keras` was saved under JAX by keras_attn 0.1.0 (main on
2026-12-01, before the renovation of the package's layout; see
`tests/assets/make_saved_by_0_1_0.py`). Every public layer with every option it had
is in it. Public names, weight names and serialised configs are a contract: this file
must load under every backend, with the same weight paths, and predict what it
predicted when it was saved. `saved_by_main_2026_12_02_*.keras` (a functional model and
a `CausalLM`, with the options added since 0.1.0) were saved by main before issue 32's
renovation, and hold to the same contract, generated tokens included.
"""

import dataclasses
import json
import os
import re
import zipfile

import keras
import numpy as np
import pytest

import keras_attn  # noqa: F401  (registers the layers for deserialisation)

from .helpers import assert_close, keras_version

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def _saved_by_keras(path):
    with zipfile.ZipFile(path) as archive:
        text = json.loads(archive.read("metadata.json"))["keras_version"]
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3]), text


_SAVED_BY = _saved_by_keras(os.path.join(ASSETS, "saved_by_0_1_0.keras"))


# Keras reads the files older Keras releases wrote, not those of newer ones (at the
# declared floor, Keras 3.9, GlorotUniform has no `input_axes`): the contract tested
# here is keras_attn's, so it holds from the Keras that saved the file on.
@pytest.mark.skipif(keras_version() < _SAVED_BY[0],
                    reason=f"the file was saved by Keras {_SAVED_BY[1]}; Keras "
                    f"{keras.__version__} cannot read a newer Keras's configs")
def test_a_file_saved_by_0_1_0_loads_and_predicts_the_same():
    stored = np.load(os.path.join(ASSETS, "saved_by_0_1_0.npz"))  # arrays only, no pickle
    model = keras.saving.load_model(os.path.join(ASSETS, "saved_by_0_1_0.keras"))
    assert [w.path for w in model.weights] == stored["weight_paths"].tolist()
    output = model([stored["x"], stored["memory"]])
    assert_close(output, stored["output"],
                 what=f"saved under {stored['backend']}, loaded under {keras.backend.backend()}")
    # The check can fail: one option read back wrong (the decoder's RoPE pairing) moves
    # the output far beyond the tolerance.
    attention = model.get_layer("decoder").self_attention
    attention.options = dataclasses.replace(attention.options, rope_interleaved=False)
    moved = np.abs(keras.ops.convert_to_numpy(model([stored["x"], stored["memory"]]))
                   - stored["output"]).max()
    assert moved > 1e-2, moved


_MAIN = "saved_by_main_2026_12_02"
_MAIN_SAVED_BY = _saved_by_keras(os.path.join(ASSETS, _MAIN + "_functional.keras"))


# The second fixture: saved by main on 2026-12-02, before issue 32 renovated the kernel
# spec, the RoPE spec, the blocks, the cache and the converters
# (`tests/assets/make_saved_by_main_2026_12_02.py`); it holds the options 0.1.0's lacks.
@pytest.mark.skipif(keras_version() < _MAIN_SAVED_BY[0],
                    reason=f"the file was saved by Keras {_MAIN_SAVED_BY[1]}; Keras "
                    f"{keras.__version__} cannot read a newer Keras's configs")
def test_files_saved_by_main_before_the_renovation_load_and_predict_the_same():
    stored = np.load(os.path.join(ASSETS, _MAIN + ".npz"))  # arrays only, no pickle
    where = f"saved under {stored['backend']}, loaded under {keras.backend.backend()}"
    functional = keras.saving.load_model(os.path.join(ASSETS, _MAIN + "_functional.keras"))
    assert [w.path for w in functional.weights] == stored["functional_weight_paths"].tolist()
    assert_close(functional(stored["x"]), stored["output"], what="functional, " + where)
    lm = keras.saving.load_model(os.path.join(ASSETS, _MAIN + "_causal_lm.keras"))
    # Where a weight is made decides whether its path starts with the model's scope
    # ("lm/block_0/..." when the blocks were built inside `lm`, "block_0/..." when
    # `load_model` deserialises them first): the same weights either way.
    assert [w.path.removeprefix("lm/") for w in lm.weights] == [
        p.removeprefix("lm/") for p in stored["causal_lm_weight_paths"].tolist()]
    assert_close(lm(stored["ids"]), stored["logits"], what="CausalLM, " + where)
    tokens = lm.generate(stored["ids"][:, :3], max_length=stored["tokens"].shape[1])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens), stored["tokens"])
    # The checks can fail: one option read back wrong moves the numbers far past the
    # tolerance (yarn read as linear scaling in the functional model, a block's window in the LM).
    attention = functional.get_layer("mha")
    attention.options = dataclasses.replace(attention.options, rope_type="linear")
    moved = np.abs(keras.ops.convert_to_numpy(functional(stored["x"])) - stored["output"]).max()
    assert moved > 1e-2, moved
    block = lm.blocks[0].self_attention
    block.options = dataclasses.replace(block.options, sliding_window=None)
    moved = np.abs(keras.ops.convert_to_numpy(lm(stored["ids"])) - stored["logits"]).max()
    assert moved > 1e-2, moved
