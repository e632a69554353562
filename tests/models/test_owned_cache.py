"""The caches `CausalLM.generate` owns on PyTorch, and the kernels' `unattended_finite`.

`keras_attn._device.owned_cache` gives `generate` an `OwnedKVCache` per block on
PyTorch: stored heads-first `(B, H_kv, S_max, d)`, written in place, and declared
finite in its unattended slots, so the kernels skip `zero_unattended_keys`. These
tests check that the layout reads and writes as a `KVCache` does, that the write is in
place, that `generate` decodes over it (the hook ran, no zeroing) to the same tokens as
over plain caches and as greedy decoding by uncached forwards, and that the kernels'
flag does skip the zeroing (NaN in an unattended slot then reaches the output: why
only a cache nothing else writes may set it).
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device, _hooks
from keras_attn import attention as attention_module
from keras_attn.attention import attend
from keras_attn.options import KernelSpec
from keras_attn.testing.weights import randomize_weights

from ..helpers import assert_greedy_over_uncached, to_numpy

# The shapes of tests/models/test_traced_step.py (JAX and the traces compile per shape).
B, P, L, V, D = 2, 5, 12, 40, 16
H_KV, D_K, D_V = 2, 4, 6

torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the owned cache is PyTorch's (see the first test)")


def test_only_pytorch_owns_its_caches():
    """Elsewhere `generate` keeps `KVCache`s: XLA already writes a loop's cache in place."""
    owned = _device.owned_cache(keras_attn.KVCache.empty(B, L, H_KV, D_K, D_V))
    if keras.backend.backend() != "torch":
        assert owned is None
        return
    assert isinstance(owned, _device.owned_cache.__globals__["OwnedKVCache"])
    assert tuple(owned.key_heads.shape) == (B, H_KV, L, D_K)  # stored heads-first
    assert tuple(owned.keys.shape) == (B, L, H_KV, D_K)  # read as every KVCache
    assert tuple(owned.values.shape) == (B, L, H_KV, D_V)
    assert owned.max_length == L and owned.unattended_finite
    assert not keras_attn.KVCache.unattended_finite
    # Another layout is not converted: its own rules stay.
    assert _device.owned_cache(keras_attn.KVCache.from_keras_hub(
        keras.ops.zeros((B, 2, L, H_KV, D_K)))) is not None  # a plain KVCache of it
    assert _device.owned_cache(keras_attn.cache.KerasHubKVCache(
        keras.ops.zeros((B, 2, L, H_KV, D_K)))) is None


def _new(length, width, seed):
    return np.random.default_rng(seed).standard_normal((B, length, H_KV, width)).astype("float32")


@torch_only
def test_a_write_is_in_place_and_reads_as_a_kv_cache_written_the_same_way():
    import torch

    owned = _device.owned_cache(keras_attn.KVCache.empty(B, L, H_KV, D_K, D_V))
    plain = keras_attn.KVCache.empty(B, L, H_KV, D_K, D_V)
    stored = owned.key_heads
    for index, length in ((0, P), (P, 1), (L - 1, 1)):
        keys, values = _new(length, D_K, index), _new(length, D_V, index + 100)
        owned = owned.write(keras.ops.convert_to_tensor(keys), keras.ops.convert_to_tensor(values),
                            torch.tensor(index, dtype=torch.int32))
        plain = plain.write(keys, values, index)
        assert owned.key_heads is stored  # the same tensor, written
        np.testing.assert_array_equal(to_numpy(owned.keys), to_numpy(plain.keys))
        np.testing.assert_array_equal(to_numpy(owned.values), to_numpy(plain.values))
    assert np.count_nonzero(to_numpy(plain.keys)) > 0  # the comparison saw real writes


@torch_only
def test_a_layer_over_an_owned_cache_equals_it_over_a_kv_cache():
    layer = keras_attn.MultiHeadAttention(4, D_K, value_dim=D_V, num_key_value_heads=H_KV,
                                          rope_max_wavelength=1e4)
    x = np.random.default_rng(0).standard_normal((B, P + 1, D)).astype("float32")
    layer(x[:, :1], x[:, :1])
    randomize_weights(layer, seed=1, scale=0.5)
    caches = {"plain": keras_attn.KVCache.empty(B, L, H_KV, D_K, D_V)}
    caches["owned"] = _device.owned_cache(caches["plain"])
    outputs = {}
    for name, cache in caches.items():
        prefill, cache = layer(x[:, :P], cache=cache, cache_update_index=0, use_causal_mask=True)
        step, cache = layer(x[:, P:], cache=cache, cache_update_index=P, use_causal_mask=True)
        outputs[name] = (to_numpy(prefill), to_numpy(step), to_numpy(cache.keys))
    for got, expected in zip(outputs["owned"], outputs["plain"]):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def _lm():
    blocks = [keras_attn.TransformerDecoderLayer(
        4, intermediate_dim=32, key_dim=4, num_key_value_heads=2, rope_max_wavelength=1e4,
        normalization="rms", normalize_first=True, gated_feed_forward=True,
        activation="silu", use_bias=False, sliding_window=window) for window in (None, 3)]
    lm = keras_attn.CausalLM(V, D, blocks, tie_word_embeddings=False)
    randomize_weights(lm, seed=0, scale=0.5)  # far from identity: logits O(1)
    return lm


