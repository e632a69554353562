"""A hybrid `CausalLM` (Qwen 3.5's layout): Gated DeltaNet blocks with a `RecurrentCache`
beside a gated softmax block with a `KVCache`, through one compiled `generate`.

The numbers against transformers are tests/convert/test_families.py's (`qwen3_5_text`);
here: cached greedy tokens = greedy argmax of the uncached forwards, the prefill is the
whole prompt at once (the chunked rule on the prompt, the recurrent one per token), the
caches' kinds, the `.keras` round trip, and the refusals.
"""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.layers.causal_lm import traced_step_of
from keras_attn.testing.weights import randomize_weights

from ..helpers import UNCACHED, assert_close, assert_greedy_over_uncached, to_numpy

V, D, B, P, L = 40, 16, 2, 7, 12


def _linear_block(chunk_size=3):
    return keras_attn.TransformerDecoderLayer(
        attention=lambda name, dtype: keras_attn.GatedDeltaNet(
            1, 2, 4, 3, linear_conv_kernel_dim=3, chunk_size=chunk_size, name=name,
            dtype=dtype),
        intermediate_dim=24, normalize_first=True, normalization="rms",
        gated_feed_forward=True, activation="silu", use_bias=False)


def _full_block():
    return keras_attn.TransformerDecoderLayer(
        2, intermediate_dim=24, key_dim=8, num_key_value_heads=1, rope_max_wavelength=1e4,
        rope_partial_rotary_factor=0.5, qk_norm="rms", use_gate=True, normalize_first=True,
        normalization="rms", gated_feed_forward=True, activation="silu", use_bias=False)


def _hybrid(seed=0):
    # 3 linear + 1 full (Qwen 3.5's full_attention_interval 4); chunk 3 divides neither
    # the prompt (7) nor the forward (11).
    lm = keras_attn.CausalLM(V, D, [_linear_block(), _linear_block(), _linear_block(),
                                    _full_block()], tie_word_embeddings=False)
    randomize_weights(lm, seed=seed, scale=0.35)
    return lm


def test_generate_is_greedy_over_the_uncached_forwards_and_takes_both_paths():
    lm = _hybrid()
    prompt = np.random.default_rng(1).integers(0, V, (B, P)).astype("int32")
    caches = [keras_attn.empty_cache(block, B, L, as_kv_cache=True) for block in lm.blocks]
    assert [type(c).__name__ for c in caches] == ["RecurrentCache"] * 3 + ["KVCache"]
    with keras_attn.observe_paths() as paths:
        tokens = to_numpy(lm.generate(prompt, max_length=L))  # compiled: XLA, or the
    # traced step on PyTorch. The prefill: the chunked rule over the whole prompt in each
    # linear block, once; the steps: the recurrent rule in each (counted per trace), the
    # full block over its KV cache.
    assert paths["chunked"] == 3, paths
    assert paths["recurrent"] >= 3 and paths["recurrent"] % 3 == 0 and paths["cached"], paths
    np.testing.assert_array_equal(tokens[:, :P], prompt)
    assert_greedy_over_uncached(lm, tokens, P)
    if keras.backend.backend() == "torch":  # the steps replayed from one traced graph
        step = traced_step_of(lm)
        assert step.graph_calls > 0 and None not in step.graphs.values()


def test_prefill_whole_prompt_equals_token_by_token():
    """The prompt in one call (chunked) leaves the caches and logits that feeding it one
    token at a time (recurrent) leaves."""
    lm = _hybrid(seed=2)
    prompt = np.random.default_rng(3).integers(0, V, (B, 5)).astype("int32")

    def caches():
        return [keras_attn.empty_cache(block, B, L, as_kv_cache=True) for block in lm.blocks]

    whole, whole_caches = lm.next_token_logits(prompt, caches(), 0)
    steps, step_caches = None, caches()
    for i in range(prompt.shape[1]):
        steps, step_caches = lm.next_token_logits(prompt[:, i:i + 1], step_caches, i)
    assert_close(to_numpy(steps)[:, -1], to_numpy(whole)[:, -1], against=UNCACHED)
    # The first linear block sees the same inputs either way: its states agree to the
    # float32 tolerance. The later blocks' inputs carry the earlier blocks' rounding (the
    # chunked solve against the recurrent steps, ~2e-5 after two blocks): 1e-4 there.
    for i, (a, b) in enumerate(zip(whole_caches[:3], step_caches[:3])):
        for x, y in zip(a, b):  # conv_state, recurrent_state
            if i == 0:
                assert_close(to_numpy(x), to_numpy(y), against=UNCACHED)
            else:
                np.testing.assert_allclose(to_numpy(x), to_numpy(y), rtol=1e-4, atol=1e-4)
    assert_close(to_numpy(whole), to_numpy(lm(prompt)), against=UNCACHED)


def test_hybrid_round_trips_through_a_keras_file():
    lm = _hybrid(seed=4)
    ids = np.random.default_rng(5).integers(0, V, (B, P)).astype("int32")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "hybrid.keras")
        lm.save(path)
        loaded = keras.saving.load_model(path)
    assert [type(b.self_attention).__name__ for b in loaded.blocks] == (
        ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"])
    assert loaded.blocks[0].self_attention.chunk_size == 3
    np.testing.assert_array_equal(to_numpy(loaded(ids)), to_numpy(lm(ids)))


def test_hybrid_refusals():
    layer = keras_attn.GatedDeltaNet(1, 2, 4, 3)
    with pytest.raises(ValueError, match=r"Received: use_causal_mask=False"):
        layer(np.ones((1, 3, 8), "float32"), use_causal_mask=False)
    # Gemma 4's KV sharing: a linear block has no keys and values to share.
    blocks = [_linear_block(), _full_block()]
    with pytest.raises(ValueError, match=r"Received: kv_sharing\[1\]=0"):
        keras_attn.CausalLM(V, D, blocks, kv_sharing=[None, 0])
    # longrope's cache recomputation cannot rewind a recurrent state.
    longrope = keras_attn.TransformerDecoderLayer(
        2, intermediate_dim=24, key_dim=8, normalize_first=True, normalization="rms",
        rope_max_wavelength=1e4, rope_type="longrope", rope_short_factor=(1.0,) * 4,
        rope_long_factor=(2.0,) * 4, rope_original_max_position_embeddings=4,
        rope_scaling_factor=4.0)
    lm = keras_attn.CausalLM(V, D, [_linear_block(), longrope])
    with pytest.raises(ValueError, match=r"linear-attention blocks"):
        lm.generate(np.ones((1, 2), "int32"), max_length=8)
