"""Gemma 4's attention options against the float64 reference: "proportional" RoPE (the
whole head rotates, the frequencies past `partial_rotary_factor` 0), K = V
(`attention_k_eq_v`: the projected keys, before qk-norm and RoPE, are the values; no
`value_dense`), the unweighted value norm (`use_value_norm`: cached normalised), and the
block's `layer_scalar`. Each test has an ablation far past the tolerance.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.rope import RopeSpec
from keras_attn.rotary import apply_rope
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H, H_KV, d = 2, 9, 16, 4, 2, 16
PROPORTIONAL = {"rope_max_wavelength": 100.0, "rope_type": "proportional",
                "rope_partial_rotary_factor": 0.25}
GEMMA4_FULL = {**PROPORTIONAL, "attention_k_eq_v": True, "use_value_norm": True,
               "qk_norm": "rms", "scale": 1.0}


def _layer(seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, d, num_key_value_heads=H_KV, use_bias=False,
                                          **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed, scale=0.5)
    return layer


def test_proportional_frequencies_are_transformers():
    """transformers' `_compute_proportional_rope_parameters` (d = 32, share 0.25, factor 2):
    4 frequencies base^(-2i/32) / 2, then 12 zeros."""
    theta, factor = RopeSpec(max_wavelength=1e6, rope_type="proportional",
                             partial_rotary_factor=0.25, scaling_factor=2.0).frequencies(32)
    expected = np.zeros(16)
    expected[:4] = 1e6 ** (-np.arange(0, 8, 2) / 32) / 2.0
    np.testing.assert_allclose(theta, expected, rtol=1e-12)
    assert factor == 1.0
    torch = pytest.importorskip("torch")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    del torch

    class Config:  # the fields the function reads
        head_dim, hidden_size, num_attention_heads = 32, 64, 2
        rope_parameters = {"rope_type": "proportional", "rope_theta": 1e6, "factor": 2.0,
                           "partial_rotary_factor": 0.25}

        def standardize_rope_params(self):
            pass

    hf, _ = rope_utils._compute_proportional_rope_parameters(Config())
    np.testing.assert_allclose(theta, hf.double().numpy(), rtol=1e-6)


def test_proportional_rotates_the_whole_head_not_a_slice():
    """Pairs (i, i + d/2) over the whole head: features 0 and d/2 turn together, and the
    features of the zero frequencies pass unchanged. The partial-rotary reading of the same
    share (the leading slice rotated as a head d/4 wide) is far away: the ablation."""
    x = randn(rng(0), 1, T, 1, d)
    spec = RopeSpec(max_wavelength=100.0, rope_type="proportional", partial_rotary_factor=0.25)
    out = to_numpy(apply_rope(x, spec))
    expected = np.swapaxes(reference.rotary_embedding(
        np.swapaxes(x, 1, 2), np.arange(T), 100.0, partial_rotary_factor=0.25,
        rope_type="proportional"), 1, 2)
    assert_close(out, expected)
    turned = [0, 1, d // 2, d // 2 + 1]  # int(0.25 * 16 // 2) = 2 frequencies
    still = [i for i in range(d) if i not in turned]
    np.testing.assert_array_equal(out[..., still], x[..., still])
    assert np.abs(out[..., turned] - x[..., turned]).max() > 0.5
    sliced = to_numpy(apply_rope(x, RopeSpec(max_wavelength=100.0, partial_rotary_factor=0.25)))
    assert np.abs(sliced - out).max() > 0.5


@pytest.mark.parametrize("options", [
    {"attention_k_eq_v": True},
    {"use_value_norm": True},
    GEMMA4_FULL,
], ids=["k-eq-v", "value-norm", "gemma4-full"])
def test_self_attention_matches_the_reference(options):
    x = randn(rng(1), B, T, D)
    layer = _layer(2, **options)
    assert hasattr(layer, "value_dense") != bool(options.get("attention_k_eq_v"))
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, num_heads=H, is_causal=True,
                                                 num_key_value_heads=H_KV, **options)
    out = to_numpy(layer(x, use_causal_mask=True))
    assert_close(out, expected)
    # The ablations: each option off (K = V off: values from a projection of their own),
    # far away.
    ablated = dict(options)
    if options.get("use_value_norm"):
        ablated["use_value_norm"] = False
        plain, _ = reference.multi_head_attention(params, x, num_heads=H, is_causal=True,
                                                  num_key_value_heads=H_KV, **ablated)
        assert np.abs(plain - out).max() > 0.1
    if options.get("attention_k_eq_v"):
        kernel = rng(3).normal(0.0, 0.5, params["key"]["kernel"].shape)
        own = dict(params, value={"kernel": kernel})
        plain, _ = reference.multi_head_attention(
            own, x, num_heads=H, is_causal=True, num_key_value_heads=H_KV,
            **dict(options, attention_k_eq_v=False))
        assert np.abs(plain - out).max() > 0.1


def test_k_eq_v_refuses_another_value_width():
    with pytest.raises(ValueError, match="value_dim=8"):
        keras_attn.MultiHeadAttention(H, d, value_dim=8, attention_k_eq_v=True)


def test_cached_decoding_is_the_uncached_forward_and_caches_normalised_values():
    x = randn(rng(5), B, T, D)
    layer = _layer(6, **GEMMA4_FULL)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = layer.empty_cache(B, T, as_kv_cache=True)
    out, cache = layer(x[:, :4], use_causal_mask=True, cache=cache, cache_update_index=0)
    outputs = [to_numpy(out)]
    for i in range(4, T):
        out, cache = layer(x[:, i:i + 1], use_causal_mask=True, cache=cache,
                           cache_update_index=i)
        outputs.append(to_numpy(out))
    assert_close(np.concatenate(outputs, 1), full, against=UNCACHED)
    values = to_numpy(cache.values)  # (B, S_max, H_kv, d): every slot written, unit RMS
    np.testing.assert_allclose(np.sqrt((values.astype(np.float64) ** 2).mean(-1)), 1.0,
                               rtol=1e-3)


def test_layer_scalar_multiplies_the_block_output_and_round_trips():
    x = randn(rng(7), B, T, D)
    block = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=32, key_dim=d, normalize_first=True, normalization="rms",
        use_layer_scalar=True, **GEMMA4_FULL)
    block.build((B, T, D))
    randomize_weights(block, seed=8, scale=0.5)
    block.layer_scalar.assign(np.array([0.3], "float32"))
    out = to_numpy(block(x))
    plain = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=32, key_dim=d, normalize_first=True, normalization="rms",
        **GEMMA4_FULL)
    plain.build((B, T, D))
    plain.set_weights([keras.ops.convert_to_numpy(w) for w in block.weights
                       if not w.path.endswith("layer_scalar")])  # all but the scalar
    assert_close(out, 0.3 * to_numpy(plain(x)))
    assert np.abs(out - to_numpy(plain(x))).max() > 0.1  # the ablation: the scalar dropped
    config = block.get_config()
    assert config["use_layer_scalar"] and config["attention_k_eq_v"] and config["use_value_norm"]
    again = keras_attn.TransformerDecoderLayer.from_config(config)
    again.build((B, T, D))
    again.set_weights(block.get_weights())
    assert_close(to_numpy(again(x)), out)
    assert "use_layer_scalar" not in plain.get_config()
    assert keras.ops.convert_to_numpy(again.layer_scalar).shape == (1,)
