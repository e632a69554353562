"""RoPE types (`rope_type` "default", "linear", "llama3", "yarn") against the
float64 reference and against Hugging Face transformers' own functions.

The parameters are far from the defaults (base 500, factor 6, context 256,
llama3 factors 2 and 16, yarn betas 8 and 0.5) so that every regime of each
formula is hit at d = 32 (llama3: kept, smoothed and scaled frequencies;
yarn: kept, ramped and interpolated) and a wrong formula is far beyond the
tolerances (`test_types_differ_far_beyond_tolerance`).
"""

import json

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.options import AttentionOptions
from keras_attn.rope import RopeSpec
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

D, BASE, FACTOR, CONTEXT = 32, 500.0, 6.0, 256

TYPES = {
    "linear": dict(rope_type="linear"),
    "llama3": dict(rope_type="llama3", low_freq_factor=2.0, high_freq_factor=16.0,
                   original_max_position_embeddings=CONTEXT),
    "yarn": dict(rope_type="yarn", beta_fast=8.0, beta_slow=0.5,
                 original_max_position_embeddings=CONTEXT),
    "yarn_untruncated": dict(rope_type="yarn", beta_fast=8.0, beta_slow=0.5, truncate=False,
                             original_max_position_embeddings=CONTEXT),
    "yarn_attention_factor": dict(rope_type="yarn", beta_fast=8.0, beta_slow=0.5,
                                  attention_factor=1.7, original_max_position_embeddings=CONTEXT),
    "yarn_mscale": dict(rope_type="yarn", beta_fast=8.0, beta_slow=0.5, mscale=0.7,
                        mscale_all_dim=0.3, original_max_position_embeddings=CONTEXT),
}

# Hugging Face's `rope_parameters` for each case (their names; `factor` is our scaling_factor).
HF_KEYS = {"low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
           "original_max_position_embeddings": "original_max_position_embeddings",
           "beta_fast": "beta_fast", "beta_slow": "beta_slow", "truncate": "truncate",
           "attention_factor": "attention_factor", "mscale": "mscale",
           "mscale_all_dim": "mscale_all_dim"}


