"""Scaled dot-product attention and its masks: the public functional API.

Notation used throughout the package:
    B  batch size
    H  number of attention heads
    T  query length (target)
    S  key/value length (source)
    d_k  width of a query/key per head
    d_v  width of a value per head

Masks are bool (or integer: nonzero = may attend) and follow the Keras
convention: True = may attend. Additive float masks are `bias`.

This module is the door to the kernels (`keras_attn._kernels`: explicit,
fused, blockwise): the layers call `attend` (or, in the `(B, T, H, d)`
layout, `fused_attention_bthd`) with the path that
`keras_attn._policy.select_implementation` chose. The positional masks come
from `keras_attn._masks`.
"""

import math

import keras
from keras import ops

from keras_attn._attention_fn import call_attention_fn
from keras_attn._kernels.blockwise import blockwise_attention
from keras_attn._kernels.common import empty_attention, group_size, zero_unattended_keys
from keras_attn._kernels.compiled import compiled
from keras_attn._kernels.explicit import explicit_attention
from keras_attn._kernels.fused import fused_attention, fused_attention_bthd
from keras_attn._masks import combine_masks, positional_mask
from keras_attn._policy import (
    block_rule,
    block_size_for,
    check_implementation,
    device_kind,
    execution_mode,
    select_implementation,
)
from keras_attn._shapes import broadcast_lead, score_lead, static_shape
from keras_attn._validation import (
    as_bool_mask,
    check_broadcastable,
    check_dropout,
    check_floating,
    check_positive_float,
    check_positive_int,
)
from keras_attn.options import KernelSpec, kernel_spec

