"""`convert.multi_head_attention_from_keras` of a `keras.layers.GroupQueryAttention`, and of
either Keras layer with `use_gate` or `sliding_window`, against the Keras layer itself with
random weights far from identity (normal, std 0.5, biases included), on the same inputs."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import convert
from keras_attn.testing.weights import randomize_weights

from ..helpers import assert_close, randn, requires_keras_argument, rng, to_numpy

B, T, S = 2, 5, 7
D_Q, D_K, D_V = 6, 9, 5

GQA = {
    "gqa": {"head_dim": 3, "num_query_heads": 4, "num_key_value_heads": 2},
    "mqa": {"head_dim": 4, "num_query_heads": 3, "num_key_value_heads": 1},
    "mha": {"head_dim": 2, "num_query_heads": 2, "num_key_value_heads": 2},
    "gqa_no_bias": {"head_dim": 3, "num_query_heads": 4, "num_key_value_heads": 2,
                    "use_bias": False},
}
MASKS = ["none", "causal", "attention_mask", "both"]


def _inputs(mode, seed):
    """Keras's call inputs and ours (every tensor by keyword; Keras's key = value explicit).
    Self-attention has T == S, the only case where Keras's causal mask and window (top-left)
    and keras_attn's (bottom-right) are the same."""
    g = rng(seed)
    x = randn(g, B, T, D_Q)
    if mode == "self":
        keras_kwargs = {"query": x, "value": x}
    else:  # "cross_key": S != T, a key of its own width
        keras_kwargs = {"query": x, "value": randn(g, B, S, D_V), "key": randn(g, B, S, D_K)}
    ours_kwargs = dict(keras_kwargs)
    ours_kwargs.setdefault("key", ours_kwargs["value"])
    return keras_kwargs, ours_kwargs, keras_kwargs["value"].shape[1]


def _built(layer, keras_kwargs, seed):
    layer.build(**{f"{name}_shape": tensor.shape for name, tensor in keras_kwargs.items()})
    randomize_weights(layer, seed=seed)
    return layer


def _call(mask, length, seed=5):
    call = {"use_causal_mask": mask in ("causal", "both")}
    if mask in ("attention_mask", "both"):
        attention_mask = rng(seed).random((B, T, length)) < 0.5
        # Every query may attend at least one key, also within any window and causal mask
        # (Keras's own two paths differ on rows with none).
        attention_mask[:, :, 0] = True
        attention_mask[:, np.arange(T), np.arange(T)] = True
        call["attention_mask"] = attention_mask
    return call


def _compare(source, layer, keras_kwargs, ours_kwargs, call, what):
    """Keras's explicit path (return_attention_scores) and its default one, against ours."""
    expected, _ = source(**keras_kwargs, **call, return_attention_scores=True)
    actual = layer(**ours_kwargs, **call)
    assert_close(actual, to_numpy(expected), what=f"{what}, Keras explicit")
    assert_close(actual, to_numpy(source(**keras_kwargs, **call)), what=f"{what}, Keras default")
    return actual


# Causal masks are compared for T == S only (Keras aligns them top-left, keras_attn bottom-right).
CASES = [("self", mask) for mask in MASKS] + [("cross_key", "none"), ("cross_key", "attention_mask")]


# Every mask for the grouped and multi-query layers; the two widest calls for the others
# (kept few: each case costs a JAX compilation of both layers).
GQA_CASES = [(config, mode, mask) for config in ("gqa", "mqa") for mode, mask in CASES] + [
    (config, mode, mask) for config in ("mha", "gqa_no_bias")
    for mode, mask in (("self", "both"), ("cross_key", "attention_mask"))]


@pytest.mark.parametrize("config, mode, mask", GQA_CASES)
def test_gqa_matches_keras(config, mode, mask):
    keras_kwargs, ours_kwargs, length = _inputs(mode, seed=3)
    source = _built(keras.layers.GroupQueryAttention(**GQA[config]), keras_kwargs, seed=4)
    layer = convert.multi_head_attention_from_keras(source)
    assert isinstance(layer, keras_attn.MultiHeadAttention) and layer.built
    _compare(source, layer, keras_kwargs, ours_kwargs, _call(mask, length),
             f"{config}/{mode}/{mask}")


