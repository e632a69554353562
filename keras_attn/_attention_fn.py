"""A user's attention function in place of the kernels (`implementation=callable`).

`keras_attn.MultiHeadAttention(implementation=fn)` hands the projected heads to
`fn`, as flax's `attention_fn` and equinox's injectable attention do. `fn` has
the signature of `keras_attn.scaled_dot_product_attention`: the public keyword
names, heads-first tensors. This module builds that call and checks what comes
back; `keras_attn.attention.attend_heads` calls it.
"""

from keras import ops


def call_attention_fn(fn, query, key, value, spec, *, mask, sinks, bias,
                      return_attention_scores):
    """`fn` on the layer's `(B, L, heads, d)` heads, as `(attended, scores or None)`.

    Args:
        fn: the callable `implementation`.
        query: `(B, T, H, d_k)`; key: `(B, S, H_kv, d_k)`; value: `(B, S, H_kv, d_v)`.
        spec: the call's `keras_attn.options.KernelSpec` (the scale, the window, ...).
        mask: bool broadcastable to `(B, H, T, S)`, or None.
        sinks: `(H,)` sink logits, or None. bias: additive, or None.
        return_attention_scores: whether `fn` must return `(output, weights)`.

    Returns:
        `(attended, scores or None)`, attended `(B, H, T, d_v)` (heads-first).
    """
    keywords = dict(mask=mask, is_causal=spec.is_causal, scale=spec.scale,
                    dropout_rate=spec.dropout_rate, seed=spec.seed, training=spec.training,
                    return_attention_scores=bool(return_attention_scores),
                    sliding_window=spec.sliding_window, logit_soft_cap=spec.logit_soft_cap)
    # Each later keyword only when set: a function written before it keeps working.
    if sinks is not None:
        keywords["sinks"] = sinks
    if spec.attention_chunk_size is not None:
        keywords["attention_chunk_size"] = spec.attention_chunk_size
    if bias is not None:
        keywords["bias"] = bias
    query, key, value = (ops.swapaxes(x, 1, 2) for x in (query, key, value))  # (B, H|H_kv, L, d)
    return _checked_result(fn, fn(query, key, value, **keywords), return_attention_scores)


def _checked_result(fn, result, return_attention_scores):
    """`(attended, scores or None)` from `fn`'s result, checked."""
    if not return_attention_scores:
        return result, None
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ValueError(
            "With `return_attention_scores=True`, a callable `implementation` must return "
            f"`(output, weights)`, as scaled_dot_product_attention does. Received from "
            f"{getattr(fn, '__name__', fn)!r}: {type(result).__name__}")
    return tuple(result)
