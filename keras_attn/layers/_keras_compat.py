"""Keras's `MultiHeadAttention` arguments and override point, in this package's terms.

`output_shape`, `attention_axes` and `flash_attention` are Keras's constructor
arguments; `_compute_attention` is Keras's documented hook for subclasses
(keras-hub's layers override it). Shapes: B batch, T query length, S key
length, H heads, H_kv key/value heads, d_k / d_v head widths.
"""

import keras
from keras import ops

from keras_attn._masks import positional_mask
from keras_attn._policy import check_implementation
from keras_attn._shapes import static_shape
from keras_attn._validation import (
    as_bool_mask,
    check_broadcastable,
    check_floating,
    check_positive_int,
    check_rank,
)
from keras_attn.attention import combine_masks
from keras_attn.cache import cache_length, cache_spec

__all__ = [
    "call_keras_hook",
    "implementation_config",
    "output_spec",
    "implementation_from_config",
    "check_attention_axes",
    "check_flash_attention",
    "check_inputs",
    "implementation_from_flash",
    "merge_masks",
    "output_dim_from_shape",
    "resolve_inputs",
]


def output_dim_from_shape(output_dim, output_shape):
    """Keras's `output_shape` (an int or a 1-tuple) as `output_dim`.

    A multi-dimensional `output_shape` (Keras projects onto several axes) is
    a deliberate difference: this layer's output is `(B, T, output_dim)`.
    """
    if output_shape is None:
        return output_dim
    shape = (output_shape,) if isinstance(output_shape, int) else tuple(output_shape)
    if len(shape) != 1:
        raise ValueError(
            "`output_shape` must be an int or a 1-tuple (the output width; this layer "
            f"takes rank-3 inputs). Received: output_shape={output_shape!r}"
        )
    width = check_positive_int("output_shape", shape[0])
    if output_dim is not None and output_dim != width:
        raise ValueError(
            "`output_dim` and `output_shape` name the same width; give one. "
            f"Received: output_dim={output_dim}, output_shape={output_shape!r}"
        )
    return width


def check_attention_axes(attention_axes):
    """Only Keras's default axis is supported: attention over the time axis of `(B, T, dim)`."""
    if attention_axes is None:
        return
    axes = (attention_axes,) if isinstance(attention_axes, int) else tuple(attention_axes)
    if axes not in ((1,), (-2,)):
        raise ValueError(
            "`attention_axes` other than the default (the time axis of (B, T, dim) "
            "inputs: None, 1 or -2) are not supported; reshape the extra axes into the "
            f"batch instead. Received: attention_axes={attention_axes!r}"
        )


def implementation_from_config(implementation):
    """`implementation` checked: a path's name, or a callable (also as its serialised config).

    A callable has `keras_attn.scaled_dot_product_attention`'s signature, as
    flax's `attention_fn`; to be saved in a `.keras` file it must be
    registered (`keras.saving.register_keras_serializable`).
    """
    if isinstance(implementation, dict):  # from a config: a registered function
        implementation = keras.saving.deserialize_keras_object(implementation)
    return check_implementation(implementation, allow_callable=True)


def implementation_config(implementation):
    """The config entry of `implementation` (a callable's serialised form)."""
    if callable(implementation):
        return keras.saving.serialize_keras_object(implementation)
    return implementation


def implementation_from_flash(implementation, flash_attention):
    """Keras's `flash_attention` flag in terms of `implementation`."""
    if flash_attention is None:
        return implementation
    wanted = "fused" if flash_attention else "explicit"
    if callable(implementation) or implementation not in ("auto", wanted):
        raise ValueError(
            f"`flash_attention={flash_attention}` means implementation='{wanted}', which "
            f"conflicts with implementation='{implementation}'. Give one of them. "
            f"Received: flash_attention={flash_attention!r}, implementation={implementation!r}"
        )
    return wanted


