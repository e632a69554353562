"""Incremental decoding with a key/value cache equals the uncached forward.

Prefill the first tokens into a cache, then decode the rest one or several
at a time: every step's output rows must equal the same rows of one uncached
forward over the whole sequence (which is itself checked against the float64
reference here). Sizes are tiny and shapes few: JAX compiles per shape.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn._policy import device_kind, observe_paths
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

BACKEND = keras.backend.backend()
B, T, D, H, D_HEAD, S_MAX = 2, 8, 12, 4, 4, 10

OPTIONS = {
    "plain": dict(),
    "gqa_rope": dict(num_key_value_heads=2, rope_max_wavelength=100.0),
    "mqa_rope_interleaved": dict(num_key_value_heads=1, rope_max_wavelength=100.0,
                                 rope_interleaved=True, rope_scaling_factor=2.0),
    "window": dict(num_key_value_heads=2, sliding_window=3, rope_max_wavelength=1e4),
    "qk_norm": dict(qk_norm="rms", rope_max_wavelength=1e4),
}
# Prefill 3 tokens, decode 2 one at a time, then 3 at once (sums to T). One
# schedule everywhere keeps the shapes few (JAX compiles each new shape).
SCHEDULE = (3, 1, 1, 3)


def _mha(seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed)
    return layer


def _decode(layer, x, schedule, cache, masks=None):
    """Run `schedule` over `x` with a cache; yields `(start, stop, output)` per step.

    `masks(start, stop)`, if given, returns the step's extra call arguments.
    """
    start = 0
    for length in schedule:
        stop = start + length
        extra = masks(start, stop) if masks else {}
        output, cache = layer(x[:, start:stop], cache=cache, cache_update_index=start,
                              use_causal_mask=True, **extra)
        assert tuple(cache.shape) == (B, 2, S_MAX, layer.num_key_value_heads, D_HEAD)
        yield start, stop, output
        start = stop


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_decoding_equals_uncached_forward(name):
    options = OPTIONS[name]
    x = randn(rng(1), B, T, D)
    layer = _mha(seed=2, **options)
    full = layer(x, use_causal_mask=True)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, is_causal=True, **options)
    assert_close(full, expected, what=f"{name} uncached")
    cache = keras_attn.empty_cache(layer, B, S_MAX)
    for start, stop, output in _decode(layer, x, SCHEDULE, cache):
        assert_close(output, to_numpy(full)[:, start:stop], what=f"{name} rows {start}:{stop}",
                     against=UNCACHED)


@pytest.mark.parametrize("kind", ["key_mask", "attention_mask"])
def test_padding_in_the_prompt(kind):
    """Left padding (row 1 starts at 2) as a key mask over the cache slots, or a full mask."""
    g = rng(3)
    x = randn(g, B, T, D)
    layer = _mha(seed=4, num_key_value_heads=2, rope_max_wavelength=100.0)
    real = np.arange(S_MAX)[None, :] >= np.array([[0], [2]])  # (B, S_max)
    if kind == "key_mask":
        full = layer(x, key_mask=real[:, :T], use_causal_mask=True)

        def masks(start, stop):
            return {"key_mask": real}
    else:
        allowed = (g.random((B, T, S_MAX)) > 0.3) & real[:, None, :]  # (B, T, S_max)
        full = layer(x, attention_mask=allowed[:, :, :T], use_causal_mask=True)

        def masks(start, stop):
            return {"attention_mask": allowed[:, start:stop]}
    cache = keras_attn.empty_cache(layer, B, S_MAX)
    for start, stop, output in _decode(layer, x, SCHEDULE, cache, masks=masks):
        assert_close(output, to_numpy(full)[:, start:stop], what=f"{kind} {start}:{stop}", against=UNCACHED)


def test_unwritten_slots_are_never_attended():
    """NaN in every slot not yet written changes nothing, causal or not."""
    x = randn(rng(5), B, T, D)
    layer = _mha(seed=6, sliding_window=4)
    nan_cache = keras.ops.full((B, 2, S_MAX, H, D_HEAD), float("nan"))
    for causal in (True, False):
        # Without the causal mask the 6 queries seen so far attend one another.
        expected = to_numpy(layer(x if causal else x[:, :6], use_causal_mask=causal))[:, 3:6]
        for cache in (layer.empty_cache(B, S_MAX), nan_cache):
            _, cache = layer(x[:, :3], cache=cache, cache_update_index=0,
                             use_causal_mask=causal)
            # slots 6.. still hold zeros or NaN
            out, _ = layer(x[:, 3:6], cache=cache, cache_update_index=3, use_causal_mask=causal)
            assert np.isfinite(to_numpy(out)).all()
            assert_close(out, expected, what=f"causal={causal}", against=UNCACHED)


@pytest.mark.parametrize("implementation", ["fused", "explicit", "blockwise"])
def test_cached_path_is_observed_on_every_implementation(implementation):
    x = randn(rng(7), B, T, D)
    layer = _mha(seed=8, num_key_value_heads=2, implementation=implementation)
    full = to_numpy(layer(x, use_causal_mask=True))
    with observe_paths() as taken:
        _, cache = layer(x[:, :3], cache=layer.empty_cache(B, S_MAX), cache_update_index=0,
                         use_causal_mask=True)
        out, _ = layer(x[:, 3:4], cache=cache, cache_update_index=3, use_causal_mask=True)
    # PyTorch's fused path reads the grouped key/value heads without repeating them.
    torch_fused = implementation == "fused" and keras.backend.backend() == "torch"
    assert taken == {"cached": 2, implementation: 2, **({"grouped": 2} if torch_fused else {})}
    assert_close(out, full[:, 3:4], what=implementation, against=UNCACHED)


def test_auto_decodes_on_the_explicit_path_on_cpus():
    """`auto` over a cache with few queries: explicit on a CPU (the decode-step rule)."""
    x = randn(rng(7), B, T, D)
    layer = _mha(seed=8, num_key_value_heads=2, implementation="auto")
    full = to_numpy(layer(x, use_causal_mask=True))
    _, cache = layer(x[:, :3], cache=layer.empty_cache(B, S_MAX), cache_update_index=0,
                     use_causal_mask=True)
    with observe_paths() as taken:
        out, _ = layer(x[:, 3:4], cache=cache, cache_update_index=3, use_causal_mask=True)
    cpu = device_kind(keras.ops.convert_to_tensor(x)) == "cpu"
    assert taken == {"cached": 1, "explicit" if cpu else "fused": 1}
    assert_close(out, full[:, 3:4], what="auto", against=UNCACHED)


def test_scores_with_a_cache():
    x = randn(rng(9), B, T, D)
    layer = _mha(seed=10)
    _, cache = layer(x[:, :3], cache=layer.empty_cache(B, S_MAX), cache_update_index=0,
                     use_causal_mask=True)
    out, scores, cache = layer(x[:, 3:6], cache=cache, cache_update_index=3,
                               use_causal_mask=True, return_attention_scores=True)
    _, full_scores = layer(x, use_causal_mask=True, return_attention_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (B, H, 3, S_MAX)
    assert_close(scores[..., :T], to_numpy(full_scores)[:, :, 3:6], against=UNCACHED)
    assert not scores[..., 6:].any(), "unwritten slots got weight"


def test_read_only_cross_cache_equals_attending_the_memory():
    g = rng(11)
    x, memory = randn(g, B, T, D), randn(g, B, 5, D)
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, num_key_value_heads=2)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=12)
    real = np.arange(5)[None, :] < np.array([[5], [3]])  # (B, S) memory padding
    full = to_numpy(layer(x, memory, key_mask=real))
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, memory, num_heads=H, mask=real[:, None, :],
        num_key_value_heads=2)
    assert_close(full, expected)
    # Fill the cache from the memory once (T = 8 queries, S_new = 5 keys) ...
    out, cache = layer(x, memory, key_mask=real, cache=layer.empty_cache(B, 5),
                       cache_update_index=0)
    assert_close(out, full, against=UNCACHED)
    # ... then read it without the memory.
    for i in range(2):
        out, same = layer(x[:, i:i + 1], key_mask=real, cache=cache)
        assert same is cache
        assert_close(out, full[:, i:i + 1], what=f"row {i}", against=UNCACHED)


def test_decode_step_compiles_once():
    """One traced step serves every `cache_update_index` (a tensor, not a Python int)."""
    x = randn(rng(13), B, T, D)
    layer = _mha(seed=14, rope_max_wavelength=100.0, sliding_window=3)
    full = to_numpy(layer(x, use_causal_mask=True))
    _, cache = layer(x[:, :3], cache=layer.empty_cache(B, S_MAX), cache_update_index=0,
                     use_causal_mask=True)
    traces = []

    def step(token, cache, index):
        traces.append(1)  # runs once per trace under a compiler, once per call otherwise
        return layer(token, cache=cache, cache_update_index=index, use_causal_mask=True)

    if BACKEND == "jax":
        import jax

        step_fn = jax.jit(step)
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        step_fn = tf.function(step, jit_compile=True)
    else:  # eager backends: the index is still a tensor, and no Python branch reads it
        step_fn = step
    for i in range(3, T):
        index = keras.ops.convert_to_tensor(i, dtype="int32")
        out, cache = step_fn(keras.ops.convert_to_tensor(x[:, i:i + 1]), cache, index)
        assert_close(out, full[:, i:i + 1], what=f"step {i}", against=UNCACHED)
    assert len(traces) == (1 if BACKEND in ("jax", "tensorflow") else T - 3)


def test_bad_cache_and_index_raise_before_computing():
    x = randn(rng(15), B, 3, D)
    layer = _mha(num_key_value_heads=2)
    good = layer.empty_cache(B, S_MAX)
    cases = [
        (dict(cache=keras.ops.zeros((B, 2, S_MAX, H, D_HEAD))),
         r"`cache` must have shape.*Received: cache.shape=\(2, 2, 10, 4, 4\)"),
        (dict(cache=keras.ops.zeros((B, S_MAX, 2, D_HEAD))),
         r"Received: cache.shape=\(2, 10, 2, 4\)"),
        (dict(cache=keras.ops.zeros((B, 2, S_MAX, 2, D_HEAD), dtype="int32")),
         r"floating.*Received: cache.dtype=int32"),
        (dict(cache=good, cache_update_index=8),
         r"must be in \[0, S_max - S_new\].*Received: cache_update_index=8"),
        (dict(cache=good, cache_update_index=-1), r"Received: cache_update_index=-1"),
        (dict(cache=good, cache_update_index=1.0), r"Received: cache_update_index=1.0"),
        (dict(cache=good, cache_update_index=keras.ops.convert_to_tensor([1, 2])),
         r"scalar integer tensor. Received: cache_update_index with shape=\(2,\)"),
        (dict(cache=layer.empty_cache(B, 2), cache_update_index=0),
         r"do not fit.*Received: S_new=3, cache.shape=\(2, 2, 2, 2, 4\)"),
        (dict(cache=good, key_mask=np.ones((B, 3), bool), cache_update_index=0),
         r"`key_mask` is over the cache's S_max=10 slots.*Received: key_mask.shape=\(2, 3\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            layer(x, **kwargs)
    different = keras_attn.MultiHeadAttention(H, D_HEAD, value_dim=6)
    with pytest.raises(ValueError, match=r"`value_dim` must equal `key_dim`.*value_dim=6"):
        different(x, cache=keras.ops.zeros((B, 2, S_MAX, H, D_HEAD)), cache_update_index=0)
    with pytest.raises(ValueError, match=r"Received: max_length=0"):
        keras_attn.empty_cache(layer, B, 0)


# ----------------------------------------------------------------------------
# TransformerDecoderLayer


LLAMA = dict(num_key_value_heads=2, rope_max_wavelength=1e4, normalization="rms",
             normalize_first=True, use_bias=False, gated_feed_forward=True, activation="silu",
             sliding_window=4)


def test_decoder_only_layer_decodes_like_the_uncached_forward():
    x = randn(rng(16), B, T, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, key_dim=D_HEAD, **LLAMA)
    layer.build(x.shape)
    randomize_weights(layer, seed=17)
    real = np.arange(S_MAX)[None, :] >= np.array([[0], [1]])  # row 1 left-padded
    full = to_numpy(layer(x, padding_mask=real[:, :T]))
    expected = reference.decoder_layer(
        reference_params(layer), x, num_heads=H, padding_mask=real[:, :T],
        normalize_first=True, epsilon=layer.layer_norm_epsilon, activation_name="silu",
        attention_options=dict(num_key_value_heads=2, rope_max_wavelength=1e4,
                               sliding_window=4))
    assert_close(full, expected)
    cache, start = keras_attn.empty_cache(layer, B, S_MAX), 0
    assert tuple(cache.shape) == (B, 2, S_MAX, 2, D_HEAD)
    for length in SCHEDULE:
        out, cache = layer(x[:, start:start + length], padding_mask=real,
                           self_attention_cache=cache,
                           self_attention_cache_update_index=start)
        assert_close(out, full[:, start:start + length], what=f"from {start}", against=UNCACHED)
        start += length


def test_encoder_decoder_layer_with_a_cross_cache():
    g = rng(18)
    x, memory = randn(g, B, T, D), randn(g, B, 5, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, normalize_first=True)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=19)
    memory_real = np.arange(5)[None, :] < np.array([[5], [3]])
    full = to_numpy(layer(x, memory, memory_padding_mask=memory_real))
    self_cache = keras_attn.empty_cache(layer, B, S_MAX)
    cross_cache = layer.cross_attention.empty_cache(B, 5)
    # Prefill: fill the self cache with 3 tokens and the cross cache from the memory.
    out, self_cache, cross_cache = layer(
        x[:, :3], memory, memory_padding_mask=memory_real, self_attention_cache=self_cache,
        self_attention_cache_update_index=0, cross_attention_cache=cross_cache,
        cross_attention_cache_update_index=0)
    assert_close(out, full[:, :3], what="prefill", against=UNCACHED)
    for i in (3, 4):  # no memory: the cross cache is read-only
        out, self_cache, same = layer(
            x[:, i:i + 1], memory_padding_mask=memory_real, self_attention_cache=self_cache,
            self_attention_cache_update_index=i, cross_attention_cache=cross_cache)
        assert same is cross_cache
        assert_close(out, full[:, i:i + 1], what=f"step {i}", against=UNCACHED)
    # Only a self cache: cross-attention reads the memory at every step.
    out, _ = layer(x[:, 5:8], memory, memory_padding_mask=memory_real,
                   self_attention_cache=self_cache, self_attention_cache_update_index=5)
    assert_close(out, full[:, 5:8], what="self cache only", against=UNCACHED)
    with pytest.raises(ValueError, match=r"pass both, or neither"):
        layer(x[:, :1], memory, cross_attention_cache=cross_cache)
    with pytest.raises(ValueError, match=r"Received: memory=None"):
        layer(x[:, :1], self_attention_cache=self_cache, self_attention_cache_update_index=0)


def test_decoding_under_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    x = randn(rng(20), B, T, D)
    options = dict(num_key_value_heads=2, rope_max_wavelength=100.0, qk_norm="rms")
    # Small weights keep the logits O(1) (bfloat16 keeps 8 bits; see test_modern_layers).
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=21, scale=0.2)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, is_causal=True,
        qk_norm_epsilon=layer.qk_norm_epsilon, **options)
    cache = keras_attn.empty_cache(layer, B, S_MAX)
    assert keras.backend.standardize_dtype(cache.dtype) == "bfloat16"
    for start, stop, output in _decode(layer, x, SCHEDULE, cache):
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        assert_close(keras.ops.cast(output, "float32"), expected[:, start:stop],
                     dtype="bfloat16", what=f"rows {start}:{stop}")
