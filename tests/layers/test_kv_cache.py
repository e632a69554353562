"""`keras_attn.KVCache`: keys and values apart (d_v != d_k), keras-hub interop, tracing.

Decoding over a `KVCache` must give, step by step, the rows of the float64
reference over the whole sequence, with a value width other than the key width
(which keras-hub's one-tensor layout cannot hold). The keras-hub tensor stays
accepted and comes back as a tensor, and the conversions are exact.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import KVCache
from keras_attn.cache import KerasHubKVCache
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

BACKEND = keras.backend.backend()
B, T, D, H, D_K, D_V, S_MAX = 2, 8, 12, 4, 4, 6, 10
OPTIONS = dict(num_key_value_heads=2, rope_max_wavelength=100.0, sliding_window=5)
SCHEDULE = (3, 1, 1, 3)  # prefill 3, two single tokens, then 3 at once (sums to T)


def _mha(value_dim=D_V, seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, D_K, value_dim=value_dim, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed)
    return layer


def _decode(layer, x, cache, index_shift=0):
    """The outputs of `SCHEDULE` over `x`, concatenated `(B, T, D)`, and the last cache."""
    outputs, start = [], 0
    for length in SCHEDULE:
        out, cache = layer(x[:, start:start + length], cache=cache,
                           cache_update_index=start + index_shift, use_causal_mask=True)
        outputs.append(to_numpy(out))
        start += length
    return np.concatenate(outputs, axis=1), cache


def test_value_width_apart_from_key_width_matches_the_float64_reference():
    x = randn(rng(1), B, T, D)
    layer = _mha(seed=2, **OPTIONS)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, is_causal=True, **OPTIONS)
    cache = keras_attn.empty_cache(layer, B, S_MAX, as_kv_cache=True)
    assert type(cache) is KVCache
    assert tuple(cache.keys.shape) == (B, S_MAX, 2, D_K)
    assert tuple(cache.values.shape) == (B, S_MAX, 2, D_V)
    decoded, cache = _decode(layer, x, cache)
    assert type(cache) is KVCache and tuple(cache.values.shape) == (B, S_MAX, 2, D_V)
    assert_close(decoded, expected, what="KVCache d_v != d_k decoding")
    # Ablation: the same steps written one slot late (RoPE and the causal rule shift
    # with the index) land far from the reference.
    shifted, _ = _decode(layer, x, KVCache.empty(B, S_MAX + 1, 2, D_K, D_V), index_shift=1)
    assert np.abs(shifted - expected).max() > 1e-2


def test_keras_hub_tensor_in_tensor_out_and_the_conversions_are_exact():
    x = randn(rng(3), B, T, D)
    layer = _mha(value_dim=None, seed=4, **OPTIONS)
    tensor = keras_attn.empty_cache(layer, B, S_MAX)
    by_tensor, tensor = _decode(layer, x, tensor)
    assert keras.ops.is_tensor(tensor) and tuple(tensor.shape) == (B, 2, S_MAX, 2, D_K)
    by_object, cache = _decode(layer, x, KVCache.from_keras_hub(
        keras_attn.empty_cache(layer, B, S_MAX)))
    np.testing.assert_array_equal(by_object, by_tensor)
    np.testing.assert_array_equal(to_numpy(cache.to_keras_hub()), to_numpy(tensor))
    back = KVCache.from_keras_hub(tensor)
    np.testing.assert_array_equal(to_numpy(back.keys), to_numpy(tensor)[:, 0])
    np.testing.assert_array_equal(to_numpy(back.values), to_numpy(tensor)[:, 1])
    assert KerasHubKVCache(tensor).to_keras_hub() is tensor


def test_layout_errors_name_the_argument():
    layer = _mha(seed=5, num_key_value_heads=2)
    x = randn(rng(6), B, 3, D)
    with pytest.raises(ValueError, match=r"`cache.values` must have shape.*\(2, S_max, 2, 6\)"
                       r".*Received: cache.keys.shape=\(2, 10, 2, 4\), "
                       r"cache.values.shape=\(2, 10, 2, 4\)"):
        layer(x, cache=KVCache.empty(B, S_MAX, 2, D_K), cache_update_index=0)
    with pytest.raises(ValueError, match=r"`value_dim` must equal `key_dim`.*value_dim=6"):
        layer(x, cache=keras.ops.zeros((B, 2, S_MAX, 2, D_K)), cache_update_index=0)
    with pytest.raises(ValueError, match=r"head widths must be equal.*"
                       r"cache.values.shape=\(2, 10, 2, 6\)"):
        KVCache.empty(B, S_MAX, 2, D_K, D_V).to_keras_hub()
    with pytest.raises(ValueError, match=r"Received: cache.shape=\(2, 10, 2, 4\)"):
        KVCache.from_keras_hub(keras.ops.zeros((B, S_MAX, 2, D_K)))


def test_a_read_only_cache_comes_back_with_the_same_tensors():
    """Cross-attention over a cache filled whole: `generate` tells it from a growing one so."""
    layer = _mha(seed=7, num_key_value_heads=2)
    memory, query = randn(rng(8), B, 5, D), randn(rng(9), B, 2, D)
    full = layer(query, memory)
    _, cache = layer(query, memory, cache=KVCache.empty(B, 5, 2, D_K, D_V), cache_update_index=0)
    out, again = layer(query, cache=cache)
    assert again.keys is cache.keys and again.values is cache.values  # not written
    assert_close(out, to_numpy(full), what="read-only KVCache", against=UNCACHED)


@pytest.mark.skipif(BACKEND not in ("jax", "tensorflow"), reason="a compiled step: jax.jit or "
                    "tf.function (torch's traced step: tests/models/test_traced_step.py)")
def test_a_kv_cache_crosses_a_compiled_step():
    layer = _mha(seed=10, **OPTIONS)
    x = randn(rng(11), B, T, D)
    expected, _ = _decode(layer, x, KVCache.empty(B, S_MAX, 2, D_K, D_V))

    def step(x, cache, index):
        return layer(x, cache=cache, cache_update_index=index, use_causal_mask=True)

    if BACKEND == "jax":
        import jax
        step = jax.jit(step)
    else:
        import tensorflow as tf
        step = tf.function(step)
    cache, outputs = KVCache.empty(B, S_MAX, 2, D_K, D_V), []
    for i in range(T):  # one token at a time: one trace, the index traced
        out, cache = step(x[:, i:i + 1], cache, keras.ops.convert_to_tensor(i, "int32"))
        assert isinstance(cache, KVCache)
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5)


def test_symbolic_call_returns_a_kv_cache_spec():
    layer = _mha(seed=12, num_key_value_heads=2)
    x = keras.Input((1, D), batch_size=B)
    cache = KVCache(keras.KerasTensor((B, S_MAX, 2, D_K)), keras.KerasTensor((B, S_MAX, 2, D_V)))
    y, new = layer.compute_output_spec(x, cache=cache)
    assert isinstance(new, KVCache) and tuple(new.values.shape) == (B, S_MAX, 2, D_V)
    assert tuple(y.shape) == (B, 1, D)


def test_generate_checks_kv_cache_capacity_once():
    """A short `KVCache` is refused by `generate`; CausalLM decodes over KVCaches."""
    blocks = [keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=16, key_dim=D_K, num_key_value_heads=2,
        rope_max_wavelength=100.0, normalize_first=True)]
    lm = keras_attn.CausalLM(11, D, blocks)
    randomize_weights(lm, seed=13, scale=0.5)
    prompt = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    lm(prompt)
    tokens = to_numpy(lm.generate(prompt, max_length=7, jit_compile=False))
    # Greedy decoding over the cache equals the argmax of the uncached model, token by token.
    logits = to_numpy(lm(tokens[:, :-1]))
    np.testing.assert_array_equal(logits[:, 2:].argmax(-1), tokens[:, 3:])
    step = lm.next_token_logits
    with pytest.raises(ValueError, match=r"S_max >= max_length - 1 = 6 slots.*`cache\[0\]`.*"
                       r"Received: max_length=7, S_max=5"):
        keras_attn.generate(step, prompt, 7, [keras_attn.empty_cache(
            blocks[0], B, 5, as_kv_cache=True)])