@torch_only
def test_generate_decodes_over_owned_caches_without_zeroing_them(monkeypatch):
    lm = _lm()
    prompt = np.random.default_rng(1).integers(1, V, (B, P)).astype("int32")
    made, zeroed = [], []
    own = _hooks.get("owned_cache")
    zero = attention_module.zero_unattended_keys
    monkeypatch.setitem(_hooks._HOOKS, "owned_cache", lambda c: made.append(own(c)) or made[-1])
    monkeypatch.setattr(attention_module, "zero_unattended_keys",
                        lambda *a, **k: zeroed.append(1) or zero(*a, **k))
    owned = to_numpy(lm.generate(prompt, max_length=L, jit_compile=False))  # eager: spies see it
    assert len(made) == len(lm.blocks) and all(m is not None for m in made)
    assert not zeroed  # the prefill and every step: no pass over the caches
    traced = to_numpy(lm.generate(prompt, max_length=L))  # the traced step, over owned caches
    monkeypatch.setitem(_hooks._HOOKS, "owned_cache", None)
    plain = to_numpy(lm.generate(prompt, max_length=L, jit_compile=False))
    assert zeroed  # plain caches are zeroed where unattended, as before
    assert owned.tolist() == plain.tolist() == traced.tolist()
    assert_greedy_over_uncached(lm, owned, P)  # independent of any cache


@pytest.mark.parametrize("path", ["explicit", "blockwise"])
def test_the_kernels_zero_unattended_keys_unless_told_they_are_finite(path):
    """NaN stored where no query may attend: zeroed by default; with
    `unattended_finite=True` the pass is skipped and the NaN reaches the output
    (0 * NaN), which is why only a cache nothing else writes sets it."""
    rng = np.random.default_rng(0)
    query = rng.standard_normal((1, 2, 1, 4)).astype("float32")  # (B, H, T, d)
    key, value = (rng.standard_normal((1, 2, 6, 4)).astype("float32") for _ in range(2))
    key[..., 5, :] = value[..., 5, :] = np.nan  # an unwritten slot holding NaN
    mask = np.array([True] * 5 + [False])[None, None, None, :]  # (1, 1, 1, S)
    zeroed = to_numpy(attend(path, query, key, value, mask, spec=KernelSpec(scale=0.5)))
    q, k, v = (x.astype("float64") for x in (query, key[..., :5, :], value[..., :5, :]))
    weights = np.exp(0.5 * q @ np.swapaxes(k, -1, -2))  # the float64 reference
    expected = (weights / weights.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(zeroed, expected, rtol=1e-5, atol=1e-6)
    skipped = to_numpy(attend(path, query, key, value, mask,
                              spec=KernelSpec(scale=0.5, unattended_finite=True)))
    assert np.isnan(skipped).all()


@torch_only
def test_tracing_a_step_over_owned_caches_writes_only_the_step_s_slot():
    """The traced step checks its graph against the eager step at its index and the one
    before; over caches written in place those checks run on copies, else the check at
    P - 1 would overwrite the prompt's last slot."""
    import torch

    lm = _lm()
    prompt = np.random.default_rng(1).integers(1, V, (B, P)).astype("int32")
    caches = [_device.owned_cache(keras_attn.empty_cache(block, B, L, as_kv_cache=True))
              for block in lm.blocks]
    with torch.no_grad():
        _, caches = lm.next_token_logits(prompt, caches, 0)
    before = [to_numpy(cache.keys).copy() for cache in caches]
    step = _device.trace_step(lm.next_token_logits, lm.variables)
    with torch.no_grad():
        step(keras.ops.convert_to_tensor([[3], [7]], "int32"), caches,
             keras.ops.convert_to_tensor(P, "int32"))
    assert step.graph_calls == 1 and all(g is not None for g in step.graphs.values())
    for cache, keys in zip(caches, before):
        got = to_numpy(cache.keys)
        np.testing.assert_array_equal(got[:, :P], keys[:, :P])  # the prompt's slots
        assert np.abs(got[:, P]).max() > 0 and not got[:, P + 1:].any()  # the step's slot
