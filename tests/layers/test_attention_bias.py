"""`attention_bias` (an additive bias on the logits) in `MultiHeadAttention` and the blocks,
and `use_gate` through the blocks' self-attention.

Against the float64 reference (`reference.multi_head_attention(attention_bias=...)`,
`reference.decoder_layer` with the gate's weights), on each path (observed), over a
cache, and with ablations (no bias, no gate) that move the numbers far past the
tolerance.
"""

import json

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn._policy import observe_paths
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

B, T, D, H, H_KV, d = 2, 6, 16, 4, 2, 4
PATHS = ["explicit", "fused", "blockwise"]


@pytest.fixture
def small_blocks():
    keras_attn.config.set_attention_block_size(2)
    yield
    keras_attn.config.set_attention_block_size(None)


def _mha(implementation="auto", **options):
    layer = keras_attn.MultiHeadAttention(H, d, num_key_value_heads=H_KV,
                                          rope_max_wavelength=100.0,
                                          implementation=implementation, **options)
    x = randn(rng(0), B, T, D)
    layer(x, x, use_causal_mask=True)
    randomize_weights(layer, seed=1)
    return layer, x


def _t5_bias(query_length, key_length, offset=0):
    """A T5-style relative position bias `(1, H, T, S)`: one learned scalar per head and
    relative-distance bucket (here: a random table over clipped distances)."""
    table = rng(7).normal(0.0, 1.5, size=(H, 9))
    distance = (np.arange(key_length)[None] - (np.arange(query_length)[:, None] + offset))
    return table[:, np.clip(distance, -4, 4) + 4][None].astype("float32")  # (1, H, T, S)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options", [{}, {"logit_soft_cap": 2.0}])
def test_bias_on_each_path_matches_reference(path, options, small_blocks):
    if path == "fused" and options:
        pytest.skip("the fused kernel takes no soft-cap (a ValueError)")
    layer, x = _mha(path, **options)
    bias = _t5_bias(T, T)
    kwargs = dict(num_heads=H, num_key_value_heads=H_KV, is_causal=True,
                  rope_max_wavelength=100.0, **options)
    expected, _ = reference.multi_head_attention(reference_params(layer), x, x,
                                                 attention_bias=bias, **kwargs)
    with observe_paths() as taken:
        out = layer(x, x, use_causal_mask=True, attention_bias=bias)
    assert taken == {path: 1}
    assert_close(out, expected)
    plain, _ = reference.multi_head_attention(reference_params(layer), x, x, **kwargs)
    assert np.abs(plain - expected).max() > 0.05  # the ablation: no bias


def test_bias_broadcasts_and_forbids_with_minus_infinity():
    layer, x = _mha()
    params = reference_params(layer)
    kwargs = dict(num_heads=H, num_key_value_heads=H_KV, is_causal=True,
                  rope_max_wavelength=100.0)
    per_key = rng(2).normal(size=(T,)).astype("float32")  # (S,): broadcast over B, H, T
    expected, _ = reference.multi_head_attention(params, x, x, attention_bias=per_key, **kwargs)
    assert_close(layer(x, x, use_causal_mask=True, attention_bias=per_key), expected)
    forbid = np.zeros((B, 1, T, T), "float32")
    forbid[:, :, :, 0] = -np.inf  # key 0 never attended (row 0 then attends nothing)
    expected, _ = reference.multi_head_attention(params, x, x, attention_bias=forbid, **kwargs)
    assert_close(layer(x, x, use_causal_mask=True, attention_bias=forbid), expected)


def test_cached_decode_with_bias_over_the_cache_slots():
    layer, x = _mha()
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True,
        rope_max_wavelength=100.0, attention_bias=_t5_bias(T, T))
    cache = keras_attn.empty_cache(layer, batch_size=B, max_length=T, as_kv_cache=True)
    outs = []
    for start, stop in ((0, 3), (3, 4), (4, 5), (5, 6)):
        bias = _t5_bias(stop - start, T, offset=start)  # (1, H, T_new, S_max)
        out, cache = layer(x[:, start:stop], x[:, start:stop], cache=cache,
                           cache_update_index=start, use_causal_mask=True, attention_bias=bias)
        outs.append(to_numpy(out))
    assert_close(np.concatenate(outs, axis=1), expected)


