"""Grouped key/value heads on the fused path: read in groups on PyTorch, repeated elsewhere.

`_kernels.fused._attend` hands grouped heads (H a multiple of H_kv > 1 ... H_kv < H) to the
`"grouped_dot_product_attention"` hook, PyTorch's SDPA with `enable_gqa=True`, which reads
each key/value head for its query heads without the copy `ops.repeat` makes. Each case is
checked against the float64 NumPy reference (query head n reads key/value head
n // (H / H_kv)), and the path is observed: "grouped" on PyTorch, never elsewhere.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _hooks
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

B, T, D, H, H_KV = 2, 6, 32, 8, 2

CASES = {  # name: (layer keywords, call keywords)
    "causal": ({}, {"use_causal_mask": True}),  # T == S: SDPA's is_causal flag
    "sliding window": ({"sliding_window": 3}, {"use_causal_mask": True}),  # a bool mask
    "sinks": ({"use_sinks": True}, {"use_causal_mask": True}),  # the sink key, as a bias
    "one key/value head": ({"num_key_value_heads": 1}, {"use_causal_mask": True}),
}


def _layer(x, **options):
    options = {"num_key_value_heads": H_KV, **options}
    layer = keras_attn.MultiHeadAttention(H, D // H, implementation="fused", **options)
    layer.build(x.shape)
    randomize_weights(layer, seed=3)
    return layer, options


@pytest.mark.parametrize("name", sorted(CASES))
def test_grouped_heads_match_the_reference(name):
    options, call = CASES[name]
    x = randn(rng(0), B, T, D)
    layer, options = _layer(x, **options)
    with keras_attn.observe_paths() as paths:
        out = to_numpy(layer(x, **call))
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, is_causal=True, **options)
    assert_close(out, expected, what=name)
    torch = keras.backend.backend() == "torch"
    assert paths["fused"] >= 1
    assert (paths["grouped"] >= 1) == torch, dict(paths)


def test_a_wrong_group_mapping_is_caught():
    """The same check fails when each query head reads another key/value head (the hook's
    output with its heads rolled), so the cases above can fail."""
    if keras.backend.backend() != "torch":
        pytest.skip("the hook runs on PyTorch only")
    grouped = _hooks.get("grouped_dot_product_attention")
    x = randn(rng(0), B, T, D)
    layer, options = _layer(x)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, is_causal=True, **options)
    try:
        _hooks.set("grouped_dot_product_attention", lambda q, k, v, **kw: grouped(
            q, keras.ops.roll(k, 1, axis=2), keras.ops.roll(v, 1, axis=2), **kw))
        wrong = to_numpy(layer(x, use_causal_mask=True))
    finally:
        _hooks.set("grouped_dot_product_attention", grouped)
    assert np.abs(wrong - expected).max() > 0.05


def test_grouped_heads_in_a_cached_decode_step():
    """One new query over a cache (T=1, S = the cache's length; SDPA gets a mask)."""
    x = randn(rng(1), B, T, D)
    layer, options = _layer(x)
    cache = keras_attn.KVCache.empty(B, T, H_KV, D // H)
    full, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, is_causal=True, **options)
    for position in range(T):
        step = x[:, position:position + 1]
        with keras_attn.observe_paths() as paths:
            out, cache = layer(step, cache=cache, cache_update_index=position)
        assert_close(to_numpy(out), full[:, position:position + 1], what=f"step {position}")
    assert (paths["grouped"] >= 1) == (keras.backend.backend() == "torch"), dict(paths)


def test_grouped_heads_gradients_match_the_explicit_path():
    """The gradient through the grouped kernel = the explicit path's (which repeats)."""
    from keras_attn import _device

    x = randn(rng(2), B, T, D)
    fused, _ = _layer(x)
    explicit = keras_attn.MultiHeadAttention(H, D // H, num_key_value_heads=H_KV,
                                             implementation="explicit")
    explicit.build(x.shape)
    explicit.set_weights(fused.get_weights())

    if keras.backend.backend() == "numpy":
        pytest.skip("NumPy cannot differentiate")

    def loss(layer):
        return lambda inputs, kernel: keras.ops.sum(keras.ops.square(
            layer(inputs, use_causal_mask=True)))

    _, grads_fused = _device.value_and_grad(loss(fused), [x, fused.key_dense.kernel])
    _, grads_explicit = _device.value_and_grad(loss(explicit), [x, explicit.key_dense.kernel])
    for what, got, expected in zip(("x", "the key kernel"), grads_fused, grads_explicit):
        got, expected = to_numpy(got), to_numpy(expected)
        scale = np.abs(expected).max()
        assert scale > 1e-2  # a live gradient
        # Both float32, of magnitude ~1e3 (weights far from identity): relative to the largest.
        assert np.abs(got - expected).max() / scale < 1e-5, f"d loss / d {what}"
