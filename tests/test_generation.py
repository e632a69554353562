"""`keras_attn.generation.generate` against a plain loop over the uncached model."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.generation import generate
from keras_attn.testing.weights import randomize_weights

from .helpers import to_numpy

B, P, L, V, D = 2, 3, 7, 11, 8


class _TinyLM:
    """Embedding -> one decoder-only block (GQA + RoPE) -> logits, with and without a cache."""

    def __init__(self):
        self.embedding = keras.layers.Embedding(V, D)
        self.block = keras_attn.TransformerDecoderLayer(
            2, intermediate_dim=16, key_dim=4, num_key_value_heads=1,
            rope_max_wavelength=100.0, normalize_first=True)
        self.head = keras.layers.Dense(V)
        self.embedding.build((B, L))
        self.block.build((B, L, D))
        self.head.build((B, L, D))
        for layer, seed in ((self.embedding, 1), (self.block, 2), (self.head, 3)):
            randomize_weights(layer, seed=seed, scale=0.3)  # logits O(1)

    def logits(self, token_ids):
        return self.head(self.block(self.embedding(token_ids)))

    def next_token_fn(self, token_ids, cache, index):
        x, cache = self.block(self.embedding(token_ids), self_attention_cache=cache,
                              self_attention_cache_update_index=index)
        return self.head(x), cache

    def cache(self):
        return keras_attn.empty_cache(self.block, B, L)


def _prompt():
    return np.random.default_rng(0).integers(0, V, (B, P)).astype("int32")


def _assert_greedy(model, tokens):
    """Each generated token is the argmax of the uncached model's logits before it.

    The model is causal, so one forward over the sequence gives every step's
    logits (one shape to compile, not one per length).
    """
    logits = to_numpy(model.logits(tokens[:, :-1]))  # (B, L - 1, V)
    np.testing.assert_array_equal(tokens[:, P:], logits[:, P - 1:].argmax(-1))


def test_greedy_and_end_token():
    model = _TinyLM()
    expected = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache()))
    np.testing.assert_array_equal(expected[:, :P], _prompt())
    _assert_greedy(model, expected)
    assert len(set(expected[:, P:].ravel())) > 1, "a constant output would test little"
    # Row 0 stops at the token it emits at position P + 1; row 1 goes on unless it
    # emits it too. Everything after a row's end token is the end token.
    end = int(expected[0, P + 1])
    stopped = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                end_token_id=end))
    for row in range(B):
        hits = np.flatnonzero(expected[row, P:] == end)
        cut = P + hits[0] + 1 if hits.size else L
        np.testing.assert_array_equal(stopped[row, :cut], expected[row, :cut])
        assert (stopped[row, cut:] == end).all()


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = _TinyLM()
    greedy = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache()))
    top1 = to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                             temperature=0.7, top_k=1, seed=5))
    np.testing.assert_array_equal(top1, greedy)
    first, again = (to_numpy(generate(model.next_token_fn, _prompt(), L, model.cache(),
                                      temperature=2.0, top_k=4, seed=7)) for _ in range(2))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first[:, :P], _prompt())
    assert ((first >= 0) & (first < V)).all()
    # With 4 candidates at temperature 2, 8 sampled tokens all equal to greedy's
    # would be a coincidence: sampling must change something.
    assert (first[:, P:] != greedy[:, P:]).any()


def test_generate_rejects_bad_arguments():
    model = _TinyLM()
    with pytest.raises(ValueError, match=r"0 < P < max_length.*max_length=3"):
        generate(model.next_token_fn, _prompt(), 3, model.cache())
    with pytest.raises(ValueError, match=r"Received: temperature=-1"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=-1)
    with pytest.raises(ValueError, match=r"Received: top_k=0"):
        generate(model.next_token_fn, _prompt(), L, model.cache(), temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match=r"integer tensor \(B, P\)"):
        generate(model.next_token_fn, _prompt().astype("float32"), L, model.cache())
