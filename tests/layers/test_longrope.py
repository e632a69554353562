"""longrope (Phi-3.5, Phi-4-mini): per-frequency short / long factors, the switch past
`original_max_position_embeddings`, over a cache and in `CausalLM.generate`.

Against the float64 reference (keras_attn.testing.rope_reference, written from
transformers' `_compute_longrope_parameters`), transformers' own function where torch is
there, and the layer's uncached forward for generation. Each comparison has an ablation
(the other factor list, or no recompute of the cache) that moves the numbers far past
the tolerance.
"""

import json
import math
import os

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import generation
from keras_attn.rope import RopeSpec
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

ORIGINAL = 16
SHORT = (1.0, 1.2, 1.5, 1.9)
LONG = (1.3, 2.5, 4.9, 9.6)
LONGROPE = dict(rope_type="longrope", original_max_position_embeddings=ORIGINAL,
                scaling_factor=4.0, short_factor=SHORT, long_factor=LONG)
OPTIONS = {f"rope_{k}" if k != "rope_type" else k: v for k, v in LONGROPE.items()}


def test_frequencies_match_reference_and_default_attention_factor():
    spec = RopeSpec(**LONGROPE)
    theta, factor = spec.frequencies(8)
    expected, expected_factor = reference.rope_inverse_frequencies(8, **LONGROPE)
    np.testing.assert_allclose(theta, expected, rtol=1e-12)
    assert factor == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(16)))
    assert factor == pytest.approx(expected_factor)
    long, _ = spec.long_frequencies(8)
    np.testing.assert_allclose(long, reference.rope_inverse_frequencies(
        8, seq_len=ORIGINAL + 1, **LONGROPE)[0], rtol=1e-12)
    assert np.abs(long - theta).max() > 1e-2  # the two lists differ
    assert RopeSpec(**{**LONGROPE, "attention_factor": 0.7}).frequencies(8)[1] == 0.7
    assert RopeSpec(**{**LONGROPE, "scaling_factor": 1.0}).frequencies(8)[1] == 1.0
    assert spec.cache_recompute_length == ORIGINAL + 1
    assert RopeSpec().cache_recompute_length is None


def test_frequencies_match_transformers():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Phi3Config(
        hidden_size=32, num_attention_heads=2, head_dim=16, partial_rotary_factor=0.5,
        max_position_embeddings=64, original_max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": list(SHORT),
                         "long_factor": list(LONG), "partial_rotary_factor": 0.5})
    spec = RopeSpec.from_rope_parameters(config.rope_parameters, max_position_embeddings=64)
    assert spec.rotary_dim(16) == 8
    for seq_len, ours in ((None, spec.frequencies(8)), (ORIGINAL + 1, spec.long_frequencies(8))):
        inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=seq_len)
        np.testing.assert_allclose(ours[0], inv_freq.numpy(), rtol=1e-6)
        assert ours[1] == pytest.approx(factor)


@pytest.mark.parametrize("length", [ORIGINAL, ORIGINAL + 4])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotary_embedding_switches_past_the_original_length(length, partial):
    x = randn(rng(0), 2, length, 3, int(8 / partial))  # (B, L, H, d): d/2 * partial = 4
    ours = keras_attn.rotary_embedding(x, partial_rotary_factor=partial, **LONGROPE)
    heads = np.swapaxes(x, 1, 2)  # the reference's (..., L, d)
    expected = np.swapaxes(reference.rotary_embedding(
        heads, np.arange(length), partial_rotary_factor=partial, **LONGROPE), 1, 2)
    assert_close(ours, expected)
    # The ablation: the other list (the switch decided the wrong way).
    other = reference.rotary_embedding(
        heads, np.arange(length), partial_rotary_factor=partial,
        seq_len=ORIGINAL if length > ORIGINAL else ORIGINAL + 1, **LONGROPE)
    assert np.abs(np.swapaxes(other, 1, 2) - expected).max() > 0.1


