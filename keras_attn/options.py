"""`AttentionOptions`: the options of attention, validated once, one name each.

Grouped key/value heads, rotary position embeddings, a sliding window, a
logit soft-cap, qk-norm and the logit scale travel together from a layer's constructor down to
the kernels. They live in one frozen object so that a new option is a field
here (its check and its config entry), its effect where it acts, and nothing
in between: `MultiHeadAttention` and the Transformer blocks hold one, and pass
it on instead of re-listing its fields. A field added here is a keyword
argument of those layers and an entry of their configs at once
(`pop_options`), with no change to the layers.

Names are the public arguments' (the same as keras-hub's and Hugging Face's
where those have them); `H` is `num_heads`, `d` the head width.
"""

import dataclasses
import functools
import numbers

from keras_attn import rope as _rope
from keras_attn._validation import check_positive_float, check_positive_int

__all__ = ["AttentionOptions", "KernelSpec", "expose_options", "kernel_spec", "pop_options"]

QK_NORMS = (None, "rms", "layer", "l2")


def _check_offset(value):
    """`query_scale_offset` as an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError("`query_scale_offset` must be an integer >= 0. "
                         f"Received: query_scale_offset={value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The options that change what attention computes, checked when made.

    The RoPE parameters are the fields of a `keras_attn.rope.RopeSpec`, flat and
    named `rope_` + its field (keras-hub's `RotaryEmbedding` argument where it has
    one), like `rope_max_wavelength`: plain JSON values in the layers' configs
    (their saved form), one keyword each; `rope_type` keeps its name, which both
    libraries use. `options.rope` is that `RopeSpec` (None without RoPE), which
    the layers apply.

    Args:
        num_key_value_heads: H_kv, the key/value heads (grouped-query
            attention; 1 is multi-query), or None for H. Must divide H.
        rope_max_wavelength: the base of rotary position embeddings applied
            to queries and keys per head, or None for none; d must be even.
        rope_scaling_factor: linear position scaling of RoPE (> 0); for
            `rope_type` llama3 and yarn, Hugging Face's `factor`.
        rope_interleaved: pair features (2i, 2i + 1) instead of (i, i + d/2).
        rope_type: `"default"`, `"linear"` (both `theta_i /
            rope_scaling_factor`), `"llama3"` or `"yarn"`, with Hugging Face's
            formulas (`keras_attn.rotary_embedding`), or `"longrope"`
            (`rope_short_factor`, `rope_long_factor`); `"dynamic"` is
            refused. Not `"default"` only with `rope_max_wavelength`.
        rope_low_freq_factor, rope_high_freq_factor: llama3's (Llama 3.1: 1
            and 4; high > low).
        rope_original_max_position_embeddings: llama3 and yarn (required
            there): the context length of pretraining.
        rope_beta_fast, rope_beta_slow: yarn's ramp bounds (32 and 1).
        rope_attention_factor: yarn's multiplier of cos and sin, or None for
            `0.1 ln(rope_scaling_factor) + 1`.
        rope_mscale, rope_mscale_all_dim: yarn's (DeepSeek), or None: both
            set, the attention factor is the ratio of `0.1 m ln s + 1` for
            the two.
        rope_truncate: yarn's: round the ramp's bounds to whole frequencies
            (Hugging Face's default, True).
        rope_partial_rotary_factor: the rotated share of each head, in (0, 1]:
            the leading `int(d * factor)` features (even), with the frequencies
            of a head that wide (transformers' `partial_rotary_factor`).
        sliding_window: W, or None: position p attends j only if
            `0 <= p - j < W` (causal) or `|p - j| < W`.
        logit_soft_cap: c > 0, or None: logits become `c * tanh(logits / c)`.
        qk_norm: None, `"rms"`, `"layer"` or `"l2"`: normalise each head's queries
            and keys over d before RoPE. `"l2"` has no weights: `x / sqrt(mean(x^2) +
            qk_norm_epsilon)` (transformers' `Llama4TextL2Norm`, which Llama 4 applies
            after RoPE: the same numbers, as RoPE rotates pairs of features and keeps
            their mean square); not with `qk_norm_full_width`.
        qk_norm_epsilon: epsilon of the qk norms (> 0).
        scale: the multiplier of the logits `q . k` (> 0), or None for
            `1 / sqrt(d_k)`: `scale` of `keras_attn.scaled_dot_product_attention`,
            `torch.nn.functional.scaled_dot_product_attention` and
            `keras.ops.dot_product_attention` (Gemma's
            `query_pre_attn_scalar ** -0.5`).
        use_sinks: attention sinks (gpt-oss): `MultiHeadAttention` gets a
            weight `sinks` `(H,)`, one logit per query head that joins every
            softmax's denominator and attends nothing (zeros at first;
            `keras_attn.scaled_dot_product_attention`'s `sinks`).
        query_scale_beta, query_scale_length: a position-dependent query scale,
            or None (both None: none): the queries at absolute position p, after
            qk-norm and RoPE, times `1 + query_scale_beta * log(1 + floor(p /
            query_scale_length))` (beta > 0, length a positive int, both set or
            neither). transformers' `get_llama_4_attn_scale` (Ministral 3:
            `rope_parameters["llama_4_scaling_beta"]` and
            `rope_parameters["original_max_position_embeddings"]`). Llama 4's
            temperature tuning (`attn_scale`, `floor_scale`) is the same curve one
            position later, `floor((p + 1) / floor_scale)`: `query_scale_offset=1`.
        attention_chunk_size: C, or None: chunked (block-diagonal) attention, Llama
            4's `attention_chunk_size` (transformers' `chunked_causal_mask_function`):
            position p attends j only if `floor(j / C) == floor(p / C)` (with the
            causal rule when causal), positions absolute (over a cache too).
        qk_norm_full_width: with `qk_norm`, normalise the queries over all H * d
            projected features and the keys over all H_kv * d (one norm each,
            weights `(H * d,)` and `(H_kv * d,)`) instead of each head over d:
            OLMo 2's and OLMo 3's `q_norm = RMSNorm(H * d)` (OLMo-core's
            `use_head_qk_norm=False`), still before RoPE. Needs `qk_norm`.
        rope_short_factor, rope_long_factor: longrope's per-frequency divisors
            (Phi-3.5, Phi-4-mini), or None; both required with `rope_type
            "longrope"`, d/2 each (d the rotated width, checked with the head
            width): `theta_i / rope_short_factor[i]`, or `/ rope_long_factor[i]`
            in a call whose positions reach past
            `rope_original_max_position_embeddings` (see
            `keras_attn.rope.RopeSpec`, which also says how a cache and
            `CausalLM.generate` switch). Tuples (JSON lists in configs).
            `rope_scaling_factor` is transformers' `factor` there and sets only the
            default `rope_attention_factor`.
        attention_k_eq_v: the key projection's output is the values too
            (transformers' `attention_k_eq_v`, Gemma 4's full-attention
            layers): `MultiHeadAttention` has no `value_dense`, and the
            values are the projected keys before `qk_norm` and RoPE (d_v =
            d_k: `value_dim` must be None or `key_dim`).
        use_value_norm: normalise each head's values over d by their root
            mean square, without a scale (`v / sqrt(mean(v^2) +
            qk_norm_epsilon)`: Gemma 4's `v_norm`, an RMSNorm `with_scale=False`),
            before they are cached and attended.
        is_kv_shared_layer: the layer reuses the keys and values of another
            (earlier) layer (transformers' `is_kv_shared_layer`, Gemma 4's
            last `num_kv_shared_layers`): `MultiHeadAttention` has no
            `key_dense`, `value_dense` or `key_norm`, and is called with that
            layer's `KVCache` as `cache` (and the step's `cache_update_index`),
            which it reads and does not write. `CausalLM(kv_sharing=...)`
            passes it.
        query_scale_offset: o, an int >= 0 (0: the default): the query scale reads
            position `p + o`, `1 + query_scale_beta * log(1 + floor((p + o) /
            query_scale_length))`; Llama 4's temperature tuning is o = 1
            (transformers' `Llama4TextAttention`: `floor((positions + 1) /
            floor_scale)`). Needs `query_scale_beta` when not 0.

    Example:

    >>> options = AttentionOptions(num_key_value_heads=2, rope_max_wavelength=1e4)
    >>> options.for_heads(8, key_dim=64).num_key_value_heads
    2
    >>> AttentionOptions(qk_norm="l3")
    Traceback (most recent call last):
        ...
    ValueError: `qk_norm` must be None, 'rms', 'layer' or 'l2'. Received: qk_norm='l3'
    """

    num_key_value_heads: int | None = None
    rope_max_wavelength: float | None = None
    rope_scaling_factor: float = 1.0
    rope_interleaved: bool = False
    sliding_window: int | None = None
    logit_soft_cap: float | None = None
    qk_norm: str | None = None
    qk_norm_epsilon: float = 1e-6
    scale: float | None = None
    rope_type: str = "default"
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int | None = None
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float | None = None
    rope_mscale: float | None = None
    rope_mscale_all_dim: float | None = None
    rope_truncate: bool = True
    rope_partial_rotary_factor: float = 1.0
    use_sinks: bool = False
    query_scale_beta: float | None = None
    query_scale_length: int | None = None
    attention_chunk_size: int | None = None
    qk_norm_full_width: bool = False
    rope_short_factor: tuple | None = None
    rope_long_factor: tuple | None = None
    attention_k_eq_v: bool = False
    use_value_norm: bool = False
    is_kv_shared_layer: bool = False
    query_scale_offset: int = 0

    def __post_init__(self):
        checked = {
            "num_key_value_heads": check_positive_int(
                "num_key_value_heads", self.num_key_value_heads, allow_none=True),
            "sliding_window": check_positive_int(
                "sliding_window", self.sliding_window, allow_none=True),
            "logit_soft_cap": check_positive_float(
                "logit_soft_cap", self.logit_soft_cap, allow_none=True),
            "qk_norm_epsilon": check_positive_float("qk_norm_epsilon", self.qk_norm_epsilon),
            "scale": check_positive_float("scale", self.scale, allow_none=True),
            "use_sinks": bool(self.use_sinks),
            "attention_k_eq_v": bool(self.attention_k_eq_v),
            "use_value_norm": bool(self.use_value_norm),
            "is_kv_shared_layer": bool(self.is_kv_shared_layer),
            "query_scale_beta": check_positive_float(
                "query_scale_beta", self.query_scale_beta, allow_none=True),
            "query_scale_length": check_positive_int(
                "query_scale_length", self.query_scale_length, allow_none=True),
            "attention_chunk_size": check_positive_int(
                "attention_chunk_size", self.attention_chunk_size, allow_none=True),
            "qk_norm_full_width": bool(self.qk_norm_full_width),
            "query_scale_offset": _check_offset(self.query_scale_offset),
        }
        if (self.query_scale_beta is None) != (self.query_scale_length is None):
            raise ValueError(
                "`query_scale_beta` and `query_scale_length` are set together (the scale "
                "`1 + beta * log(1 + floor(p / length))` needs both), or neither. Received: "
                f"query_scale_beta={self.query_scale_beta!r}, "
                f"query_scale_length={self.query_scale_length!r}")
        if self.query_scale_offset != 0 and self.query_scale_beta is None:
            raise ValueError(
                "`query_scale_offset` shifts the position the query scale reads, which needs "
                "`query_scale_beta` and `query_scale_length`. Received: "
                f"query_scale_offset={self.query_scale_offset!r}, query_scale_beta=None")
        # The rope_* fields are a RopeSpec's, flat (their saved form), checked as one.
        rope = _rope.check_rope({name: getattr(self, name if name == "rope_type" else f"rope_{name}")
                                 for name in _rope.FIELDS}, prefix="rope_")
        checked.update({name if name == "rope_type" else f"rope_{name}": value
                        for name, value in rope.items()})
        if self.rope_type != "default" and self.rope_max_wavelength is None:
            raise ValueError(
                "`rope_type` applies to rotary embeddings, which need `rope_max_wavelength`. "
                f"Received: rope_type={self.rope_type!r}, rope_max_wavelength=None")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(
                "`qk_norm` must be None, 'rms', 'layer' or 'l2'. "
                f"Received: qk_norm={self.qk_norm!r}")
        if self.qk_norm_full_width and self.qk_norm is None:
            raise ValueError(
                "`qk_norm_full_width` says over which features `qk_norm` normalises, so it "
                "needs `qk_norm` ('rms' or 'layer'). Received: qk_norm_full_width=True, "
                "qk_norm=None")
        if self.qk_norm_full_width and self.qk_norm == "l2":
            raise ValueError(
                "`qk_norm='l2'` normalises each head over d (Llama 4's `Llama4TextL2Norm`); "
                "keras_attn does not apply it over all heads at once. Received: "
                "qk_norm_full_width=True, qk_norm='l2'")
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # normalised (NumPy ints -> int, ...)

    @functools.cached_property
    def rope(self):
        """The `keras_attn.rope.RopeSpec` of the `rope_*` fields, or None without RoPE."""
        return _rope.RopeSpec.from_options(self)

    def for_heads(self, num_heads, key_dim=None):
        """These options for H `num_heads` of width `key_dim`: H_kv resolved and checked.

        `key_dim` None (the blocks derive it at build) skips RoPE's even-width
        check until then.
        """
        kv_heads = self.num_key_value_heads or num_heads
        if num_heads % kv_heads:
            raise ValueError(
                "`num_heads` must be divisible by `num_key_value_heads` (each key/value head "
                f"serves a group of query heads). Received: num_heads={num_heads}, "
                f"num_key_value_heads={kv_heads}")
        if self.rope_max_wavelength is not None and key_dim is not None and key_dim % 2:
            raise ValueError(
                "Rotary embeddings rotate pairs of features: the head width must be even when "
                f"`rope_max_wavelength` is set. Received: key_dim={key_dim}")
        if self.rope is not None and key_dim is not None:
            self.rope.check_width(key_dim, "rope_")  # even slice; longrope's list lengths
        return dataclasses.replace(self, num_key_value_heads=kv_heads)

    def get_config(self):
        """The fields as a layer's config entries (each under its argument's name)."""
        return dataclasses.asdict(self)


