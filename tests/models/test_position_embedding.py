"""`CausalLM(max_position_embeddings=N)`: learned absolute positions (GPT-2's `wpe`) that
move with the cache index in cached calls and `generate`."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights, reference_params

from ..helpers import UNCACHED, assert_close, to_numpy
from ..shapes import S_MAX, B, D, H, T

V, N = 32, S_MAX


def _lm(**kwargs):
    blocks = [keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, normalize_first=True)
              for _ in range(2)]
    lm = keras_attn.CausalLM(V, D, blocks, normalization="layer",
                             max_position_embeddings=N, **kwargs)
    randomize_weights(lm, seed=0)
    return lm


def _ids(seed=1, length=T):
    return np.random.default_rng(seed).integers(0, V, (B, length)).astype("int32")


def _reference(lm, ids, positions):
    """float64: E[ids] + W_pos[positions], the blocks, the final LayerNorm, the tied head."""
    table = to_numpy(lm.token_embedding.embeddings).astype(np.float64)
    x = table[ids] + to_numpy(lm.position_embedding.embeddings).astype(np.float64)[positions]
    for block in lm.blocks:
        x = reference.decoder_layer(reference_params(block), x, H, normalize_first=True)
    norm = {k: to_numpy(getattr(lm.final_norm, k)).astype(np.float64) for k in ("gamma", "beta")}
    x = reference.layer_norm(x, norm, 1e-6)
    return x @ table.T


def test_logits_match_the_float64_reference():
    lm = _lm()
    ids = _ids()
    out = to_numpy(lm(ids))
    assert_close(out, _reference(lm, ids, np.arange(T)))
    # Ablation: positions shifted by one (or none at all) are far away.
    assert np.abs(_reference(lm, ids, np.arange(1, T + 1)) - out).max() > 0.1
    assert "position_embedding" in [w.path.split("/")[-2] for w in lm.weights]


def test_cached_steps_take_the_positions_of_the_cache_index():
    lm = _lm()
    ids = _ids(2)
    full = to_numpy(lm(ids))
    caches = [keras_attn.empty_cache(b, B, S_MAX, as_kv_cache=True) for b in lm.blocks]
    first, caches = lm.next_token_logits(ids[:, :3], caches, 0)
    rest, caches = lm.next_token_logits(ids[:, 3:], caches, 3)
    assert_close(np.concatenate([to_numpy(first), to_numpy(rest)], 1), full, against=UNCACHED)
    # Ablation: the step at positions 0.. (the index not moving the positions) is far away.
    fresh = [keras_attn.empty_cache(b, B, S_MAX, as_kv_cache=True) for b in lm.blocks]
    _, fresh = lm.next_token_logits(ids[:, :3], fresh, 0)
    x = lm._embed(ids[:, 3:])  # positions 0, 1: what a table indexed from 0 would add
    x, _ = lm._blocks(x, None, fresh, 3)
    assert np.abs(to_numpy(lm._logits(x)) - full[:, 3:]).max() > 0.1


@pytest.mark.skipif(keras.backend.backend() == "jax",
                    reason="eager JAX compiles the uncached forward at every length (about "
                           "20 s); the gpt2 family fixture checks generate on JAX")
def test_generate_is_the_uncached_greedy_loop():
    lm = _lm()
    prompt = _ids(3, 3)
    tokens = to_numpy(lm.generate(prompt, max_length=N, jit_compile=False))
    expected = prompt
    for _ in range(N - 3):
        nxt = to_numpy(lm(expected))[:, -1].argmax(-1).astype("int32")
        expected = np.concatenate([expected, nxt[:, None]], 1)
    np.testing.assert_array_equal(tokens, expected)


def test_config_round_trip_and_refusals():
    lm = _lm()
    config = lm.get_config()
    assert config["max_position_embeddings"] == N
    again = keras_attn.CausalLM.from_config(config)
    again.set_weights(lm.get_weights())
    ids = _ids(4)
    np.testing.assert_array_equal(to_numpy(again(ids)), to_numpy(lm(ids)))
    blocks = [keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, normalize_first=True)]
    assert "max_position_embeddings" not in keras_attn.CausalLM(V, D, blocks).get_config()
    with pytest.raises(ValueError, match=r"Received: token_ids.shape=\(2, 11\)"):
        lm(_ids(5, N + 1))
    with pytest.raises(ValueError, match=r"Received: max_length=11"):
        lm.generate(_ids(5, 3), max_length=N + 1)
    with pytest.raises(ValueError, match=r"Received: max_position_embeddings=0"):
        keras_attn.CausalLM(V, D, blocks, max_position_embeddings=0)
    assert isinstance(lm.position_embedding, keras.layers.Embedding)
