"""The contract of `keras_attn.generation.generate`'s `next_token_fn`, checked: what it
returns (`_check_returned`: logits `(B, T, V)` floating, the cache with the structure, shapes
and dtypes it was given) and the capacity of the caches a decoding step writes
(`check_capacity`). Checked on the prefill and the first decoding step, at trace time
inside a compiled loop; a violation is a `ValueError` that states it."""

import keras
from keras import ops

from keras_attn._shapes import static_shape
from keras_attn._validation import dtype_of
from keras_attn.cache import KVCache, cache_length, cache_shape

__all__ = ["check_capacity"]


def check_capacity(given, returned, max_length):
    """Every cache that a decoding step writes must hold positions 0 .. L - 2.

    The one capacity check of a generation, on the first decoding step (at
    trace time inside a compiled loop): the last token is chosen, never fed,
    so a cache needs L - 1 slots. A cache is a `keras_attn.KVCache` or
    keras-hub's `(B, 2, S_max, H_kv, d)` tensor; one that the step hands back
    untouched (the same tensors: a read-only cross-attention cache, filled
    whole from its memory) is not a growing cache and is not checked.
    """
    def walk(before, after, path):
        if isinstance(before, KVCache) or _is_array(before):
            if _untouched(before, after):
                return
            shape = cache_shape(before)
            if isinstance(before, KVCache) or len(shape) == 5 and shape[1] == 2:
                slots = cache_length(before)
                if slots is not None and slots < max_length - 1:
                    raise ValueError(
                        f"`generate(max_length={max_length})` writes cache positions 0 to "
                        f"{max_length - 2}: its caches need S_max >= max_length - 1 = "
                        f"{max_length - 1} slots, but `cache{path}` (written by each "
                        f"decoding step) has S_max={slots} slots. Make them with "
                        "`keras_attn.empty_cache(layer, B, max_length)`. Received: "
                        f"max_length={max_length}, S_max={slots}")
        elif isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
            for i, (b, a) in enumerate(zip(before, after)):
                walk(b, a, f"{path}[{i}]")
        elif isinstance(before, dict) and isinstance(after, dict):
            for key in before:
                if key in after:
                    walk(before[key], after[key], f"{path}[{key!r}]")

    walk(given, returned, "")


def _untouched(before, after):
    """`after` is `before` handed back: the same tensor, or a `KVCache` of the same tensors
    (Keras rebuilds a named tuple argument, with the same leaves), or not a cache at all."""
    if isinstance(before, KVCache) and isinstance(after, KVCache):
        return len(before) == len(after) and all(a is b for a, b in zip(after, before))
    return after is before or not (isinstance(after, KVCache) or _is_array(after))


def _check_returned(result, given, batch, length, vocabulary, prefill):
    """`result` is `(logits (B, T, V) floating, cache like given)`; returns it as a pair.

    Python-level and static shapes only, so that it runs at trace time too.
    `length` is T; `vocabulary` V, or None where not yet known; `prefill` says
    which call this is.
    """
    call = "the prefill" if prefill else "a decoding step"
    expected = f"({batch}, {length}, {'V' if vocabulary is None else vocabulary})"
    also = "" if length == 1 else f" (or ({batch}, 1, V))"

    def fail(received):
        raise ValueError(
            f"`next_token_fn` must return `(logits, cache)`: logits (B, T, V) = {expected}"
            f"{also} floating, and the cache with the structure, shapes and dtypes it was "
            f"given (checked on {call}, T = {length}). Received: {received}")

    if not isinstance(result, (tuple, list)) or len(result) != 2:
        fail(f"{_summary(result)}, not a pair `(logits, cache)`")
    logits, cache = result
    if not _is_array(logits):
        fail(f"logits={_summary(logits)}")
    shape = static_shape(logits)
    if len(shape) != 3 or shape[0] not in (None, batch) or shape[1] not in (None, length, 1) \
            or (vocabulary is not None and shape[2] not in (None, vocabulary)):
        fail(f"logits.shape={shape}")
    if "float" not in dtype_of(logits):
        fail(f"logits.dtype={dtype_of(logits)}")
    try:
        keras.tree.assert_same_structure(given, cache)
    except (ValueError, TypeError):
        fail(f"a cache of structure {_shapes(cache)} for {_shapes(given)}")
    for (path, before), after in zip(keras.tree.flatten_with_path(given),
                                     keras.tree.flatten(cache)):
        name = "cache" + "".join(f"[{key!r}]" for key in path)
        if not _is_array(before):
            continue  # nothing to compare with (a None or a Python value was given)
        if not _is_array(after):
            fail(f"{name}={_summary(after)} for a tensor of shape {static_shape(before)}")
        old, new = static_shape(before), static_shape(after)
        if len(old) != len(new) or any(a is not None and b is not None and a != b
                                       for a, b in zip(old, new)):
            fail(f"{name}.shape={new} for {old}")
        # On the prefill, a NumPy array given to a backend other than NumPy may come
        # back as that backend's tensor of another dtype (JAX makes float64 float32);
        # the loop needs exact dtypes, which the first step's check compares.
        if (not prefill or ops.is_tensor(before)) \
                and dtype_of(before) != dtype_of(after):
            fail(f"{name}.dtype={dtype_of(after)} for {dtype_of(before)}")
    return logits, cache


def _is_array(x):
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _summary(x):
    """A short description: type, and shape and dtype for tensors."""
    if _is_array(x):
        return f"{type(x).__name__} of shape {static_shape(x)} and dtype {dtype_of(x)}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of length {len(x)}"
    return repr(x) if x is None else type(x).__name__


def _shapes(structure):
    """`structure` with each tensor replaced by its static shape, for messages."""
    return keras.tree.map_structure(
        lambda x: static_shape(x) if _is_array(x) else x, structure)
