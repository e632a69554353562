"""The edges of the serving path: every cache argument is right or a `ValueError`.

Indices of every kind (Python and NumPy integers, 0-d arrays, eager tensors;
traced under `jax.jit` / `tf.function(jit_compile=True)`), in and out of
range; masks over the cache slots; the decoder's cache arguments as a set;
cross caches longer than their memory; `generate` with a cache shorter than
the generation; the decoder in a Functional model. Each case either equals
the uncached forward or raises a `ValueError` that names the argument.
Shapes are those of tests/layers/test_cache.py (JAX compiles per shape).
"""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_attn
from keras_attn.generation import generate
from keras_attn.testing.weights import randomize_weights

from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

BACKEND = keras.backend.backend()
ops = keras.ops
B, T, D, H, D_HEAD, S_MAX = 2, 8, 12, 4, 4, 10


def _compiled(fn):
    """`fn` traced by the backend's compiler (its index has no value), or None (eager)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    return None


def _mha(seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, num_key_value_heads=2,
                                          rope_max_wavelength=100.0, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed)
    return layer


INDEX_KINDS = {
    "int": int,
    "numpy_int64": np.int64,
    "numpy_int32_0d": lambda i: np.array(i, dtype="int32"),
    "tensor": lambda i: ops.convert_to_tensor(i, dtype="int32"),
}


@pytest.fixture(scope="module")
def prefilled():
    """A layer, its input, the uncached forward and a cache holding 3 tokens."""
    x = randn(rng(1), B, T, D)
    layer = _mha(seed=2)
    full = to_numpy(layer(x, use_causal_mask=True))
    _, cache = layer(x[:, :3], cache=layer.empty_cache(B, S_MAX), cache_update_index=0,
                     use_causal_mask=True)
    return layer, x, full, cache


@pytest.mark.parametrize("kind", sorted(INDEX_KINDS))
def test_concrete_indices_are_range_checked(prefilled, kind):
    """In range: the uncached rows. Out of range or negative: a ValueError, never a write."""
    layer, x, full, cache = prefilled
    make = INDEX_KINDS[kind]
    out, new_cache = layer(x[:, 3:4], cache=cache, cache_update_index=make(3),
                           use_causal_mask=True)
    assert_close(out, full[:, 3:4], what=kind, against=UNCACHED)
    # S_max = 10: one new key fits at 0..9; two at 0..8.
    for index, length in ((10, 1), (9, 2), (25, 1), (-1, 1), (-3, 2)):
        with pytest.raises(ValueError, match=rf"Received: cache_update_index={index}(?!\d)"):
            layer(x[:, 3:3 + length], cache=cache, cache_update_index=make(index),
                  use_causal_mask=True)


def test_non_integer_indices_are_refused(prefilled):
    layer, x, _, cache = prefilled
    for index in (1.0, np.float32(1), np.array(1.0), np.bool_(True), True,
                  ops.convert_to_tensor(1.0), ops.convert_to_tensor([1, 2])):
        with pytest.raises(ValueError, match=r"`cache_update_index` must be an int"):
            layer(x[:, 3:4], cache=cache, cache_update_index=index, use_causal_mask=True)


@pytest.mark.skipif(BACKEND not in ("jax", "tensorflow"), reason="needs a tracing compiler: "
                    "on torch and numpy every index is eager and checked above")
def test_a_traced_index_out_of_range_gives_nan_not_a_clamped_write(prefilled):
    """XLA clamps `dynamic_update_slice`: the layer makes the result NaN instead."""
    layer, x, full, cache = prefilled

    def step(token, cache, index):
        return layer(token, cache=cache, cache_update_index=index, use_causal_mask=True)

    step = _compiled(step)
    token = ops.convert_to_tensor(x[:, 3:4])
    out, new_cache = step(token, cache, ops.convert_to_tensor(3, "int32"))
    assert_close(out, full[:, 3:4], what="traced, in range", against=UNCACHED)
    for index in (S_MAX, S_MAX + 5, -1):
        out, new_cache = step(token, cache, ops.convert_to_tensor(index, "int32"))
        assert np.isnan(to_numpy(out)).all(), f"index {index}: output not NaN"
        # The clamped write holds NaN: a later read sees it too.
        assert np.isnan(to_numpy(new_cache)).any(), f"index {index}: cache not poisoned"


def test_masks_over_a_cache_cover_every_slot(prefilled):
    """A (B, 1) key mask on a one-token step would broadcast over every slot."""
    layer, x, full, cache = prefilled
    token = x[:, 3:4]
    for name, mask in (("key_mask", np.ones((B, 1), bool)),
                       ("key_mask", np.zeros((B, 1), bool)),
                       ("value_mask", np.ones((B, 4), bool)),
                       ("attention_mask", np.ones((B, 1, 1), bool))):
        with pytest.raises(ValueError, match=rf"`{name}` is over the cache's S_max=10 slots"
                           rf".*Received: {name}.shape="):
            layer(token, cache=cache, cache_update_index=3, use_causal_mask=True,
                  **{name: mask})
    out, _ = layer(token, cache=cache, cache_update_index=3, use_causal_mask=True,
                   key_mask=np.ones((B, S_MAX), bool))
    assert_close(out, full[:, 3:4], what="full key mask", against=UNCACHED)


def test_an_index_without_a_cache_is_refused(prefilled):
    layer, x, _, _ = prefilled
    with pytest.raises(ValueError, match=r"Received: cache=None, cache_update_index=3"):
        layer(x, cache_update_index=3)


# ----------------------------------------------------------------------------
# TransformerDecoderLayer


@pytest.fixture(scope="module")
def seq2seq():
    g = rng(3)
    x, memory = randn(g, B, T, D), randn(g, B, 5, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, key_dim=D_HEAD,
                                               normalize_first=True, num_key_value_heads=2,
                                               rope_max_wavelength=100.0)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=4)
    full = to_numpy(layer(x, memory))
    return layer, x, memory, full


def test_decoder_cache_arguments_are_checked_as_a_set(seq2seq):
    layer, x, memory, _ = seq2seq
    self_cache = keras_attn.empty_cache(layer, B, S_MAX)
    cross = layer.cross_attention.empty_cache(B, 5)
    token = x[:, :1]
    cases = [
        (dict(memory=memory, self_attention_cache=self_cache),
         r"needs `self_attention_cache_update_index`.*self_attention_cache_update_index=None"),
        (dict(memory=memory, self_attention_cache_update_index=0),
         r"Received: self_attention_cache=None, self_attention_cache_update_index=0"),
        (dict(memory=memory, self_attention_cache=self_cache,
              self_attention_cache_update_index=0, cross_attention_cache_update_index=0),
         r"Received: cross_attention_cache=None, cross_attention_cache_update_index=0"),
        (dict(memory=memory, self_attention_cache=self_cache,
              self_attention_cache_update_index=0, padding_mask=np.ones((B, 1), bool)),
         r"`padding_mask` is over its S_max=10 slots.*Received: padding_mask.shape=\(2, 1\)"),
        (dict(memory=memory, self_attention_cache=self_cache,
              self_attention_cache_update_index=0, attention_mask=np.ones((B, 1, 1), bool)),
         r"Received: attention_mask.shape=\(2, 1, 1\)"),
        (dict(self_attention_cache=self_cache, self_attention_cache_update_index=0,
              cross_attention_cache=cross, memory_padding_mask=np.ones((B, 1), bool)),
         r"`memory_padding_mask` is over its S_max=5 slots"),
        (dict(memory=memory, self_attention_cache=self_cache,
              self_attention_cache_update_index=0,
              cross_attention_cache=layer.cross_attention.empty_cache(B, 7),
              cross_attention_cache_update_index=0),
         r"S_max=7 must equal the memory's length S=5"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            layer(token, **kwargs)


def test_decoder_only_block_without_an_index_is_refused():
    """It used to read the cache without writing the new token (errors 0.65-2.5)."""
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16)
    layer.build((B, T, D))
    cache = keras_attn.empty_cache(layer, B, S_MAX)
    with pytest.raises(ValueError, match=r"needs `self_attention_cache_update_index`"):
        layer(randn(rng(5), B, 1, D), self_attention_cache=cache)


def test_decoder_in_a_functional_model_returns_outputs_and_caches(seq2seq):
    """A compiled decode step built as a Keras model, like one around MultiHeadAttention."""
    layer, x, memory, full = seq2seq
    token = keras.Input((1, D), batch_size=B)
    self_in = keras.Input((2, S_MAX, 2, D_HEAD), batch_size=B)
    cross_in = keras.Input((2, 5, H, D_HEAD), batch_size=B)
    index = keras.Input((), batch_size=1, dtype="int32")  # (1,): one index per step
    outputs = layer(token, self_attention_cache=self_in,
                    self_attention_cache_update_index=ops.reshape(index, ()),
                    cross_attention_cache=cross_in, return_attention_scores=True)
    assert isinstance(outputs, tuple) and len(outputs) == 5
    out, self_scores, cross_scores, self_out, cross_out = outputs
    assert tuple(self_scores.shape) == (B, H, 1, S_MAX)
    assert tuple(cross_scores.shape) == (B, H, 1, 5)
    assert tuple(self_out.shape) == (B, 2, S_MAX, 2, D_HEAD)
    assert tuple(cross_out.shape) == (B, 2, 5, H, D_HEAD)
    model = keras.Model([token, self_in, cross_in, index], [out, self_out, cross_out])
    # Fill the caches eagerly with 3 tokens, then run steps 3 and 4 through the model.
    _, self_cache, cross = layer(
        x[:, :3], memory, self_attention_cache=keras_attn.empty_cache(layer, B, S_MAX),
        self_attention_cache_update_index=0,
        cross_attention_cache=layer.cross_attention.empty_cache(B, 5),
        cross_attention_cache_update_index=0)
    for i in (3, 4):
        out, self_cache, cross = model([ops.convert_to_tensor(x[:, i:i + 1]), self_cache, cross,
                                        ops.convert_to_tensor([i], "int32")])
        assert_close(out, full[:, i:i + 1], what=f"functional step {i}", against=UNCACHED)


def test_functional_decoder_scores_without_caches(seq2seq):
    layer, _, _, _ = seq2seq
    inputs, memory = keras.Input((T, D)), keras.Input((5, D))
    out, self_scores, cross_scores = layer(inputs, memory, return_attention_scores=True)
    assert tuple(self_scores.shape) == (None, H, T, T)
    assert tuple(cross_scores.shape) == (None, H, T, 5)
    encoder = keras_attn.TransformerEncoderLayer(H, intermediate_dim=16)
    out, scores = encoder(inputs, return_attention_scores=True)
    assert tuple(scores.shape) == (None, H, T, T)


# ----------------------------------------------------------------------------
# generate


def _block_lm():
    V = 11
    embedding = keras.layers.Embedding(V, D)
    block = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, key_dim=D_HEAD,
                                               num_key_value_heads=2, rope_max_wavelength=100.0,
                                               normalize_first=True)
    head = keras.layers.Dense(V)
    embedding.build((B, T))
    block.build((B, T, D))
    head.build((B, T, D))
    for layer, seed in ((embedding, 6), (block, 7), (head, 8)):
        randomize_weights(layer, seed=seed, scale=0.3)

    def next_token(ids, cache, index):
        y, cache = block(embedding(ids), self_attention_cache=cache,
                         self_attention_cache_update_index=index)
        return head(y), cache

    return block, next_token


def test_generate_refuses_a_cache_shorter_than_the_generation():
    """It used to finish with wrong tokens (JAX, TF) or a raw IndexError (torch).

    `generate` checks the caches that its first decoding step writes. With 3 slots
    (P = 3: the prefill fills them) an eager step (torch, numpy, TF's eager loop)
    refuses its index first, naming it; a traced one reaches `generate`'s check.
    """
    block, next_token = _block_lm()
    prompt = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    for slots in (3, 5, 6):  # max_length 8 needs 7 slots
        capacity = rf"S_max >= max_length - 1 = 7 slots.*Received: max_length=8, S_max={slots}"
        index = r"\[0, 3 - 1\].*Received: cache_update_index=3"
        with pytest.raises(ValueError, match=capacity if slots > 3 else f"{capacity}|{index}"):
            generate(next_token, prompt, 8, keras_attn.empty_cache(block, B, slots))
        with pytest.raises(ValueError, match=capacity if slots > 3 else f"{capacity}|{index}"):
            generate(next_token, prompt, 8,
                     keras_attn.empty_cache(block, B, slots, as_kv_cache=True))
    generate(next_token, prompt, 8, keras_attn.empty_cache(block, B, 7))
    compiled = _compiled(lambda p, c: generate(next_token, p, 8, c))
    if compiled is not None:  # the whole generation traced: refused at trace time
        with pytest.raises(ValueError, match=r"Received: max_length=8, S_max=6"):
            compiled(ops.convert_to_tensor(prompt), keras_attn.empty_cache(block, B, 6))


@pytest.mark.skipif(BACKEND not in ("jax", "tensorflow"), reason="needs a tracing compiler: "
                    "eager steps check every index's value")
def test_generate_with_a_step_compiled_earlier_still_refuses_a_short_cache():
    """A step traced before (a cache hit) skips the layer's checks; `generate`'s own capacity
    check still refuses the cache, and a cache it cannot see gives NaN, then -1, then a
    ValueError."""
    block, next_token = _block_lm()
    step = _compiled(next_token)
    prompt = np.array([[1, 2, 3], [4, 5, 6]], "int32")
    cache = keras_attn.empty_cache(block, B, 5)
    good = to_numpy(generate(step, prompt, 6, cache))  # traces the step: 5 slots suffice
    np.testing.assert_array_equal(good, to_numpy(generate(next_token, prompt, 6, cache)))
    with pytest.raises(ValueError, match=r"S_max >= max_length - 1 = 7 slots.*"
                       r"Received: max_length=8, S_max=5"):
        generate(step, prompt, 8, cache)
    # The same cache folded to rank 4: no cache layout `generate` knows, so only the NaN
    # that the out-of-range traced write gives is left to find it.
    folded = keras.ops.reshape(cache, (B * 2,) + tuple(cache.shape[2:]))

    def hidden(ids, flat, index):
        logits, new = step(ids, keras.ops.reshape(flat, cache.shape), index)
        return logits, keras.ops.reshape(new, flat.shape)

    with pytest.raises(ValueError, match=r"NaN or infinite logits.*Received: max_length=8"):
        generate(hidden, prompt, 8, folded)


@pytest.mark.skipif(BACKEND not in ("jax", "tensorflow"), reason="needs a tracing compiler")
def test_shape_checks_hold_inside_a_compiled_step(seq2seq):
    """The checks read static shapes only: a traced step raises them at trace time."""
    layer, x, memory, _ = seq2seq
    self_cache = keras_attn.empty_cache(layer, B, S_MAX)

    def too_long_cross(token, memory, cache, index):
        return layer(token, memory, self_attention_cache=cache,
                     self_attention_cache_update_index=index,
                     cross_attention_cache=layer.cross_attention.empty_cache(B, 7),
                     cross_attention_cache_update_index=0)

    def one_slot_mask(token, memory, cache, index):
        return layer(token, memory, self_attention_cache=cache,
                     self_attention_cache_update_index=index,
                     padding_mask=ops.ones((B, 1), "bool"))

    for fn, message in ((too_long_cross, r"S_max=7 must equal the memory's length S=5"),
                        (one_slot_mask, r"Received: padding_mask.shape=\(2, 1\)")):
        with pytest.raises(ValueError, match=message):
            _compiled(fn)(ops.convert_to_tensor(x[:, :1]), ops.convert_to_tensor(memory),
                          self_cache, ops.convert_to_tensor(0, "int32"))


# ----------------------------------------------------------------------------
# The property: the uncached answer or a ValueError, never anything else.


@settings(max_examples=max(6, settings.default.max_examples // 4), deadline=None)
@given(slots=st.sampled_from([4, 6, 8]), prefill=st.integers(1, 4),
       index=st.integers(-3, 10), new=st.integers(1, 3),
       kind=st.sampled_from(sorted(INDEX_KINDS)), memory_length=st.sampled_from([3, 4, 6]),
       cross_slots=st.sampled_from([3, 4, 6]))
def test_property_uncached_answer_or_value_error(seq2seq, slots, prefill, index, new, kind,
                                                 memory_length, cross_slots):
    """Random cache lengths, indices (every kind, in and out of range) and memory lengths."""
    layer, x, memory, _ = seq2seq
    memory = memory[:, :memory_length]
    full = to_numpy(layer(x, memory))  # (B, T, D): every prefix is causal
    make = INDEX_KINDS[kind]
    self_cache = keras_attn.empty_cache(layer, B, slots)
    cross = layer.cross_attention.empty_cache(B, cross_slots)
    try:
        out, self_cache, cross = layer(
            x[:, :prefill], memory, self_attention_cache=self_cache,
            self_attention_cache_update_index=make(0), cross_attention_cache=cross,
            cross_attention_cache_update_index=0)
    except ValueError as error:
        message = str(error)
        assert cross_slots != memory_length or prefill > slots, message
        return
    assert cross_slots == memory_length and prefill <= slots
    assert_close(out, full[:, :prefill], what="prefill", against=UNCACHED)
    stop = index + new
    try:
        out, _, _ = layer(x[:, index:stop] if index >= 0 else x[:, :new],
                          self_attention_cache=self_cache,
                          self_attention_cache_update_index=make(index),
                          cross_attention_cache=cross)
    except ValueError as error:
        assert "cache_update_index" in str(error)
        assert index < 0 or stop > slots, str(error)
        return
    assert 0 <= index and stop <= slots
    if index == prefill and stop <= T:  # the continuation of the prefill
        assert_close(out, full[:, index:stop], what="step", against=UNCACHED)
    else:  # a gap or an overwrite: finite, over the written slots only
        assert np.isfinite(to_numpy(out)).all()
