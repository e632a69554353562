"""Which key a query may see: the one positional rule, and mask combination.

Positions are absolute and causal alignment is bottom-right (DESIGN.md): query
i of T over S keys sits at position `i + (S - T)`; over a key/value cache it
sits at `cache_update_index + S_new - T + i`. Query position p may attend key
j iff

- `j < key_end` when the keys stop early (cache slots not yet written, the
  padding of the blockwise path's last block),
- `j <= p` when causal,
- `p - j < W` (causal) or `|p - j| < W` (not causal) with a sliding window W,
- `floor(j / C) == floor(p / C)` with chunks of C (Llama 4's
  `attention_chunk_size`: block-diagonal attention).

`may_attend` is that rule, written once. Every user calls it: the explicit
and fused kernels and the public helpers through `positional_mask` (`(T, S)`,
bottom-right), the cache (`keras_attn.cache.cached_positional_mask`, over its
S_max slots) and the blockwise kernel (one block at a time, with its offsets).
Masks are bool, True = may attend.
"""

from keras import ops

__all__ = ["and_masks", "combine_masks", "may_attend", "positional_mask", "query_positions"]


def combine_masks(*masks):
    """Logical AND of boolean masks, with broadcasting; `None`s are ignored."""
    combined = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        combined = mask if combined is None else ops.logical_and(combined, mask)
    return combined


def may_attend(query_position, key_position, is_causal=False, sliding_window=None, key_end=None,
               *, attention_chunk_size=None):
    """Bool: the query at absolute position p may attend the key at position j.

    Args:
        query_position: int32 positions p, broadcastable against
            `key_position` (usually `(T, 1)`). Unused (may be None) when
            neither `is_causal` nor `sliding_window` is set.
        key_position: int32 positions j (usually `(1, S)`).
        is_causal: `j <= p`.
        sliding_window: W or None: `p - j < W` (causal; W keys, the query's own
            included) or `|p - j| < W` (not causal).
        key_end: keys at `j >= key_end` are never attended (an int or a
            scalar int tensor), or None.
        attention_chunk_size: C or None: `floor(j / C) == floor(p / C)` (a floor
            division: a negative position, a query before the keys, is in a
            chunk of its own below every key's).

    Returns:
        The broadcast of the two position tensors, or None when nothing
        restricts the keys.
    """
    allowed = None if key_end is None else ops.less(key_position, key_end)
    if attention_chunk_size is not None:
        allowed = and_masks(allowed, ops.equal(
            ops.floor_divide(query_position, attention_chunk_size),
            ops.floor_divide(key_position, attention_chunk_size)))
    if is_causal or sliding_window is not None:
        distance = query_position - key_position
        if is_causal:
            allowed = and_masks(allowed, ops.greater_equal(distance, 0))
        if sliding_window is not None:
            reach = distance if is_causal else ops.abs(distance)
            allowed = and_masks(allowed, ops.less(reach, sliding_window))
    return allowed


def and_masks(a, b):
    """`a and b` of two bool tensors, `b` when `a` is None (no cast: both are bool)."""
    return b if a is None else ops.logical_and(a, b)


def query_positions(T, S):
    """`(T, 1)` int32: the absolute position `i + (S - T)` of each query (bottom-right)."""
    rows = ops.expand_dims(ops.arange(T, dtype="int32"), 1)  # (T, 1)
    # `S - T` stays a (symbolic) scalar: casting a dim to a tensor would
    # specialise it to its traced value under torch.export.
    return rows + (S - T)


def positional_mask(T, S, is_causal=False, sliding_window=None, slots=None, key_end=None, *,
                    attention_chunk_size=None):
    """Bool `(T, slots)` of the queries bottom-right aligned over S keys, or None.

    Args:
        T, S: query and key lengths (ints or scalar tensors): query i sits at
            `i + (S - T)`.
        is_causal, sliding_window, key_end, attention_chunk_size: as in `may_attend`.
        slots: the number of key positions (`0 .. slots - 1`) the mask spans;
            defaults to S. A cache spans its S_max slots while its queries
            are aligned to the last written one.

    Returns:
        None when neither `is_causal`, `sliding_window`, `attention_chunk_size` nor
        `key_end` restricts the keys; else a mask that broadcasts to `(T, slots)`
        (`(T, slots)` itself whenever one of the first three is set).
    """
    keys = ops.expand_dims(ops.arange(S if slots is None else slots, dtype="int32"), 0)  # (1, S)
    by_position = is_causal or sliding_window is not None or attention_chunk_size is not None
    rows = query_positions(T, S) if by_position else None
    return may_attend(rows, keys, is_causal, sliding_window, key_end,
                      attention_chunk_size=attention_chunk_size)
