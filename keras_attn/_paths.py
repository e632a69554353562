"""The attention implementations (explicit, fused) and the choice between them.

Dimension letters: B batch, H heads, T query length, S key length, d_k and
d_v head widths. Masks are bool, True = may attend; `bias` is additive.

- explicit: materialised logits and weights, softmax in float32 at least;
  the only path that returns the weights or applies attention dropout.
- fused: `keras.ops.dot_product_attention` (PyTorch's SDPA, cuDNN/flash on
  GPU), wrapped so that it has this package's mask semantics.
- blockwise: the online-softmax loop in `_blockwise.py`.

The rule that picks among them is `keras_attn._policy.select_implementation`.
"""

import functools
import math

import keras
import numpy as np
from keras import ops

from keras_attn._blockwise import blockwise_attention, group_size
from keras_attn._masks import combine_masks, positional_mask
from keras_attn._policy import DECODE_EXPLICIT_BELOW, block_size_for
from keras_attn._shapes import broadcast_lead, score_lead, softmax_dtype, static_shape, to_rank

__all__ = [
    "attend",
    "empty_attention",
    "explicit_attention",
    "fused_attention",
    "fused_attention_bthd",
    "zero_unattended_keys",
]


# ----------------------------------------------------------------------------
# Semantics shared by every path.


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


def _masked_softmax(logits, allowed):
    """Softmax over the last axis restricted to `allowed` keys.

    A row with no allowed key (all masked, or all -inf bias) gets all-zero
    weights. Disallowed logits become -inf, so they contribute exp(-inf) = 0
    and receive zero gradient; the row maximum is replaced by 0 where it is
    -inf so that no `-inf - -inf = NaN` appears, forward or backward.
    """
    if allowed is not None:
        logits = ops.where(allowed, logits, float("-inf"))
    # A -inf maximum (no allowed key) becomes a finite floor; finite maxima
    # are above it and unchanged.
    lowest = float(np.finfo(keras.backend.standardize_dtype(logits.dtype)).min)
    row_max = ops.maximum(ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True)), lowest)
    unnormalized = ops.exp(logits - row_max)
    # A row with an allowed key sums to >= 1 (its maximum contributes
    # exp(0)), so the floor of 0.5 only turns an empty row's 0 / 0 into
    # 0 / 0.5 = 0: it never ties with a real sum (a tie would split the
    # gradient), and 0.5**2 in the quotient's gradient cannot underflow.
    total = ops.maximum(ops.sum(unnormalized, axis=-1, keepdims=True), 0.5)
    return unnormalized / total


