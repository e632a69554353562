"""Llama 4's attention options: `qk_norm="l2"` (transformers' `Llama4TextL2Norm`: each head
divided by its root mean square, no weights; the reference applies it after RoPE, as Llama
4 does) and `query_scale_offset` (the query scale one position later: Llama 4's
temperature tuning `1 + attn_scale * log(1 + floor((p + 1) / floor_scale))`), against the
float64 reference, with interleaved RoPE and chunked attention, uncached and over a cache,
each with an ablation that moves the numbers far past the tolerance."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.options import AttentionOptions
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H = 2, 10, 16, 4  # the shapes of test_query_scale.py (JAX compiles once)
# RoPE layers: interleaved pairs (Llama 4's complex RoPE), the L2 norm, chunks of 4.
ROPE_LAYER = {"num_key_value_heads": 2, "rope_max_wavelength": 100.0,
              "rope_interleaved": True, "qk_norm": "l2", "qk_norm_epsilon": 1e-5,
              "attention_chunk_size": 4}
# NoPE layers: no RoPE, full attention, the temperature tuning (beta 0.5, floor_scale 3:
# floor((p + 1) / 3) = 0, 1, 2, 3 over positions 0..9; at p = 2, 5, 8 the offset moves it).
NOPE_LAYER = {"num_key_value_heads": 2, "query_scale_beta": 0.5, "query_scale_length": 3,
              "query_scale_offset": 1}
CASES = [ROPE_LAYER, NOPE_LAYER]
IDS = ["rope-l2-chunked", "nope-temperature"]


def _layer(seed, **options):
    layer = keras_attn.MultiHeadAttention(H, 4, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed, scale=0.5)
    return layer


def _far(a, b, by=0.05):
    return np.abs(np.asarray(a) - np.asarray(b)).max() > by


@pytest.mark.parametrize("options", CASES, ids=IDS)
def test_self_attention_matches_the_reference(options):
    x = randn(rng(1), B, T, D)
    layer = _layer(2, **options)
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, num_heads=H, is_causal=True,
                                                 **options)
    out = to_numpy(layer(x, use_causal_mask=True))
    assert_close(out, expected)
    # The ablations: each option off (the L2 norm; the offset: the curve at p, not p + 1).
    ablated = dict(options, qk_norm=None) if "qk_norm" in options else dict(
        options, query_scale_offset=0)
    plain, _ = reference.multi_head_attention(params, x, num_heads=H, is_causal=True,
                                              **ablated)
    assert _far(plain, out)


def test_the_l2_norm_commutes_with_rope():
    """Llama 4 normalises after RoPE, keras_attn before it: the same up to rounding (RoPE
    rotates pairs, keeping each head's mean square), checked in float64."""
    g = rng(3)
    q = g.standard_normal((B, H, T, 4))
    rope = dict(max_wavelength=100.0, interleaved=True)

    def norm(x):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)

    positions = np.arange(T)
    np.testing.assert_allclose(norm(reference.rotary_embedding(q, positions, **rope)),
                               reference.rotary_embedding(norm(q), positions, **rope),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", CASES, ids=IDS)
def test_cached_decoding_is_the_uncached_forward(options):
    """A prefill of 3 tokens, then one token per call at cache_update_index 3..9: the
    temperature's positions, RoPE's and the chunks' come from the cache index."""
    x = randn(rng(5), B, T, D)
    layer = _layer(6, **options)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = layer.empty_cache(B, T)
    out, cache = layer(x[:, :3], use_causal_mask=True, cache=cache, cache_update_index=0)
    outputs = [to_numpy(out)]
    for i in range(3, T):
        out, cache = layer(x[:, i:i + 1], use_causal_mask=True, cache=cache,
                           cache_update_index=i)
        outputs.append(to_numpy(out))
    assert_close(np.concatenate(outputs, 1), full, against=UNCACHED)


def test_l2_has_no_weights_and_the_configs_round_trip():
    layer = _layer(7, **ROPE_LAYER)
    assert not hasattr(layer, "query_norm") and not hasattr(layer, "key_norm")
    assert len(layer.weights) == 4 * 2  # q, k, v, o kernels and biases
    for options in CASES:
        layer = _layer(8, **options)
        config = layer.get_config()
        again = keras_attn.MultiHeadAttention.from_config(config)
        assert again.options == layer.options
    assert config["query_scale_offset"] == 1
    del config["query_scale_offset"]  # a config saved before the option: offset 0
    assert keras_attn.MultiHeadAttention.from_config(config).query_scale_offset == 0


def test_decoder_block_takes_the_options():
    block = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, **NOPE_LAYER)
    block.build((B, T, D))
    assert block.self_attention.options.query_scale_offset == 1
    block = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, **ROPE_LAYER)
    block.build((B, T, D))
    assert block.self_attention.options.qk_norm == "l2"
    assert keras.ops.shape(block(randn(rng(9), B, T, D))) == (B, T, D)


@pytest.mark.parametrize("options, match", [
    (dict(qk_norm="l3"), r"'rms', 'layer' or 'l2'. Received: qk_norm='l3'"),
    (dict(qk_norm="l2", qk_norm_full_width=True), r"Received: qk_norm_full_width=True"),
    (dict(query_scale_offset=1), r"Received: query_scale_offset=1, query_scale_beta=None"),
    (dict(query_scale_beta=0.1, query_scale_length=8, query_scale_offset=-1),
     r"Received: query_scale_offset=-1"),
    (dict(query_scale_beta=0.1, query_scale_length=8, query_scale_offset=1.0),
     r"Received: query_scale_offset=1.0"),
    (dict(query_scale_beta=0.1, query_scale_length=8, query_scale_offset=True),
     r"Received: query_scale_offset=True"),
])
def test_bad_values_are_refused_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        AttentionOptions(**options)
    with pytest.raises(ValueError, match=match):
        keras_attn.MultiHeadAttention(H, 4, **options)
