"""The position-dependent query scale (`query_scale_beta`, `query_scale_length`): the
queries at absolute position p, after RoPE, times `1 + beta * log(1 + floor(p / n))`
(transformers' `get_llama_4_attn_scale`: Ministral 3's `llama_4_scaling_beta`), against
the float64 reference, uncached and over a cache (the layer's cache API and
`CausalLM.generate`), with positions past n so that the scale is not 1."""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.options import AttentionOptions
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, assert_greedy_over_uncached, randn, rng, to_numpy

B, T, D, H = 2, 10, 16, 4
BETA, N = 0.5, 3  # positions 0..9: floor(p / 3) = 0, 1, 2, 3; the scale up to 1.69
QUERY_SCALE = {"query_scale_beta": BETA, "query_scale_length": N}
OPTIONS = [
    {},
    {"num_key_value_heads": 2, "rope_max_wavelength": 100.0},
    {"rope_max_wavelength": 100.0, "rope_type": "yarn", "rope_scaling_factor": 4.0,
     "rope_original_max_position_embeddings": 4, "qk_norm": "rms"},
]


def _layer(seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, 4, **options, **QUERY_SCALE)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed, scale=0.5)
    return layer


def test_the_scale_is_not_one_somewhere():
    p = np.arange(T)
    factor = 1.0 + BETA * np.log1p(np.floor(p / N))
    assert factor[0] == 1.0 and factor[-1] > 1.6 and len(set(factor)) == 4


@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "gqa-rope", "yarn-qk-norm"])
def test_self_attention_matches_the_reference(options):
    x = randn(rng(1), B, T, D)
    layer = _layer(2, **options)
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, num_heads=H, is_causal=True,
                                                 **options, **QUERY_SCALE)
    out = to_numpy(layer(x, use_causal_mask=True))
    assert_close(out, expected)
    # The ablation: the same layer without the query scale is far away.
    plain, _ = reference.multi_head_attention(params, x, num_heads=H, is_causal=True,
                                              **options)
    assert np.abs(plain - out).max() > 0.1


def test_cross_attention_queries_sit_at_the_end_of_the_keys():
    """T = 4 queries over S = 10 keys: the queries at positions 6..9 (bottom-right), so
    every one is scaled (floor(p / 3) = 2 or 3)."""
    g = rng(3)
    x, memory = randn(g, B, 4, D), randn(g, B, T, D)
    options = {"rope_max_wavelength": 100.0}
    layer = _layer(4, **options)
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, memory, memory, num_heads=H,
                                                 is_causal=True, **options, **QUERY_SCALE)
    assert_close(to_numpy(layer(x, memory, use_causal_mask=True)), expected)


@pytest.mark.parametrize("options", OPTIONS[1:], ids=["gqa-rope", "yarn-qk-norm"])
def test_cached_decoding_is_the_uncached_forward(options):
    """A prefill of 4 tokens, then one token per call at cache_update_index 4..9: the
    queries' positions come from the cache index."""
    x = randn(rng(5), B, T, D)
    layer = _layer(6, **options)
    full = to_numpy(layer(x, use_causal_mask=True))
    for as_kv_cache in (False, True):
        cache = layer.empty_cache(B, T, as_kv_cache=as_kv_cache)
        out, cache = layer(x[:, :4], use_causal_mask=True, cache=cache, cache_update_index=0)
        outputs = [to_numpy(out)]
        for i in range(4, T):
            out, cache = layer(x[:, i:i + 1], use_causal_mask=True, cache=cache,
                               cache_update_index=i)
            outputs.append(to_numpy(out))
        assert_close(np.concatenate(outputs, 1), full, against=UNCACHED)


