"""Blocks with a given `attention=` or `feed_forward=`: a layer, a factory, a serialized layer.

The default sublayers' weights, names and numbers are checked elsewhere
(tests/layers/test_layers.py); here a block built from a factory of the default is
the default exactly, a custom attention and feed-forward match a float64
reference of the block around them, the given layers survive a `.keras`
file, and the arguments they would make meaningless are refused.
"""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights

from ..custom_sublayers import (
    MeanAttention,
    TanhFeedForward,
    float64_weights,
    mean_attention_reference,
    tanh_feed_forward_reference,
)
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H = 2, 5, 8, 2
BLOCKS = [keras_attn.TransformerEncoderLayer, keras_attn.TransformerDecoderLayer]


def _mha_factory(name, dtype):
    return keras_attn.MultiHeadAttention(H, D // H, name=name, dtype=dtype)


def _ff_factory(name, dtype):
    return keras_attn.PositionwiseFeedForward(16, name=name, dtype=dtype)


@pytest.mark.parametrize("cls", BLOCKS)
def test_factories_of_the_defaults_give_the_default_block(cls):
    """Same variable paths, same numbers: the factory is called with the block's names."""
    x = randn(rng(0), B, T, D)
    default = cls(H, intermediate_dim=16)
    given = cls(attention=_mha_factory, feed_forward=_ff_factory,
                **({"num_heads": H} if cls is keras_attn.TransformerDecoderLayer else {}))
    default.build(x.shape)
    given.build(x.shape)
    randomize_weights(default, seed=1)
    strip = lambda layer: [v.path.split("/", 1)[1] for v in layer.weights]  # noqa: E731
    assert strip(given) == strip(default)
    assert given.self_attention.name == "self_attention"
    assert given.feed_forward.name == "feed_forward"
    for mine, theirs in zip(given.weights, default.weights, strict=True):
        mine.assign(theirs)
    np.testing.assert_array_equal(to_numpy(given(x)), to_numpy(default(x)))


def test_a_default_block_config_has_no_new_keys():
    """Configs stay what today's files hold: the new arguments appear only when set."""
    for cls in BLOCKS:
        config = cls(H, intermediate_dim=16).get_config()
        assert not {"attention", "feed_forward", "residual_scale"} & set(config)
        assert config["num_heads"] == H and config["intermediate_dim"] == 16


def _block_reference(params, x, causal, normalize_first, value_mask=None):
    """Norms and residuals of the block (LayerNorm, eps 1e-5) around the two custom layers."""
    attend = lambda h: mean_attention_reference(  # noqa: E731
        params["self_attention"], h, causal, value_mask)
    ffn = lambda h: tanh_feed_forward_reference(params["feed_forward"], h)  # noqa: E731
    x = reference._sublayer(x, attend, params["self_attention_norm"], 1e-5, normalize_first)
    return reference._sublayer(x, ffn, params["feed_forward_norm"], 1e-5, normalize_first)


def _params(block):
    norms = {name: {leaf: to_numpy(getattr(getattr(block, name), leaf)).astype(np.float64)
                    for leaf in ("gamma", "beta")}
             for name in ("self_attention_norm", "feed_forward_norm")}
    return {"self_attention": float64_weights(block.self_attention),
            "feed_forward": float64_weights(block.feed_forward), **norms}


@pytest.mark.parametrize("cls,normalize_first", [(keras_attn.TransformerEncoderLayer, False),
                                                 (keras_attn.TransformerDecoderLayer, True)])
def test_custom_attention_and_feed_forward_match_the_reference(cls, normalize_first):
    g = rng(2)
    x = randn(g, B, T, D)
    real = np.arange(T) < np.array([[T], [3]])
    attention = MeanAttention(name="mean_attention")  # an instance: it keeps its own name
    block = cls(attention=attention, feed_forward=lambda **kw: TanhFeedForward(12, **kw),
                normalize_first=normalize_first)
    block.build(x.shape)
    assert block.self_attention is attention and block.feed_forward.units == 12
    randomize_weights(block, seed=3)
    causal = cls is keras_attn.TransformerDecoderLayer
    out, scores = block(x, padding_mask=real, return_attention_scores=True)
    expected = _block_reference(_params(block), x, causal, normalize_first, real)
    assert_close(out, expected)
    assert tuple(scores.shape) == (B, 1, T, T)
    # Ablation: the other causality moves the numbers far past the tolerance.
    wrong = _block_reference(_params(block), x, not causal, normalize_first, real)
    assert np.abs(wrong - to_numpy(out)).max() > 1e-2


_ABSENT = "absent"  # a default no caller passes: what the block left out stays this


class _Recording(MeanAttention):
    calls: list = []  # the keywords each call received, read by the test

    def call(self, query, use_causal_mask=_ABSENT, training=None, attention_mask=_ABSENT,
             value_mask=_ABSENT, return_attention_scores=_ABSENT, cache=_ABSENT,
             cache_update_index=_ABSENT):
        given = dict(use_causal_mask=use_causal_mask, attention_mask=attention_mask,
                     value_mask=value_mask, return_attention_scores=return_attention_scores,
                     cache=cache, cache_update_index=cache_update_index)
        _Recording.calls.append(sorted(k for k, v in given.items() if v is not _ABSENT))
        kept = {k: v for k, v in given.items() if v is not _ABSENT}
        return super().call(query, training=training, **kept)


def test_the_block_passes_only_what_applies():
    """The contract: query, use_causal_mask and training, then each extra only when set."""
    x = randn(rng(4), B, T, D)
    block = keras_attn.TransformerEncoderLayer(attention=_Recording(),
                                               intermediate_dim=16)
    _Recording.calls.clear()
    block(x)
    block(x, padding_mask=np.ones((B, T), bool), attention_mask=np.ones((B, T, T), bool),
          return_attention_scores=True)
    assert _Recording.calls == [
        ["use_causal_mask"],
        ["attention_mask", "return_attention_scores", "use_causal_mask", "value_mask"]]


@pytest.mark.parametrize("cls", BLOCKS)
def test_given_sublayers_round_trip_through_a_keras_file(cls):
    x = randn(rng(5), B, T, D)
    block = cls(attention=MeanAttention, feed_forward=TanhFeedForward(10),
                normalize_first=True, residual_scale=0.5)
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, block(inputs))
    randomize_weights(model, seed=6)
    config = block.get_config()
    assert config["attention"]["class_name"] == "MeanAttention"
    assert config["feed_forward"]["config"]["units"] == 10
    assert config["residual_scale"] == 0.5
    assert "intermediate_dim" not in config and "sliding_window" not in config
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "block.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    restored = loaded.layers[-1]
    assert isinstance(restored.self_attention, MeanAttention)
    assert isinstance(restored.feed_forward, TanhFeedForward)
    assert restored.residual_scale == 0.5
    assert_close(loaded(x), to_numpy(model(x)), against=UNCACHED)


