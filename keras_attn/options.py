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

from keras_attn._validation import check_positive_float, check_positive_int

__all__ = ["AttentionOptions", "expose_options", "pop_options"]

QK_NORMS = (None, "rms", "layer")


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The options that change what attention computes, checked when made.

    Args:
        num_key_value_heads: H_kv, the key/value heads (grouped-query
            attention; 1 is multi-query), or None for H. Must divide H.
        rope_max_wavelength: the base of rotary position embeddings applied
            to queries and keys per head, or None for none; d must be even.
        rope_scaling_factor: linear position scaling of RoPE (> 0).
        rope_interleaved: pair features (2i, 2i + 1) instead of (i, i + d/2).
        sliding_window: W, or None: position p attends j only if
            `0 <= p - j < W` (causal) or `|p - j| < W`.
        logit_soft_cap: c > 0, or None: logits become `c * tanh(logits / c)`.
        qk_norm: None, `"rms"` or `"layer"`: normalise each head's queries
            and keys over d before RoPE.
        qk_norm_epsilon: epsilon of the qk norms (> 0).
        scale: the multiplier of the logits `q . k` (> 0), or None for
            `1 / sqrt(d_k)`: `scale` of `keras_attn.scaled_dot_product_attention`,
            `torch.nn.functional.scaled_dot_product_attention` and
            `keras.ops.dot_product_attention` (Gemma's
            `query_pre_attn_scalar ** -0.5`).

    Example:

    >>> options = AttentionOptions(num_key_value_heads=2, rope_max_wavelength=1e4)
    >>> options.for_heads(8, key_dim=64).num_key_value_heads
    2
    >>> AttentionOptions(qk_norm="l2")
    Traceback (most recent call last):
        ...
    ValueError: `qk_norm` must be None, 'rms' or 'layer'. Received: qk_norm='l2'
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

    def __post_init__(self):
        checked = {
            "num_key_value_heads": check_positive_int(
                "num_key_value_heads", self.num_key_value_heads, allow_none=True),
            "rope_max_wavelength": check_positive_float(
                "rope_max_wavelength", self.rope_max_wavelength, allow_none=True),
            "rope_scaling_factor": check_positive_float(
                "rope_scaling_factor", self.rope_scaling_factor),
            "rope_interleaved": bool(self.rope_interleaved),
            "sliding_window": check_positive_int(
                "sliding_window", self.sliding_window, allow_none=True),
            "logit_soft_cap": check_positive_float(
                "logit_soft_cap", self.logit_soft_cap, allow_none=True),
            "qk_norm_epsilon": check_positive_float("qk_norm_epsilon", self.qk_norm_epsilon),
            "scale": check_positive_float("scale", self.scale, allow_none=True),
        }
        if self.qk_norm not in QK_NORMS:
            raise ValueError(
                f"`qk_norm` must be None, 'rms' or 'layer'. Received: qk_norm={self.qk_norm!r}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # normalised (NumPy ints -> int, ...)

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