def _lm(**query_scale):
    def attention(name, dtype):
        return keras_attn.MultiHeadAttention(4, 4, num_key_value_heads=2,
                                             rope_max_wavelength=1e4, use_bias=False,
                                             name=name, dtype=dtype, **query_scale)

    blocks = [keras_attn.TransformerDecoderLayer(
        attention=attention, intermediate_dim=16, normalize_first=True, normalization="rms")
        for _ in range(2)]
    lm = keras_attn.CausalLM(40, D, blocks)
    randomize_weights(lm, seed=7, scale=1.0)
    return lm


def test_generate_is_greedy_over_the_uncached_model():
    """`CausalLM.generate` (compiled on JAX and TensorFlow, traced on PyTorch: a traced
    cache index) equals greedy decoding by full uncached forwards, past n = 2."""
    lm = _lm(query_scale_beta=1.0, query_scale_length=2)
    prompt = np.random.default_rng(8).integers(0, 40, (B, 3))
    tokens = to_numpy(lm.generate(prompt, max_length=12))
    np.testing.assert_array_equal(tokens[:, :3], prompt)
    assert_greedy_over_uncached(lm, tokens, 3)
    expected = tokens
    # The ablation: the same weights without the scale give other logits.
    plain = _lm()
    plain.set_weights(lm.get_weights())
    assert np.abs(to_numpy(plain(expected)) - to_numpy(lm(expected))).max() > 0.1


def test_decoder_block_takes_the_options_and_round_trips():
    block = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, **QUERY_SCALE)
    block.build((B, T, D))
    assert block.self_attention.options.query_scale_beta == BETA
    again = keras_attn.TransformerDecoderLayer.from_config(block.get_config())
    again.build((B, T, D))
    assert again.self_attention.options.query_scale_length == N


def test_config_and_keras_file_round_trip():
    x = randn(rng(9), B, T, D)
    layer = _layer(10, rope_max_wavelength=100.0)
    config = layer.get_config()
    assert (config["query_scale_beta"], config["query_scale_length"]) == (BETA, N)
    again = keras_attn.MultiHeadAttention.from_config(config)
    assert again.options == layer.options
    model = keras.Sequential([keras.Input((T, D)), layer])
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "query_scale.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    assert loaded.layers[0].options.query_scale_beta == BETA
    assert_close(loaded(x), to_numpy(model(x)), against=UNCACHED)
    config = dict(config)
    del config["query_scale_beta"], config["query_scale_length"]  # saved before the option
    assert keras_attn.MultiHeadAttention.from_config(config).query_scale_beta is None


@pytest.mark.parametrize("name, value", [
    ("query_scale_beta", 0.0), ("query_scale_beta", -0.1), ("query_scale_beta", float("nan")),
    ("query_scale_beta", "0.1"), ("query_scale_beta", True),
    ("query_scale_length", 0), ("query_scale_length", 2.5), ("query_scale_length", True),
])
def test_bad_values_are_refused_by_name(name, value):
    other = {"query_scale_beta": 0.1, "query_scale_length": 8}
    with pytest.raises(ValueError, match=rf"Received: {name}="):
        AttentionOptions(**{**other, name: value})
    with pytest.raises(ValueError, match=rf"Received: {name}="):
        keras_attn.MultiHeadAttention(H, 4, **{**other, name: value})


def test_one_without_the_other_is_refused():
    with pytest.raises(ValueError, match=r"query_scale_beta=0.1, query_scale_length=None"):
        AttentionOptions(query_scale_beta=0.1)
    with pytest.raises(ValueError, match=r"query_scale_beta=None, query_scale_length=8"):
        keras_attn.MultiHeadAttention(H, 4, query_scale_length=8)


def test_matches_transformers_get_llama_4_attn_scale():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    from keras_attn.layers import _projection

    p = np.arange(40)
    expected = get_llama_4_attn_scale(torch.from_numpy(p)[None], 0.1, 8)[0, 0, :, 0].numpy()
    q = np.ones((1, 40, 1, 1), "float32")
    ours = to_numpy(_projection.query_scale(
        q, p, AttentionOptions(query_scale_beta=0.1, query_scale_length=8)))[0, :, 0, 0]
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
