"""Multi-head attention (paper Section 3.2.2) as a Keras layer."""

import math

import keras
from keras import ops

from keras_attn._policy import check_implementation, device_kind, select_implementation
from keras_attn._shapes import static_shape
from keras_attn._validation import (
    as_bool_mask,
    check_broadcastable,
    check_dropout,
    check_floating,
    check_positive_float,
    check_positive_int,
    check_rank,
)
from keras_attn.attention import attend, combine_masks, fused_attention_bthd
from keras_attn.cache import (
    cached_positional_mask,
    check_cache,
    check_cache_update_index,
    check_generation_slots,
    empty_cache,
    index_in_range,
    poison,
)
from keras_attn.layers._common import clone_initializer
from keras_attn.rotary import rotary_embedding

__all__ = ["MultiHeadAttention", "check_attention_options"]


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, with masks that are never silently dropped.

    `output = concat(head_1, ..., head_H) W_o`, where
    `head_h = attention(query W_q^h, key W_k^h, value W_v^h)` and attention is
    `keras_attn.scaled_dot_product_attention`.

    A drop-in for `keras.layers.MultiHeadAttention`: the same call order
    `(query, value, key)`, with `key` defaulting to `value`, the same mask
    arguments and the same constructor names (`output_shape`,
    `attention_axes` for the default axis, regularizers, constraints,
    `seed`). Weights of a Keras layer are brought over with
    `keras_attn.convert.multi_head_attention_from_keras`. Deliberate
    differences:

    - With `use_causal_mask=True` and `T != S`, causal masking is aligned to
      the bottom-right corner (query `i` attends key `j <= i + S - T`: the
      `T` queries are the last `T` positions, as for new tokens over a
      cache); Keras's layer aligns it to the top-left (`j <= i`). With
      `T == S` both are the usual lower triangle.
    - The query's Keras mask (`query_mask`) marks padded query rows on the
      output but does not mask them inside attention: a padded query still
      attends the real keys (Keras's layer masks the whole row).
    - `value` may be omitted: `layer(x)` is self-attention.
    - A floating `attention_mask` raises a `ValueError` (Keras casts it):
      a 0/1 keep-mask and an additive 0/-inf mask look alike.

    Shapes: B batch, T query length, S key/value length, H `num_heads`,
    q_dim, k_dim, v_dim the widths of query, key and value (they may all
    differ), d_k `key_dim`, d_v `value_dim`.

    Weight layout: the sublayers are `keras.layers.Dense` named
    `query_dense` (kernel `(q_dim, H * d_k)`), `key_dense`
    (`(k_dim, H * d_k)`), `value_dense` (`(v_dim, H * d_v)`) and
    `output_dense` (`(H * d_v, output_dim)`). Head `h` owns columns
    `[h * d_k, (h + 1) * d_k)` of the query and key kernels (and likewise for
    values). Keras's layer keeps the same numbers as `(q_dim, H, d_k)`
    `EinsumDense` kernels; `torch.nn.MultiheadAttention` keeps their
    transposes (see `keras_attn.convert`).

    Args:
        num_heads: H, the number of attention heads.
        key_dim: d_k, the width of each head's queries and keys.
        value_dim: d_v, the width of each head's values. Defaults to
            `key_dim`.
        output_dim: width of the output. Defaults to q_dim.
        dropout: dropout rate on the attention weights (training only).
        use_bias: whether the four dense layers have biases.
        kernel_initializer: initializer of the dense kernels.
        bias_initializer: initializer of the dense biases.
        kernel_regularizer: regularizer of the dense kernels.
        bias_regularizer: regularizer of the dense biases.
        seed: int seed of the attention dropout.
        implementation: `"auto"` (default), `"fused"`, `"blockwise"` or
            `"explicit"`; see `keras_attn.scaled_dot_product_attention`.
            The fused path keeps the projections in `(B, T, H, d)` layout
            (no head transposes); attention scores and attention dropout
            always use the explicit path. The weights are the same on
            every path.
        output_shape: Keras's name for the output width: an int or a
            1-tuple, the same as `output_dim` (give one or the other).
        attention_axes: Keras's argument; only the default (`None`, or the
            time axis `1` / `-2` of rank-3 inputs) is supported.
        kernel_constraint: constraint of the dense kernels.
        bias_constraint: constraint of the dense biases.
        flash_attention: Keras's argument: `None` (default) leaves the
            choice to `implementation`; `True` means `implementation="fused"`
            and `False` means `"explicit"`.
        num_key_value_heads: H_kv, the key/value heads (grouped-query
            attention; 1 is multi-query). Defaults to `num_heads`; must
            divide it. `key_dense`/`value_dense` project to `H_kv * d`, and
            query head n uses key/value head `n // (H / H_kv)` (as Keras's
            `GroupQueryAttention`).
        rope_max_wavelength: the base of rotary position embeddings applied
            to queries and keys per head (after `qk_norm`); None (default)
            for none. `key_dim` must then be even. Positions are absolute
            and bottom-right aligned: query i is at `i + (S - T)`, key j at j.
        rope_scaling_factor: linear position scaling of RoPE.
        rope_interleaved: pair features (2i, 2i + 1) instead of the default
            half-split (i, i + d/2) (see `keras_attn.rotary_embedding`).
        sliding_window: W, or None: query position p attends key j only if
            `0 <= p - j < W` with `use_causal_mask=True`, or `|p - j| < W`
            without (see `keras_attn.scaled_dot_product_attention`).
        logit_soft_cap: c > 0, or None: logits become `c * tanh(logits / c)`
            before masking (Gemma 2).
        qk_norm: None (default), `"rms"` or `"layer"`: normalise each head's
            queries and keys over d_k (sublayers `query_norm`, `key_norm`:
            Keras's `RMSNormalization` / `LayerNormalization`, one scale
            shared by the heads) before RoPE.
        qk_norm_epsilon: epsilon of the qk norms.
        **kwargs: base layer arguments (`name`, `dtype`,
            `activity_regularizer`, ...).

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
        cache: a key/value cache `(B, 2, S_max, H_kv, d)` (keys, then
            values, after qk-norm and RoPE; see `keras_attn.empty_cache`),
            or None. S_max is the cache length; `value_dim` must equal
            `key_dim`. With a cache, attention runs over the S_max cache
            slots: `key_mask`/`value_mask` are `(B, S_max)` and
            `attention_mask` broadcasts to `(B, T, S_max)`, over the slots,
            with a last axis of exactly S_max (one slot is a `ValueError`,
            not a broadcast; the query's Keras mask is not used as a key
            mask).
        cache_update_index: where this call's S_new new keys and values
            (projected from `key`/`value`, the query for self-attention) are
            written into `cache`: an int or a scalar int tensor (traced
            under `jit`; one compiled step serves every index). An index
            whose value is known (a Python or NumPy integer, an eager
            tensor) must be in `[0, S_max - S_new]`, else `ValueError`; a
            traced one out of that range makes the output and the written
            keys NaN (XLA would clamp the write). Query i sits
            at absolute position `cache_update_index + S_new - T + i`
            (`cache_update_index + i` for self-attention), the new keys at
            `cache_update_index + j`, for RoPE, the causal mask and the
            window alike; slots `>= cache_update_index + S_new` (not yet
            written) are never attended, even without the causal mask. None
            with a cache: read-only (cross-attention over a precomputed
            memory), `key`/`value` are ignored and all S_max slots count as
            written, subject to the masks: fill such a cache whole (S_new =
            S_max at index 0, as `TransformerDecoderLayer` requires of its
            cross-attention cache), or mask the unwritten slots with
            `key_mask`. An index without a cache is a `ValueError`.

    Returns:
        The output `(B, T, output_dim)`, and with
        `return_attention_scores=True` also the weights `(B, H, T, S)`
        (S = S_max with a cache). With a `cache`, the updated cache
        `(B, 2, S_max, H_kv, d)` comes last: `(output, new_cache)` or
        `(output, scores, new_cache)`. A query that may attend no key gets
        a zero attention output.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        seed=None,
        implementation="auto",
        output_shape=None,
        attention_axes=None,
        kernel_constraint=None,
        bias_constraint=None,
        flash_attention=None,
        num_key_value_heads=None,
        rope_max_wavelength=None,
        rope_scaling_factor=1.0,
        rope_interleaved=False,
        sliding_window=None,
        logit_soft_cap=None,
        qk_norm=None,
        qk_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.output_dim = _output_dim_from_shape(output_dim, output_shape)
        self.dropout = check_dropout("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        _check_attention_axes(attention_axes)
        self.seed = seed
        self.implementation = _implementation_from_flash(
            check_implementation(implementation), flash_attention)
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        options = check_attention_options(
            self.num_heads, self.key_dim, num_key_value_heads=num_key_value_heads,
            rope_max_wavelength=rope_max_wavelength, rope_scaling_factor=rope_scaling_factor,
            rope_interleaved=rope_interleaved, sliding_window=sliding_window,
            logit_soft_cap=logit_soft_cap, qk_norm=qk_norm)
        for name, value in options.items():
            setattr(self, name, value)
        self.qk_norm_epsilon = check_positive_float("qk_norm_epsilon", qk_norm_epsilon)
        self.supports_masking = True

    @property
    def head_value_dim(self):
        """d_v: `value_dim`, or `key_dim` when it is not set."""
        return self.value_dim or self.key_dim

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        """Create the projections; shapes in Keras's order `(query, value, key)`."""
        query_shape = check_rank("query", query_shape, 3, "(B, T, q_dim)")
        if value_shape is None:
            value_shape = query_shape if key_shape is None else key_shape
        value_shape = check_rank("value", value_shape, 3, "(B, S, v_dim)")
        key_shape = value_shape if key_shape is None else check_rank(
            "key", key_shape, 3, "(B, S, k_dim)")
        H, d_k, d_v = self.num_heads, self.key_dim, self.head_value_dim
        out_dim = self.output_dim or query_shape[-1]

        self.query_dense = self._dense(H * d_k, "query_dense")
        self.query_dense.build(query_shape)
        H_kv = self.num_key_value_heads
        self.key_dense = self._dense(H_kv * d_k, "key_dense")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense(H_kv * d_v, "value_dense")
        self.value_dense.build(value_shape)
        if self.qk_norm is not None:
            self.query_norm = self._qk_norm("query_norm")
            self.key_norm = self._qk_norm("key_norm")
        self.output_dense = self._dense(out_dim, "output_dense")
        self.output_dense.build(query_shape[:-1] + (H * d_v,))
        self.built = True

    @staticmethod
    def _plain(dense):
        """Whether `dense` computes `x @ kernel + bias` (no LoRA, no quantization)."""
        return not getattr(dense, "lora_enabled", False) and not getattr(
            dense, "quantization_mode", None)

    def _qk_norm(self, name):
        if self.qk_norm == "rms":
            layer = keras.layers.RMSNormalization(
                epsilon=self.qk_norm_epsilon, dtype=self.dtype_policy, name=name)
        else:
            layer = keras.layers.LayerNormalization(
                epsilon=self.qk_norm_epsilon, dtype=self.dtype_policy, name=name)
        layer.build((None, None, None, self.key_dim))
        return layer

    def _positions(self, query, key, cache=None, cache_update_index=None):
        """Query and key absolute positions, bottom-right aligned: `(T,)`, `(S,)`.

        With a cache the new keys sit at `cache_update_index + j` and the
        queries end where they end (see `keras_attn.cache`); with a read-only
        cache the queries end at S_max (its keys were stored rotated).
        """
        T = ops.shape(query)[1]
        if cache is not None and cache_update_index is None:
            return ops.arange(T, dtype="int32") + (ops.shape(cache)[2] - T), None
        S = ops.shape(key)[1]
        start = 0 if cache is None else cache_update_index
        keys = ops.arange(S, dtype="int32") + start  # (S,) or (S_new,)
        S = S + start  # one past the last written position
        return ops.arange(T, dtype="int32") + (S - T), keys

    def _rope(self, x, positions):
        return rotary_embedding(x, positions, max_wavelength=self.rope_max_wavelength,
                                scaling_factor=self.rope_scaling_factor,
                                interleaved=self.rope_interleaved)

    def _project_heads(self, dense, x, head_dim, heads=None):
        """`dense(x)` as `(B, L, heads, d)` (`heads` defaults to H).

        One einsum into the heads layout (as Keras's own MHA does with
        `EinsumDense`), reading the `Dense` kernel `(in, H * d)` as
        `(in, H, d)` (a free reshape). This measured faster than `Dense` +
        reshape in JAX's compiled train step; the weights are the same.
        In float16 it is `dense(x)` (a matmul) and a reshape
        (`_einsum_sums_in_float32`).
        """
        heads = heads or self.num_heads
        if not self._plain(dense) or not _einsum_sums_in_float32(x):
            y = dense(x)  # (B, L, heads * d): Dense's own matmul
            return ops.reshape(y, (ops.shape(y)[0], ops.shape(y)[1], heads, head_dim))
        kernel = ops.reshape(dense.kernel, (dense.kernel.shape[0], heads, head_dim))
        y = ops.einsum("bli,ihd->blhd", x, kernel)
        if dense.bias is not None:
            y = y + ops.reshape(dense.bias, (heads, head_dim))
        return y

    def _project_output(self, attended, heads_first=False):
        """`output_dense` applied to `(B, T, H, d_v)` (or `(B, H, T, d_v)` when
        `heads_first`), contracting heads and width: one einsum, or in float16
        a reshape and `dense` (a matmul; `_einsum_sums_in_float32`)."""
        dense = self.output_dense
        if not self._plain(dense) or not _einsum_sums_in_float32(attended):
            if heads_first:
                attended = ops.swapaxes(attended, 1, 2)  # (B, T, H, d_v)
            B, T = ops.shape(attended)[0], ops.shape(attended)[1]
            attended = ops.reshape(attended, (B, T, self.num_heads * self.head_value_dim))
            return dense(attended)
        kernel = ops.reshape(dense.kernel, (self.num_heads, self.head_value_dim, -1))
        y = ops.einsum("bhtd,hdo->bto" if heads_first else "bthd,hdo->bto", attended, kernel)
        if dense.bias is not None:
            y = y + dense.bias
        return y

    def _attention_mask(self, query, key, attention_mask, key_padding):
        """Merge the explicit mask and the key padding into `(B, H|1, T, S)`."""
        B, T = static_shape(query)[:2]
        S = static_shape(key)[1]
        attention_mask = as_bool_mask("attention_mask", attention_mask)
        if attention_mask is not None:
            rank = len(static_shape(attention_mask))
            if rank == 4:
                check_broadcastable("attention_mask", attention_mask,
                                    (B, self.num_heads, T, S), "(B, H, T, S)")
            else:
                check_broadcastable("attention_mask", attention_mask,
                                    (B, T, S), "(B, T, S)")
                if rank == 3:
                    attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
                # rank < 3 ((T, S) or (S,)) already broadcasts from the right.
        if key_padding is not None:
            check_broadcastable("key_mask", key_padding, (B, S), "(B, S)")
            key_padding = ops.expand_dims(ops.expand_dims(key_padding, 1), 1)  # (B, 1, 1, S)
        return combine_masks(attention_mask, key_padding)

    def _check_inputs(self, query, value, key):
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
                f"Received: key.shape={shapes['key']}, value.shape={shapes['value']}"
            )
        if self.built:
            for name, dense in (("query", self.query_dense), ("value", self.value_dense),
                                ("key", self.key_dense)):
                if name not in shapes:
                    continue
                width, built = shapes[name][-1], dense.kernel.shape[0]
                if width is not None and width != built:
                    raise ValueError(
                        f"Layer '{self.name}' was built for `{name}` of width {built}, "
                        f"and cannot be called on another width. "
                        f"Received: {name}.shape={shapes[name]}"
                    )

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        mask=None,
        cache=None,
        cache_update_index=None,
    ):
        query_mask = query_mask if query_mask is not None else mask
        if cache is None and cache_update_index is not None:
            raise ValueError(
                "`cache_update_index` is where new keys are written into `cache`; without "
                "a cache it has no meaning. Pass `cache=` (see `keras_attn.empty_cache`) "
                f"or drop the index. Received: cache=None, "
                f"cache_update_index={cache_update_index!r}")
        given_masks = (attention_mask, key_mask, value_mask)  # before the defaults below
        read_only = cache is not None and cache_update_index is None
        if read_only:
            # Keys and values come from the cache alone: `key`/`value` are ignored.
            value = key = None
        else:
            if cache is not None and value is None and key is None:
                # The query's Keras mask marks query rows (B, T), not cache slots
                # (B, S_max): it must not become the key mask.
                value = query
            if value is None and key is None:  # self-attention
                value, value_mask = query, (value_mask if value_mask is not None else query_mask)
            elif value is None:
                value, value_mask = key, (value_mask if value_mask is not None else key_mask)
            if key is None:
                key, key_mask = value, (key_mask if key_mask is not None else value_mask)
        self._check_inputs(query, value, key)
        B, T = static_shape(query)[:2]
        S = None if read_only else static_shape(key)[1]
        if cache is not None:
            S, cache_update_index = self._check_cache(cache, query, key, cache_update_index)
            key_shape = (B, S)  # masks are over the cache's slots
        else:
            key_shape = key
        key_padding = combine_masks(as_bool_mask("key_mask", key_mask),
                                    as_bool_mask("value_mask", value_mask))
        if cache is not None:
            self._check_cache_masks(S, *given_masks)
        mask_4d = self._attention_mask(query, key_shape, attention_mask, key_padding)
        is_causal, window = use_causal_mask, self.sliding_window
        if cache is not None:
            # Positions over the cache depend on `cache_update_index`, which may be
            # traced: the causal/window/written-slots mask is built here, explicitly.
            positional = cached_positional_mask(
                T, S, cache_update_index, None if read_only else static_shape(key)[1],
                use_causal_mask, window)
            mask_4d = combine_masks(mask_4d, positional)
            is_causal, window = False, None

        H, d_k = self.num_heads, self.key_dim
        training = bool(training)
        needs_weights = bool(return_attention_scores) or (training and self.dropout > 0.0)
        path = select_implementation(
            self.implementation, lead=(B, H), T=T, S=S, has_mask=mask_4d is not None,
            has_bias=False, is_causal=is_causal, needs_weights=needs_weights,
            symbolic=isinstance(query, keras.KerasTensor),
            has_window=window is not None,
            has_soft_cap=self.logit_soft_cap is not None, device=device_kind(query),
            cached=cache is not None, backend=keras.backend.backend())

        # A traced index cannot be range-checked now: an out-of-range one gives NaN.
        in_range = None
        if cache is not None and not read_only and not isinstance(cache_update_index, int):
            in_range = index_in_range(cache_update_index, ops.shape(key)[1], S)
        q, k, v, new_cache = self._project(query, key, value, cache, cache_update_index,
                                           in_range)
        scale = 1.0 / math.sqrt(d_k)
        scores = None
        heads_first = not (path == "fused" and 0 not in (T, S))
        if not heads_first:
            # Keras's (B, T, H, d) layout: no transposes on our side.
            attended = fused_attention_bthd(
                q, k, v, mask=mask_4d, is_causal=is_causal, scale=scale,
                window=window)  # (B, T, H, d_v)
        else:
            q, k, v = (ops.swapaxes(x, 1, 2) for x in (q, k, v))  # (B, H|H_kv, L, d)
            attended = attend(
                path, q, k, v, mask=mask_4d, is_causal=is_causal, scale=scale,
                dropout_rate=self.dropout, seed=self.seed_generator, training=training,
                return_attention_scores=bool(return_attention_scores),
                window=window, soft_cap=self.logit_soft_cap)
            if return_attention_scores:
                attended, scores = attended
        # (B, T, H, d_v) from the fused path, (B, H, T, d_v) from the others: the
        # output einsum reads either layout, so no transpose back (float16: see
        # `_einsum_sums_in_float32`).
        output = self._project_output(attended, heads_first)  # (B, T, output_dim)
        if in_range is not None:
            output = poison(output, in_range)
        results = (output, scores) if return_attention_scores else (output,)
        if cache is not None:
            results += (new_cache,)
        return results if len(results) > 1 else output

    def _project(self, query, key, value, cache, cache_update_index, in_range=None):
        """Queries, keys and values in `(B, L, heads, d)` after qk-norm and RoPE.

        With a cache, the new keys and values are written into it at
        `cache_update_index` and the keys and values returned are the
        cache's `(B, S_max, H_kv, d)`; with a read-only cache (no index),
        `key` and `value` are not used. `in_range` (a bool scalar tensor, for
        a traced index) turns the written keys and values into NaN when false.

        Returns:
            `(q, k, v, new_cache)`, `new_cache` None without a cache.
        """
        d_k, d_v, H_kv = self.key_dim, self.head_value_dim, self.num_key_value_heads
        q = self._project_heads(self.query_dense, query, d_k)  # (B, T, H, d_k)
        read_only = cache is not None and cache_update_index is None
        if read_only:
            k, v = None, None
        else:
            k = self._project_heads(self.key_dense, key, d_k, H_kv)  # (B, S_new, H_kv, d_k)
            v = self._project_heads(self.value_dense, value, d_v, H_kv)  # (B, S_new, H_kv, d_v)
        if self.qk_norm is not None:
            q = self.query_norm(q)
            k = None if read_only else self.key_norm(k)
        if self.rope_max_wavelength is not None:
            q_positions, k_positions = self._positions(query, key, cache, cache_update_index)
            q = self._rope(q, q_positions)
            k = None if read_only else self._rope(k, k_positions)
        if cache is None:
            return q, k, v, None
        if read_only:
            new_cache = cache
        else:
            new = _cast(ops.stack([k, v], axis=1), cache.dtype)  # (B, 2, S_new, H_kv, d)
            if in_range is not None:
                new = poison(new, in_range)
            new_cache = ops.slice_update(cache, [0, 0, cache_update_index, 0, 0], new)
        k = _cast(new_cache[:, 0], q.dtype)  # (B, S_max, H_kv, d_k)
        v = _cast(new_cache[:, 1], q.dtype)  # (B, S_max, H_kv, d_v)
        return q, k, v, new_cache

    def _check_cache(self, cache, query, key, cache_update_index):
        """Validate a cache call before any computation; returns `(S_max, index)`."""
        if self.head_value_dim != self.key_dim:
            raise ValueError(
                "A key/value cache stores keys and values in one tensor "
                "(B, 2, S_max, H_kv, d): `value_dim` must equal `key_dim`. "
                f"Received: key_dim={self.key_dim}, value_dim={self.value_dim}")
        B = static_shape(query)[0]
        S_max = check_cache(cache, B, self.num_key_value_heads, self.key_dim)[2]
        if cache_update_index is None:
            return S_max, None
        S_new = static_shape(key)[1]
        if S_new is not None and S_new > S_max:
            raise ValueError(
                f"The {S_new} new keys (`key`/`value` length, the query's for "
                f"self-attention) do not fit in a cache of length S_max={S_max}. "
                f"Received: key.shape={static_shape(key)}, cache.shape={static_shape(cache)}")
        check_generation_slots(S_max, S_new, self.name)
        return S_max, check_cache_update_index(cache_update_index, S_new, S_max)

    @staticmethod
    def _check_cache_masks(S_max, attention_mask, key_mask, value_mask):
        """With a cache, every mask's key axis is the S_max slots: never broadcast.

        A `(B, 1)` key mask on a one-token step would otherwise broadcast over
        every slot (a False kills the row, a True drops the prompt's padding).
        """
        for name, mask in (("attention_mask", attention_mask), ("key_mask", key_mask),
                           ("value_mask", value_mask)):
            if mask is None:
                continue
            shape = static_shape(mask)
            if shape and shape[-1] is not None and shape[-1] != S_max:
                raise ValueError(
                    f"With a `cache`, `{name}` is over the cache's S_max={S_max} slots: "
                    f"its last axis must be S_max (mark the cached positions, not only "
                    f"the new ones). Received: {name}.shape={shape}")

    def empty_cache(self, batch_size, max_length, dtype=None):
        """Zeros `(B, 2, S_max, H_kv, d)` for this layer; see `keras_attn.empty_cache`."""
        return empty_cache(self, batch_size, max_length, dtype)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        query_shape = check_rank("query", query_shape, 3, "(B, T, q_dim)")
        return query_shape[:-1] + (self.output_dim or query_shape[-1],)

    def compute_output_spec(
        self, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None,
        attention_mask=None, return_attention_scores=False, training=None,
        use_causal_mask=False, mask=None, cache=None, cache_update_index=None,
    ):
        source = value if value is not None else (key if key is not None else query)
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape), dtype=self.compute_dtype)
        results = (output,)
        if return_attention_scores:
            B, T = query.shape[0], query.shape[1]
            S = source.shape[1] if cache is None else cache.shape[2]
            scores_shape = (B, self.num_heads, T, S)
            results += (keras.KerasTensor(scores_shape, dtype=self.compute_dtype),)
        if cache is not None:
            results += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return results if len(results) > 1 else output

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "output_dim": self.output_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
            "seed": self.seed,
            "implementation": self.implementation,
            "num_key_value_heads": self.num_key_value_heads,
            "rope_max_wavelength": self.rope_max_wavelength,
            "rope_scaling_factor": self.rope_scaling_factor,
            "rope_interleaved": self.rope_interleaved,
            "sliding_window": self.sliding_window,
            "logit_soft_cap": self.logit_soft_cap,
            "qk_norm": self.qk_norm,
            "qk_norm_epsilon": self.qk_norm_epsilon,
        })
        return config


