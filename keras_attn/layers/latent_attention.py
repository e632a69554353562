"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3) as a Keras layer.

`call`: project the queries (through a low-rank `q_a` / `q_b` pair, or one projection)
and the latent `kv_a_proj_with_mqa(x) = [latent, shared RoPE key]` -> RoPE on the
queries' and the shared key's rotary parts -> with a cache, one `LatentCache.update`
(the latent and the rotated shared key written, the slots read) -> attention in one of
two forms (`_expanded`, `_absorbed`), both through `attend_heads` -> output projection.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from keras_attn import cache as kv_cache
from keras_attn._observe import record_path
from keras_attn._shapes import static_shape
from keras_attn._typing import Initializer
from keras_attn._validation import (
    as_bool_mask,
    check_dropout,
    check_floating,
    check_positive_float,
    check_positive_int,
    check_rank,
)
from keras_attn.attention import attend_heads, combine_masks
from keras_attn.latent_cache import LatentCache
from keras_attn.layers import _keras_compat as compat
from keras_attn.layers import _projection as projection
from keras_attn.layers._common import check_not_quantized
from keras_attn.options import expose_options, pop_options

__all__ = ["DECODE_FORMS", "MultiHeadLatentAttention"]

DECODE_FORMS = ("auto", "absorbed", "expanded")
# AttentionOptions fields that are not part of DeepSeek's attention, with their neutral value.
_NOT_IN_MLA = {"sliding_window": None, "logit_soft_cap": None,
               "qk_norm": None, "use_sinks": False, "query_scale_beta": None,
               "query_scale_length": None, "rope_partial_rotary_factor": 1.0}


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadLatentAttention(keras.layers.Layer):
    """Multi-head latent attention (MLA), as DeepSeek V2 and V3 define it.

    Every head's keys and values are expanded from one compressed latent per
    position (r = `kv_lora_rank` wide), and every head shares one RoPE key
    (`qk_rope_head_dim` wide); a cache holds only those two
    (`keras_attn.latent_cache.LatentCache`). For a query position t and head h:

        q_h = [q_nope_h, RoPE(q_rope_h)]   (from x W_q, or q_b(RMSNorm(q_a(x))))
        [c, k_rope] = x W_kv_a              (c: the latent, r wide; k_rope shared)
        c = RMSNorm(c);  [k_nope_h, v_h] = c W_kv_b^h
        k_h = [k_nope_h, RoPE(k_rope)]
        output = concat_h(softmax(q_h k_h^T * scale) v_h) W_o

    Two forms compute that attention (`decode`): **expanded** (transformers' code:
    expand the latent through `kv_b_proj` to full keys and values, d_qk = nope +
    rope, d_v = `v_head_dim`) and **absorbed** (DeepSeek-V2's Section 2.1.3: the
    key half of `kv_b_proj` is absorbed into the queries, `q_nope_h W_uk^h^T`,
    which then attend the latent and the shared RoPE key directly as one
    key/value head, d_qk = r + rope, d_v = r; the attended latent goes through
    the value half `W_uv^h` before `o_proj`). The logits are the same numbers
    (`q_nope . (c W_uk) = (q_nope W_uk^T) . c`), so both give the same output
    to rounding; absorbed never materialises per-head keys and values.

    Shapes: B batch, T query / S key length, D the input width, H `num_heads`,
    r `kv_lora_rank`, d_nope `qk_nope_head_dim`, d_rope `qk_rope_head_dim`,
    d_qk = d_nope + d_rope, d_v `v_head_dim`, q_r `q_lora_rank`.

    Weights: `keras.layers.Dense` / `keras.layers.RMSNormalization` sublayers,
    named in Keras's style after transformers' `DeepseekV3Attention` modules
    (a torch `Linear` weight is the transpose of the Keras kernel):

    | keras_attn sublayer   | transformers module  | kernel / scale           |
    |-----------------------|----------------------|--------------------------|
    | `query_dense`         | `q_proj`             | `(D, H * d_qk)`, q_r None |
    | `query_a_dense`       | `q_a_proj`           | `(D, q_r)`               |
    | `query_a_norm`        | `q_a_layernorm`      | `(q_r,)`                 |
    | `query_b_dense`       | `q_b_proj`           | `(q_r, H * d_qk)`        |
    | `key_value_a_dense`   | `kv_a_proj_with_mqa` | `(D, r + d_rope)`        |
    | `key_value_a_norm`    | `kv_a_layernorm`     | `(r,)`                   |
    | `key_value_b_dense`   | `kv_b_proj`          | `(r, H * (d_nope + d_v))` |
    | `output_dense`        | `o_proj`             | `(H * d_v, output_dim)`  |

    Head h owns columns `[h * d_qk, (h + 1) * d_qk)` of the query kernels (its
    nope part first, then its rope part) and `[h * (d_nope + d_v), ...)` of
    `key_value_b_dense` (its key part first, then its value part); the latent
    comes first in `key_value_a_dense`, the shared RoPE key last. Biases: as
    transformers' `attention_bias`, on `query_a_dense`, `key_value_a_dense`
    and `output_dense` only (`use_bias`).

    Args:
        num_heads: H (transformers' `num_attention_heads`).
        kv_lora_rank: r, the width of the compressed key/value latent.
        qk_nope_head_dim: d_nope, each head's query/key part without RoPE.
        qk_rope_head_dim: d_rope, each head's rotary query part and the shared
            rotary key's width (even with RoPE).
        v_head_dim: d_v, each head's value width.
        q_lora_rank: q_r, the width of the low-rank query projection
            (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), or None for one `q_proj`.
        output_dim: width of the output; defaults to D.
        use_bias: transformers' `attention_bias`.
        layer_norm_epsilon: epsilon of `q_a_layernorm` and `kv_a_layernorm`
            (transformers' `rms_norm_eps`).
        dropout: dropout rate on the attention weights (training only).
        decode: `"auto"` (default), `"absorbed"` or `"expanded"`: the form of the
            attention (see above). `"auto"` takes the absorbed form for a call
            over a cache with at most `ABSORB_MAX_QUERIES` (8) queries (per-token
            decoding), where it measured faster, and the expanded form otherwise
            (training, prefill: fewer FLOPs when T is long).
        implementation: the kernel path, as `MultiHeadAttention`'s.
        kernel_initializer, bias_initializer, kernel_regularizer,
            bias_regularizer, kernel_constraint, bias_constraint: of the dense
            sublayers, as in `keras.layers.Dense`.
        seed: int seed of the attention dropout.
        rope_max_wavelength: RoPE's base (transformers' `rope_theta`), or None
            for no RoPE on the rotary parts; default 10000.
        rope_interleaved: pair features (2i, 2i + 1) of the rotary parts
            (DeepSeek's `rope_interleave`, True by default here as there).
            transformers' interleaved kernel also de-interleaves its output (the
            evens then the odds); a dot product of two vectors permuted alike is
            unchanged, so the attention is the same.
        scale: the softmax scale (`AttentionOptions.scale`), or None for
            `1 / sqrt(d_qk)`. DeepSeek's yarn checkpoints multiply it by
            `mscale**2`, `mscale = 0.1 * mscale_all_dim * ln(factor) + 1`
            (transformers' `yarn_apply_mscale`; the converter computes it).
        **kwargs: the other RoPE fields of `keras_attn.options.AttentionOptions`
            (`rope_type`, `rope_scaling_factor`, yarn's `rope_mscale`,
            `rope_mscale_all_dim`, ...), and base layer arguments (`name`,
            `dtype`, ...). The options that DeepSeek's attention does not have
            (`num_key_value_heads`, `sliding_window`, `logit_soft_cap`,
            `qk_norm`, `use_sinks`, the query scale, a partial rotary factor)
            are refused. Stored as `self.options`.

    Call arguments:
        query: `(B, T, D)`, floating (self-attention).
        attention_mask: bool or integer, broadcastable to `(B, T, S)` or
            `(B, H, T, S)`; True = may attend (S = S_max with a cache).
        use_causal_mask: query i attends keys `j <= i + (S - T)`.
        cache: a `keras_attn.latent_cache.LatentCache` (`layer.empty_cache`), or None.
        cache_update_index: where the T new positions are written, an int or
            scalar int tensor in `[0, S_max - T]`; positions (RoPE, causal)
            follow it, unwritten slots are never attended.
        return_attention_scores: also return the weights `(B, H, T, S)`.
        training: whether attention dropout is active.
        mask: the query's Keras mask `(B, T)` (filled in by Keras from a masked
            input): without a cache, its padded positions are never attended as
            keys; the output carries it.

    Returns:
        The output `(B, T, output_dim)`; with `return_attention_scores` also
        the weights; with a `cache`, the new `LatentCache` last.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadLatentAttention(num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8,
    ...                                  qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=12)
    >>> x = np.zeros((2, 5, 32), "float32")
    >>> tuple(layer(x, use_causal_mask=True).shape)
    (2, 5, 32)
    >>> cache = layer.empty_cache(2, 16)
    >>> y, cache = layer(x, use_causal_mask=True, cache=cache, cache_update_index=0)
    >>> tuple(cache.latent.shape), tuple(cache.rope_keys.shape)
    ((2, 16, 16), (2, 16, 4))
    """

    # Measured (benchmarks/latent_decode.py, torch CPU): absorbed 2.8-3.7x faster at T <= 8,
    # slower from T = 16 on.
    ABSORB_MAX_QUERIES = 8

    def __init__(self, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None,
                 output_dim: int | None = None, use_bias: bool = False,
                 layer_norm_epsilon: float = 1e-6, dropout: float = 0.0, decode: str = "auto",
                 implementation: str | Callable = "auto",
                 kernel_initializer: Initializer = "glorot_uniform",
                 bias_initializer: Initializer = "zeros", kernel_regularizer: Any = None,
                 bias_regularizer: Any = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, seed: int | None = None,
                 rope_max_wavelength: float | None = 10000.0, rope_interleaved: bool = True,
                 scale: float | None = None, **kwargs) -> None:
        options = pop_options(kwargs, rope_max_wavelength=rope_max_wavelength,
                              rope_interleaved=rope_interleaved, scale=scale)
        super().__init__(**kwargs)
        for name, neutral in _NOT_IN_MLA.items():
            if getattr(options, name) != neutral:
                raise ValueError(
                    f"`{name}` is not part of multi-head latent attention (DeepSeek's attention "
                    f"has none; its key/value heads are expanded from one latent). Received: "
                    f"{name}={getattr(options, name)!r}")
        self.num_heads = check_positive_int("num_heads", num_heads)
        if options.num_key_value_heads not in (None, self.num_heads):  # H: a saved config's
            raise ValueError(
                "`num_key_value_heads` is not part of multi-head latent attention: every head's "
                "keys and values are expanded from one latent. Received: "
                f"num_key_value_heads={options.num_key_value_heads!r}")
        self.kv_lora_rank = check_positive_int("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = check_positive_int("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = check_positive_int("qk_rope_head_dim", qk_rope_head_dim)
        self.v_head_dim = check_positive_int("v_head_dim", v_head_dim)
        self.q_lora_rank = check_positive_int("q_lora_rank", q_lora_rank, allow_none=True)
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.use_bias = bool(use_bias)
        self.layer_norm_epsilon = check_positive_float("layer_norm_epsilon", layer_norm_epsilon)
        self.dropout = check_dropout("dropout", dropout)
        if decode not in DECODE_FORMS:
            raise ValueError(f"`decode` must be one of {DECODE_FORMS}. Received: decode={decode!r}")
        self.decode = decode
        self.implementation = compat.implementation_from_config(implementation)
        projection.set_dense_arguments(
            self, kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
            kernel_constraint=kernel_constraint, bias_constraint=bias_constraint)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        self.options = options.for_heads(self.num_heads, self.qk_rope_head_dim)
        # What the kernels get: the scale resolved for d_qk, whichever form runs (the
        # absorbed form's head is r + d_rope wide, but its logits are the same numbers).
        self._kernel_options = dataclasses.replace(self.options, scale=self.softmax_scale)
        self.supports_masking = True

    @property
    def qk_head_dim(self):
        """d_qk = `qk_nope_head_dim + qk_rope_head_dim`."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self):
        """The multiplier of the logits: `scale`, or `1 / sqrt(d_qk)`."""
        return self.options.scale or 1.0 / math.sqrt(self.qk_head_dim)

    def build(self, query_shape):
        query_shape = check_rank("query", query_shape, 3, "(B, T, D)")
        H, r, d_rope = self.num_heads, self.kv_lora_rank, self.qk_rope_head_dim
        lead = query_shape[:-1]

        def dense(name, units, input_width, use_bias):
            layer = projection.dense(self, units, name, use_bias=use_bias)
            layer.build(lead + (input_width,))
            setattr(self, name, layer)

        def norm(name, width):
            layer = keras.layers.RMSNormalization(epsilon=self.layer_norm_epsilon,
                                                  dtype=self.dtype_policy, name=name)
            layer.build(lead + (width,))
            setattr(self, name, layer)

        D = query_shape[-1]
        if self.q_lora_rank is None:
            dense("query_dense", H * self.qk_head_dim, D, False)
        else:
            dense("query_a_dense", self.q_lora_rank, D, self.use_bias)
            norm("query_a_norm", self.q_lora_rank)
            dense("query_b_dense", H * self.qk_head_dim, self.q_lora_rank, False)
        dense("key_value_a_dense", r + d_rope, D, self.use_bias)
        norm("key_value_a_norm", r)
        dense("key_value_b_dense", H * (self.qk_nope_head_dim + self.v_head_dim), r, False)
        dense("output_dense", self.output_dim or D, H * self.v_head_dim, self.use_bias)
        self.built = True

    def call(self, query, attention_mask=None, use_causal_mask=False, cache=None,
             cache_update_index=None, return_attention_scores=False, training=None, mask=None):
        check_rank("query", query, 3, "(B, T, D)")
        check_floating("query", query)
        if cache is not None and not isinstance(cache, LatentCache):
            raise ValueError(
                "`cache` of a MultiHeadLatentAttention must be a "
                "`keras_attn.latent_cache.LatentCache` "
                f"(`layer.empty_cache(B, S_max)`). Received: cache of type {type(cache).__name__}")
        kv_cache.check_index_has_cache(cache, cache_update_index)
        if cache is not None and cache_update_index is None:
            raise ValueError(
                "A latent cache is written by self-attention: give `cache_update_index` (where "
                "the T new positions go). Received: cache_update_index=None")
        (B, T), H = static_shape(query)[:2], self.num_heads
        q_nope, q_rope, latent, k_rope = self._project(query)
        step = None
        if cache is None:
            q_positions, k_positions = kv_cache.positions(T, T)
            if self.rope_max_wavelength is not None:
                q_rope = projection.rope(q_rope, q_positions, self.options)
                k_rope = projection.rope(k_rope, k_positions, self.options)
            is_causal, S = use_causal_mask, T
        else:  # RoPE'd shared keys written (the cache's "keys"), latents as its "values"
            step = cache.update(
                k_rope, latent, cache_update_index, query_length=T, batch_size=B,
                num_key_value_heads=1, key_dim=self.qk_rope_head_dim,
                value_dim=self.kv_lora_rank, is_causal=use_causal_mask, dtype=q_nope.dtype,
                rope=self._rope_keys if self.rope_max_wavelength is not None else None,
                masks={"attention_mask": attention_mask})
            if self.rope_max_wavelength is not None:
                q_rope = projection.rope(q_rope, step.query_positions, self.options)
            k_rope, latent = step.keys, step.values  # (B, S_max, 1, d_rope | r)
            is_causal, S = False, cache.max_length  # the rules are in `step.mask`
        key_padding = None if cache is not None else as_bool_mask("mask", mask)
        mask = compat.merge_masks(B, T, S, H, attention_mask, key_padding)
        if step is not None:
            mask = combine_masks(mask, step.mask)
        form = record_path(self._form(cache is not None, T))
        attend = self._absorbed if form == "latent_absorbed" else self._expanded
        attended, scores = attend(q_nope, q_rope, latent, k_rope, mask, is_causal,
                                  training=training, cached=cache is not None,
                                  return_attention_scores=return_attention_scores)
        output = projection.project_output(self.output_dense, attended, H, self.v_head_dim,
                                           heads_first=True)  # (B, T, D_out)
        output = output if step is None else step.poison(output)
        results = ((output, scores) if return_attention_scores else (output,)) + (
            () if cache is None else (step.cache,))
        return results if len(results) > 1 else output

    def _form(self, cached, query_length):
        """"latent_absorbed" or "latent_expanded" (the name recorded for `observe_paths`)."""
        if self.decode == "auto":
            plain = projection._plain(self.key_value_b_dense)  # no LoRA / quantized kernel
            absorbed = cached and plain and query_length is not None and (
                query_length <= self.ABSORB_MAX_QUERIES)
            return "latent_absorbed" if absorbed else "latent_expanded"
        if self.decode == "absorbed" and not projection._plain(self.key_value_b_dense):
            raise ValueError(
                "`decode='absorbed'` reads `key_value_b_dense`'s kernel into the queries; a "
                "LoRA or quantized kernel is not a plain matrix. Received: decode='absorbed'")
        return f"latent_{self.decode}"

    def _project(self, query):
        """`(q_nope (B, T, H, d_nope), q_rope (B, T, H, d_rope), latent (B, T, 1, r),
        k_rope (B, T, 1, d_rope))`, before RoPE (the latent after `key_value_a_norm`)."""
        H, d_nope, r = self.num_heads, self.qk_nope_head_dim, self.kv_lora_rank
        if self.q_lora_rank is None:
            q = projection.project_heads(self.query_dense, query, H, self.qk_head_dim)
        else:
            q_a = self.query_a_norm(self.query_a_dense(query))  # (B, T, q_r)
            q = projection.project_heads(self.query_b_dense, q_a, H, self.qk_head_dim)
        compressed = self.key_value_a_dense(query)  # (B, T, r + d_rope)
        latent = self.key_value_a_norm(compressed[..., :r])  # (B, T, r)
        k_rope = compressed[..., r:]  # (B, T, d_rope), one head shared by all
        return (q[..., :d_nope], q[..., d_nope:], ops.expand_dims(latent, 2),
                ops.expand_dims(k_rope, 2))

    def _attend(self, q, k, v, mask, is_causal, training, cached, return_attention_scores):
        """`attend_heads` with this layer's settings; `(attended (B, H, T, d), scores)`."""
        attended, scores, heads_first = attend_heads(
            q, k, v, self._kernel_options, mask=mask, is_causal=is_causal,
            implementation=self.implementation, dropout_rate=self.dropout,
            seed=self.seed_generator, training=training,
            return_attention_scores=return_attention_scores, cached=cached,
            window_in_mask=True)
        return (attended if heads_first else ops.swapaxes(attended, 1, 2)), scores

    def _expanded(self, q_nope, q_rope, latent, k_rope, mask, is_causal, **call):
        """Keys and values of every head expanded from the latent (transformers' form)."""
        H, d_nope, d_v = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
        kv = projection.project_heads(self.key_value_b_dense, latent[:, :, 0], H,
                                      d_nope + d_v)  # (B, S, H, d_nope + d_v)
        k_nope, v = kv[..., :d_nope], kv[..., d_nope:]
        k_rope = ops.broadcast_to(k_rope, tuple(ops.shape(k_nope)[:3]) + (
            self.qk_rope_head_dim,))  # (B, S, H, d_rope)
        q = ops.concatenate([q_nope, q_rope], axis=-1)  # (B, T, H, d_qk)
        k = ops.concatenate([k_nope, k_rope], axis=-1)  # (B, S, H, d_qk)
        return self._attend(q, k, v, mask, is_causal, **call)

    def _absorbed(self, q_nope, q_rope, latent, k_rope, mask, is_causal, **call):
        """The key half of `kv_b_proj` absorbed into the queries, the value half applied
        after attention: one key/value head `[latent, k_rope]` of width r + d_rope."""
        H, d_nope, r = self.num_heads, self.qk_nope_head_dim, self.kv_lora_rank
        kernel = ops.reshape(self.key_value_b_dense.kernel, (r, H, d_nope + self.v_head_dim))
        kernel = ops.cast(ops.transpose(kernel, (1, 0, 2)), q_nope.dtype)  # (H, r, nope + v)
        w_uk, w_uv = kernel[..., :d_nope], kernel[..., d_nope:]  # (H, r, d_nope), (H, r, d_v)
        # Matmuls, not einsums: they sum float16 products in float32 on every backend
        # (`_projection.einsum_sums_in_float32`).
        q_latent = ops.matmul(ops.swapaxes(q_nope, 1, 2), ops.swapaxes(w_uk, 1, 2))  # (B, H, T, r)
        q = ops.concatenate([ops.swapaxes(q_latent, 1, 2), q_rope], axis=-1)  # (B, T, H, r + rope)
        k = ops.concatenate([latent, k_rope], axis=-1)  # (B, S, 1, r + d_rope)
        attended, scores = self._attend(q, k, latent, mask, is_causal, **call)  # (B, H, T, r)
        return ops.matmul(attended, w_uv), scores  # (B, H, T, d_v)

    def _rope_keys(self, keys, positions):
        """RoPE of the new shared keys at their absolute positions (`KVCache.update`'s)."""
        return projection.rope(keys, positions, self.options)

    def empty_cache(self, batch_size, max_length, dtype=None, *, as_kv_cache=True):
        """A zero `keras_attn.latent_cache.LatentCache`: latent `(B, S_max, r)` and RoPE keys
        `(B, S_max, d_rope)`, in `dtype` (default the layer's compute dtype).

        `as_kv_cache` must stay True: the latent cache is a `KVCache` subclass and has no
        keras-hub tensor form.
        """
        if not as_kv_cache:
            raise ValueError(
                "A multi-head latent attention cache is a `LatentCache` (a `KVCache`): it has "
                "no keras-hub (B, 2, S_max, H_kv, d) tensor form. Received: as_kv_cache=False")
        return LatentCache.empty(batch_size, max_length, self.kv_lora_rank,
                                          self.qk_rope_head_dim, dtype or self.compute_dtype)

    def cache_bytes_per_token(self, dtype=None):
        """`(latent, expanded)`: bytes per cached position of the latent cache, `r +
        d_rope` numbers, and of a full key/value cache, `H * (d_qk + d_v)`."""
        size = keras.backend.standardize_dtype(dtype or self.compute_dtype)
        width = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[size]
        return (width * (self.kv_lora_rank + self.qk_rope_head_dim),
                width * self.num_heads * (self.qk_head_dim + self.v_head_dim))

    def compute_output_shape(self, query_shape):
        query_shape = check_rank("query", query_shape, 3, "(B, T, D)")
        return query_shape[:-1] + (self.output_dim or query_shape[-1],)

    def compute_output_spec(self, query, attention_mask=None, use_causal_mask=False, cache=None,
                            cache_update_index=None, return_attention_scores=False,
                            training=None, mask=None):
        results = (keras.KerasTensor(self.compute_output_shape(query.shape),
                                     dtype=self.compute_dtype),)
        if return_attention_scores:
            S = query.shape[1] if cache is None else kv_cache.cache_length(cache)
            results += (keras.KerasTensor((query.shape[0], self.num_heads, query.shape[1], S),
                                          dtype=self.compute_dtype),)
        if cache is not None:
            results += (kv_cache.cache_spec(cache),)
        return results if len(results) > 1 else results[0]

    def get_config(self):
        check_not_quantized(self)
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads, "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim, "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim, "q_lora_rank": self.q_lora_rank,
            "output_dim": self.output_dim, "use_bias": self.use_bias,
            "layer_norm_epsilon": self.layer_norm_epsilon, "dropout": self.dropout,
            "decode": self.decode,
            "implementation": compat.implementation_config(self.implementation),
            **projection.dense_config(self), "seed": self.seed,
            **self.options.get_config(),
        })
        return config


expose_options(MultiHeadLatentAttention)  # layer.rope_max_wavelength, layer.scale, ...
