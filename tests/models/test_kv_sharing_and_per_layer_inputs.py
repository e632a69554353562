"""`CausalLM`'s KV sharing (`kv_sharing`, blocks with `is_kv_shared_layer`) and per-layer
input embeddings (`hidden_size_per_layer_input`), on every backend: cached generation
equals greedy decoding by uncached forwards, the options change the logits, the configs
round-trip (and stay today's when unset), and bad input is refused by name. Their numbers
against transformers' Gemma 4: tests/convert/test_gemma4.py and the family fixtures."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights

from ..helpers import assert_greedy_over_uncached, to_numpy

V, D, P = 40, 16, 4


def _block(shared=False, window=None, per_layer=True):
    return keras_attn.TransformerDecoderLayer(
        4, intermediate_dim=24, key_dim=8, num_key_value_heads=2, rope_max_wavelength=1e4,
        normalization="rms", normalize_first=True, gated_feed_forward=True, activation="silu",
        use_bias=False, sliding_window=window, qk_norm="rms", use_value_norm=True,
        is_kv_shared_layer=shared, use_layer_scalar=True,
        hidden_size_per_layer_input=P if per_layer else None)


def _lm(per_layer=True, sharing=True):
    blocks = [_block(window=3, per_layer=per_layer), _block(per_layer=per_layer),
              _block(shared=sharing, window=3, per_layer=per_layer),
              _block(shared=sharing, per_layer=per_layer)]
    lm = keras_attn.CausalLM(
        V, D, blocks, kv_sharing=[None, None, 0, 1] if sharing else None,
        hidden_size_per_layer_input=P if per_layer else None)
    randomize_weights(lm, seed=3, scale=0.7)
    return lm


def test_generate_is_greedy_over_the_uncached_model():
    lm = _lm()
    prompt = np.random.default_rng(4).integers(0, V, (2, 3))
    tokens = to_numpy(lm.generate(prompt, max_length=10))
    np.testing.assert_array_equal(tokens[:, :3], prompt)
    assert_greedy_over_uncached(lm, tokens, 3)


def test_the_options_change_the_logits_and_round_trip(tmp_path):
    lm = _lm()
    ids = np.random.default_rng(5).integers(0, V, (2, 7))
    out = to_numpy(lm(ids))
    config = lm.get_config()
    assert config["kv_sharing"] == [None, None, 0, 1] and config[
        "hidden_size_per_layer_input"] == P
    path = str(tmp_path / "lm.keras")
    lm.save(path)
    np.testing.assert_array_equal(to_numpy(keras.saving.load_model(path)(ids)), out)
    # Without the per-layer inputs (the gate zeroed: nothing added) the logits move.
    for block in lm.blocks:
        block.per_layer_projection.kernel.assign(np.zeros((P, D), "float32"))
    assert np.abs(to_numpy(lm(ids)) - out).max() > 0.1
    plain = _lm(per_layer=False, sharing=False).get_config()
    for key in ("kv_sharing", "hidden_size_per_layer_input", "vocab_size_per_layer_input"):
        assert key not in plain


def test_a_shared_block_reads_its_source_not_its_input():
    """The shared blocks own no key/value weights, and which block they read matters: block
    2 reading block 1's keys and values instead of block 0's moves the logits."""
    lm = _lm()
    assert not hasattr(lm.blocks[2].self_attention, "key_dense")
    assert not hasattr(lm.blocks[3].self_attention, "value_dense")
    ids = np.random.default_rng(6).integers(0, V, (2, 7))
    config = lm.get_config()
    config["kv_sharing"] = [None, None, 1, 1]  # block 2 from block 1 instead of block 0
    other = keras_attn.CausalLM.from_config(config)
    other.set_weights(lm.get_weights())
    assert np.abs(to_numpy(other(ids)) - to_numpy(lm(ids))).max() > 0.1


@pytest.mark.parametrize("kv_sharing, match", [
    ([None, 0], r"kv_sharing=\[None, 0\]"),  # one entry per block: 4
    ([None, None, 2, 1], r"kv_sharing\[2\]"),  # not an earlier block
    ([None, None, 0, 2], r"kv_sharing\[3\]"),  # a source that shares itself
    ([None, None, 0, None], r"kv_sharing\[3\]=None, is_kv_shared_layer=True"),
])
def test_bad_kv_sharing_is_refused(kv_sharing, match):
    blocks = [_block(window=3), _block(), _block(shared=True, window=3), _block(shared=True)]
    with pytest.raises(ValueError, match=match):
        keras_attn.CausalLM(V, D, blocks, kv_sharing=kv_sharing, hidden_size_per_layer_input=P)


def test_bad_per_layer_inputs_are_refused():
    with pytest.raises(ValueError, match="hidden_size_per_layer_input=0"):
        keras_attn.CausalLM(V, D, [_block()], hidden_size_per_layer_input=0)
    with pytest.raises(ValueError, match="vocab_size_per_layer_input=8"):
        keras_attn.CausalLM(V, D, [_block(per_layer=False)], vocab_size_per_layer_input=8)
    block = _block()
    block.build((None, None, D))
    with pytest.raises(ValueError, match="per_layer_input=None"):
        block(np.zeros((1, 3, D), "float32"))
    shared = keras_attn.MultiHeadAttention(4, 8, is_kv_shared_layer=True)
    with pytest.raises(ValueError, match="is_kv_shared_layer=True.*cache=None"):
        shared(np.zeros((1, 3, D), "float32"))