def test_gqa_copies_the_configuration():
    keras_kwargs, _, _ = _inputs("cross_key", seed=0)
    source = _built(keras.layers.GroupQueryAttention(
        head_dim=3, num_query_heads=4, num_key_value_heads=2, dropout=0.25, use_bias=False,
        seed=11, kernel_initializer="he_normal", kernel_regularizer="l2"), keras_kwargs, seed=1)
    layer = convert.multi_head_attention_from_keras(source, name="converted")
    assert (layer.num_heads, layer.num_key_value_heads, layer.key_dim) == (4, 2, 3)
    assert (layer.head_value_dim, layer.output_dim) == (3, None)
    assert (layer.dropout, layer.use_bias, layer.seed, layer.name) == (0.25, False, 11, "converted")
    assert layer.use_gate is False and layer.sliding_window is None
    assert isinstance(layer.kernel_initializer, keras.initializers.HeNormal)
    assert isinstance(layer.kernel_regularizer, keras.regularizers.L2)
    assert tuple(layer.query_dense.kernel.shape) == (D_Q, 12)
    assert tuple(layer.key_dense.kernel.shape) == (D_K, 6)
    assert tuple(layer.value_dense.kernel.shape) == (D_V, 6)
    assert tuple(layer.output_dense.kernel.shape) == (12, D_Q)
    assert layer.query_dense.bias is None and layer.output_dense.bias is None
    # Head h of Keras's key kernel (D_k, H_kv, d) is our columns [h * d, (h + 1) * d).
    np.testing.assert_array_equal(to_numpy(layer.key_dense.kernel)[:, 3:6],
                                  to_numpy(source._key_dense.kernel)[:, 1, :])


def test_gqa_flash_attention_comes_along():
    keras_kwargs, _, _ = _inputs("self", seed=0)
    source = _built(keras.layers.GroupQueryAttention(2, 2, 1, flash_attention=True),
                    keras_kwargs, seed=1)
    assert convert.multi_head_attention_from_keras(source).implementation == "fused"
    # An implementation chosen here wins over the carried flag.
    chosen = convert.multi_head_attention_from_keras(source, implementation="explicit")
    assert chosen.implementation == "explicit"
    plain = _built(keras.layers.GroupQueryAttention(2, 2, 1), keras_kwargs, seed=1)
    assert convert.multi_head_attention_from_keras(plain).implementation == "auto"


# ---------------------------------------------------------------------------
# use_gate (Keras 3.15) and sliding_window, on both Keras layers.


def _keras_layer(kind, **arguments):
    if kind == "gqa":
        return keras.layers.GroupQueryAttention(
            head_dim=3, num_query_heads=4, num_key_value_heads=2, **arguments)
    # value_dim == key_dim: Keras's default (fused) path fails on JAX otherwise.
    return keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, **arguments)


def _gate_cases():
    return [pytest.param(kind, marks=requires_keras_argument(layer, "use_gate"))
            for kind, layer in (("gqa", "GroupQueryAttention"), ("mha", "MultiHeadAttention"))]


def _window_cases():
    return [pytest.param(kind, marks=requires_keras_argument(layer, "sliding_window"))
            for kind, layer in (("gqa", "GroupQueryAttention"), ("mha", "MultiHeadAttention"))]