def _hf_config(params):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    rope = {"rope_type": params["rope_type"], "rope_theta": BASE, "factor": FACTOR}
    rope.update({HF_KEYS[k]: v for k, v in params.items() if k != "rope_type"})
    return transformers.LlamaConfig(
        hidden_size=2 * D, num_attention_heads=2, head_dim=D,
        max_position_embeddings=int(FACTOR * CONTEXT), rope_parameters=rope)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_frequencies_match_reference(name):
    params = TYPES[name]
    theta, factor = RopeSpec(max_wavelength=BASE, scaling_factor=FACTOR, **params).frequencies(D)
    expected, expected_factor = reference.rope_inverse_frequencies(D, BASE, FACTOR, **params)
    np.testing.assert_allclose(theta, expected, rtol=1e-12, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-12)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_frequencies_match_transformers(name):
    params = TYPES[name]
    config = _hf_config(params)  # skips without transformers (only the torch environment has it)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config)
    theta, factor = RopeSpec(max_wavelength=BASE, scaling_factor=FACTOR, **params).frequencies(D)
    # Hugging Face computes in float32: 1e-6 relative is a few float32 roundings.
    np.testing.assert_allclose(theta, inv_freq.numpy(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(attention_scaling, rel=1e-6)


def test_types_differ_far_beyond_tolerance():
    """Each type moves the frequencies (or the factor) by far more than the tolerances,
    and every regime of llama3 and yarn occurs at these parameters."""
    plain = BASE ** (-np.arange(0, D, 2) / D)
    ratios = {}
    for name, params in TYPES.items():
        theta, factor = RopeSpec(max_wavelength=BASE, scaling_factor=FACTOR, **params).frequencies(D)
        ratios[name] = (np.round(theta / plain, 6), factor)
    for name in ("llama3", "yarn", "yarn_untruncated"):
        ratio = ratios[name][0]
        assert (ratio == 1).any() and (ratio == np.round(1 / FACTOR, 6)).any()
        assert ((ratio < 1) & (ratio > 1 / FACTOR + 1e-3)).sum() >= 2, (name, ratio)
    assert np.abs(ratios["yarn"][0] - ratios["yarn_untruncated"][0]).max() > 0.05
    assert ratios["yarn"][1] == pytest.approx(0.1 * np.log(FACTOR) + 1)
    assert ratios["yarn_attention_factor"][1] == 1.7
    assert ratios["yarn_mscale"][1] == pytest.approx(
        (0.07 * np.log(FACTOR) + 1) / (0.03 * np.log(FACTOR) + 1))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("name", sorted(TYPES))
def test_rotated_outputs_match_reference(name, interleaved):
    params = TYPES[name]
    g = rng(7)
    x = randn(g, 2, 7, 3, D)  # (B, L, H, d)
    positions = np.array([0, 1, 5, 40, 100, 255, 300])
    layer = keras_attn.RotaryEmbedding(BASE, FACTOR, interleaved=interleaved, **params)
    out = to_numpy(layer(x, positions=positions))
    expected = reference.rotary_embedding(np.swapaxes(x, 1, 2), positions, BASE, FACTOR,
                                          interleaved, **params)
    # float32 angles up to 300 rad carry ~2e-5 rad of rounding; a wrong formula is O(1).
    np.testing.assert_allclose(out, np.swapaxes(expected, 1, 2), atol=1e-4, rtol=0)
    functional = keras_attn.rotary_embedding(x, positions, max_wavelength=BASE,
                                             scaling_factor=FACTOR, interleaved=interleaved,
                                             **params)
    np.testing.assert_array_equal(to_numpy(functional), out)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_rotated_outputs_match_transformers(name):
    """Hugging Face Llama's rotary module and `apply_rotary_pos_emb`, same inputs."""
    params = TYPES[name]
    config = _hf_config(params)
    import torch
    from transformers.models.llama import modeling_llama

    g = rng(8)
    q = randn(g, 2, 7, 2, D)  # (B, L, H, d)
    positions = np.array([[0, 1, 5, 40, 100, 255, 300], [3, 4, 5, 6, 7, 8, 9]])
    rotary = modeling_llama.LlamaRotaryEmbedding(config=config)
    q_hf = torch.from_numpy(np.swapaxes(q, 1, 2).copy())  # (B, H, L, d)
    cos, sin = rotary(q_hf, torch.from_numpy(positions))
    expected, _ = modeling_llama.apply_rotary_pos_emb(q_hf, q_hf, cos, sin)
    out = keras_attn.RotaryEmbedding(BASE, FACTOR, **params)(q, positions=positions)
    np.testing.assert_allclose(to_numpy(out), np.swapaxes(expected.numpy(), 1, 2),
                               atol=1e-4, rtol=0)


MHA_TYPES = {  # d = 8: frequencies 1, 0.32, 0.1, 0.03; context 32 splits them.
    "llama3": dict(rope_type="llama3", rope_scaling_factor=4.0, rope_low_freq_factor=1.0,
                   rope_high_freq_factor=4.0, rope_original_max_position_embeddings=32),
    "yarn": dict(rope_type="yarn", rope_scaling_factor=4.0, rope_beta_fast=4.0,
                 rope_beta_slow=0.5, rope_original_max_position_embeddings=32),
}


@pytest.mark.parametrize("name", sorted(MHA_TYPES))
def test_mha_rope_types_match_reference(name):
    options = dict(num_key_value_heads=2, rope_max_wavelength=100.0, **MHA_TYPES[name])
    g = rng(11)
    x = randn(g, 2, 6, 12)
    layer = keras_attn.MultiHeadAttention(4, 8, **options)
    layer.build(x.shape, x.shape)
    randomize_weights(layer, seed=2)
    assert layer.rope_type == name
    out = to_numpy(layer(x, x, use_causal_mask=True))
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, x, num_heads=4, is_causal=True,
                                                 **options)
    assert_close(out, expected, what=f"MHA rope_type={name}")
    plain = dict(options, rope_type="default", rope_scaling_factor=1.0)
    unscaled, _ = reference.multi_head_attention(params, x, x, num_heads=4, is_causal=True,
                                                 **plain)
    assert np.abs(unscaled - expected).max() > 100 * 1e-5  # the type matters here


@pytest.mark.parametrize("name", sorted(MHA_TYPES))
def test_cached_decoding_with_rope_types(name):
    """Over a key/value cache (positions from `cache_update_index`), prefill 3 then 1 + 2
    tokens: the rows of the uncached forward."""
    layer = keras_attn.MultiHeadAttention(4, 8, num_key_value_heads=2,
                                          rope_max_wavelength=100.0, **MHA_TYPES[name])
    x = randn(rng(14), 2, 6, 12)
    layer.build(x.shape)
    randomize_weights(layer, seed=3)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache, start = keras_attn.empty_cache(layer, 2, 8), 0
    for length in (3, 1, 2):
        out, cache = layer(x[:, start:start + length], cache=cache, cache_update_index=start,
                           use_causal_mask=True)
        assert_close(out, full[:, start:start + length], what=f"{name} rows {start}",
                     against=UNCACHED)
        start += length


def test_rope_fields_save_and_reload(tmp_path):
    options = dict(rope_max_wavelength=100.0, rope_type="yarn", rope_scaling_factor=4.0,
                   rope_beta_fast=4.0, rope_beta_slow=0.5, rope_attention_factor=1.3,
                   rope_truncate=False, rope_original_max_position_embeddings=32)
    inputs = keras.Input((None, 12))
    model = keras.Model(inputs, keras_attn.MultiHeadAttention(2, 8, name="mha", **options)(
        inputs, inputs, use_causal_mask=True))
    x = randn(rng(12), 2, 5, 12)
    path = str(tmp_path / "yarn.keras")
    model.save(path)
    again = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(again(x)), to_numpy(model(x)), rtol=1e-6, atol=1e-6)
    config = again.get_layer("mha").get_config()
    assert {k: config[k] for k in options} == options
    json.dumps(config)

    layer = keras_attn.RotaryEmbedding(BASE, FACTOR, **TYPES["yarn_mscale"])
    config = json.loads(json.dumps(layer.get_config()))
    reloaded = keras_attn.RotaryEmbedding.from_config(config)
    assert reloaded.get_config() == layer.get_config()
    assert (reloaded.rope_type, reloaded.mscale, reloaded.original_max_position_embeddings) == (
        "yarn", 0.7, CONTEXT)


