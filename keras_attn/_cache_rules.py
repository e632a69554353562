"""The rules of a call over a key/value cache: checks, positions, the positional mask.

What a cache holds is known from its shape alone, so the rules are checked
where the shapes are: a read-only cache must have been filled whole, an index
whose value is known is range-checked, a traced one out of range turns the
step's output NaN (`index_in_range`, `poison`). `keras_attn.cache.KVCache.update`
applies them in one call; the functions stay public in `keras_attn.cache`
(the protocol that `MultiHeadAttention` ran before the object).

Positions are absolute (see DESIGN.md): with `cache_update_index = u` and
`S_new` new keys, the written slots are `j < u + S_new`, and query i of T sits
at `u + S_new - T + i` (bottom-right aligned over the written slots; for
self-attention S_new = T, so query i is at `u + i`). Slots not yet written
are never attended. Without an update index (a read-only cache, such as
cross-attention over a precomputed memory) every slot counts as written, and
query i sits at `S_max - T + i`.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._masks import combine_masks, positional_mask
from keras_attn._policy import record_path
from keras_attn._shapes import static_shape
from keras_attn._validation import concrete_value, dtype_of

__all__ = [
    "cached_positional_mask",
    "check_cache",
    "check_cache_call",
    "check_cache_masks",
    "check_cache_update_index",
    "check_index_has_cache",
    "fold_positions",
    "index_in_range",
    "poison",
    "positions",
    "read",
    "slice_update",
    "write",
]


def check_cache(cache, batch_size, kv_heads, head_dim):
    """`cache` is a floating `(B, 2, S_max, H_kv, d)` tensor; returns its static shape."""
    shape = static_shape(cache)
    layout = f"(B, 2, S_max, H_kv, d) = ({batch_size}, 2, S_max, {kv_heads}, {head_dim})"
    expected = (batch_size, 2, None, kv_heads, head_dim)
    if len(shape) != 5 or shape[2] is None or any(
            e is not None and s is not None and s != e for s, e in zip(shape, expected)):
        raise ValueError(
            f"`cache` must have shape {layout} with a static S_max (keys then values on "
            f"axis 1; see `keras_attn.empty_cache`). Received: cache.shape={shape}")
    dtype = dtype_of(cache)
    if "float" not in dtype:
        raise ValueError(
            f"`cache` must be a floating tensor (see `keras_attn.empty_cache`). "
            f"Received: cache.dtype={dtype}")
    return shape


def check_cache_update_index(cache_update_index, new_length, max_length):
    """A position with room for `new_length` keys: an int, or a scalar int32 tensor if traced.

    Every index whose value is known now is range-checked, whatever carries
    it: a Python or NumPy integer, a 0-d NumPy array, or an eager tensor of
    any backend (read with `keras.ops.convert_to_numpy`; Keras turns NumPy
    values into tensors, so "a tensor" does not mean "traced"). Only an index
    traced by a compiler (`jax.jit`, `tf.function`) has no value yet: it is
    returned as an int32 tensor, and the caller guards the write with
    `index_in_range` so that an out-of-range index gives NaN, never a
    silently clamped write.

    Returns:
        A Python int (the value was known) or a scalar int32 tensor (traced).
    """
    index = cache_update_index
    if isinstance(index, (bool, np.bool_)) or index is None:
        raise ValueError(
            "`cache_update_index` must be an int or a scalar integer tensor. "
            f"Received: cache_update_index={index!r}")
    if not isinstance(index, numbers.Integral):
        if not (hasattr(index, "shape") and hasattr(index, "dtype")):
            raise ValueError(
                "`cache_update_index` must be an int or a scalar integer tensor. "
                f"Received: cache_update_index={index!r}")
        dtype = keras.backend.standardize_dtype(index.dtype)
        if len(index.shape) != 0 or "int" not in dtype:
            raise ValueError(
                "`cache_update_index` must be an int or a scalar integer tensor. "
                f"Received: cache_update_index with shape={tuple(index.shape)}, dtype={dtype}")
        value = concrete_value(index)
        if value is None:
            return index if dtype == "int32" else ops.cast(index, "int32")
        index = value
    index = int(index)
    if index < 0 or (new_length is not None and index + new_length > max_length):
        raise ValueError(
            f"`cache_update_index` must be in [0, S_max - S_new] = "
            f"[0, {max_length} - {new_length}]: the {new_length} new keys must fit in "
            f"the cache. Received: cache_update_index={index}")
    return index


def index_in_range(index, new_length, max_length):
    """Bool scalar tensor: a traced `index` leaves room for `new_length` keys.

    `ops.slice_update` clamps an out-of-range start (XLA's
    `dynamic_update_slice`), which would write the keys at the wrong slots
    while RoPE and the masks use the true position: the layer turns its
    output and the written keys into NaN instead (`poison`).
    """
    return ops.logical_and(ops.greater_equal(index, 0),
                           ops.less_equal(index, max_length - new_length))


def poison(x, ok):
    """`x` where `ok` (a bool scalar tensor), NaN elsewhere."""
    return ops.where(ok, x, ops.cast(float("nan"), x.dtype))


def check_index_has_cache(cache, cache_update_index):
    """An index says where to write into a cache: without one it is an error."""
    if cache is None and cache_update_index is not None:
        raise ValueError(
            "`cache_update_index` is where new keys are written into `cache`; without "
            "a cache it has no meaning. Pass `cache=` (see `keras_attn.empty_cache`) "
            f"or drop the index. Received: cache=None, "
            f"cache_update_index={cache_update_index!r}")


def check_cache_call(cache, batch_size, kv_heads, key_dim, value_dim, key_shape, *,
                     cache_update_index, layer_name):
    """Everything about a call with a cache, before any computation.

    Args:
        cache: the `cache` argument, `(B, 2, S_max, H_kv, d)`.
        batch_size, kv_heads, key_dim, value_dim: the layer's B, H_kv, d_k, d_v.
        key_shape: the static shape of the keys to write, `(B, S_new, k_dim)`
            (unused for a read-only call).
        cache_update_index: the index, or None for a read-only call.
        layer_name: unused (the capacity of a generation is `generate`'s check now);
            kept so that existing callers keep working.

    Returns:
        `(S_max, index)`: the index as `check_cache_update_index` returns it
        (None for a read-only call).
    """
    if value_dim != key_dim:
        raise ValueError(
            "A key/value cache stores keys and values in one tensor "
            "(B, 2, S_max, H_kv, d): `value_dim` must equal `key_dim`. "
            f"Received: key_dim={key_dim}, value_dim={value_dim}")
    S_max = check_cache(cache, batch_size, kv_heads, key_dim)[2]
    if cache_update_index is None:
        return S_max, None
    new_length = key_shape[1]
    if new_length is not None and new_length > S_max:
        raise ValueError(
            f"The {new_length} new keys (`key`/`value` length, the query's for "
            f"self-attention) do not fit in a cache of length S_max={S_max}. "
            f"Received: key.shape={key_shape}, cache.shape={static_shape(cache)}")
    return S_max, check_cache_update_index(cache_update_index, new_length, S_max)


def check_cache_masks(S_max, **masks):
    """With a cache, every mask's key axis is the S_max slots: never broadcast.

    A `(B, 1)` key mask on a one-token step would otherwise broadcast over
    every slot (a False kills the row, a True drops the prompt's padding).
    `masks` maps each argument's name to its value (None: not given).
    """
    for name, mask in masks.items():
        if mask is None:
            continue
        shape = static_shape(mask)
        if shape and shape[-1] is not None and shape[-1] != S_max:
            raise ValueError(
                f"With a `cache`, `{name}` is over the cache's S_max={S_max} slots: "
                f"its last axis must be S_max (mark the cached positions, not only "
                f"the new ones). Received: {name}.shape={shape}")


def positions(T, new_length, start=0):
    """Absolute positions `(T,)` of the queries and `(S_new,)` of the keys.

    The `S_new` keys sit at `start + j` and the T queries end where they
    end (bottom-right aligned): query i is at `start + S_new - T + i`.
    Without a cache `start` is 0 and S_new = S; a read-only cache is all
    written (`start` 0, S_new = S_max). `start` may be a traced tensor.
    """
    end = start + new_length  # one past the last key's position
    return (ops.arange(T, dtype="int32") + (end - T),
            ops.arange(new_length, dtype="int32") + start)


def fold_positions(mask, T, S_max, cache_update_index, new_length, *, is_causal, window,
                   attention_chunk_size=None):
    """`(mask, in_range)` of a call over a cache: the positional rules folded into `mask`.

    Positions over the cache follow `cache_update_index`, which may be
    traced, so the causal / window / chunk / written-slots mask `(T, S_max)` is built
    explicitly and ANDed into `mask` (`(B|1, H|1, T, S_max)` or None).
    `new_length` is S_new (None: a read-only call). `in_range` is None, or,
    for a traced index, the bool tensor that `index_in_range` gives: a
    traced index cannot be range-checked now, and out of range gives NaN.
    """
    mask = combine_masks(mask, cached_positional_mask(
        T, S_max, cache_update_index, new_length, is_causal, window,
        attention_chunk_size=attention_chunk_size))
    in_range = None
    if new_length is not None and not isinstance(cache_update_index, int):
        in_range = index_in_range(cache_update_index, new_length, S_max)
    return mask, in_range


def write(cache, keys, values, cache_update_index, in_range=None):
    """Write `(B, S_new, H_kv, d)` keys and values at `cache_update_index`.

    `in_range` (a bool scalar tensor, for a traced index) turns what is
    written into NaN when false (see `index_in_range`).

    Returns:
        The new cache `(B, 2, S_max, H_kv, d)`.
    """
    new = _cast(ops.stack([keys, values], axis=1), cache.dtype)  # (B, 2, S_new, H_kv, d)
    if in_range is not None:
        new = poison(new, in_range)
    return slice_update(cache, [0, 0, cache_update_index, 0, 0], new)


def slice_update(x, start, update):
    """`ops.slice_update` that never changes `x`: a cache is a value.

    Keras's NumPy backend writes into `x` in place (the others return a new
    tensor), which changed the caller's cache and hid a write from
    `generate`, which tells a growing cache by the new tensor a step returns.
    """
    if keras.backend.backend() == "numpy":
        x = ops.copy(x)
    return ops.slice_update(x, start, update)


def read(cache, dtype):
    """The keys and values `(B, S_max, H_kv, d)` of `cache`, in `dtype`."""
    return _cast(cache[:, 0], dtype), _cast(cache[:, 1], dtype)


def _cast(x, dtype):
    """`ops.cast`, skipped when `x` already has `dtype` (one op less per decode step)."""
    if keras.backend.standardize_dtype(x.dtype) == keras.backend.standardize_dtype(dtype):
        return x
    return ops.cast(x, dtype)


def cached_positional_mask(T, max_length, start, new_length, is_causal, window, *,
                           attention_chunk_size=None):
    """Bool `(T, S_max)`: which cache slots each query may attend.

    Args:
        T: the query length.
        max_length: S_max.
        start: `cache_update_index` (an int or a scalar int tensor), or None
            for a read-only cache (every slot written).
        new_length: S_new, the keys written at `start` by this call (unused
            when `start` is None).
        is_causal: slot j only if `j <= p`, p the query's absolute position.
        window: W or None: `0 <= p - j < W` (causal) or `|p - j| < W`.
        attention_chunk_size: C or None: `floor(j / C) == floor(p / C)`, at the
            absolute positions (slot j holds position j).

    Built from `arange` comparisons (never Python control flow on `start`),
    so one compiled step serves every `start`. Recorded as the `"cached"`
    path (`keras_attn._policy.observe_paths`), so tests can observe that a
    call took the cached path.
    """
    record_path("cached")
    if start is None:  # every slot written: the queries are the last T positions
        allowed = positional_mask(T, max_length, is_causal, window,
                                  attention_chunk_size=attention_chunk_size)
    else:
        end = start + new_length  # one past the last written slot
        # Self-attention (S_new == T) under the causal mask: `j <= p` already
        # excludes every unwritten slot (the last query sits at end - 1).
        written = None if (is_causal and new_length == T) else end
        allowed = positional_mask(T, end, is_causal, window, slots=max_length, key_end=written,
                                  attention_chunk_size=attention_chunk_size)
    if allowed is None:
        return None
    return ops.broadcast_to(allowed, (T, max_length))