def check_flash_attention(flash_attention, dropout=0.0, return_attention_scores=False):
    """As Keras: flash attention has neither attention dropout nor scores.

    Only an explicit `flash_attention=True` raises; `implementation="fused"`
    (this package's name) computes scores and dropout on the explicit path.
    """
    if not flash_attention:
        return
    if dropout > 0.0:
        raise ValueError(
            "Dropout is not supported when flash attention is enabled (as in Keras): set "
            "`dropout=0.0`, or use `implementation='fused'`, which runs dropout on the "
            f"explicit path. Received: flash_attention=True, dropout={dropout}")
    if return_attention_scores:
        raise ValueError(
            "Returning attention scores is not supported when flash attention is enabled "
            "(as in Keras): use `implementation='fused'` (scores then come from the "
            "explicit path) or `flash_attention=None`. Received: flash_attention=True, "
            "return_attention_scores=True")


def call_keras_hook(layer, query, key, value, mask, training, return_attention_scores,
                    is_causal, window, *, attention_chunk_size=None):
    """A subclass's own `_compute_attention`, called with Keras's layout and signature.

    Keras passes H heads for keys and values: grouped ones are repeated.
    The hook gets every rule in its mask `(B, H|1, T, S)`: `mask` (with the
    cache's slots, if any), and the causal rule, `window` and the chunks of
    `attention_chunk_size` (bottom-right aligned), so its `use_causal_mask` is False.

    Returns:
        `(output (B, T, H, d_v), scores or None, False)`: False for "not heads-first",
        as `keras_attn.attention.attend_heads` says it.
    """
    group = layer.num_heads // layer.num_key_value_heads
    if group > 1:
        key = ops.repeat(key, group, axis=2)  # (B, S, H, d_k)
        value = ops.repeat(value, group, axis=2)  # (B, S, H, d_v)
    if is_causal or window is not None or attention_chunk_size is not None:
        T, S = static_shape(query)[1], static_shape(key)[1]
        positional = positional_mask(T, S, is_causal, window,
                                     attention_chunk_size=attention_chunk_size)  # (T, S)
        mask = combine_masks(mask, positional)
    output, scores = layer._compute_attention(
        query, key, value, attention_mask=mask, training=training,
        return_attention_scores=return_attention_scores, use_causal_mask=False)
    return output, scores, False


def resolve_inputs(query, value, key, query_mask, value_mask, key_mask, cache, read_only):
    """Keras's defaults: `key` is `value`, `value` is `query` (self-attention), masks follow.

    With a cache and neither `value` nor `key`, the query is the source of
    the new keys, but its Keras mask marks query rows `(B, T)`, not cache
    slots `(B, S_max)`: it does not become the key mask. A read-only cache
    takes no keys at all.

    Returns:
        `(value, key, value_mask, key_mask)`.
    """
    if read_only:
        return None, None, value_mask, key_mask
    if cache is not None and value is None and key is None:
        value = query
    if value is None and key is None:  # self-attention
        value, value_mask = query, (value_mask if value_mask is not None else query_mask)
    elif value is None:
        value, value_mask = key, (value_mask if value_mask is not None else key_mask)
    if key is None:
        key, key_mask = value, (key_mask if key_mask is not None else value_mask)
    return value, key, value_mask, key_mask


def check_key_masks(B, S, given, value_mask, query_mask_name):
    """The key masks `(B, S)` under the names the call gave them, before they merge.

    `resolve_inputs` makes a missing `key_mask` the `value_mask` and, in
    self-attention, a missing `value_mask` the query's mask: a wrong length is
    reported under the argument the caller passed, not the one it became.
    `given` maps "value_mask" and "key_mask" to the call's arguments;
    `value_mask` is the resolved one, and `query_mask_name` names the query's
    mask (`query_mask` or `mask`).
    """
    named = [(name, given[name]) for name in ("value_mask", "key_mask")]
    if given["value_mask"] is None and given["key_mask"] is None:
        named.append((query_mask_name, value_mask))  # None unless self-attention's
    for name, key_mask in named:
        if key_mask is not None:
            check_broadcastable(name, key_mask, (B, S), "(B, S)")


