"""Qwen 3.5 (`qwen3_5_text`, issue 35) beyond tests/convert/test_families.py's comparison
with transformers: generate's cached greedy tokens are the uncached forwards' argmax (the
prefill through the chunked rule, the steps through the recurrent one and the KV cache),
the layer converters, a config.json with numpy weights, and the attention's layout.

Torch and transformers only (a tiny random transformers model, tests/family_cases.py).
"""

import json

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import convert

from .. import family_cases as fc
from ..helpers import assert_greedy_over_uncached

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "qwen3_5_text"


@pytest.fixture(scope="module")
def converted():
    model = fc.build_hf(NAME)
    return model, fc.token_ids(NAME), convert.causal_lm_from_transformers(model)


def test_generate_is_greedy_over_the_uncached_forwards(converted):
    _, ids, lm = converted
    assert [type(b.self_attention).__name__ for b in lm.blocks] == (
        ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"])
    with keras_attn.observe_paths() as paths:
        tokens = keras.ops.convert_to_numpy(lm.generate(ids[:, :fc.P], max_length=fc.P + fc.NEW))
    # The prompt whole through the chunked rule (3 linear blocks, once), the steps through
    # the recurrent one, the full block over its KV cache.
    assert paths["chunked"] == 3 and paths["recurrent"] >= 3 and paths["cached"], paths
    assert_greedy_over_uncached(lm, tokens, fc.P)


def test_layer_converters_build_the_models_blocks(converted):
    model, _, lm = converted
    x = np.random.default_rng(0).standard_normal((fc.B, 5, fc.D)).astype("float32")
    for i, hf_layer in enumerate(model.model.layers):
        block = convert.transformer_decoder_layer_from_transformers(hf_layer, model.config, i)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(block(x)),
                                      keras.ops.convert_to_numpy(lm.blocks[i](x)))
    attention = convert.multi_head_attention_from_transformers(
        model.model.layers[3].self_attn, model.config, layer_index=3)
    assert attention.use_gate
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(attention(x, use_causal_mask=True)),
        keras.ops.convert_to_numpy(lm.blocks[3].self_attention(x, use_causal_mask=True)))
    with pytest.raises(ValueError, match=r"linear-attention layer.*Received: layer_index=0"):
        convert.multi_head_attention_from_transformers(
            model.model.layers[3].self_attn, model.config, layer_index=0)


def test_config_json_and_numpy_state_dict(converted):
    model, ids, lm = converted
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    again = convert.causal_lm_from_transformers(config, state)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))
    # Without layer_types, transformers' derivation (every 4th layer full) is read.
    del config["layer_types"]
    derived = convert.causal_lm_from_transformers(config, state)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(derived(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))


def test_query_and_gate_interleave_per_head(converted):
    """q_proj's rows are, per head, d query rows then d gate rows: the converted query and
    gate kernels are those rows."""
    model, _, lm = converted
    H, d = fc.H, fc.CASES[NAME][1]["head_dim"]
    rows = model.model.layers[3].self_attn.q_proj.weight.detach().numpy().reshape(H, 2 * d, -1)
    attention = lm.blocks[3].self_attention
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(attention.query_dense.kernel).T,
                                  rows[:, :d].reshape(H * d, -1))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(attention.gate_dense.kernel).T,
                                  rows[:, d:].reshape(H * d, -1))


def test_checkpoint_folder_round_trip(converted, tmp_path):
    """save_pretrained's folder (q_proj's query and gate rows joined back per head) read
    back without torch gives the same model."""
    _, ids, lm = converted
    lm.save_pretrained(tmp_path)
    again = convert.causal_lm_from_pretrained(tmp_path)
    assert [type(b.self_attention).__name__ for b in again.blocks] == (
        ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))
