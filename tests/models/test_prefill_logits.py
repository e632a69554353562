"""`CausalLM.next_token_logits(..., logits_to_keep=N)` and `generate`'s prefill, which keeps 1.

transformers' `logits_to_keep`: N > 0 computes the head over the last N positions only.
`generate` reads only the last position of its prefill (unless a right-padded prompt is
prefilled whole: each row's own last), so it asks for that one and skips the head over
the rest of the prompt. These tests check the kept logits against the full ones (a
slice of the wrong positions fails: every position's logits differ), the argument's
checks, and which prefill `generate` ran, observed through a spy.
"""

import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights

from ..helpers import assert_greedy_over_uncached, to_numpy

# The shapes of tests/models/test_owned_cache.py (JAX compiles per shape).
B, P, L, V, D = 2, 5, 12, 40, 16


def _lm():
    blocks = [keras_attn.TransformerDecoderLayer(
        4, intermediate_dim=32, key_dim=4, num_key_value_heads=2, rope_max_wavelength=1e4,
        normalization="rms", normalize_first=True, gated_feed_forward=True,
        activation="silu", use_bias=False) for _ in range(2)]
    lm = keras_attn.CausalLM(V, D, blocks, tie_word_embeddings=False)
    randomize_weights(lm, seed=0, scale=0.5)  # far from identity: logits O(1)
    return lm


def _caches(lm):
    return [keras_attn.empty_cache(block, B, L, as_kv_cache=True) for block in lm.blocks]


def _prompt():
    return np.random.default_rng(1).integers(1, V, (B, P)).astype("int32")


def test_logits_to_keep_gives_the_last_positions_of_the_full_logits():
    lm, prompt = _lm(), _prompt()
    full, full_caches = lm.next_token_logits(prompt, _caches(lm), 0)
    for keep in (1, 2, P):
        kept, caches = lm.next_token_logits(prompt, _caches(lm), 0, logits_to_keep=keep)
        assert tuple(kept.shape) == (B, keep, V)
        np.testing.assert_allclose(to_numpy(kept), to_numpy(full)[:, P - keep:],
                                   rtol=1e-6, atol=1e-6)
        for got, expected in zip(caches, full_caches):  # the caches are the same either way
            np.testing.assert_array_equal(to_numpy(got.keys), to_numpy(expected.keys))
    # Each position's logits differ: keeping the wrong ones could not pass.
    logits = to_numpy(full)
    assert np.abs(logits[:, -1] - logits[:, -2]).max() > 0.1


@pytest.mark.parametrize("value", [-1, 1.5, True, "1"])
def test_logits_to_keep_is_checked(value):
    lm = _lm()
    with pytest.raises(ValueError, match=r"logits_to_keep.*Received: logits_to_keep="):
        lm.next_token_logits(_prompt(), _caches(lm), 0, logits_to_keep=value)


def _spy(lm, monkeypatch):
    """Record `(T of the tokens, T of the logits)` of every `next_token_logits` call."""
    calls, model_step = [], lm.next_token_logits

    def spy(token_ids, caches, index, **kwargs):
        logits, caches = model_step(token_ids, caches, index, **kwargs)
        calls.append((tuple(token_ids.shape)[1], tuple(logits.shape)[1]))
        return logits, caches

    monkeypatch.setattr(lm, "next_token_logits", spy)
    return calls


def test_generate_computes_the_prefill_s_last_logits_only(monkeypatch):
    lm, prompt = _lm(), _prompt()
    calls = _spy(lm, monkeypatch)
    tokens = to_numpy(lm.generate(prompt, max_length=L, jit_compile=False))
    assert calls[0] == (P, 1)  # the prefill: P tokens in, one position's logits out
    assert all(call == (1, 1) for call in calls[1:])  # the steps
    assert_greedy_over_uncached(lm, tokens, P)  # independent of the cache and the prefill


def test_a_padded_prompt_prefilled_whole_keeps_every_position(monkeypatch):
    """Each row's next token comes from its own last position: all P are kept."""
    lm, prompt = _lm(), _prompt()
    mask = np.ones((B, P), bool)
    mask[1, :2] = False  # row 1 left-padded: 3 tokens
    calls = _spy(lm, monkeypatch)
    lm.generate(prompt, max_length=L, padding_mask=mask, jit_compile=False)
    assert calls[0] == (P, P)