FIELDS = tuple(field.name for field in dataclasses.fields(AttentionOptions))


def pop_options(kwargs, **given):
    """`AttentionOptions(**given, **<the fields found in kwargs>)`, popping those from kwargs.

    The layers list the options they had when they were released as named
    arguments (`given`); any other field arrives in their `**kwargs` (and
    from their configs) and is taken from there before the base layer sees
    `kwargs`.
    """
    found = {name: kwargs.pop(name) for name in FIELDS if name in kwargs and name not in given}
    return AttentionOptions(**given, **found)


def expose_options(cls):
    """Give `cls` a read-only property per field: `layer.<name>` is `layer.options.<name>`."""
    for name in FIELDS:
        setattr(cls, name, property(lambda self, name=name: getattr(self.options, name),
                                    doc=f"`self.options.{name}` (`AttentionOptions`)."))
    return cls


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What one attention kernel call computes besides its tensors: one frozen object
    from `attend` to every path (explicit, fused, blockwise), their block geometry and
    the compile cache, with the public names all the way down.

    `AttentionOptions.kernel_spec(...)` makes it for a layer; the functional core makes
    it from its arguments. Hashable (a key of `keras_attn._kernels.compiled`).
    A new kernel option (attention sinks, a chunk size) is a field here: its
    effect goes in the kernels (or the policy routes around a path), its check in
    `AttentionOptions`.

    Args:
        is_causal: bottom-right aligned causal masking.
        scale: the multiplier of the logits `q . k` (resolved: a float).
        sliding_window: W, or None (`AttentionOptions.sliding_window`).
        logit_soft_cap: c, or None (`AttentionOptions.logit_soft_cap`).
        dropout_rate: dropout of the weights while `training`.
        seed: the dropout's seed (an int, a `keras.random.SeedGenerator`, or None).
        training: whether dropout applies.
        sinks: a sink logit per query head enters every softmax's denominator
            (gpt-oss's `sinks`; the values travel beside the tensors, as a
            `(H,)` tensor, since they are a layer's weights).
        attention_chunk_size: C, or None (`AttentionOptions.attention_chunk_size`):
            position p sees key j only if `floor(j / C) == floor(p / C)`.
        unattended_finite: the keys and values that no query may attend are known
            finite, so the kernels skip zeroing them (`zero_unattended_keys`, a pass
            over every key and value): a cache that `generate` owns, whose unwritten
            slots are zeros and whose written ones the model's own keys
            (`KVCache.unattended_finite`). False: they may hold NaN or inf (a
            caller's padding, a cache someone else filled) and are zeroed.
    """

    is_causal: bool = False
    scale: float = 1.0
    sliding_window: int | None = None
    logit_soft_cap: float | None = None
    dropout_rate: float = 0.0
    seed: object = None
    training: bool = False
    sinks: bool = False
    attention_chunk_size: int | None = None
    unattended_finite: bool = False

    # The fields that transform the logits `q . k * scale` elementwise, applied in that
    # order by `keras_attn._kernels.common.transform_logits` on the explicit and
    # blockwise paths; the fused kernel (`keras.ops.dot_product_attention`) applies none,
    # so the policy routes a call that sets one elsewhere.
    LOGIT_TRANSFORMS = ("logit_soft_cap",)

    @property
    def unfusable(self):
        """The names of the set fields that the fused kernel cannot apply."""
        return tuple(name for name in self.LOGIT_TRANSFORMS if getattr(self, name) is not None)

    @property
    def positional(self):
        """Whether positions mask keys (causal, a window or chunks)."""
        return (self.is_causal or self.sliding_window is not None
                or self.attention_chunk_size is not None)

    @property
    def drops(self):
        """Whether dropout applies (random state: such a call is not compiled alone)."""
        return bool(self.training and self.dropout_rate > 0.0)

    def inference(self):
        """This spec without dropout (what a compiled eager call is keyed on)."""
        if not (self.dropout_rate or self.seed is not None or self.training):
            return self
        return dataclasses.replace(self, dropout_rate=0.0, seed=None, training=False)


def kernel_spec(options, *, is_causal=False, scale, dropout_rate=0.0, seed=None,
                training=False, sliding_window="options", sinks=False,
                attention_chunk_size="options", unattended_finite=False):
    """The `KernelSpec` of `options` (an `AttentionOptions`) for one call.

    `scale` is resolved by the caller (`options.scale` or `1 / sqrt(d_k)`);
    `sliding_window` / `attention_chunk_size` None: that rule is in the mask
    already (a cached call). `unattended_finite`: see `KernelSpec`.
    """
    return KernelSpec(
        attention_chunk_size=(options.attention_chunk_size if attention_chunk_size == "options"
                              else attention_chunk_size),
        is_causal=bool(is_causal), scale=float(scale),
        sliding_window=options.sliding_window if sliding_window == "options" else sliding_window,
        dropout_rate=float(dropout_rate), seed=seed, training=bool(training), sinks=bool(sinks),
        unattended_finite=bool(unattended_finite),
        # Every logit transform is an AttentionOptions field of the same name.
        **{name: getattr(options, name) for name in KernelSpec.LOGIT_TRANSFORMS})