def test_bad_bias_is_refused_by_name():
    layer, x = _mha()
    with pytest.raises(ValueError, match=r"`attention_bias` is an additive float bias.*"
                                         r"Received: attention_bias.dtype=bool"):
        layer(x, x, attention_bias=np.ones((T, T), bool))
    with pytest.raises(ValueError, match=r"Received: attention_bias.dtype=int32"):
        layer(x, x, attention_bias=np.ones((T, T), "int32"))
    with pytest.raises(ValueError, match=r"`attention_bias` must be broadcastable to "
                                         r"\(B, H, T, S\).*Received: attention_bias.shape="
                                         r"\(3, 6, 6\)"):
        layer(x, x, attention_bias=np.zeros((3, T, T), "float32"))
    cache = keras_attn.empty_cache(layer, batch_size=B, max_length=8, as_kv_cache=True)
    with pytest.raises(ValueError, match=r"attention_bias.shape=\(1, 6\)"):  # S is S_max = 8
        layer(x[:, :1], x[:, :1], cache=cache, cache_update_index=0,
              attention_bias=np.zeros((1, T), "float32"))


def _block(cls, **kwargs):
    block = cls(H, intermediate_dim=12, num_key_value_heads=H_KV, rope_max_wavelength=100.0,
                normalize_first=True, **kwargs)
    x = randn(rng(3), B, T, D)
    block(x)
    randomize_weights(block, seed=4)
    return block, x


@pytest.mark.parametrize("cls, causal", [(keras_attn.TransformerDecoderLayer, True),
                                         (keras_attn.TransformerEncoderLayer, False)])
def test_blocks_pass_the_bias_to_their_self_attention(cls, causal):
    block, x = _block(cls)
    bias = _t5_bias(T, T)
    options = dict(num_key_value_heads=H_KV, rope_max_wavelength=100.0)
    expected = reference.decoder_layer(
        reference_params(block), x, H, is_causal=causal, normalize_first=True,
        attention_options={**options, "attention_bias": bias})
    assert_close(block(x, attention_bias=bias), expected)
    plain = reference.decoder_layer(reference_params(block), x, H, is_causal=causal,
                                    normalize_first=True, attention_options=options)
    assert np.abs(plain - expected).max() > 0.05


@pytest.mark.parametrize("cls, causal", [(keras_attn.TransformerDecoderLayer, True),
                                         (keras_attn.TransformerEncoderLayer, False)])
def test_blocks_use_gate_matches_reference(cls, causal):
    block, x = _block(cls, use_gate=True)
    assert block.self_attention.use_gate
    params = reference_params(block)
    assert "gate" in params["self_attention"]
    options = dict(num_key_value_heads=H_KV, rope_max_wavelength=100.0)
    expected = reference.decoder_layer(params, x, H, is_causal=causal, normalize_first=True,
                                       attention_options=options)
    assert_close(block(x), expected)
    # The ablation: the same weights without the gate.
    del params["self_attention"]["gate"]
    ungated = reference.decoder_layer(params, x, H, is_causal=causal, normalize_first=True,
                                      attention_options=options)
    assert np.abs(ungated - expected).max() > 0.05
    # The config: `use_gate` only when set, and it round-trips (a .keras file too).
    config = block.get_config()
    assert config["use_gate"] is True
    assert "use_gate" not in cls(H, intermediate_dim=12).get_config()
    again = cls.from_config(json.loads(json.dumps(config)))
    again(x)
    again.set_weights(block.get_weights())
    assert_close(again(x), expected)