__all__ = [
    "attend",
    "attend_heads",
    "causal_mask",
    "combine_masks",
    "fused_attention_bthd",
    "padding_mask",
    "scaled_dot_product_attention",
    "sliding_window_mask",
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
    return positional_mask(query_length, key_length, is_causal=True)  # (T, S)


def sliding_window_mask(query_length, key_length, window, is_causal=True):
    """Boolean sliding-window mask `(T, S)`, aligned to the bottom-right corner.

    Query `i` sits at absolute position `p = i + (S - T)`. Causal: it may
    attend key `j` iff `0 <= p - j < window` (W keys, its own included);
    not causal: iff `|p - j| < window`.

    Args:
        query_length: `T`. key_length: `S`. window: W, a positive int.
        is_causal: the causal (one-sided) window, or the two-sided one.

    Returns:
        A bool tensor of shape `(T, S)`.
    """
    check_positive_int("window", window)
    return positional_mask(query_length, key_length, is_causal, window)  # (T, S)


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


def _validate(query, key, value, mask, bias, *, dropout_rate, sliding_window, logit_soft_cap,
              attention_chunk_size=None):
    """Check dtypes, ranks, widths, lengths, heads and mask shapes before computing."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_floating(name, x)
    if bias is not None:
        check_floating("bias", bias)
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
    # Fewer key/value heads than query heads on axis -3: grouped-query attention.
    grouped = (len(q) >= 3 and len(k) >= 3 and None not in (q[-3], k[-3])
               and 1 < k[-3] < q[-3])
    if grouped and q[-3] % k[-3] != 0:
        raise ValueError(
            "With fewer key/value heads than query heads (grouped-query attention), the "
            "query heads H (axis -3) must be a multiple of the key/value heads H_kv. "
            f"Received: query.shape={q}, key.shape={k}"
        )
    if None not in (k[-3:-2] + v[-3:-2]) and len(k) >= 3 and len(v) >= 3 and k[-3] != v[-3]:
        raise ValueError(
            "`key` and `value` must have the same number of heads (axis -3). "
            f"Received: key.shape={k}, value.shape={v}"
        )
    for name, lead in (("key", k[:-2]), ("value", v[:-2])):
        if grouped:
            lead = lead[:-1] + (q[-3],)  # the heads axis is matched by grouping
        if not _broadcasts(q[:-2], lead):
            raise ValueError(
                f"`query` and `{name}` must have broadcastable leading dims (batch, "
                f"heads, ...). Received: query.shape={q}, {name}.shape={shapes[name]}"
            )
    check_dropout("dropout_rate", dropout_rate)
    check_positive_int("sliding_window", sliding_window, allow_none=True)
    check_positive_int("attention_chunk_size", attention_chunk_size, allow_none=True)
    check_positive_float("logit_soft_cap", logit_soft_cap, allow_none=True)
    target = score_lead(q, k) + (q[-2], k[-2])
    for name, tensor in (("mask", mask), ("bias", bias)):
        if tensor is not None:
            check_broadcastable(name, tensor, target, "(..., T, S)")


def _broadcasts(a, b):
    """Whether two static shapes broadcast against each other (None = unknown)."""
    return all(x is None or y is None or x == 1 or y == 1 or x == y
               for x, y in zip(reversed(a), reversed(b), strict=False))


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
    sliding_window=None,
    logit_soft_cap=None,
    sinks=None,
    attention_chunk_size=None,
):
    """Scaled dot-product attention, `softmax(q k^T * scale + bias) v`.

    Paper Eq. 1 of "Attention Is All You Need", over any leading dims.

    Args:
        query: floating tensor of shape `(..., T, d_k)`, usually
            `(B, H, T, d_k)`.
        key: floating tensor of shape `(..., S, d_k)`. It may have fewer
            heads than the query, `(B, H_kv, S, d_k)` with H divisible by
            H_kv (grouped-query attention; H_kv = 1 is multi-query): query
            head n then uses key/value head `n // (H / H_kv)`, as in Keras's
            `GroupQueryAttention`, Hugging Face's `repeat_kv` and PyTorch's
            `enable_gqa`. The blockwise path never repeats the keys.
        value: floating tensor of shape `(..., S, d_v)`, with the key's heads.
        mask: optional bool or integer tensor broadcastable to `(..., T, S)`;
            True (nonzero) = the query may attend the key. A floating mask
            raises a `ValueError`: a 0/1 keep-mask and an additive 0/-inf
            mask look alike, so additive masks go in `bias`.
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
            online-softmax loop over blocks of queries and keys (a block
            length chosen from the shape, or the one set with
            `keras_attn.config.set_attention_block_size`) whose memory grows
            linearly with the sequence length (forward and backward); it
            needs static `T` and `S`. `"auto"` follows a measured,
            backend-aware policy (`keras_attn._policy.select_implementation`;
            docs/guides/performance.md): blockwise when the scores would exceed
            `keras_attn.config.blockwise_threshold()` elements (on PyTorch,
            unmasked attention stays on SDPA's own flash kernel, which is
            linear in memory); below that, blockwise on a CPU under JAX or
            TensorFlow once one head's scores reach 32 x 32 (JAX) or
            512 x 512 causal / 1024 x 1024 full (TensorFlow) with at least
            16 queries, where it is
            measured faster, and fused everywhere else (PyTorch, NumPy,
            GPUs). Dims unknown while tracing (a `None` batch) count as 1,
            so the per-example score count decides. A soft-cap, which the
            fused kernel cannot apply, goes to the explicit path where the
            policy says fused (`"fused"` with a soft-cap is a `ValueError`).
        sliding_window: W, a positive int, or None. Query position
            p = i + (S - T) may attend key j iff `0 <= p - j < W` when
            causal (W keys, its own included; Hugging Face's and keras-hub
            Mistral's meaning) and iff `|p - j| < W` otherwise (Keras's
            `GroupQueryAttention` meaning). The blockwise path skips blocks
            outside the window: its cost grows like T * W.
        logit_soft_cap: c > 0, or None: the logits `q k^T * scale` become
            `c * tanh(logits / c)` before the bias and masks (Gemma 2).
        sinks: optional float tensor `(H,)`, one logit per query head (axis -3
            of `(..., H, T, d_k)`) that joins every softmax's denominator and
            attends nothing: weights `exp(s_j) / (exp(sink) + sum_k exp(s_k))`
            (gpt-oss's `sinks`, "attention sinks"), on every path: the
            explicit one adds them to the softmax, the fused one takes them
            exactly as one more key, of zero key and value, whose bias is the
            sink, the blockwise one starts each row's online softmax from it.
        attention_chunk_size: C, a positive int, or None: chunked
            (block-diagonal) attention, Llama 4's `attention_chunk_size`.
            Query position p = i + (S - T) may attend key j only if
            `floor(j / C) == floor(p / C)` (and `j <= p` when causal;
            transformers' `chunked_causal_mask_function`), on top of a
            window and the masks. On every path: the explicit and fused ones
            fold it into the mask, the blockwise one skips the blocks outside
            the chunks (its cost grows like T * C).

    Returns:
        The output `(..., T, d_v)` in the dtype of `value`, and, with
        `return_attention_scores=True`, the weights `(..., T, S)` (before
        dropout). Softmax runs in float32 at least on every path, so float16
        and bfloat16 inputs never overflow in it. A query with no allowed key
        gets zero weights and a zero output row, never NaN; a key that no
        query may attend (padding) is zeroed first, so NaN or inf stored
        there never reaches an output. `T == 0` gives an empty output and
        `S == 0` zero rows.
    """
    check_implementation(implementation)
    _validate(query, key, value, mask, bias, dropout_rate=dropout_rate,
              sliding_window=sliding_window, logit_soft_cap=logit_soft_cap,
              attention_chunk_size=attention_chunk_size)
    symbolic = any(isinstance(x, keras.KerasTensor) for x in (query, key, value, mask, bias))
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    mask = as_bool_mask("mask", mask)
    if scale is None:
        scale = 1.0 / math.sqrt(static_shape(query)[-1])
    if sinks is not None:
        sinks = _checked_sinks(sinks, query)
    spec = KernelSpec(is_causal=bool(is_causal), scale=float(scale),
                      sliding_window=sliding_window, logit_soft_cap=logit_soft_cap,
                      dropout_rate=float(dropout_rate), seed=seed, training=bool(training),
                      sinks=sinks is not None, attention_chunk_size=attention_chunk_size)
    needs_weights = bool(return_attention_scores) or bool(training and dropout_rate > 0.0)
    path = select_implementation(
        implementation, backend=keras.backend.backend(), lead=score_lead(query, key),
        T=static_shape(query)[-2], S=static_shape(key)[-2], has_mask=mask is not None,
        has_bias=bias is not None, is_causal=is_causal, needs_weights=needs_weights, symbolic=symbolic,
        has_window=_banded_by_position(spec), unfusable=spec.unfusable,
        device=device_kind(query), mode=execution_mode())
    return attend(path, query, key, value, mask, bias, spec=spec, sinks=sinks,
                  return_attention_scores=return_attention_scores)


def _checked_sinks(sinks, query):
    """`sinks` as a floating tensor of shape `(H,)`, H the query's axis -3."""
    shape = static_shape(query)
    heads = shape[-3] if len(shape) >= 3 else None
    sinks = ops.convert_to_tensor(sinks)
    floating = "float" in keras.backend.standardize_dtype(sinks.dtype)
    if heads is None or tuple(static_shape(sinks)) != (heads,) or not floating:
        raise ValueError(
            "`sinks` must be a floating tensor with one logit per query head, of shape "
            f"(H,) for a query (..., H, T, d_k). Received: sinks.shape={static_shape(sinks)} "
            f"({keras.backend.standardize_dtype(sinks.dtype)}) for query.shape={shape}")
    return sinks


def attend(path, query, key, value, mask=None, bias=None, *, spec=None, sinks=None,
           return_attention_scores=False, **fields):
    """Run the chosen `path` on `(..., L, d)` tensors (already validated).

    `mask` is bool or None. Key/value may have fewer heads (axis -3) than the
    query (grouped heads). Empty sequences (`T == 0` or `S == 0`) are
    answered here, whatever the path. `spec`: the `KernelSpec` of the call, or
    its fields by keyword (`is_causal=True, sliding_window=8`; the scale then
    defaults to 1.0). `sinks`: `(H,)` sink logits, with `spec.sinks`.
    """
    if spec is None:
        spec = KernelSpec(**fields, sinks=sinks is not None)
    elif fields:
        raise TypeError(f"Pass a KernelSpec or its fields, not both. Received: {sorted(fields)}")
    T, S = static_shape(query)[-2], static_shape(key)[-2]
    block = None
    if path == "blockwise" and 0 not in (T, S):
        block = block_size_for(score_lead(query, key), T, S, spec.positional,
                               blocks=block_rule(keras.backend.backend()),
                               sliding_window=_band_width(spec))
    settings = dict(path=path, return_attention_scores=bool(return_attention_scores),
                    block_size=block)
    # On JAX an eager call is one compiled program per shape and settings
    # (`keras_attn._kernels.compiled`). Not with active dropout (random state), and the
    # block size is chosen above, because `keras_attn.config` can change it.
    if not spec.drops:
        program = compiled(_attend, {**settings, "spec": spec.inference()}, _kernels_in_use())
        if program is not None:
            return program(query, key, value, mask, bias, sinks)
    return _attend(query, key, value, mask, bias, sinks, spec=spec, **settings)


def _attend(query, key, value, mask, bias, sinks=None, *, spec, path, return_attention_scores,
            block_size):
    if spec.sinks != (sinks is not None):
        raise ValueError("`spec.sinks` says whether sink logits are passed. "
                         f"Received: spec.sinks={spec.sinks}, sinks={sinks!r}")
    group = group_size(query, key)
    T, S = static_shape(query)[-2], static_shape(key)[-2]
    if group > 1 and (path == "fused" or 0 in (T, S)):  # the others zero dead keys first
        key, value = (ops.repeat(x, group, axis=-3) for x in (key, value))
        group = 1
    if 0 in (T, S):
        return empty_attention(query, key, value, return_attention_scores)
    if path == "fused":
        (query, key, value), lead = broadcast_lead([query, key, value])
        return fused_attention(query, key, value, mask, bias, spec, lead=lead, sinks=sinks)
    allowed = mask
    if bias is not None:
        allowed = combine_masks(mask, ops.greater(bias, float("-inf")))
    # Zeroed over the H_kv heads: blockwise and explicit group the query
    # heads without repeating the keys and values. Not over a cache known finite
    # (`spec.unattended_finite`): at 32k cached positions that pass was 84% of a
    # PyTorch decoding step's op time (benchmarks/README.md, "Decoding at scale").
    if not spec.unattended_finite:
        key, value = zero_unattended_keys(key, value, allowed, key_axis=-2, group=group)
    if path == "blockwise":
        return blockwise_attention(query, key, value, mask=mask, bias=bias, spec=spec,
                                   block_size=block_size, sinks=sinks)
    return explicit_attention(query, key, value, mask, bias, spec, sinks=sinks,
                              return_attention_scores=return_attention_scores)


def attend_heads(query, key, value, options, *, mask=None, is_causal=False,
                 implementation="auto", dropout_rate=0.0, seed=None, training=False,
                 return_attention_scores=False, cached=False, window_in_mask=False, sinks=None,
                 bias=None, unattended_finite=False):
    """The attention of projected heads in the layers' `(B, L, heads, d)` layout.

    What `keras_attn.MultiHeadAttention` calls: the policy picks the path for
    these shapes and options (`cached`: a call over a key/value cache), the
    fused path reads `(B, T, H, d)` directly, the others work heads-first.

    Args:
        query: `(B, T, H, d_k)`; key: `(B, S, H_kv, d_k)`; value:
            `(B, S, H_kv, d_v)`.
        options: the `keras_attn.options.AttentionOptions` that act here
            (`sliding_window`, `attention_chunk_size`, `logit_soft_cap`,
            `scale`: the call's `KernelSpec`); the projections have applied
            the others.
        window_in_mask: the window and the chunks are folded into `mask`
            already (a call over a cache): the kernel applies neither.
        mask: bool broadcastable to `(B, H, T, S)`, or None.
        sinks: `(H,)` sink logits (the layer's `sinks` weight), or None.
        bias: an additive float bias broadcastable to `(B, H, T, S)` (heads-first:
            `scaled_dot_product_attention`'s `bias`, added after the scale and the
            soft-cap), or None. With it the fused path runs heads-first.
        unattended_finite: the keys and values no query may attend are known
            finite (a cache `generate` owns: `KVCache.unattended_finite`), so the
            kernels do not zero them (`KernelSpec.unattended_finite`).
        implementation: a path's name, or a callable with the signature of
            `scaled_dot_product_attention` (flax's `attention_fn`): it gets
            heads-first `(B, H, T, d_k)` queries and `(B, H_kv, S, d)` keys
            and values, every keyword that function takes but
            `implementation`, and returns `(B, H, T, d_v)` (and the weights
            `(B, H, T, S)` with `return_attention_scores=True`).

    Returns:
        `(attended, scores or None, heads_first)`: attended is
        `(B, H, T, d_v)` when `heads_first`, else `(B, T, H, d_v)` (fused).
    """
    (B, T, H, d_k), S = static_shape(query), static_shape(key)[1]
    training = bool(training)
    spec = kernel_spec(options, is_causal=is_causal, scale=options.scale or 1.0 / math.sqrt(d_k),
                       dropout_rate=dropout_rate, seed=seed, training=training,
                       sliding_window=None if window_in_mask else "options",
                       attention_chunk_size=None if window_in_mask else "options",
                       sinks=sinks is not None, unattended_finite=unattended_finite)
    if callable(implementation):
        attended, scores = call_attention_fn(
            implementation, query, key, value, spec, mask=mask, sinks=sinks, bias=bias,
            return_attention_scores=return_attention_scores)
        return attended, scores, True
    path = select_implementation(
        implementation, lead=(B, H), T=T, S=S, has_mask=mask is not None,
        has_bias=bias is not None,
        is_causal=is_causal, needs_weights=bool(return_attention_scores) or spec.drops,
        symbolic=isinstance(query, keras.KerasTensor), has_window=_banded_by_position(spec),
        unfusable=spec.unfusable, device=device_kind(query),
        cached=cached, backend=keras.backend.backend(), mode=execution_mode())
    if path == "fused" and 0 not in (T, S) and bias is None:
        # Keras's (B, T, H, d) layout: no transposes on our side.
        program = compiled(_fused_bthd, {"spec": spec.inference()}, _kernels_in_use())
        if program is not None:
            return program(query, key, value, mask, sinks), None, False
        return _fused_bthd(query, key, value, mask, sinks, spec=spec), None, False
    query, key, value = (ops.swapaxes(x, 1, 2) for x in (query, key, value))  # (B, H|H_kv, L, d)
    attended = attend(path, query, key, value, mask, bias, spec=spec, sinks=sinks,
                      return_attention_scores=return_attention_scores)
    attended, scores = attended if return_attention_scores else (attended, None)
    return attended, scores, True


def _banded_by_position(spec):
    """Whether positions beyond the causal rule restrict the keys (a window or chunks):
    the policy's `has_window` (a positional mask for the fused kernel, blocks to skip)."""
    return spec.sliding_window is not None or spec.attention_chunk_size is not None


def _band_width(spec):
    """The width of the band of keys a query sees (window or chunk), for the block size."""
    widths = [w for w in (spec.sliding_window, spec.attention_chunk_size) if w is not None]
    return min(widths) if widths else None


def _kernels_in_use():
    """The kernels a compiled call runs (looked up now: a test may replace one)."""
    return (explicit_attention, fused_attention, fused_attention_bthd, blockwise_attention)


def _fused_bthd(query, key, value, mask, sinks=None, *, spec):
    return fused_attention_bthd(query, key, value, mask=mask, is_causal=spec.is_causal,
                                scale=spec.scale, sliding_window=spec.sliding_window, sinks=sinks,
                                attention_chunk_size=spec.attention_chunk_size,
                                zero_unattended=not spec.unattended_finite)

