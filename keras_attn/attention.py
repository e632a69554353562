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

from keras_attn import config
from keras_attn._blockwise import blockwise_attention, broadcast_lead
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


# ----------------------------------------------------------------------------
# Implementations: explicit (materialised weights), fused
# (`keras.ops.dot_product_attention`) and blockwise (online softmax).

IMPLEMENTATIONS = ("auto", "fused", "blockwise", "explicit")


def check_implementation(implementation):
    """`implementation` is one of `IMPLEMENTATIONS`, else a `ValueError`."""
    if not isinstance(implementation, str) or implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}. "
            f"Received: implementation={implementation!r}"
        )
    return implementation


def _num_scores(lead, T, S):
    """`prod(lead) * T * S`, or None when a dim is not known statically."""
    total = 1
    for d in tuple(lead) + (T, S):
        if d is None:
            return None
        total *= d
    return total


def select_implementation(implementation, *, lead, T, S, has_mask, has_bias, is_causal,
                          needs_weights, symbolic):
    """The path a call takes; see `scaled_dot_product_attention`.

    Args:
        implementation: the requested one (`"auto"` resolves here).
        lead: static leading dims of the scores (batch, heads, ...).
        T, S: static query and key lengths (None if unknown).
        has_mask, has_bias, is_causal: what the call carries.
        needs_weights: scores are requested, or attention dropout is active;
            only the explicit path materialises the weights.
        symbolic: the inputs are `KerasTensor`s (shape inference only).
    """
    check_implementation(implementation)
    if needs_weights or symbolic:
        return "explicit"
    if implementation == "blockwise" and (T is None or S is None):
        raise ValueError(
            "`implementation='blockwise'` needs static query and key lengths. "
            f"Received: implementation={implementation!r} with T={T}, S={S}"
        )
    if implementation != "auto":
        return implementation
    num_scores = _num_scores(lead, T, S)
    if num_scores is None or num_scores <= config.blockwise_threshold():
        return "fused"
    if (keras.backend.backend() == "torch" and not has_mask and not has_bias
            and (not is_causal or T == S)):
        # PyTorch's SDPA runs its own flash kernel here (no mask to
        # materialise): linear memory already, and faster than a loop.
        return "fused"
    return "blockwise"


def _large_negative(dtype):
    """A finite stand-in for -inf that still underflows exp() in float32 softmax."""
    return -0.7 * (65504.0 if keras.backend.standardize_dtype(dtype) == "float16" else 3.4e38)


def _to_rank(x, rank):
    while len(x.shape) < rank:
        x = ops.expand_dims(x, 0)
    return x


def fused_attention_bthd(query, key, value, mask=None, bias=None, is_causal=False, scale=None):
    """`keras.ops.dot_product_attention` with keras_attn's mask semantics.

    Layout `(B, T, N, d)` (heads after time, as `keras.ops.dot_product_attention`
    wants). `mask`/`bias` broadcast to `(B, N, T, S)`. Causal masking is
    bottom-right aligned: the backend's `is_causal` flag (top-left aligned on
    PyTorch) is used only when `T == S` statically and there is no mask or
    bias; otherwise the causal mask is folded into the mask. Rows with no
    allowed key are re-opened before the kernel (so that it never sees a
    fully masked row, which gives NaN on PyTorch and a uniform row on JAX and
    TensorFlow) and zeroed after it, which keeps values and gradients finite.

    Returns:
        `(B, T, N, d_v)`.
    """
    d_k, d_v = static_shape(query)[-1], static_shape(value)[-1]
    if keras.backend.backend() == "jax" and d_k != d_v:
        # JAX's kernel (and Keras's fallback) assume d_v == d_k. Zero columns
        # change neither q.k nor the output's first d_v columns.
        width = max(d_k, d_v)
        pad = [[0, 0], [0, 0], [0, 0]]
        query, key = (ops.pad(x, pad + [[0, width - d_k]]) for x in (query, key))
        value = ops.pad(value, pad + [[0, width - d_v]])
        output = fused_attention_bthd(query, key, value, mask, bias, is_causal, scale)
        return output[..., :d_v]
    T, S = static_shape(query)[1], static_shape(key)[1]
    use_flag = bool(is_causal) and mask is None and bias is None and T is not None and T == S
    allowed = None if mask is None else _to_rank(ops.cast(mask, "bool"), 4)
    if is_causal and not use_flag:
        allowed = combine_masks(allowed, causal_mask(ops.shape(query)[1], ops.shape(key)[1]))
    if bias is not None:
        bias = _to_rank(ops.cast(bias, query.dtype), 4)
        allowed = combine_masks(allowed, ops.greater(bias, float("-inf")))
    keep = None
    if allowed is not None:
        allowed = _to_rank(allowed, 4)
        keep = ops.any(allowed, axis=-1, keepdims=True)  # (B|1, N|1, T|1, 1)
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
        keep = ops.transpose(keep, (0, 2, 1, 3))  # (B|1, T|1, N|1, 1)
        output = output * ops.cast(keep, output.dtype)
    return output