def test_decoder_gate_is_self_attention_only_and_old_configs_load():
    block = keras_attn.TransformerDecoderLayer(H, intermediate_dim=12, use_gate=True)
    block(randn(rng(5), B, T, D), randn(rng(6), B, 3, D))
    assert block.self_attention.use_gate and not block.cross_attention.use_gate
    config = keras_attn.TransformerDecoderLayer(H, intermediate_dim=12).get_config()
    config.pop("use_gate", None)  # a config from before the argument
    assert not keras_attn.TransformerDecoderLayer.from_config(config).use_gate
    with pytest.raises(ValueError, match=r"use_gate=True"):
        keras_attn.TransformerDecoderLayer(
            intermediate_dim=12, use_gate=True,
            attention=keras_attn.MultiHeadAttention(H, d))
    with pytest.raises(ValueError, match=r"Received: use_gate='yes'"):
        keras_attn.TransformerEncoderLayer(H, intermediate_dim=12, use_gate="yes")


def test_cached_block_with_bias_matches_uncached():
    block, x = _block(keras_attn.TransformerDecoderLayer)
    full = to_numpy(block(x, attention_bias=_t5_bias(T, T)))
    cache = keras_attn.empty_cache(block, B, T, as_kv_cache=True)
    outs = []
    for start, stop in ((0, 4), (4, 5), (5, 6)):
        out, cache = block(x[:, start:stop], self_attention_cache=cache,
                           self_attention_cache_update_index=start,
                           attention_bias=_t5_bias(stop - start, T, offset=start))
        outs.append(to_numpy(out))
    assert_close(np.concatenate(outs, axis=1), full, against="uncached forward")


def test_symbolic_call_with_bias():
    block = keras_attn.TransformerEncoderLayer(H, intermediate_dim=12)
    inputs = keras.Input((T, D))
    bias = keras.Input((H, T, T))
    model = keras.Model([inputs, bias], block(inputs, attention_bias=bias))
    x = randn(rng(8), B, T, D)
    b = _t5_bias(T, T).repeat(B, axis=0)
    assert_close(model([x, b]), to_numpy(block(x, attention_bias=b)), against="eager")


def test_a_callable_implementation_receives_the_bias():
    """A user's attention function gets `bias=` (heads-first), only when one is given."""
    seen = []

    def attention_fn(query, key, value, **kwargs):
        seen.append("bias" in kwargs)
        return keras_attn.scaled_dot_product_attention(query, key, value, **kwargs)

    layer, x = _mha(attention_fn)
    bias = _t5_bias(T, T)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True,
        rope_max_wavelength=100.0, attention_bias=bias)
    assert_close(layer(x, x, use_causal_mask=True, attention_bias=bias), expected)
    layer(x, x, use_causal_mask=True)
    assert seen[-2:] == [True, False]


def test_a_given_attention_receives_the_bias_only_when_set():
    calls = []

    @keras.saving.register_keras_serializable(package="test_attention_bias")
    class Recording(keras_attn.MultiHeadAttention):
        def call(self, query, use_causal_mask=False, training=None, attention_bias=None):
            calls.append(attention_bias is not None)
            return super().call(query, use_causal_mask=use_causal_mask, training=training,
                                attention_bias=attention_bias)

    block = keras_attn.TransformerEncoderLayer(
        intermediate_dim=12, attention=Recording(H, d, num_key_value_heads=H_KV))
    x = randn(rng(9), B, T, D)
    block(x)
    block(x, attention_bias=_t5_bias(T, T))
    assert calls[-2:] == [False, True]

    @keras.saving.register_keras_serializable(package="test_attention_bias")
    class NoBias(keras_attn.MultiHeadAttention):  # written before the argument
        def call(self, query, use_causal_mask=False, training=None):
            return super().call(query, use_causal_mask=use_causal_mask, training=training)

    old = keras_attn.TransformerEncoderLayer(intermediate_dim=12, attention=NoBias(H, d))
    assert tuple(old(x).shape) == (B, T, D)  # no `attention_bias` keyword reaches it