def check_inputs(layer, query, value, key):
    """Ranks, dtypes, batch and length agreement, and the built widths.

    `value` and `key` None (a read-only cache) are not checked.
    """
    shapes = {}
    for name, x, layout in (("query", query, "(B, T, q_dim)"),
                            ("value", value, "(B, S, v_dim)"),
                            ("key", key, "(B, S, k_dim)")):
        if x is None:
            continue
        shapes[name] = check_rank(name, x, 3, layout)
        check_floating(name, x)
    batches = {n: s[0] for n, s in shapes.items() if s[0] is not None}
    if len(set(batches.values())) > 1:
        raise ValueError(
            "`query`, `value` and `key` must have the same batch size B. Received: "
            + ", ".join(f"{n}.shape={shapes[n]}" for n in shapes))
    S_key, S_value = shapes.get("key", (0, 0))[1], shapes.get("value", (0, 0))[1]
    if None not in (S_key, S_value) and S_key != S_value:
        raise ValueError(
            "`key` and `value` must have the same length S. "
            f"Received: key.shape={shapes['key']}, value.shape={shapes['value']}")
    if not layer.built:
        return
    # K = V layers have no value_dense (the keys' projection reads `key`), KV-shared ones
    # no key_dense either (their keys and values are another layer's).
    for name, dense in (("query", layer.query_dense), ("value", getattr(
            layer, "value_dense", None)), ("key", getattr(layer, "key_dense", None))):
        if dense is not None and name in shapes and shapes[name][-1] not in (
                None, dense.kernel.shape[0]):
            raise ValueError(
                f"Layer '{layer.name}' was built for `{name}` of width "
                f"{dense.kernel.shape[0]}, and cannot be called on another width. "
                f"Received: {name}.shape={shapes[name]}")


def merge_masks(B, T, S, H, attention_mask, key_padding):
    """The explicit mask and the key padding `(B, S)` as one bool `(B, H|1, T, S)`."""
    attention_mask = as_bool_mask("attention_mask", attention_mask)
    if attention_mask is not None:
        rank = len(static_shape(attention_mask))
        if rank == 4:
            check_broadcastable("attention_mask", attention_mask, (B, H, T, S), "(B, H, T, S)")
        else:
            check_broadcastable("attention_mask", attention_mask, (B, T, S), "(B, T, S)")
            if rank == 3:
                attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
            # rank < 3 ((T, S) or (S,)) already broadcasts from the right.
    if key_padding is not None:
        check_broadcastable("key_mask", key_padding, (B, S), "(B, S)")
        if len(static_shape(key_padding)) == 1:  # (S,): the same keys for every row
            key_padding = ops.expand_dims(key_padding, 0)  # (1, S)
        key_padding = ops.expand_dims(ops.expand_dims(key_padding, 1), 1)  # (B|1, 1, 1, S)
    return combine_masks(attention_mask, key_padding)


def output_spec(layer, query, value, key, return_attention_scores, cache):
    """`compute_output_spec` of the layer: output, scores, cache as `KerasTensor`s.

    Keras calls it on symbolic inputs (a Functional model); the tuple mirrors
    what `call` returns.
    """
    source = value if value is not None else (key if key is not None else query)
    results = (keras.KerasTensor(layer.compute_output_shape(query.shape),
                                 dtype=layer.compute_dtype),)
    if return_attention_scores:
        S = source.shape[1] if cache is None else cache_length(cache)
        results += (keras.KerasTensor((query.shape[0], layer.num_heads, query.shape[1], S),
                                      dtype=layer.compute_dtype),)
    if cache is not None:
        results += (cache_spec(cache),)  # a KVCache's spec is a KVCache
    return results if len(results) > 1 else results[0]