def explicit_attention(query, key, value, mask, bias, is_causal, scale, dropout_rate, seed,
                       training, return_attention_scores, window=None, soft_cap=None):
    """Materialised logits and weights `(..., T, S)`; softmax in float32 at least."""
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
    if rows is not None and rows < DECODE_EXPLICIT_BELOW:
        # Few query rows (a decode step): `k q^T` reads the keys in their own
        # layout; `q k^T` has the compiler transpose every key (S x d) first,
        # 2-3x slower on XLA's CPU backend at S = 768 (benchmarks/decode.py).
        logits = ops.swapaxes(ops.matmul(k, ops.swapaxes(q, -1, -2)), -1, -2) * scale
    else:
        logits = ops.matmul(q, ops.swapaxes(k, -1, -2)) * scale  # (..., T, S) or (..., H_kv, G*T, S)
    if group > 1:
        logits = ops.reshape(logits, (*lead, H, T, -1))  # (..., H, T, S)
    if soft_cap is not None:
        logits = soft_cap * ops.tanh(logits / soft_cap)
    if bias is not None:
        logits = logits + ops.cast(bias, compute)
    allowed = combine_masks(
        mask, positional_mask(ops.shape(query)[-2], ops.shape(key)[-2], is_causal, window))
    weights = ops.cast(_masked_softmax(logits, allowed), value.dtype)  # (..., T, S)
    attended = weights
    if training and dropout_rate > 0.0:
        attended = keras.random.dropout(weights, dropout_rate, seed=seed)
    if group > 1:
        attended = ops.reshape(attended, (*lead, H // group, group * T, -1))  # (..., H_kv, G*T, S)
        output = ops.matmul(attended, value)  # (..., H_kv, G*T, d_v)
        output = ops.reshape(output, (*lead, H, T, static_shape(value)[-1]))  # (..., H, T, d_v)
    else:
        output = ops.matmul(attended, value)  # (..., T, d_v)
    if return_attention_scores:
        return output, weights
    return output


# ----------------------------------------------------------------------------
# The fused path.


def _large_negative(dtype):
    """A finite stand-in for -inf that still underflows exp() in float32 softmax."""
    return -0.7 * (65504.0 if keras.backend.standardize_dtype(dtype) == "float16" else 3.4e38)


@functools.cache
def _jax_on_gpu():
    try:
        return keras.distribution.list_devices()[0].startswith(("gpu", "cuda"))
    except Exception:  # no device list: be safe
        return False


def _kernel_keeps_half_precision(x):
    """Whether `ops.dot_product_attention` may take float16/bfloat16 `x` as it is.

    The GPU kernels (PyTorch's flash and memory-efficient SDPA, cuDNN under
    JAX) accumulate the logits and the softmax in float32. On the CPU,
    PyTorch's SDPA gives wrong rows once half-precision logits pass 65504
    (measured: float16 logits of ~1e5), TensorFlow's and NumPy's kernels
    (Keras's own math) compute the softmax in the input dtype (NaN), and
    JAX's XLA kernel asks for a float16 x float16 -> float32 dot that the CPU
    compiler rejects under `jit`. Those get float32 inputs instead.
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return "cuda" in str(getattr(x, "device", ""))
    if backend == "jax":
        return _jax_on_gpu()
    return False


def fused_attention_bthd(query, key, value, mask=None, bias=None, is_causal=False, scale=None,
                         window=None):
    """`keras.ops.dot_product_attention` with keras_attn's mask semantics.

    Layout `(B, T, H, d)` (heads after time, as `keras.ops.dot_product_attention`
    wants). `mask`/`bias` broadcast to `(B, H, T, S)`. Causal masking is
    bottom-right aligned: the backend's `is_causal` flag (top-left aligned on
    PyTorch) is used only when `T == S` statically and there is no mask or
    bias; otherwise the causal mask is folded into the mask. Rows with no
    allowed key are re-opened before the kernel (so that it never sees a
    fully masked row, which gives NaN on PyTorch and a uniform row on JAX and
    TensorFlow) and zeroed after it, which keeps values and gradients finite.
    Keys that no query may attend are zeroed (`zero_unattended_keys`). A
    sliding `window` is folded into the mask. Key/value heads fewer than the
    query's (grouped heads) are repeated to match.
    Half precision runs the kernel in float32 unless it is a GPU kernel that
    accumulates in float32 (`_kernel_keeps_half_precision`).

    Returns:
        `(B, T, H, d_v)` in the dtype of `value`.
    """
    out_dtype = value.dtype
    if "float16" in keras.backend.standardize_dtype(query.dtype) and not (
            _kernel_keeps_half_precision(query)):
        query, key, value = (ops.cast(x, "float32") for x in (query, key, value))
    d_k, d_v = static_shape(query)[-1], static_shape(value)[-1]
    if keras.backend.backend() == "jax" and d_k != d_v:
        # JAX's kernel (and Keras's fallback) assume d_v == d_k. Zero columns
        # change neither q.k nor the output's first d_v columns.
        width = max(d_k, d_v)
        pad = [[0, 0], [0, 0], [0, 0]]
        query, key = (ops.pad(x, pad + [[0, width - d_k]]) for x in (query, key))
        value = ops.pad(value, pad + [[0, width - d_v]])
        output = fused_attention_bthd(query, key, value, mask, bias, is_causal, scale, window)
        return ops.cast(output[..., :d_v], out_dtype)
    heads, kv_heads = static_shape(query)[2], static_shape(key)[2]
    group = heads // kv_heads if None not in (heads, kv_heads) else 1
    T, S = static_shape(query)[1], static_shape(key)[1]
    use_flag = (bool(is_causal) and window is None and mask is None and bias is None
                and T is not None and T == S)
    allowed = None if mask is None else to_rank(ops.cast(mask, "bool"), 4)
    if not use_flag:
        allowed = combine_masks(
            allowed, positional_mask(ops.shape(query)[1], ops.shape(key)[1], is_causal, window))
    if bias is not None:
        bias = to_rank(ops.cast(bias, query.dtype), 4)
        allowed = combine_masks(allowed, ops.greater(bias, float("-inf")))
    keep = None
    if allowed is not None:
        allowed = to_rank(allowed, 4)
        keep = ops.any(allowed, axis=-1, keepdims=True)  # (B|1, H|1, T|1, 1)
        key, value = zero_unattended_keys(key, value, allowed, key_axis=1, group=group)
    if group > 1:  # (B, S, H_kv, d) -> (B, S, H, d)
        key, value = (ops.repeat(x, group, axis=2) for x in (key, value))
    if bias is not None:
        bias = ops.where(allowed, bias, _large_negative(query.dtype))
        bias = ops.where(keep, bias, ops.zeros_like(bias))
        output = ops.dot_product_attention(query, key, value, bias=bias, scale=scale)
    else:
        if keep is not None:
            allowed = ops.logical_or(allowed, ops.logical_not(keep))
        output = ops.dot_product_attention(
            query, key, value, mask=allowed, scale=scale, is_causal=use_flag)
    if keep is not None:
        keep = ops.transpose(keep, (0, 2, 1, 3))  # (B|1, T|1, H|1, 1)
        output = output * ops.cast(keep, output.dtype)
    return ops.cast(output, out_dtype)


def fused_attention(query, key, value, mask, bias, is_causal, scale, lead, window=None):
    """The fused path for the `(..., T, d)` layout of the functional core.

    `query`, `key`, `value` already share the leading dims `lead`.
    """
    T, d_v = static_shape(query)[-2], static_shape(value)[-1]
    n = len(lead)
    if n > 2:  # fold the extra leading dims into the batch
        if any(not isinstance(d, int) for d in lead):
            raise ValueError(
                "The fused path needs static leading dims beyond (batch, heads). "
                f"Received: query.shape={static_shape(query)}"
            )
        batch = int(math.prod(lead[:-1]))

        def fold(x):
            return ops.reshape(x, (batch, lead[-1]) + tuple(x.shape[-2:]))  # (B', H, L, w)

        def fold_mask(x):
            x = to_rank(x, n + 2)
            x = ops.broadcast_to(x, tuple(lead) + tuple(x.shape[-2:]))
            return fold(x)

        query, key, value = fold(query), fold(key), fold(value)
        mask = None if mask is None else fold_mask(ops.cast(mask, "bool"))
        bias = None if bias is None else fold_mask(bias)
    else:
        query, key, value = (to_rank(x, 4) for x in (query, key, value))
    q, k, v = (ops.swapaxes(x, 1, 2) for x in (query, key, value))  # (B, L, H, d)
    out = fused_attention_bthd(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale,
                               window=window)
    out = ops.swapaxes(out, 1, 2)  # (B, H, T, d_v)
    if n > 2:
        return ops.reshape(out, tuple(lead) + (T, d_v))
    for _ in range(2 - n):
        out = ops.squeeze(out, 0)
    return out


# ----------------------------------------------------------------------------
# Dispatch.


def attend(path, query, key, value, mask=None, bias=None, is_causal=False, scale=1.0,
           dropout_rate=0.0, seed=None, training=False, return_attention_scores=False,
           window=None, soft_cap=None):
    """Run the chosen `path` on `(..., L, d)` tensors (already validated).

    `mask` is bool or None. Key/value may have fewer heads (axis -3) than the
    query (grouped heads). Empty sequences (`T == 0` or `S == 0`) are
    answered here, whatever the path.
    """
    group = group_size(query, key)
    T, S = static_shape(query)[-2], static_shape(key)[-2]
    if group > 1 and (path == "fused" or 0 in (T, S)):  # the others zero dead keys first
        key, value = (ops.repeat(x, group, axis=-3) for x in (key, value))
        group = 1
    if 0 in (T, S):
        return empty_attention(query, key, value, return_attention_scores)
    if path == "fused":
        (query, key, value), lead = broadcast_lead([query, key, value])
        return fused_attention(query, key, value, mask, bias, is_causal, scale, lead, window)
    allowed = mask
    if bias is not None:
        allowed = combine_masks(mask, ops.greater(bias, float("-inf")))
    # Zeroed over the H_kv heads: blockwise and explicit group the query
    # heads without repeating the keys and values.
    key, value = zero_unattended_keys(key, value, allowed, key_axis=-2, group=group)
    if path == "blockwise":
        return blockwise_attention(query, key, value, mask=mask, bias=bias,
                                   is_causal=is_causal, scale=scale,
                                   block_size=block_size_for(score_lead(query, key), T, S,
                                                             is_causal or window is not None),
                                   sliding_window=window, logit_soft_cap=soft_cap)
    return explicit_attention(query, key, value, mask, bias, is_causal, scale, dropout_rate,
                              seed, training, return_attention_scores, window, soft_cap)