# "none" and "both" (causal with a random mask) cover the gate's paths; fewer cases, fewer
# JAX compilations.
@pytest.mark.parametrize("mask", ["none", "both"])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("kind", _gate_cases())
def test_gate_matches_keras(kind, use_bias, mask):
    keras_kwargs, ours_kwargs, length = _inputs("self", seed=6)
    source = _built(_keras_layer(kind, use_gate=True, use_bias=use_bias), keras_kwargs, seed=7)
    layer = convert.multi_head_attention_from_keras(source)
    assert layer.use_gate and tuple(layer.gate_dense.kernel.shape) == (
        D_Q, 12 if kind == "gqa" else 6)  # (D_q, H * d_v)
    assert (layer.gate_dense.bias is None) == (not use_bias)
    actual = _compare(source, layer, keras_kwargs, ours_kwargs, _call(mask, length),
                      f"{kind}/gate/bias={use_bias}/{mask}")
    # The gate matters: the same weights without it are far from Keras's output.
    layer.use_gate = False
    try:
        without = to_numpy(layer(**ours_kwargs, **_call(mask, length)))
    finally:
        layer.use_gate = True
    assert np.max(np.abs(without - to_numpy(actual))) > 0.1


@pytest.mark.parametrize("kind", _gate_cases())
def test_gate_cross_attention_matches_keras(kind):
    keras_kwargs, ours_kwargs, length = _inputs("cross_key", seed=8)
    source = _built(_keras_layer(kind, use_gate=True), keras_kwargs, seed=9)
    layer = convert.multi_head_attention_from_keras(source)
    _compare(source, layer, keras_kwargs, ours_kwargs, _call("attention_mask", length),
             f"{kind}/gate/cross")


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("mask", ["none", "attention_mask", "causal", "both"])
@pytest.mark.parametrize("kind", _window_cases())
def test_sliding_window_matches_keras_on_causal_and_non_causal_calls(kind, mask, window):
    """Keras's symmetric band |i - j| < W, alone and with its causal mask, is keras_attn's
    `|p - j| < W` (non-causal) and `0 <= p - j < W` (causal) for T == S."""
    keras_kwargs, ours_kwargs, length = _inputs("self", seed=10)
    source = _built(_keras_layer(kind, sliding_window=window), keras_kwargs, seed=11)
    layer = convert.multi_head_attention_from_keras(source)
    assert layer.sliding_window == window
    _compare(source, layer, keras_kwargs, ours_kwargs, _call(mask, length),
             f"{kind}/window={window}/{mask}")


# ---------------------------------------------------------------------------
# Refusals.


def test_gqa_rejects_an_unbuilt_layer():
    with pytest.raises(ValueError, match="must be built"):
        convert.multi_head_attention_from_keras(keras.layers.GroupQueryAttention(2, 2, 1))


def test_rejects_other_layers_naming_both_accepted():
    with pytest.raises(ValueError, match=r"GroupQueryAttention.*Received: layer of type Dense"):
        convert.multi_head_attention_from_keras(keras.layers.Dense(3))


@pytest.mark.parametrize("name, value", [("num_key_value_heads", 4), ("use_gate", True),
                                         ("num_heads", 2), ("key_dim", 8)])
def test_gqa_rejects_derived_arguments(name, value):
    keras_kwargs, _, _ = _inputs("self", seed=0)
    source = _built(keras.layers.GroupQueryAttention(2, 2, 1), keras_kwargs, seed=1)
    with pytest.raises(ValueError, match=rf"`{name}` cannot be passed.*Received: {name}={value}"):
        convert.multi_head_attention_from_keras(source, **{name: value})


def test_mha_rejects_use_gate_as_an_argument():
    source = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    source.build((2, 3, 6), (2, 3, 6))
    with pytest.raises(ValueError, match=r"`use_gate` cannot be passed.*Received: use_gate=True"):
        convert.multi_head_attention_from_keras(source, use_gate=True)


def test_gqa_rejects_a_quantized_layer():
    keras_kwargs, _, _ = _inputs("self", seed=0)
    source = _built(keras.layers.GroupQueryAttention(2, 2, 1), keras_kwargs, seed=1)
    source._value_dense.quantize("int8")  # GroupQueryAttention has no `quantize` of its own
    with pytest.raises(ValueError, match=r"GroupQueryAttention .*quantization_mode='int8'"):
        convert.multi_head_attention_from_keras(source)
