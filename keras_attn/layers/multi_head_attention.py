"""Multi-head attention (paper Section 3.2.2) as a Keras layer. `call`: resolve the inputs
(`_keras_compat`) -> check them, project (`_projection`) -> one `KVCache.update` with a cache
(`keras_attn.cache`: checks, RoPE'd keys written, slots read, positional mask) -> attention
(`_compute_attention`, if overridden) -> output projection.
"""

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn import cache as kv_cache
from keras_attn._shapes import static_shape
from keras_attn._typing import Initializer
from keras_attn._validation import (
    as_bool_mask,
    check_broadcastable,
    check_dropout,
    check_positive_int,
    check_rank,
)
from keras_attn.attention import attend_heads, combine_masks
from keras_attn.layers import _keras_compat as compat
from keras_attn.layers import _projection as projection
from keras_attn.layers._common import check_not_quantized
from keras_attn.options import expose_options, pop_options

__all__ = ["MultiHeadAttention"]


def cache_shape_text(cache):
    return None if cache is None else kv_cache.cache_shape(cache)


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, with masks that are never silently dropped.

    `output = concat(head_1, ..., head_H) W_o`, `head_h = attention(query W_q^h,
    key W_k^h, value W_v^h)`, attention `keras_attn.scaled_dot_product_attention`.

    A drop-in for `keras.layers.MultiHeadAttention`: the same call order
    `(query, value, key)`, masks and constructor names (`output_shape`,
    `attention_axes` for the default axis, regularizers, constraints,
    `seed`); `keras_attn.convert.multi_head_attention_from_keras` brings a
    Keras layer's weights. Deliberate differences (also in the docs):

    - `use_causal_mask=True` with `T != S` is bottom-right aligned (query
      `i` attends key `j <= i + S - T`, as new tokens over a cache); Keras
      aligns it top-left (`j <= i`). With `T == S` both are the usual triangle.
    - A padded query (`query_mask`) still attends the real keys; its output
      row carries the mask (Keras masks the whole row).
    - `value` may be omitted: `layer(x)` is self-attention.
    - A floating `attention_mask` is a `ValueError` (Keras casts it): a 0/1
      keep-mask and an additive 0/-inf mask look alike.

    Shapes: B batch, T query / S key length, H `num_heads`, q_dim, k_dim,
    v_dim the input widths, d_k `key_dim`, d_v `value_dim`.

    Weights: `keras.layers.Dense` sublayers `query_dense` (kernel
    `(q_dim, H * d_k)`), `key_dense` (`(k_dim, H_kv * d_k)`), `value_dense`
    (`(v_dim, H_kv * d_v)`), `output_dense` (`(H * d_v, output_dim)`) and,
    with `use_gate`, `gate_dense` (`(q_dim, H * d_v)`);
    head `h` owns columns `[h * d, (h + 1) * d)`. Keras keeps the same
    numbers as `(q_dim, H, d_k)` `EinsumDense` kernels, `torch.nn` their
    transposes (`keras_attn.convert`).

    Args:
        num_heads: H, the number of attention heads.
        key_dim: d_k, the width of each head's queries and keys.
        value_dim: d_v, the width of each head's values. Defaults to `key_dim`.
        output_dim: width of the output. Defaults to q_dim.
        dropout: dropout rate on the attention weights (training only).
        use_bias: whether the dense layers have biases (q, k, v, and the
            output and gate unless `output_use_bias` says otherwise).
        output_use_bias: whether `output_dense` has a bias; None (default)
            follows `use_bias`. `use_bias=True, output_use_bias=False` is
            Qwen 2's attention (bias on q, k, v only).
        kernel_initializer, bias_initializer, kernel_regularizer,
            bias_regularizer, kernel_constraint, bias_constraint: of the
            dense kernels and biases, as in `keras.layers.Dense`.
        seed: int seed of the attention dropout.
        implementation: `"auto"` (default), `"fused"`, `"blockwise"` or
            `"explicit"` (see `keras_attn.scaled_dot_product_attention`;
            scores and attention dropout use the explicit path), or a callable
            with that function's signature (flax's `attention_fn`) called on
            heads-first `(B, H|H_kv, L, d)` tensors; saved when registered
            (`keras.saving.register_keras_serializable`).
        output_shape: Keras's name for the output width: an int or a
            1-tuple (a multi-dimensional one is not supported).
        attention_axes: Keras's argument; only the default (`None`, or the
            time axis `1` / `-2` of rank-3 inputs) is supported.
        flash_attention: Keras's argument: `None` (default) leaves the
            choice to `implementation`; `True` means `"fused"` and, as in
            Keras, refuses attention dropout and scores; `False` means
            `"explicit"`.
        use_gate: Keras 3.15's gated attention output (arXiv 2505.06708,
            Qwen3-Next): a `gate_dense` sublayer `(q_dim, H * d_v)` with a
            sigmoid multiplies each head's output before `output_dense`.
        num_key_value_heads, rope_max_wavelength, rope_scaling_factor,
            rope_interleaved, sliding_window, logit_soft_cap, qk_norm,
            qk_norm_epsilon: see `keras_attn.options.AttentionOptions`, whose
            other fields (`scale`, `attention_k_eq_v`, `use_value_norm`,
            `query_scale_beta`, `query_scale_length` and `query_scale_offset` o:
            the queries times `1 + beta * log(1 + floor((p + o) / length))` at their
            absolute positions p, after RoPE) are keywords too (GQA: query head n uses
            key/value head `n // (H / H_kv)`, as Keras's
            `GroupQueryAttention`; RoPE on queries and keys after qk-norm,
            at absolute bottom-right-aligned positions; qk-norm sublayers
            `query_norm`, `key_norm`, over d, or over H * d and H_kv * d with
            `qk_norm_full_width`, OLMo 2's; `qk_norm="l2"`, Llama 4's, without
            weights; `attention_chunk_size`: Llama 4's
            chunked attention). Stored as `self.options`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Subclasses: `_compute_attention(query, key, value, attention_mask=None,
    training=None, return_attention_scores=False, use_causal_mask=False)`
    is Keras's override point, with Keras's layout: projected `(B, T, H,
    d_k)` queries, `(B, S, H, d)` keys and values (grouped heads repeated),
    a bool mask `(B, H|1, T, S)` holding every rule (causal, window, cache
    slots), returning `(output (B, T, H, d_v), scores or None)`. An
    override replaces the attention computation (soft-cap and dropout
    included); the default runs this package's paths.

    Call arguments:
        query: `(B, T, q_dim)`, floating.
        value: `(B, S, v_dim)`. Defaults to `key`, or to `query`
            (self-attention) when `key` is not given either.
        key: `(B, S, k_dim)`. Defaults to `value`.
        query_mask, value_mask, key_mask: Keras masks `(B, T)`, `(B, S)`,
            `(B, S)`, bool or integer, filled in by Keras from masked inputs
            (for example after `Embedding(mask_zero=True)`). Masked keys and
            values are never attended; the output carries the query's mask.
        attention_mask: bool or integer, broadcastable to `(B, T, S)` or
            `(B, H, T, S)`; True (nonzero) = may attend. Combined (logical
            AND) with the causal mask and with the Keras masks of the inputs.
        return_attention_scores: also return the attention weights.
        training: whether attention dropout is active.
        use_causal_mask: if True, query `i` may only attend key
            `j <= i + (S - T)`.
        mask: the query's Keras mask when `query` is the only tensor
            argument (Keras fills it in); used as `query_mask`.
        cache: a `keras_attn.KVCache` (keys `(B, S_max, H_kv, d_k)` and
            values `(B, S_max, H_kv, d_v)` apart, after qk-norm and RoPE), or
            keras-hub's tensor `(B, 2, S_max, H_kv, d)` (keys, then values;
            `keras_attn.empty_cache`; `value_dim` must then equal `key_dim`),
            or None. Attention then runs over the S_max slots: the masks' key
            axis is exactly S_max.
        cache_update_index: an int or scalar int tensor: where the S_new new
            keys and values are written, in `[0, S_max - S_new]` (else a
            `ValueError`, or NaN output for a traced index). Positions (RoPE,
            causal, window) follow it; unwritten slots are never attended.
            None with a cache: read-only (cross-attention), every slot counts
            as written (fill it whole, or mask the rest with `key_mask`).
        attention_bias: an additive float bias on the logits, broadcastable
            to `(B, H, T, S)` (S = S_max with a cache: over its slots), or
            None: added after the scale and the soft-cap, before the softmax
            (`keras_attn.scaled_dot_product_attention`'s `bias`; T5's relative
            position bias, ALiBi's slopes; -inf forbids a key). A bool or
            integer tensor is a `ValueError` (a mask goes in `attention_mask`),
            as is one that does not broadcast; so is a bias with a subclass's
            own `_compute_attention` (Keras's hook takes none).

    Returns:
        The output `(B, T, output_dim)`, and with
        `return_attention_scores=True` also the weights `(B, H, T, S)`
        (S = S_max with a cache). With a `cache`, the updated cache, of the
        kind given (a `KVCache`, or a tensor `(B, 2, S_max, H_kv, d)`), comes last: `(output, new_cache)` or
        `(output, scores, new_cache)`. A query that may attend no key gets
        a zero attention output.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=8, key_dim=16, num_key_value_heads=2,
    ...                            rope_max_wavelength=1e4, sliding_window=64)
    >>> x = np.zeros((2, 10, 32), "float32")
    >>> output, scores = layer(x, use_causal_mask=True, return_attention_scores=True)
    >>> tuple(output.shape), tuple(scores.shape)
    ((2, 10, 32), (2, 8, 10, 10))
    """

    def __init__(self, num_heads: int, key_dim: int, value_dim: int | None = None,
                 output_dim: int | None = None, dropout: float = 0.0, use_bias: bool = True,
                 kernel_initializer: Initializer = "glorot_uniform",
                 bias_initializer: Initializer = "zeros", kernel_regularizer: Any = None,
                 bias_regularizer: Any = None, seed: int | None = None,
                 implementation: str | Callable = "auto", output_shape: int | tuple | None = None,
                 attention_axes: int | tuple | None = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, flash_attention: bool | None = None,
                 num_key_value_heads: int | None = None,
                 rope_max_wavelength: float | None = None, rope_scaling_factor: float = 1.0,
                 rope_interleaved: bool = False, sliding_window: int | None = None,
                 logit_soft_cap: float | None = None, qk_norm: str | None = None,
                 qk_norm_epsilon: float = 1e-6, output_use_bias: bool | None = None,
                 use_gate: bool = False, **kwargs) -> None:
        options = pop_options(  # any further AttentionOptions field comes in kwargs
            kwargs, num_key_value_heads=num_key_value_heads,
            rope_max_wavelength=rope_max_wavelength, rope_scaling_factor=rope_scaling_factor,
            rope_interleaved=rope_interleaved, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, qk_norm=qk_norm, qk_norm_epsilon=qk_norm_epsilon)
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.output_dim = compat.output_dim_from_shape(output_dim, output_shape)
        self.dropout = check_dropout("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.output_use_bias = self.use_bias if output_use_bias is None else bool(output_use_bias)
        self.use_gate = bool(use_gate)
        projection.set_dense_arguments(
            self, kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
            kernel_constraint=kernel_constraint, bias_constraint=bias_constraint)
        compat.check_attention_axes(attention_axes)
        compat.check_flash_attention(flash_attention, self.dropout)
        self._flash_attention = bool(flash_attention)
        self.seed = seed
        self.implementation = compat.implementation_from_flash(
            compat.implementation_from_config(implementation), flash_attention)
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        self.options = options.for_heads(self.num_heads, self.key_dim)
        if self.attention_k_eq_v and self.value_dim not in (None, self.key_dim):
            raise ValueError(
                "With `attention_k_eq_v=True` the values are the projected keys: `value_dim` "
                f"must be None or key_dim={self.key_dim}. Received: value_dim={self.value_dim}")
        self.supports_masking = True

    @property
    def head_value_dim(self):
        """d_v: `value_dim`, or `key_dim` when it is not set."""
        return self.value_dim or self.key_dim

    def build(self, query_shape, value_shape=None, key_shape=None):
        """Create the projections; shapes in Keras's order `(query, value, key)`."""
        query_shape = check_rank("query", query_shape, 3, "(B, T, q_dim)")
        if value_shape is None:
            value_shape = query_shape if key_shape is None else key_shape
        value_shape = check_rank("value", value_shape, 3, "(B, S, v_dim)")
        key_shape = value_shape if key_shape is None else check_rank(
            "key", key_shape, 3, "(B, S, k_dim)")
        H, H_kv, d_k, d_v = self.num_heads, self.num_key_value_heads, self.key_dim, self.head_value_dim
        projections = [("query_dense", H * d_k, query_shape)]
        if not self.is_kv_shared_layer:  # else another layer's keys and values
            projections.append(("key_dense", H_kv * d_k, key_shape))
        if not (self.attention_k_eq_v or self.is_kv_shared_layer):  # K = V: the keys' too
            projections.append(("value_dense", H_kv * d_v, value_shape))
        for name, units, shape in projections:
            setattr(self, name, projection.dense(self, units, name))
            getattr(self, name).build(shape)
        if self.qk_norm not in (None, "l2"):  # "l2" has no weights (Llama 4)
            # One norm over each head's d, or (OLMo 2) over all H * d / H_kv * d features;
            # a KV-shared layer has no key norm (its keys are another layer's).
            widths = (H * d_k, H_kv * d_k) if self.qk_norm_full_width else (d_k, d_k)
            names = ("query_norm",) + (() if self.is_kv_shared_layer else ("key_norm",))
            for name, width in zip(names, widths[:len(names)], strict=True):
                setattr(self, name, projection.qk_norm_layer(
                    self.qk_norm, self.qk_norm_epsilon, width, self.dtype_policy, name))
        if self.use_gate:
            self.gate_dense = projection.dense(self, H * d_v, "gate_dense", activation="sigmoid")
            self.gate_dense.build(query_shape)
        self.output_dense = projection.dense(self, self.output_dim or query_shape[-1],
                                             "output_dense", use_bias=self.output_use_bias)
        self.output_dense.build(query_shape[:-1] + (H * d_v,))
        if self.use_sinks:  # gpt-oss's and keras-hub's `sinks`: a logit per query head
            self.sinks = self.add_weight(name="sinks", shape=(H,), initializer="zeros")
        self.built = True

    def call(self, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None,
             attention_mask=None, return_attention_scores=False, training=None,
             use_causal_mask=False, mask=None, cache=None, cache_update_index=None,
             attention_bias=None):
        compat.check_flash_attention(self._flash_attention,
                                     return_attention_scores=return_attention_scores)
        if self.is_kv_shared_layer and (cache is None or cache_update_index is None):
            raise ValueError(
                f"Layer '{self.name}' has `is_kv_shared_layer=True`: it attends another "
                "layer's keys and values, passed as that layer's `cache` with the step's "
                f"`cache_update_index`. Received: cache={cache_shape_text(cache)}, "
                f"cache_update_index={cache_update_index!r}")
        cache_in = kv_cache.KVCache.of(cache, cache_update_index)  # a tensor: keras-hub's layout
        given = dict(attention_mask=attention_mask, key_mask=key_mask, value_mask=value_mask)
        read_only = cache is not None and cache_update_index is None
        value, key, value_mask, key_mask = compat.resolve_inputs(
            query, value, key, query_mask if query_mask is not None else mask, value_mask,
            key_mask, cache, read_only)
        compat.check_inputs(self, query, value, key)
        (B, T), H, d_v = static_shape(query)[:2], self.num_heads, self.head_value_dim
        q, k, v = self._project(query, key, value, cache is not None, read_only)
        is_causal, window, step = use_causal_mask, self.sliding_window, None
        chunk = self.attention_chunk_size
        if cache is not None:  # the one cache call: checks, RoPE'd keys written, slots read
            step = cache_in.update(
                k, v, cache_update_index, query_length=T, batch_size=B,
                num_key_value_heads=self.num_key_value_heads, key_dim=self.key_dim,
                value_dim=d_v, is_causal=use_causal_mask, window=window, dtype=q.dtype,
                attention_chunk_size=chunk,
                rope=self._rope_keys if self.rope_max_wavelength is not None else None,
                masks=given)  # the masks as given: before `resolve_inputs`
            if self.rope_max_wavelength is not None:
                q = projection.rope(q, step.query_positions, self.options)
            if self.query_scale_beta is not None:  # at the cache's positions, as RoPE
                q = projection.query_scale(q, step.query_positions, self.options)
            k, v = step.keys, step.values  # (B, S_max, H_kv, d_k | d_v)
            is_causal, window, chunk = False, None, None  # in `step.mask` (the index may be traced)
        S_all = static_shape(key)[1] if cache is None else cache_in.max_length  # keys attended
        if cache is None:  # each mask by the name it was given as (a cache checked them)
            compat.check_key_masks(B, S_all, given, value_mask,
                                   "query_mask" if query_mask is not None else "mask")
        key_padding = combine_masks(as_bool_mask("key_mask", key_mask),
                                    as_bool_mask("value_mask", value_mask))
        mask_4d = compat.merge_masks(B, T, S_all, H, attention_mask, key_padding)
        if step is not None:
            mask_4d = combine_masks(mask_4d, step.mask)
        hooked = type(self)._compute_attention is not MultiHeadAttention._compute_attention
        bias = _check_attention_bias(attention_bias, (B, H, T, S_all), hooked)
        if hooked:
            attended, scores, heads_first = compat.call_keras_hook(
                self, q, k, v, mask_4d, training, return_attention_scores, is_causal, window,
                attention_chunk_size=chunk)
        else:
            attended, scores, heads_first = self._attend(
                q, k, v, mask_4d, is_causal, cache is not None, training, return_attention_scores,
                cache is not None, bias, unattended_finite=step is not None and step.unattended_finite)
        if self.use_gate:
            attended = projection.gate(self.gate_dense, query, attended, H, d_v, heads_first)
        output = projection.project_output(self.output_dense, attended, H, d_v, heads_first)
        output = output if step is None else step.poison(output)  # (B, T, D_out)
        results = ((output, scores) if return_attention_scores else (output,)) + (
            () if cache is None else (step.cache,))
        return results if len(results) > 1 else output

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, use_causal_mask=False):
        """Attention over projected heads; Keras's override point (see the class docstring).

        Args:
            query: `(B, T, H, d_k)`; key: `(B, S, H|H_kv, d_k)`; value:
                `(B, S, H|H_kv, d_v)`.
            attention_mask: bool broadcastable to `(B, H, T, S)` (a `(B, T, S)`
                one gets a head axis), or None.
            use_causal_mask: the bottom-right causal rule, on top of the mask.

        Returns:
            `(output (B, T, H, d_v), scores (B, H, T, S) or None)`.
        """
        if attention_mask is not None and len(static_shape(attention_mask)) == 3:
            attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
        attended, scores, heads_first = self._attend(
            query, key, value, attention_mask, use_causal_mask, True, training,
            return_attention_scores, False)
        return (ops.swapaxes(attended, 1, 2) if heads_first else attended), scores

    def _attend(self, q, k, v, mask, is_causal, in_mask, training, return_scores, cached,
                bias=None, unattended_finite=False):
        """`keras_attn.attention.attend_heads` with this layer's settings (`in_mask`: the
        window and the chunks are in `mask` already, or not for this call: a cache's
        mask, Keras's `_compute_attention`; `bias` `(B|1, H|1, T|1, S|1)` or None;
        `unattended_finite`: the cache's, `CacheUpdate.unattended_finite`)."""
        return attend_heads(
            q, k, v, self.options, mask=mask, is_causal=is_causal, window_in_mask=in_mask,
            implementation=self.implementation, dropout_rate=self.dropout,
            seed=self.seed_generator, training=training, return_attention_scores=return_scores,
            cached=cached, sinks=ops.convert_to_tensor(self.sinks) if self.use_sinks else None,
            bias=bias, unattended_finite=unattended_finite)

    def _project(self, query, key, value, cached=False, read_only=False):
        """`(q, k, v)` in `(B, L, heads, d)` after qk-norm, and RoPE and the query scale
        without a cache.

        With a cache, RoPE follows the cache's positions: `KVCache.update`
        rotates the new keys (`_rope_keys`) and gives the queries' positions
        (RoPE's and the query scale's, applied in `call`).
        A read-only cache takes no `key`/`value` (k and v None).
        """
        d_k, d_v, H_kv = self.key_dim, self.head_value_dim, self.num_key_value_heads
        q = projection.project_heads(self.query_dense, query, self.num_heads, d_k)  # (B, T, H, d_k)
        k = v = None
        if not read_only and not self.is_kv_shared_layer:
            k = projection.project_heads(self.key_dense, key, H_kv, d_k)  # (B, S_new, H_kv, d_k)
            v = (k if self.attention_k_eq_v  # the projected keys, before key_norm and RoPE
                 else projection.project_heads(self.value_dense, value, H_kv, d_v))  # (B, S_new, H_kv, d_v)
            if self.use_value_norm:  # before the cache: the cached values are normalised
                v = projection.value_norm(v, self.qk_norm_epsilon)
        if self.qk_norm == "l2":  # no weights: each head over its root mean square
            q = projection.value_norm(q, self.qk_norm_epsilon)
            k = None if k is None else projection.value_norm(k, self.qk_norm_epsilon)
        elif self.qk_norm is not None:
            norm = projection.full_width_norm if self.qk_norm_full_width else projection.head_norm
            q = norm(self.query_norm, q)
            k = None if k is None else norm(self.key_norm, k)
        if self.rope_max_wavelength is not None and not cached:
            q, k = projection.rope_heads(q, k, ops.shape(query)[1], ops.shape(key)[1], None,
                                         None, self.options)  # never shared: a cache
        if self.query_scale_beta is not None and not cached:  # after RoPE, RoPE's positions
            q = projection.query_scale(q, projection.query_positions(
                ops.shape(query)[1], ops.shape(key)[1]), self.options)
        return q, k, v

    def _rope_keys(self, keys, positions):
        """RoPE of the new keys at their absolute positions (`KVCache.update`'s `rope`)."""
        return projection.rope(keys, positions, self.options)

    def empty_cache(self, batch_size, max_length, dtype=None, *, as_kv_cache=False):
        """Zeros `(B, 2, S_max, H_kv, d)`, or a `KVCache`; see `keras_attn.empty_cache`."""
        return kv_cache.empty_cache(self, batch_size, max_length, dtype,
                                    as_kv_cache=as_kv_cache)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        query_shape = check_rank("query", query_shape, 3, "(B, T, q_dim)")
        return query_shape[:-1] + (self.output_dim or query_shape[-1],)

    def compute_output_spec(self, query, value=None, key=None, *args,
                            return_attention_scores=False, cache=None, **kwargs):
        return compat.output_spec(self, query, value, key, return_attention_scores, cache)

    def get_config(self):
        check_not_quantized(self)
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads, "key_dim": self.key_dim, "value_dim": self.value_dim,
            "output_dim": self.output_dim, "dropout": self.dropout, "use_bias": self.use_bias,
            "output_use_bias": self.output_use_bias, "use_gate": self.use_gate,
            **projection.dense_config(self),
            "seed": self.seed, "implementation": compat.implementation_config(self.implementation),
            **self.options.get_config(),
        })
        return config