def _fused(query, key, value, mask, bias, is_causal, scale):
    """The fused path for the `(..., T, d)` layout of the functional core."""
    (q, k, v), lead = broadcast_lead([query, key, value])
    T, d_v = static_shape(q)[-2], static_shape(v)[-1]
    n = len(lead)
    if n > 2:  # fold the extra leading dims into the batch
        if any(not isinstance(d, int) for d in lead):
            raise ValueError(
                "The fused path needs static leading dims beyond (batch, heads). "
                f"Received: query.shape={static_shape(query)}"
            )
        batch = int(math.prod(lead[:-1]))

        def fold(x):
            return ops.reshape(x, (batch, lead[-1]) + tuple(x.shape[-2:]))

        def fold_mask(x):
            x = _to_rank(x, n + 2)
            x = ops.broadcast_to(x, tuple(lead) + tuple(x.shape[-2:]))
            return fold(x)

        q, k, v = fold(q), fold(k), fold(v)
        mask = None if mask is None else fold_mask(ops.cast(mask, "bool"))
        bias = None if bias is None else fold_mask(bias)
    else:
        q, k, v = (_to_rank(x, 4) for x in (q, k, v))
    q, k, v = (ops.transpose(x, (0, 2, 1, 3)) for x in (q, k, v))  # (B, T, N, d)
    out = fused_attention_bthd(q, k, v, mask=mask, bias=bias, is_causal=is_causal, scale=scale)
    out = ops.transpose(out, (0, 2, 1, 3))  # (B, N, T, d_v)
    if n > 2:
        return ops.reshape(out, tuple(lead) + (T, d_v))
    for _ in range(2 - n):
        out = ops.squeeze(out, 0)
    return out


def _explicit(query, key, value, mask, bias, is_causal, scale, dropout_rate, seed,
              training, return_attention_scores):
    """Materialised logits and weights; the only path with scores and dropout."""
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


def _score_lead(query, key):
    """Static leading dims of the scores: the broadcast of query's and key's."""
    lead_q, lead_k = static_shape(query)[:-2], static_shape(key)[:-2]
    width = max(len(lead_q), len(lead_k))
    lead_q = (1,) * (width - len(lead_q)) + lead_q
    lead_k = (1,) * (width - len(lead_k)) + lead_k
    return tuple(b if a == 1 else a for a, b in zip(lead_q, lead_k, strict=True))


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
    implementation="auto",
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
        implementation: `"auto"` (default), `"fused"`, `"blockwise"` or
            `"explicit"`. `"explicit"` materialises the logits and weights
            (the only path that can return them or apply attention dropout,
            so it is always taken when scores are requested or dropout is
            active). `"fused"` calls `keras.ops.dot_product_attention`
            (PyTorch's SDPA kernels, cuDNN/flash on GPU). `"blockwise"` is an
            online-softmax loop over blocks of `keras_attn.config.
            attention_block_size()` queries and keys whose memory grows
            linearly with the sequence length (forward and backward); it
            needs static `T` and `S`. `"auto"` takes the fused path unless
            the scores would exceed `keras_attn.config.blockwise_threshold()`
            elements, then the blockwise one (on PyTorch, unmasked attention
            stays on SDPA's own flash kernel, which is linear in memory).

    Returns:
        The output `(..., T, d_v)` in the dtype of `value`, and, with
        `return_attention_scores=True`, the weights `(..., T, S)` (before
        dropout). A query with no allowed key gets zero weights and a zero
        output row, never NaN.
    """
    check_implementation(implementation)
    _validate(query, key, value, mask, bias, dropout_rate)
    symbolic = any(isinstance(x, keras.KerasTensor) for x in (query, key, value, mask, bias))
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    if scale is None:
        scale = 1.0 / math.sqrt(static_shape(query)[-1])
    needs_weights = bool(return_attention_scores) or bool(training and dropout_rate > 0.0)
    path = select_implementation(
        implementation, lead=_score_lead(query, key), T=static_shape(query)[-2],
        S=static_shape(key)[-2], has_mask=mask is not None, has_bias=bias is not None,
        is_causal=is_causal, needs_weights=needs_weights, symbolic=symbolic)
    if path == "fused":
        return _fused(query, key, value, mask, bias, is_causal, scale)
    if path == "blockwise":
        return blockwise_attention(query, key, value, mask=mask, bias=bias,
                                   is_causal=is_causal, scale=scale,
                                   block_size=config.attention_block_size())
    return _explicit(query, key, value, mask, bias, is_causal, scale, dropout_rate, seed,
                     training, return_attention_scores)
