"""Scaled dot-product attention and its masks, written against `keras.ops`.

Notation used throughout the package:
    B  batch size
    H  number of attention heads
    T  query length (target)
    S  key/value length (source)
    d_k  width of a query/key per head
    d_v  width of a value per head

Masks are boolean and follow the Keras convention: True = may attend.
"""

import math

import keras
from keras import ops

from keras_attn._validation import check_broadcastable, check_dropout, static_shape

__all__ = [
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "scaled_dot_product_attention",
]


def causal_mask(query_length, key_length):
    """Boolean causal mask, aligned to the bottom-right corner.

    Query `i` may attend key `j` iff `j <= i + (S - T)`. With `T == S` this is
    the usual lower-triangular mask; with `T < S` the `T` queries are the
    last `T` positions of a sequence of `S` keys (new tokens over a cache).

    Args:
        query_length: `T`, an int (or a scalar tensor).
        key_length: `S`, an int (or a scalar tensor).

    Returns:
        A bool tensor of shape `(T, S)`.
    """
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32"), 1)  # (T, 1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)  # (1, S)
    offset = ops.cast(key_length, "int32") - ops.cast(query_length, "int32")
    return ops.less_equal(cols, rows + offset)  # (T, S)


def padding_mask(lengths, max_length):
    """Boolean key padding mask from sequence lengths.

    Args:
        lengths: int tensor of shape `(B,)`, the number of real tokens of
            each sequence.
        max_length: `S`, the padded length.

    Returns:
        A bool tensor of shape `(B, S)`, True on the first `lengths[b]`
        positions of row `b`.
    """
    lengths = ops.convert_to_tensor(lengths)
    if len(lengths.shape) != 1:
        raise ValueError(
            "`lengths` must have shape (B,). "
            f"Received: lengths.shape={tuple(lengths.shape)}"
        )
    positions = ops.expand_dims(ops.arange(max_length, dtype="int32"), 0)  # (1, S)
    return ops.less(positions, ops.expand_dims(ops.cast(lengths, "int32"), 1))


def combine_masks(*masks):
    """Logical AND of boolean masks, with broadcasting; `None`s are ignored.

    Returns:
        The combined bool mask, or `None` if every mask is `None`.
    """
    combined = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        combined = mask if combined is None else ops.logical_and(combined, mask)
    return combined


def _softmax_dtype(dtype):
    """Softmax runs in float32 at least: half precision overflows in exp."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


def _validate(query, key, value, mask, bias, dropout_rate):
    """Check ranks, widths, lengths and mask shapes before computing."""
    shapes = {n: static_shape(x) for n, x in (("query", query), ("key", key), ("value", value))}
    for name, shape in shapes.items():
        if len(shape) < 2:
            raise ValueError(
                f"`{name}` must have rank >= 2, with shape (..., length, dim). "
                f"Received: {name}.shape={shape}"
            )
    q, k, v = shapes["query"], shapes["key"], shapes["value"]
    if None not in (q[-1], k[-1]) and q[-1] != k[-1]:
        raise ValueError(
            "`query` and `key` must have the same last dimension d_k. "
            f"Received: query.shape={q}, key.shape={k}"
        )
    if None not in (k[-2], v[-2]) and k[-2] != v[-2]:
        raise ValueError(
            "`key` and `value` must have the same length S. "
            f"Received: key.shape={k}, value.shape={v}"
        )
    check_dropout("dropout_rate", dropout_rate)
    # Leading dims of the scores: the broadcast of query's and key's.
    lead_q, lead_k = q[:-2], k[:-2]
    width = max(len(lead_q), len(lead_k))
    lead_q = (1,) * (width - len(lead_q)) + lead_q
    lead_k = (1,) * (width - len(lead_k)) + lead_k
    lead = tuple(b if a in (1, None) else a for a, b in zip(lead_q, lead_k, strict=False))
    target = lead + (q[-2], k[-2])
    for name, tensor in (("mask", mask), ("bias", bias)):
        if tensor is not None:
            check_broadcastable(name, tensor, target, "(..., T, S)")


def _masked_softmax(logits, allowed):
    """Softmax over the last axis restricted to `allowed` keys.

    A row with no allowed key (all masked, or all -inf bias) gets all-zero
    weights. Disallowed logits become -inf, so they contribute exp(-inf) = 0
    and receive zero gradient; the row maximum is replaced by 0 where it is
    -inf so that no `-inf - -inf = NaN` appears, forward or backward.
    """
    if allowed is not None:
        logits = ops.where(allowed, logits, float("-inf"))
    row_max = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))
    row_max = ops.where(ops.isfinite(row_max), row_max, ops.zeros_like(row_max))
    unnormalized = ops.exp(logits - row_max)
    total = ops.sum(unnormalized, axis=-1, keepdims=True)
    total = ops.where(total > 0, total, ops.ones_like(total))
    return unnormalized / total


def scaled_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    bias=None,
    is_causal=False,
    scale=None,
    dropout_rate=0.0,
    seed=None,
    training=False,
    return_attention_scores=False,
):
    """Scaled dot-product attention, `softmax(q k^T * scale + bias) v`.

    Paper Eq. 1 of "Attention Is All You Need", over any leading dims.

    Args:
        query: tensor of shape `(..., T, d_k)`.
        key: tensor of shape `(..., S, d_k)`.
        value: tensor of shape `(..., S, d_v)`.
        mask: optional boolean tensor broadcastable to `(..., T, S)`;
            True = the query may attend the key.
        bias: optional additive float tensor broadcastable to `(..., T, S)`,
            added to the logits before the softmax (-inf forbids a key).
        is_causal: if True, query `i` may only attend key `j <= i + (S - T)`
            (see `causal_mask`).
        scale: multiplier of the logits; defaults to `1 / sqrt(d_k)`.
        dropout_rate: dropout rate on the attention weights, applied only
            when `training` is True.
        seed: int or `keras.random.SeedGenerator` driving the dropout.
        training: whether dropout is active.
        return_attention_scores: also return the attention weights.

    Returns:
        The output `(..., T, d_v)` in the dtype of `value`, and, with
        `return_attention_scores=True`, the weights `(..., T, S)` (before
        dropout). A query with no allowed key gets zero weights and a zero
        output row, never NaN.
    """
    _validate(query, key, value, mask, bias, dropout_rate)
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    if scale is None:
        scale = 1.0 / math.sqrt(static_shape(query)[-1])

    softmax_dtype = _softmax_dtype(query.dtype)
    q = ops.cast(query, softmax_dtype)
    k = ops.cast(key, softmax_dtype)
    logits = ops.matmul(q, ops.swapaxes(k, -1, -2)) * scale  # (..., T, S)
    if bias is not None:
        logits = logits + ops.cast(bias, softmax_dtype)

    allowed = mask
    if is_causal:
        T, S = ops.shape(query)[-2], ops.shape(key)[-2]
        allowed = combine_masks(allowed, causal_mask(T, S))
    elif allowed is not None:
        allowed = ops.cast(allowed, "bool")
    weights = _masked_softmax(logits, allowed)  # (..., T, S)
    weights = ops.cast(weights, value.dtype)

    attended = weights
    if training and dropout_rate > 0.0:
        attended = keras.random.dropout(weights, dropout_rate, seed=seed)
    output = ops.matmul(attended, value)  # (..., T, d_v)
    if return_attention_scores:
        return output, weights
    return output