def _output_dim_from_shape(output_dim, output_shape):
    """Keras's `output_shape` (an int or a 1-tuple) as `output_dim`."""
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


def _check_attention_axes(attention_axes):
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


def _implementation_from_flash(implementation, flash_attention):
    """Keras's `flash_attention` flag in terms of `implementation`."""
    if flash_attention is None:
        return implementation
    wanted = "fused" if flash_attention else "explicit"
    if implementation not in ("auto", wanted):
        raise ValueError(
            f"`flash_attention={flash_attention}` means implementation='{wanted}', which "
            f"conflicts with implementation='{implementation}'. Give one of them. "
            f"Received: flash_attention={flash_attention!r}, implementation={implementation!r}"
        )
    return wanted


def check_attention_options(num_heads, key_dim=None, *, num_key_value_heads=None,
                            rope_max_wavelength=None, rope_scaling_factor=1.0,
                            rope_interleaved=False, sliding_window=None, logit_soft_cap=None,
                            qk_norm=None):
    """The grouped-heads / RoPE / window / soft-cap / qk-norm options, checked and normalised.

    `key_dim` None (the encoder/decoder derive it at build) skips the
    even-width check of RoPE until then.
    """
    kv_heads = check_positive_int(
        "num_key_value_heads", num_key_value_heads, allow_none=True) or num_heads
    if num_heads % kv_heads:
        raise ValueError(
            "`num_heads` must be divisible by `num_key_value_heads` (each key/value head "
            f"serves a group of query heads). Received: num_heads={num_heads}, "
            f"num_key_value_heads={kv_heads}")
    wavelength = check_positive_float("rope_max_wavelength", rope_max_wavelength, allow_none=True)
    if wavelength is not None and key_dim is not None and key_dim % 2:
        raise ValueError(
            "Rotary embeddings rotate pairs of features: the head width must be even when "
            f"`rope_max_wavelength` is set. Received: key_dim={key_dim}")
    if qk_norm not in (None, "rms", "layer"):
        raise ValueError(f"`qk_norm` must be None, 'rms' or 'layer'. Received: qk_norm={qk_norm!r}")
    return {
        "num_key_value_heads": kv_heads,
        "rope_max_wavelength": wavelength,
        "rope_scaling_factor": check_positive_float("rope_scaling_factor", rope_scaling_factor),
        "rope_interleaved": bool(rope_interleaved),
        "sliding_window": check_positive_int("sliding_window", sliding_window, allow_none=True),
        "logit_soft_cap": check_positive_float("logit_soft_cap", logit_soft_cap, allow_none=True),
        "qk_norm": qk_norm,
    }


def _einsum_sums_in_float32(x):
    """Whether the projections of `x` may run as one `ops.einsum`: not in float16.

    Every backend's `ops.matmul` sums float16 products in float32 and rounds
    once; their einsums do not all. NumPy's (`np.einsum` in float16, under
    Keras's NumPy backend) rounds every partial sum to float16, 2-3x the
    error of one rounding, and TensorFlow's sums the heads of the heads-first
    output projection (`bhtd,hdo->bto`) in float16. That failed the float16
    parity of cached decoding on NumPy (2.2e-2 from the float64 reference,
    1.8e-2 from TensorFlow), so float16 projections are matmuls: the same
    rule on every backend. float32 and bfloat16 keep the einsum (NumPy runs
    a bfloat16 einsum in float32): the matmul form of the input projections
    measured 8-10% slower in JAX's compiled train step (CPU, B=8 T=128
    D=256 H=8).
    """
    return keras.backend.standardize_dtype(x.dtype) != "float16"


def _cast(x, dtype):
    """`ops.cast`, skipped when `x` already has `dtype` (one op less per decode step)."""
    if keras.backend.standardize_dtype(x.dtype) == keras.backend.standardize_dtype(dtype):
        return x
    return ops.cast(x, dtype)