def test_old_configs_mean_default_rope():
    """A config without the new fields (every config written before them) is today's RoPE."""
    layer = keras_attn.RotaryEmbedding.from_config(
        {"name": "rope", "max_wavelength": 50.0, "scaling_factor": 2.0, "interleaved": False,
         "sequence_axis": 1})
    assert layer.rope_type == "default"
    x = randn(rng(13), 1, 5, 8)
    expected = reference.rotary_embedding(x, np.arange(5), 50.0, 2.0)
    assert_close(layer(x), expected)


@pytest.mark.parametrize("refused", ["dynamic"])
def test_refused_types(refused):
    match = rf"`rope_type` '{refused}' is not supported.*Received: rope_type='{refused}'"
    with pytest.raises(ValueError, match=match):
        keras_attn.RotaryEmbedding(rope_type=refused)
    with pytest.raises(ValueError, match=match):
        keras_attn.rotary_embedding(np.ones((1, 2, 4), "float32"), rope_type=refused)
    with pytest.raises(ValueError, match=match):
        keras_attn.MultiHeadAttention(2, 4, rope_max_wavelength=1e4, rope_type=refused)
    with pytest.raises(ValueError, match=match):
        keras_attn.TransformerDecoderLayer(2, intermediate_dim=8, rope_max_wavelength=1e4,
                                           rope_type=refused)


def test_bad_rope_arguments():
    with pytest.raises(ValueError, match=r"must be one of.*Received: rope_type='ntk'"):
        AttentionOptions(rope_max_wavelength=1e4, rope_type="ntk")
    with pytest.raises(ValueError, match=r"needs `rope_original_max_position_embeddings`.*"
                                         r"Received: rope_original_max_position_embeddings=None"):
        AttentionOptions(rope_max_wavelength=1e4, rope_type="yarn")
    with pytest.raises(ValueError, match=r"needs `original_max_position_embeddings`.*"
                                         r"Received: original_max_position_embeddings=None"):
        keras_attn.RotaryEmbedding(rope_type="llama3")
    with pytest.raises(ValueError, match=r"high_freq_factor` > `low_freq_factor`.*Received: "
                                         r"low_freq_factor=4.0, high_freq_factor=2.0"):
        keras_attn.RotaryEmbedding(rope_type="llama3", low_freq_factor=4.0,
                                   high_freq_factor=2.0, original_max_position_embeddings=64)
    with pytest.raises(ValueError, match=r"Received: rope_beta_fast=-1"):
        AttentionOptions(rope_max_wavelength=1e4, rope_beta_fast=-1)
    with pytest.raises(ValueError, match=r"Received: attention_factor=0"):
        keras_attn.RotaryEmbedding(rope_type="yarn", attention_factor=0,
                                   original_max_position_embeddings=64)
    with pytest.raises(ValueError, match=r"Received: rope_mscale=-0.5"):
        AttentionOptions(rope_max_wavelength=1e4, rope_mscale=-0.5)
    with pytest.raises(ValueError, match=r"need `rope_max_wavelength`.*Received: "
                                         r"rope_type='llama3', rope_max_wavelength=None"):
        keras_attn.MultiHeadAttention(2, 4, rope_type="llama3",
                                      rope_original_max_position_embeddings=64)