def test_the_flat_arguments_a_given_layer_replaces_are_refused():
    mha = keras_attn.MultiHeadAttention
    enc, dec = keras_attn.TransformerEncoderLayer, keras_attn.TransformerDecoderLayer
    with pytest.raises(ValueError, match=r"ignored: sliding_window.*Received: sliding_window=4"):
        dec(H, attention=mha(H, 4), intermediate_dim=16, sliding_window=4)
    with pytest.raises(ValueError, match=r"ignored: num_heads, key_dim\..*num_heads=2, key_dim=4"):
        enc(H, key_dim=4, attention=mha(H, 4), intermediate_dim=16)
    with pytest.raises(ValueError, match=r"ignored: rope_max_wavelength"):
        enc(attention=mha(H, 4), intermediate_dim=16, rope_max_wavelength=1e4)
    with pytest.raises(ValueError, match=r"ignored: intermediate_dim, gated_feed_forward, "
                                         r"activation"):
        enc(H, feed_forward=TanhFeedForward(4), intermediate_dim=16, gated_feed_forward=True,
            activation="silu")
    # "relu" spelled as the function is the default, not an ignored argument.
    enc(H, feed_forward=TanhFeedForward(4), activation=keras.activations.relu)
    # A decoder's num_heads, key_dim, ... configure its default cross-attention.
    block = dec(H, key_dim=4, attention=MeanAttention(), intermediate_dim=16)
    x, memory = randn(rng(7), B, T, D), randn(rng(8), B, 3, D)
    block.build(x.shape, memory.shape)
    assert block.cross_attention.key_dim == 4
    with pytest.raises(ValueError, match=r"needs `num_heads`.*Received: num_heads=None"):
        dec(attention=MeanAttention(), intermediate_dim=16).build(x.shape, memory.shape)


def test_what_is_not_a_layer_is_refused():
    enc = keras_attn.TransformerEncoderLayer
    with pytest.raises(ValueError, match=r"`attention` must be a keras.layers.Layer.*"
                                         r"Received: attention=3 of type int"):
        enc(attention=3, intermediate_dim=16)
    with pytest.raises(ValueError, match=r"`feed_forward` factory must return a keras.layers"
                                         r".Layer.*returned str"):
        enc(H, feed_forward=lambda name, dtype: "dense")
    with pytest.raises(ValueError, match=r"Received: intermediate_dim=None"):
        enc(H)  # without a given feed-forward, the default's width is required