def test_bad_factors_are_refused_by_name():
    with pytest.raises(ValueError, match=r"needs `rope_long_factor`.*Received: rope_long_factor"):
        keras_attn.MultiHeadAttention(2, 8, rope_max_wavelength=1e4, **{
            **OPTIONS, "rope_long_factor": None})
    with pytest.raises(ValueError, match=r"Received: rope_short_factor=\[1.0, -2.0\]"):
        keras_attn.MultiHeadAttention(2, 8, rope_max_wavelength=1e4,
                                      **{**OPTIONS, "rope_short_factor": [1.0, -2.0]})
    with pytest.raises(ValueError, match=r"Received: short_factor='abc'"):
        RopeSpec(**{**LONGROPE, "short_factor": "abc"})
    with pytest.raises(ValueError, match=r"`rope_short_factor` holds one factor per rotated "
                                         r"frequency: 8 .*Received: rope_short_factor of length 4"):
        keras_attn.MultiHeadAttention(2, 16, rope_max_wavelength=1e4, **OPTIONS)
    with pytest.raises(ValueError, match=r"`short_factor` holds one factor.*length 4"):
        keras_attn.rotary_embedding(np.ones((1, 3, 6), "float32"), **LONGROPE)
    with pytest.raises(ValueError, match="needs `original_max_position_embeddings`"):
        RopeSpec(**{**LONGROPE, "original_max_position_embeddings": None})


def _layer(seed=1):
    layer = keras_attn.MultiHeadAttention(4, 8, num_key_value_heads=2,
                                          rope_max_wavelength=1e4, **OPTIONS)
    x = randn(rng(seed), 2, ORIGINAL + 4, 16)
    layer(x, x, use_causal_mask=True)
    randomize_weights(layer, seed=seed)
    return layer, x


@pytest.mark.parametrize("length", [ORIGINAL - 2, ORIGINAL + 4])
def test_multi_head_attention_uncached_matches_reference(length):
    layer, x = _layer()
    x = x[:, :length]
    kwargs = dict(num_heads=4, num_key_value_heads=2, is_causal=True, rope_max_wavelength=1e4,
                  **OPTIONS)
    expected, _ = reference.multi_head_attention(reference_params(layer), x, x, **kwargs)
    assert_close(layer(x, x, use_causal_mask=True), expected)
    swapped = {**kwargs, "rope_short_factor": LONG, "rope_long_factor": SHORT}
    ablation, _ = reference.multi_head_attention(reference_params(layer), x, x, **swapped)
    assert np.abs(ablation - expected).max() > 0.05


def _projected(params, x, heads):
    return np.swapaxes(reference.dense(x, params).reshape(x.shape[:2] + (heads, 8)), 1, 2)


def test_cached_decode_rotates_each_call_by_its_own_positions():
    """Over a cache, a call rotates its new queries and keys by its own positions (long
    once `cache_update_index + T > original`); cached keys keep their rotation: what a
    transformers forward with `past_key_values` does (not the uncached forward)."""
    layer, x = _layer(seed=2)
    params = reference_params(layer)
    L = x.shape[1]
    calls = [(0, 12)] + [(p, p + 1) for p in range(12, L)]  # prefill short, then one by one
    cache = keras_attn.empty_cache(layer, batch_size=2, max_length=L, as_kv_cache=True)
    outs = []
    for start, stop in calls:
        out, cache = layer(x[:, start:stop], x[:, start:stop], cache=cache,
                           cache_update_index=start, use_causal_mask=True)
        outs.append(to_numpy(out))
    # The float64 expectation, call by call (H = 4 query heads over H_kv = 2).
    q = _projected(params["query"], x, 4)
    k, v = _projected(params["key"], x, 2), _projected(params["value"], x, 2)
    rope = dict(max_wavelength=1e4, **LONGROPE)
    keys, expected = [], []
    for start, stop in calls:
        positions = np.arange(start, stop)
        keys.append(reference.rotary_embedding(k[:, :, start:stop], positions, seq_len=stop,
                                               **rope))
        q_call = reference.rotary_embedding(q[:, :, start:stop], positions, seq_len=stop, **rope)
        k_all = np.repeat(np.concatenate(keys, axis=2), 2, axis=1)
        v_all = np.repeat(v[:, :, :stop], 2, axis=1)
        out, _ = reference.scaled_dot_product_attention(q_call, k_all, v_all, is_causal=True)
        expected.append(reference.dense(np.swapaxes(out, 1, 2).reshape(2, stop - start, 32),
                                        params["output"]))
    assert_close(np.concatenate(outs, axis=1), np.concatenate(expected, axis=1))
    # The uncached forward (every key long) differs at the positions after the prefill.
    uncached = to_numpy(layer(x, x, use_causal_mask=True))
    assert np.abs(uncached[:, 12:] - np.concatenate(outs, axis=1)[:, 12:]).max() > 0.05


