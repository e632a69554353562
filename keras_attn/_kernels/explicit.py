"""The explicit path: materialised logits and weights, softmax in float32 at least.

The only path that returns the attention weights or applies attention
dropout. Dimension letters: H query heads, H_kv key/value heads, G = H / H_kv,
T query length, S key length, d head width. Masks are bool, True = may attend.
"""

import keras
import numpy as np
from keras import ops

from keras_attn._kernels.common import group_size, transform_logits
from keras_attn._masks import combine_masks, positional_mask
from keras_attn._shapes import softmax_dtype, static_shape

__all__ = ["explicit_attention"]

# Below this many query rows (a decode step), the logits are computed as
# `(k q^T)^T` (measured: see `explicit_attention`). The same 16 as the decode
# rule of the policy (`_policy.DECODE_EXPLICIT_BELOW`), which sends such steps here.
KEY_MAJOR_ROWS = 16


def _masked_softmax(logits, allowed, sinks=None):
    """Softmax over the last axis restricted to `allowed` keys.

    `sinks` (broadcastable to `(..., 1)`): one more logit per row in the
    denominator only (gpt-oss's attention sinks), `exp(s_j) / (exp(sink) +
    sum_k exp(s_k))`. A row with no allowed key (all masked, or all -inf bias)
    gets all-zero weights. Disallowed logits become -inf, so they contribute exp(-inf) = 0
    and receive zero gradient; the row maximum is replaced by 0 where it is
    -inf so that no `-inf - -inf = NaN` appears, forward or backward.
    """
    if allowed is not None:
        logits = ops.where(allowed, logits, float("-inf"))
    # A -inf maximum (no allowed key) becomes a finite floor; finite maxima
    # are above it and unchanged.
    lowest = float(np.finfo(keras.backend.standardize_dtype(logits.dtype)).min)
    row_max = ops.maximum(ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True)), lowest)
    if sinks is not None:
        row_max = ops.maximum(row_max, ops.stop_gradient(sinks))
    unnormalized = ops.exp(logits - row_max)
    # A row with an allowed key sums to >= 1 (its maximum contributes
    # exp(0)), so the floor of 0.5 only turns an empty row's 0 / 0 into
    # 0 / 0.5 = 0: it never ties with a real sum (a tie would split the
    # gradient), and 0.5**2 in the quotient's gradient cannot underflow.
    total = ops.sum(unnormalized, axis=-1, keepdims=True)
    if sinks is not None:  # the row maximum is the sink's or a logit's: total >= 1
        total = total + ops.exp(sinks - row_max)
    return unnormalized / ops.maximum(total, 0.5)


def explicit_attention(query, key, value, mask, bias, spec, *, sinks=None,
                       return_attention_scores=False):
    """Materialised logits and weights `(..., T, S)`; softmax in float32 at least.

    `spec`: the `keras_attn.options.KernelSpec` (causal, scale, window, chunks, soft-cap,
    dropout);
    `sinks`: `(H,)` sink logits (with `spec.sinks`), or None.
    """
    is_causal, scale, sliding_window = spec.is_causal, spec.scale, spec.sliding_window
    compute = softmax_dtype(query.dtype)
    q, k = ops.cast(query, compute), ops.cast(key, compute)
    group, q_shape = group_size(query, key), static_shape(query)
    if group > 1 and None in q_shape:  # the grouped reshapes below need static dims
        key, value = (ops.repeat(x, group, axis=-3) for x in (key, value))
        k, group = ops.cast(key, compute), 1
    if group > 1:
        # Grouped heads without repeating the keys and values: the G query
        # heads of a key/value head are stacked along the rows (head-major).
        *lead, H, T, _ = q_shape
        q = ops.reshape(q, (*lead, H // group, group * T, q_shape[-1]))  # (..., H_kv, G*T, d)
    rows = static_shape(q)[-2]
    if rows is not None and rows < KEY_MAJOR_ROWS:
        # Few query rows (a decode step): `k q^T` reads the keys in their own
        # layout; `q k^T` has the compiler transpose every key (S x d) first,
        # 2-3x slower on XLA's CPU backend at S = 768 (benchmarks/decode.py).
        logits = ops.swapaxes(ops.matmul(k, ops.swapaxes(q, -1, -2)), -1, -2) * scale
    else:
        logits = ops.matmul(q, ops.swapaxes(k, -1, -2)) * scale  # (..., T, S) or (..., H_kv, G*T, S)
    if group > 1:
        logits = ops.reshape(logits, (*lead, H, T, -1))  # (..., H, T, S)
    logits, _ = transform_logits(logits, spec)
    if bias is not None:
        logits = logits + ops.cast(bias, compute)
    allowed = combine_masks(
        mask, positional_mask(ops.shape(query)[-2], ops.shape(key)[-2], is_causal, sliding_window,
                              attention_chunk_size=spec.attention_chunk_size))
    if sinks is not None:
        sinks = ops.reshape(ops.cast(sinks, compute), (-1, 1, 1))  # (H, 1, 1)
    weights = ops.cast(_masked_softmax(logits, allowed, sinks), value.dtype)  # (..., T, S)
    attended = weights
    if spec.drops:
        attended = keras.random.dropout(weights, spec.dropout_rate, seed=spec.seed)
    if group > 1:
        attended = ops.reshape(attended, (*lead, H // group, group * T, -1))  # (..., H_kv, G*T, S)
        output = ops.matmul(attended, value)  # (..., H_kv, G*T, d_v)
        output = ops.reshape(output, (*lead, H, T, static_shape(value)[-1]))  # (..., H, T, d_v)
    else:
        output = ops.matmul(attended, value)  # (..., T, d_v)
    # float64 on PyTorch: Keras 3.15's `ops.matmul` returns float32 there
    # (keras_attn._float64), which the float64 output projection would refuse.
    output = ops.cast(output, value.dtype)
    if return_attention_scores:
        return output, weights
    return output
