"""Partial rotary (`partial_rotary_factor`): RoPE on the leading `int(d * f)` features of
each head, with the frequencies of a head that wide, the rest passed through (GLM-4,
Phi-4-mini, Qwen 3.5, GPT-NeoX), in both pairings, against the float64 reference and
transformers' own `apply_rotary_pos_emb` (Phi-3's half-split, GLM-4's interleaved)."""

import numpy as np
import pytest

import keras_attn
from keras_attn.options import AttentionOptions
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

D = 16  # head width; factor 0.5 rotates 8 features, 0.25 four


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("factor", [0.25, 0.5])
def test_rotary_embedding_matches_reference(interleaved, factor):
    x = randn(rng(0), 2, 5, 3, D)  # (B, L, H, d)
    y = to_numpy(keras_attn.rotary_embedding(x, start_index=3, max_wavelength=100.0,
                                             interleaved=interleaved,
                                             partial_rotary_factor=factor))
    # The reference rotates (..., L, d): heads before positions.
    expected = np.swapaxes(reference.rotary_embedding(
        np.swapaxes(x, 1, 2), np.arange(5) + 3, 100.0, interleaved=interleaved,
        partial_rotary_factor=factor), 1, 2)
    assert_close(y, expected)
    rotated = int(D * factor)
    np.testing.assert_array_equal(y[..., rotated:], x[..., rotated:])  # passed through
    whole = to_numpy(keras_attn.rotary_embedding(x, start_index=3, max_wavelength=100.0,
                                                 interleaved=interleaved))
    assert np.abs(whole - y).max() > 0.5  # not the whole-head rotation


def test_multi_head_attention_matches_reference():
    x = randn(rng(1), 2, 6, 32)
    options = dict(num_key_value_heads=1, rope_max_wavelength=100.0,
                   rope_partial_rotary_factor=0.5)
    layer = keras_attn.MultiHeadAttention(2, D, **options)
    layer(x, x, use_causal_mask=True)
    randomize_weights(layer, seed=2, scale=1.0)
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, x, num_heads=2, is_causal=True,
                                                 **options)
    whole, _ = reference.multi_head_attention(params, x, x, num_heads=2, is_causal=True,
                                              **{**options, "rope_partial_rotary_factor": 1.0})
    assert np.abs(expected - whole).max() > 0.05
    assert_close(to_numpy(layer(x, x, use_causal_mask=True)), expected)
    again = keras_attn.MultiHeadAttention.from_config(layer.get_config())
    assert again.options.rope.partial_rotary_factor == 0.5


def test_an_odd_or_empty_slice_is_refused_by_name():
    with pytest.raises(ValueError, match=r"head_dim=16, partial_rotary_factor=0.2"):
        keras_attn.RotaryEmbedding(partial_rotary_factor=0.2)(np.ones((1, 2, 16), "float32"))
    options = AttentionOptions(rope_max_wavelength=1e4, rope_partial_rotary_factor=0.3)
    assert options.for_heads(2, key_dim=16).num_key_value_heads == 2  # int(4.8) = 4: even
    with pytest.raises(ValueError, match=r"head_dim=10, partial_rotary_factor=0.3"):
        options.for_heads(2, key_dim=10)  # int(3.0) = 3: odd
    with pytest.raises(ValueError, match=r"Received: rope_partial_rotary_factor=1.5"):
        AttentionOptions(rope_max_wavelength=1e4, rope_partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match=r"Received: partial_rotary_factor=0"):
        keras_attn.RotaryEmbedding(partial_rotary_factor=0)


@pytest.mark.parametrize("family, interleaved", [("phi3", False), ("glm4", True)])
def test_matches_transformers_apply_rotary_pos_emb(family, interleaved):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import importlib

    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config_class = {"phi3": transformers.Phi3Config, "glm4": transformers.Glm4Config}[family]
    config = config_class(hidden_size=4 * D, num_attention_heads=4, head_dim=D,
                          partial_rotary_factor=0.5, rope_theta=100.0)
    rotary = getattr(modeling, f"{family.capitalize()}RotaryEmbedding")(config=config)
    q = randn(rng(3), 1, 4, 7, D)  # (B, H, L, d), transformers' layout
    positions = torch.arange(7)[None]
    cos, sin = rotary(torch.from_numpy(q), positions)
    expected, _ = modeling.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(q), cos, sin)
    ours = keras_attn.rotary_embedding(np.swapaxes(q, 1, 2), max_wavelength=100.0,
                                       interleaved=interleaved, partial_rotary_factor=0.5)
    assert_close(np.swapaxes(to_numpy(ours), 1, 2), expected.numpy())