def _lm():
    block_options = dict(rope_max_wavelength=1e4, **OPTIONS)
    blocks = [keras_attn.TransformerDecoderLayer(4, intermediate_dim=32, key_dim=8,
                                                 normalize_first=True,
                                                 num_key_value_heads=2, **block_options)
              for _ in range(2)]
    lm = keras_attn.CausalLM(vocabulary_size=32, hidden_dim=16, blocks=blocks)
    randomize_weights(lm, seed=3, scale=0.6)
    return lm


def test_generate_recomputes_the_cache_at_the_switch():
    """Greedy generation across the switch equals the uncached forward's argmax at every
    step (transformers' Phi-3 drops its cache there); without the recompute, the step
    after the switch attends short-rotated keys and its logits move far."""
    lm = _lm()
    prompt = np.random.default_rng(4).integers(0, 32, (2, 6)).astype("int32")
    L = ORIGINAL + 6
    tokens = to_numpy(lm.generate(prompt, max_length=L))
    # The uncached forward of every prefix, from two calls: the forward is causal, and a
    # prefix of n tokens rotates with the short factors iff n <= ORIGINAL, so the call over
    # ORIGINAL tokens has every short prefix's last logits and the call over L - 1 tokens
    # every long one's (one call per prefix compiled 16 shapes on JAX: 51 s).
    short = to_numpy(lm(tokens[:, :ORIGINAL]))
    long = to_numpy(lm(tokens[:, :L - 1]))
    for n in range(6, L):  # the step that appends token n to the first n tokens
        logits = short[:, n - 1] if n <= ORIGINAL else long[:, n - 1]
        np.testing.assert_array_equal(tokens[:, n], logits.argmax(-1), err_msg=f"token {n}")
    # The step that makes the sequence ORIGINAL + 1 long, with and without the recompute.
    caches = [keras_attn.empty_cache(b, 2, L, as_kv_cache=True) for b in lm.blocks]
    _, caches = lm.next_token_logits(tokens[:, :ORIGINAL], caches, 0)
    stale, _ = lm.next_token_logits(tokens[:, ORIGINAL:ORIGINAL + 1], caches, ORIGINAL)
    fresh = long[:, ORIGINAL]  # the uncached forward of the first ORIGINAL + 1 tokens
    assert np.abs(to_numpy(stale)[:, -1] - fresh).max() > 1e-2
    # The generic mechanism: `generate` with `recompute_cache_at` gives the same tokens.
    caches = [keras_attn.empty_cache(b, 2, L, as_kv_cache=True) for b in lm.blocks]
    again = generation.generate(lm.next_token_logits, prompt, L, caches,
                                recompute_cache_at=[ORIGINAL + 1])
    np.testing.assert_array_equal(to_numpy(again), tokens)


def test_recompute_cache_at_is_checked():
    with pytest.raises(ValueError, match=r"Received: recompute_cache_at=0"):
        generation.generate(lambda t, c, i: (None, c), np.zeros((1, 2), "int32"), 4, None,
                            recompute_cache_at=0)


def test_config_json_and_keras_file_round_trip(tmp_path):
    layer, x = _layer(seed=5)
    config = layer.get_config()
    text = json.dumps(config)
    assert json.loads(text)["rope_short_factor"] == list(SHORT)
    again = keras_attn.MultiHeadAttention.from_config(json.loads(text))
    assert again.rope_long_factor == LONG and again.options == layer.options
    model = keras.Sequential([keras.Input((None, 16)), layer])
    path = os.path.join(tmp_path, "longrope.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert_close(loaded(x), to_numpy(model(x)), against="the saved model")
