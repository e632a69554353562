"""What the three paths share: grouped heads, keys no query sees, empty sequences.

Dimension letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv,
T query length, S key length, d head width.
"""

from keras import ops

from keras_attn._shapes import static_shape, to_rank

__all__ = ["empty_attention", "group_size", "zero_unattended_keys"]


def group_size(query, key):
    """G = H / H_kv when `key` has fewer heads (axis -3) than `query`, else 1."""
    q, k = static_shape(query), static_shape(key)
    # One key/value head (multi-query, or a key broadcast over the heads) is a group of H.
    if len(q) < 3 or len(k) < 3 or None in (q[-3], k[-3]) or not 1 <= k[-3] < q[-3]:
        return 1
    return q[-3] // k[-3]


def zero_unattended_keys(key, value, allowed, key_axis, group=1):
    """Zero the keys and values that no query may attend.

    `allowed` broadcasts to the scores `(..., T, S)`. A masked-out key gets
    weight exactly 0, but `0 * NaN` is NaN in the weights-times-values
    product: zeroing the key and value of a position that no query may see
    (padding) keeps NaN or inf stored there out of every output and gradient.

    Args:
        key, value: `(..., S, d)` (`key_axis=-2`) or `(B, S, H, d)` (`key_axis=1`).
        allowed: bool, broadcastable to `(..., T, S)` or `(B, H, T, S)`.
        key_axis: where S sits in `key`/`value`.
        group: G query heads per key/value head: a key is live when a query
            of any head of its group may attend it. Zeroing before the heads
            are repeated touches H_kv heads, not H.
    """
    if allowed is None:
        return key, value
    live = ops.any(to_rank(allowed, 2), axis=-2)  # (..., S): attended by some query
    if group > 1 and len(live.shape) >= 2 and live.shape[-2] not in (1, None):
        heads, S = live.shape[-2:]
        grouped = tuple(ops.shape(live)[:-2]) + (heads // group, group, S)
        live = ops.any(ops.reshape(live, grouped), axis=-2)  # (..., H_kv, S)
    if key_axis == -2:
        live = ops.expand_dims(live, -1)  # (..., S, 1)
    else:  # (B|1, H|1, S) -> (B|1, S, H|1, 1)
        live = ops.expand_dims(ops.swapaxes(to_rank(live, 3), 1, 2), -1)
    # A scalar zero broadcasts: no full-size zeros tensor per call (PyTorch
    # eager fills one for each otherwise, a cache-sized write per decode step).
    return (ops.where(live, key, ops.zeros((), key.dtype)),
            ops.where(live, value, ops.zeros((), value.dtype)))


def empty_attention(query, key, value, return_attention_scores=False):
    """T == 0 or S == 0: an empty output, or zero rows (no key to attend).

    Written as products so that the result stays connected to the inputs and
    every gradient is a (zero) tensor of the right shape, on every backend.
    """
    weights = ops.matmul(query, ops.swapaxes(key, -1, -2)) * 0  # (..., T, S), empty
    output = ops.matmul(ops.cast(weights, value.dtype), value)  # (..., T, d_v), zeros
    if return_attention_scores:
        return output, ops.cast(weights, value.dtype)
    return output


def transform_logits(logits, spec):
    """`(logits, d_logits)`: `spec`'s elementwise transforms of the logits `q . k * scale`.

    `spec.LOGIT_TRANSFORMS` in order: a soft-cap c gives `c * tanh(logits / c)`
    (Gemma 2). `d_logits` is the derivative of the result by the input (None when
    nothing is applied), what the blockwise backward pass multiplies by; the
    explicit path lets autodiff differentiate the same ops.
    """
    derivative = None
    if spec.logit_soft_cap is not None:
        t = ops.tanh(logits / spec.logit_soft_cap)
        logits, derivative = spec.logit_soft_cap * t, 1.0 - t * t
    return logits, derivative