def _check_attention_bias(bias, target, hooked):
    """`bias` as a rank-4 tensor broadcastable to `target` `(B, H, T, S)`, or None; a
    `ValueError` naming `attention_bias` for a mask's dtype or a shape that does not fit."""
    if bias is None:
        return None
    if not hasattr(bias, "shape") or not hasattr(bias, "dtype"):
        bias = np.asarray(bias)
    dtype = keras.backend.standardize_dtype(bias.dtype)
    if "float" not in dtype:
        raise ValueError(
            "`attention_bias` is an additive float bias on the logits (a bool or integer "
            "mask goes in `attention_mask`). Received: "
            f"attention_bias.dtype={dtype}, attention_bias.shape={static_shape(bias)}")
    check_broadcastable("attention_bias", bias, target, "(B, H, T, S)")
    if hooked:
        raise ValueError(
            "`attention_bias` is not passed to a subclass's own `_compute_attention` (Keras's "
            "override point takes a mask only). Received: attention_bias.shape="
            f"{static_shape(bias)}")
    bias = ops.convert_to_tensor(bias)
    while len(static_shape(bias)) < 4:
        bias = ops.expand_dims(bias, 0)  # (1, ..., T|1, S|1)
    return bias


expose_options(MultiHeadAttention)  # layer.sliding_window, layer.qk_norm, ...
