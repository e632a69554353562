"""`CausalLM` over blocks with given sublayers, and its `logits_scaling` (Granite's)."""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights

from ..custom_sublayers import (
    MeanAttention,
    TanhFeedForward,
    float64_weights,
    mean_attention_reference,
    tanh_feed_forward_reference,
)
from ..helpers import UNCACHED, assert_close, assert_greedy_over_uncached, to_numpy

V, D, B, P = 40, 8, 2, 5


def _custom_block(residual_scale=None):
    return keras_attn.TransformerDecoderLayer(
        attention=MeanAttention, feed_forward=lambda **kw: TanhFeedForward(12, **kw),
        normalize_first=True, normalization="rms", residual_scale=residual_scale)


def _numpy(variable):
    return to_numpy(variable).astype(np.float64)


def _lm_reference(lm, ids, logits_scaling=None, soft_cap=None, scale_after_cap=False):
    """The model in float64 (blocks: pre-RMS-norm around the custom sublayers)."""
    x = _numpy(lm.token_embedding.embeddings)[ids]
    for block in lm.blocks:
        s = block.residual_scale or 1.0
        norm = lambda h, n: reference.rms_norm(h, {"scale": _numpy(n.scale)}, 1e-5)  # noqa: E731
        x = x + s * mean_attention_reference(float64_weights(block.self_attention),
                                             norm(x, block.self_attention_norm), causal=True)
        x = x + s * tanh_feed_forward_reference(float64_weights(block.feed_forward),
                                                norm(x, block.feed_forward_norm))
    x = reference.rms_norm(x, {"scale": _numpy(lm.final_norm.scale)}, 1e-6)
    logits = x @ _numpy(lm.token_embedding.embeddings).T
    if logits_scaling is not None and not scale_after_cap:
        logits = logits / logits_scaling
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    if logits_scaling is not None and scale_after_cap:
        logits = logits / logits_scaling
    return logits


def test_custom_blocks_and_logits_scaling_match_the_reference():
    """Scaling first, then the cap: c tanh((l / s) / c); the other order is far away."""
    lm = keras_attn.CausalLM(V, D, [_custom_block(0.5), _custom_block()],
                             logits_scaling=0.25, final_logit_soft_cap=6.0)
    randomize_weights(lm, seed=1, scale=1.0)
    ids = np.random.default_rng(2).integers(0, V, (B, P))
    out = to_numpy(lm(ids))
    assert_close(out, _lm_reference(lm, ids, 0.25, 6.0))
    for wrong in (_lm_reference(lm, ids, None, 6.0),
                  _lm_reference(lm, ids, 0.25, 6.0, scale_after_cap=True)):
        assert np.abs(wrong - out).max() > 0.5


def test_cached_generate_with_factory_attention_is_greedy_over_the_uncached_model():
    def attention(name, dtype):
        return keras_attn.MultiHeadAttention(4, 2, num_key_value_heads=2,
                                             rope_max_wavelength=1e4, use_bias=False,
                                             name=name, dtype=dtype)

    blocks = [keras_attn.TransformerDecoderLayer(
        attention=attention, intermediate_dim=16, normalize_first=True, normalization="rms",
        residual_scale=scale) for scale in (0.5, None)]
    lm = keras_attn.CausalLM(V, D, blocks, logits_scaling=2.0)
    randomize_weights(lm, seed=3, scale=1.0)
    prompt = np.random.default_rng(4).integers(0, V, (B, P))
    tokens = to_numpy(lm.generate(prompt, max_length=P + 4))
    np.testing.assert_array_equal(tokens[:, :P], prompt)
    assert_greedy_over_uncached(lm, tokens, P)  # greedy decoding by full uncached forwards


def test_generate_needs_a_cache_in_every_block():
    lm = keras_attn.CausalLM(V, D, [_custom_block()])
    with pytest.raises(ValueError, match=r"Received: layer="):
        lm.generate(np.ones((1, 3), "int32"), max_length=5)


def test_custom_blocks_round_trip_through_a_keras_file():
    lm = keras_attn.CausalLM(V, D, [_custom_block(0.5)], logits_scaling=3.0,
                             tie_word_embeddings=False)
    randomize_weights(lm, seed=5)
    ids = np.random.default_rng(6).integers(0, V, (B, P))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "lm.keras")
        lm.save(path)
        loaded = keras.saving.load_model(path)
    assert isinstance(loaded.blocks[0].self_attention, MeanAttention)
    assert (loaded.logits_scaling, loaded.blocks[0].residual_scale) == (3.0, 0.5)
    assert_close(loaded(ids), to_numpy(lm(ids)), against=UNCACHED)


def test_logits_scaling_config_and_errors():
    blocks = lambda: [_custom_block()]  # noqa: E731
    assert "logits_scaling" not in keras_attn.CausalLM(V, D, blocks()).get_config()
    config = keras_attn.CausalLM(V, D, blocks(), logits_scaling=2.0).get_config()
    assert config["logits_scaling"] == 2.0
    del config["logits_scaling"]  # a config saved before the option: the default
    assert keras_attn.CausalLM.from_config(config).logits_scaling is None
    for bad in (0.0, -2.0, "2"):
        with pytest.raises(ValueError, match=r"Received: logits_scaling="):
            keras_attn.CausalLM(V, D, blocks(), logits_scaling=bad)


def test_blocks_that_are_not_layers_or_of_another_width_are_refused():
    with pytest.raises(ValueError, match=r"Received: blocks\[1\] of type int"):
        keras_attn.CausalLM(V, D, [_custom_block(), 3])
    block = _custom_block()
    block.build((None, None, 2 * D))  # no MultiHeadAttention: the width comes from the build
    with pytest.raises(ValueError, match=r"built for inputs of width 16, not hidden_dim=8"):
        keras_attn.CausalLM(V, D, [block])
