"""`RopeSpec`: what rotary position embeddings compute, one frozen object, and the registry
from `rope_type` to its frequency function.

transformers keeps one `rope_parameters` dict per model and a registry
(`ROPE_INIT_FUNCTIONS`) from its `rope_type` to the function that computes the
inverse frequencies and the attention factor; keras_attn does the same with one
frozen, checked object. It is made by `RotaryEmbedding` and `rotary_embedding`
from their arguments, by `AttentionOptions` from its flat `rope_*` fields (their
saved form: `AttentionOptions.rope`), and by the converters from a Hugging Face
config (`RopeSpec.from_rope_parameters`). A new RoPE type is one entry of
`ROPE_TYPES` (its frequency function and the parameters it reads); a new parameter
is a field here, with `RotaryEmbedding`'s argument and `AttentionOptions`'
`rope_<name>` field of the same name.

The field names are `RotaryEmbedding`'s arguments (keras-hub's names where it
has them: `max_wavelength` is transformers' `rope_theta`, `scaling_factor` its
`factor`; the others are transformers' own). d is the rotated head width.
"""

import dataclasses
import functools
import math
import numbers
from collections.abc import Callable, Mapping

import numpy as np

from keras_attn._validation import check_positive_float

__all__ = ["ROPE_TYPES", "RopeSpec", "RopeType"]


@dataclasses.dataclass(frozen=True)
class RopeType:
    """One `rope_type`: its frequency function and the `RopeSpec` fields it reads.

    Args:
        frequencies: `(spec, d) -> (theta, attention_factor)`: the d/2 inverse
            frequencies (float64 NumPy) and the multiplier of cos and sin.
        parameters: the Hugging Face `rope_parameters` keys it reads besides
            `rope_type` and `rope_theta`, as `{hf_key: RopeSpec field}`.
        required: the keys of `parameters` that must be given (transformers raises a
            `KeyError` without them; yarn defaults its own).
        long_frequencies: None, or `(spec, d) -> (theta, attention_factor)` used
            instead of `frequencies` by a call whose positions reach past
            `original_max_position_embeddings` (`max(positions) + 1 > original`:
            transformers' `longrope_frequency_update`), the same for all its positions.
        whole_head: the type reads `partial_rotary_factor` in its frequencies and
            rotates the whole head (transformers' "proportional": the frequencies past
            the rotated share are 0), instead of rotating a leading slice.
    """

    frequencies: Callable
    parameters: Mapping = dataclasses.field(default_factory=dict)
    required: tuple = ()
    long_frequencies: Callable | None = None
    whole_head: bool = False


def _base_frequencies(spec, dim):
    return 1.0 / float(spec.max_wavelength) ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def _linear(spec, dim):
    return _base_frequencies(spec, dim) / spec.scaling_factor, 1.0


def _llama3(spec, dim):
    inv = _base_frequencies(spec, dim)  # (d/2,)
    old = float(spec.original_max_position_embeddings)
    low, high = spec.low_freq_factor, spec.high_freq_factor
    low_wavelength, high_wavelength = old / low, old / high
    wavelength = 2 * math.pi / inv
    scaled = np.where(wavelength > low_wavelength, inv / spec.scaling_factor, inv)
    smooth = (old / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / spec.scaling_factor + smooth * scaled
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return np.where(medium, smoothed, scaled), 1.0


def _yarn_mscale(factor, mscale=1.0):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(spec, dim):
    inv = _base_frequencies(spec, dim)  # (d/2,)
    base, old, factor = float(spec.max_wavelength), float(
        spec.original_max_position_embeddings), spec.scaling_factor

    def correction_dim(rotations):  # the frequency index that turns `rotations` times
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no zero division
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    theta = (inv / factor) * ramp + inv * (1 - ramp)
    attention_factor = spec.attention_factor
    if attention_factor is None:
        if spec.mscale and spec.mscale_all_dim:
            attention_factor = (_yarn_mscale(factor, spec.mscale)
                                / _yarn_mscale(factor, spec.mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    return theta, float(attention_factor)


def _longrope_attention_factor(spec):
    if spec.attention_factor is not None:
        return spec.attention_factor
    factor = spec.scaling_factor  # transformers' `factor` (or max / original positions)
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(spec.original_max_position_embeddings))


def _longrope_with(name):
    def frequencies(spec, dim):
        factors = getattr(spec, name)
        if len(factors) != dim // 2:
            raise ValueError(
                f"`{name}` holds one factor per rotated frequency: {dim // 2} for a rotated "
                f"width {dim}. Received: {name} of length {len(factors)}")
        return (_base_frequencies(spec, dim) / np.asarray(factors, np.float64),
                _longrope_attention_factor(spec))
    return frequencies
def _proportional(spec, dim):
    """transformers' "proportional" (Gemma 4's full-attention layers): the first
    `int(partial_rotary_factor * dim // 2)` frequencies `base^(-2i / dim)` (over the whole
    head's width, not the rotated share's), the other ones 0 (those pairs do not turn),
    all divided by `factor`; pairs (i, i + dim/2) over the whole head."""
    angles = int(spec.partial_rotary_factor * dim // 2)
    inv = np.zeros(dim // 2, np.float64)
    inv[:angles] = 1.0 / float(spec.max_wavelength) ** (
        np.arange(0, 2 * angles, 2, dtype=np.float64) / dim)
    return inv / spec.scaling_factor, 1.0


_CONTEXT = {"original_max_position_embeddings": "original_max_position_embeddings"}
_PARTIAL = {"partial_rotary_factor": "partial_rotary_factor"}  # every type: a slice of d
# rope_type -> RopeType, with Hugging Face's formulas (`modeling_rope_utils.py`). "default"
# divides by `scaling_factor` too: keras_attn's (and keras-hub's) meaning of a
# scaling factor before `rope_type` existed.
ROPE_TYPES = {
    "default": RopeType(_linear, _PARTIAL),
    "linear": RopeType(_linear, {"factor": "scaling_factor", **_PARTIAL}, required=("factor",)),
    "llama3": RopeType(_llama3, {"factor": "scaling_factor", "low_freq_factor": "low_freq_factor",
                                 "high_freq_factor": "high_freq_factor", **_CONTEXT,
                                 **_PARTIAL},
                       required=("factor", "low_freq_factor", "high_freq_factor",
                                 "original_max_position_embeddings")),
    "yarn": RopeType(_yarn, {"factor": "scaling_factor", "beta_fast": "beta_fast",
                             "beta_slow": "beta_slow", "attention_factor": "attention_factor",
                             "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
                             "truncate": "truncate", **_CONTEXT, **_PARTIAL}),
    # Phi-3.5 / Phi-4-mini: theta_i / short_factor[i], or / long_factor[i] for a call whose
    # positions reach past original_max_position_embeddings; `factor` only sets the
    # default attention factor sqrt(1 + ln(factor) / ln(original)).
    "longrope": RopeType(_longrope_with("short_factor"),
                         {"short_factor": "short_factor", "long_factor": "long_factor",
                          "factor": "scaling_factor", "attention_factor": "attention_factor",
                          **_CONTEXT, **_PARTIAL},
                         required=("short_factor", "long_factor",
                                   "original_max_position_embeddings"),
                         long_frequencies=_longrope_with("long_factor")),
    "proportional": RopeType(_proportional, {"factor": "scaling_factor", **_PARTIAL},
                             whole_head=True),
}
# Their frequencies depend on the sequence length itself (dynamic NTK).
REFUSED_ROPE_TYPES = ("dynamic",)


def _non_negative(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            value >= 0 and np.isfinite(value)):
        raise ValueError(
            f"`{name}` must be None or a non-negative, finite number. Received: {name}={value!r}")
    return float(value)


def _factors(name, value):
    """A list of positive, finite numbers as a tuple of floats (JSON gives lists), or None."""
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise ValueError(f"`{name}` must be None or a sequence of positive, finite numbers. "
                         f"Received: {name}={value!r}")
    items = list(value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Real) or not (
                item > 0 and math.isfinite(item)):
            raise ValueError(f"`{name}` must be None or a sequence of positive, finite "
                             f"numbers. Received: {name}={value!r}")
    if not items:
        raise ValueError(f"`{name}` must not be empty. Received: {name}={value!r}")
    return tuple(float(item) for item in items)


def check_rope(values, prefix=""):
    """The fields of a `RopeSpec` (a dict by field name), checked and normalised.

    Errors name each as `prefix + name` (`rope_beta_fast` for `AttentionOptions`,
    `beta_fast` for `RotaryEmbedding`); `rope_type` keeps its name.
    `max_wavelength` None is allowed (`AttentionOptions` without RoPE).
    """
    rope_type = values["rope_type"]
    if rope_type in REFUSED_ROPE_TYPES:
        raise ValueError(
            f"`rope_type` {rope_type!r} is not supported (its frequencies depend on the sequence "
            f"length); supported: {', '.join(map(repr, ROPE_TYPES))}. "
            f"Received: rope_type={rope_type!r}")
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"`rope_type` must be one of {', '.join(map(repr, ROPE_TYPES))}. "
            f"Received: rope_type={rope_type!r}")
    positive = ("max_wavelength", "scaling_factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor")
    optional = ("max_wavelength", "original_max_position_embeddings", "attention_factor")
    checked = {"rope_type": rope_type, "interleaved": bool(values["interleaved"]),
               "truncate": bool(values["truncate"])}
    for name in positive:
        checked[name] = check_positive_float(prefix + name, values[name],
                                             allow_none=name in optional)
    for name in ("mscale", "mscale_all_dim"):
        checked[name] = _non_negative(prefix + name, values[name])
    name = prefix + "partial_rotary_factor"
    checked["partial_rotary_factor"] = check_positive_float(name, values["partial_rotary_factor"])
    if checked["partial_rotary_factor"] > 1:
        raise ValueError(f"`{name}` is the rotated share of each head, in (0, 1]. "
                         f"Received: {name}={values['partial_rotary_factor']!r}")
    for name in ("short_factor", "long_factor"):
        checked[name] = _factors(prefix + name, values.get(name))
        if rope_type == "longrope" and checked[name] is None:
            raise ValueError(f"`rope_type='longrope'` needs `{prefix + name}` (one factor per "
                             f"rotated frequency). Received: {prefix + name}=None")
    name = prefix + "original_max_position_embeddings"
    if rope_type in ("llama3", "yarn", "longrope") and checked["original_max_position_embeddings"] is None:
        raise ValueError(
            f"`rope_type={rope_type!r}` needs `{name}` (the context length of pretraining). "
            f"Received: {name}=None")
    if rope_type == "llama3" and not checked["high_freq_factor"] > checked["low_freq_factor"]:
        raise ValueError(
            f"`rope_type='llama3'` needs `{prefix}high_freq_factor` > `{prefix}low_freq_factor`. "
            f"Received: {prefix}low_freq_factor={values['low_freq_factor']!r}, "
            f"{prefix}high_freq_factor={values['high_freq_factor']!r}")
    context = checked["original_max_position_embeddings"]
    if context is not None and context.is_integer():
        checked["original_max_position_embeddings"] = int(context)
    return checked


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """The parameters of rotary position embeddings, checked when made.

    `RotaryEmbedding(**dataclasses.asdict(spec))` is the layer of a spec, and
    `AttentionOptions.rope` the spec of a layer's options.

    Args:
        max_wavelength: the base of the frequencies (transformers' `rope_theta`).
        scaling_factor: linear position scaling (`theta_i / scaling_factor`);
            for llama3 and yarn, transformers' `factor`.
        interleaved: pair features (2i, 2i + 1) (the paper, GPT-J) instead of
            (i, i + d/2) (Llama, the default).
        rope_type: a key of `ROPE_TYPES`: `"default"`, `"linear"`, `"llama3"`,
            `"yarn"`, `"longrope"` or `"proportional"` (`"dynamic"` is refused).
        low_freq_factor, high_freq_factor: llama3's (Llama 3.1: 1 and 4).
        original_max_position_embeddings: llama3 and yarn (required there):
            the context length of pretraining.
        beta_fast, beta_slow: yarn's ramp bounds (32 and 1).
        attention_factor: yarn's multiplier of cos and sin, or None for
            `0.1 ln(scaling_factor) + 1` (with `mscale` / `mscale_all_dim`).
        mscale, mscale_all_dim: yarn's (DeepSeek): both set, the attention
            factor is the ratio of `0.1 m ln s + 1` for the two.
        truncate: yarn's: round the ramp's bounds to whole frequencies.
        short_factor, long_factor: longrope's (Phi-3.5, Phi-4-mini; required
            there): one divisor per rotated frequency (d/2 each, d the rotated
            width), `theta_i / short_factor[i]`, or `theta_i / long_factor[i]` in
            a call whose positions reach past `original_max_position_embeddings`
            (`max(positions) + 1 > original_max_position_embeddings`, for all of
            that call's positions, as transformers' `longrope_frequency_update`).
            So an uncached forward over T > original tokens rotates its first
            positions otherwise than a forward over fewer: it is not
            prefix-consistent, as in transformers; over a cache, each call
            rotates its new keys by its own positions and the cached keys keep
            theirs (`CausalLM.generate` recomputes the cache once at the switch,
            as Phi-3's `prepare_inputs_for_generation` does, so that greedy
            generation is the uncached forward's). longrope's `scaling_factor`
            is transformers' `factor` (the config's `max_position_embeddings /
            original_max_position_embeddings` when not given) and only sets the
            default `attention_factor`, `sqrt(1 + ln(factor) / ln(original))`
            (1 for a factor <= 1). Tuples of floats (JSON lists in configs).
        partial_rotary_factor: the share of each head that is rotated, in
            (0, 1]: the leading `int(d * partial_rotary_factor)` features
            (transformers' truncation; it must be even), paired within that
            slice as `interleaved` says, with the frequencies of a head that
            wide; the others pass unchanged (GLM-4, Phi-4-mini, Qwen 3.5,
            GPT-NeoX). transformers' name. With `rope_type="proportional"`
            (Gemma 4) the whole head rotates instead, its frequencies past
            the share being 0.

    Example:

    >>> spec = RopeSpec(max_wavelength=500000.0, scaling_factor=8.0, rope_type="llama3",
    ...                 original_max_position_embeddings=8192)
    >>> theta, factor = spec.frequencies(64)
    >>> theta.shape, factor
    ((32,), 1.0)
    >>> RopeSpec(rope_type="llama3")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: `rope_type='llama3'` needs `original_max_position_embeddings` ...
    """

    max_wavelength: float = 10000.0
    scaling_factor: float = 1.0
    interleaved: bool = False
    rope_type: str = "default"
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    partial_rotary_factor: float = 1.0
    short_factor: tuple | None = None
    long_factor: tuple | None = None

    def __post_init__(self):
        self._set(check_rope(dataclasses.asdict(self)))
        if self.max_wavelength is None:
            raise ValueError("`max_wavelength` must be a positive, finite number. "
                             "Received: max_wavelength=None")

    def _set(self, checked):
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # normalised (NumPy ints -> int, ...)

    @classmethod
    def named(cls, prefix, **values):
        """A spec from `values` whose errors name each field `prefix + name`."""
        defaults = {field.name: field.default for field in dataclasses.fields(cls)}
        return cls(**check_rope({**defaults, **values}, prefix))

    def frequencies(self, dim):
        """`(theta, attention_factor)`: the dim/2 inverse frequencies (float64 NumPy) and
        the multiplier of cos and sin, for a rotated width `dim` (`rotary_dim(d)`)."""
        return ROPE_TYPES[self.rope_type].frequencies(self, dim)

    def long_frequencies(self, dim):
        """`(theta, attention_factor)` of a call whose positions reach past
        `original_max_position_embeddings`, or None where the type has no such switch."""
        long = ROPE_TYPES[self.rope_type].long_frequencies
        return None if long is None else long(self, dim)

    @property
    def cache_recompute_length(self):
        """The sequence length at which a cache written before must be recomputed, or None:
        longrope's `original_max_position_embeddings + 1` (the first call past it rotates
        with the long factors, and transformers' Phi-3 drops the cache there)."""
        if ROPE_TYPES[self.rope_type].long_frequencies is None:
            return None
        return self.original_max_position_embeddings + 1

    def check_width(self, head_dim, prefix=""):
        """`rotary_dim(head_dim)`, with longrope's factor lists checked against it
        (d/2 each; a `ValueError` naming `prefix + field` otherwise)."""
        dim = self.rotary_dim(head_dim)
        if self.rope_type == "longrope":
            for name in ("short_factor", "long_factor"):
                factors = getattr(self, name)
                if len(factors) != dim // 2:
                    raise ValueError(
                        f"`{prefix}{name}` holds one factor per rotated frequency: {dim // 2} "
                        f"for head_dim={head_dim} (rotated width {dim}). Received: "
                        f"{prefix}{name} of length {len(factors)}")
        return dim

    @functools.cached_property
    def whole_head(self):
        """This spec over all of a head (`partial_rotary_factor` 1): what rotates the
        leading slice, made once per spec rather than per call."""
        return dataclasses.replace(self, partial_rotary_factor=1.0)

    def rotary_dim(self, head_dim):
        """The rotated width of a head `head_dim` wide: `int(head_dim *
        partial_rotary_factor)`, checked even (a `ValueError` naming both otherwise); the
        whole head for a `whole_head` type ("proportional")."""
        if ROPE_TYPES[self.rope_type].whole_head:
            return head_dim
        dim = int(head_dim * self.partial_rotary_factor)
        if dim <= 0 or dim % 2:
            raise ValueError(
                "Rotary embeddings rotate pairs of features: the rotated width "
                "int(head_dim * partial_rotary_factor) must be even and positive. Received: "
                f"head_dim={head_dim}, partial_rotary_factor={self.partial_rotary_factor}")
        return dim

    def options(self):
        """The spec as `AttentionOptions` fields (`rope_` + each name; `rope_type` as is)."""
        return {name if name == "rope_type" else f"rope_{name}": value
                for name, value in dataclasses.asdict(self).items()}

    @classmethod
    def from_options(cls, options):
        """The spec of an `AttentionOptions`' `rope_*` fields, or None without RoPE."""
        if options.rope_max_wavelength is None:
            return None
        return cls(**{name: getattr(options, name if name == "rope_type" else f"rope_{name}")
                      for name in FIELDS})

    @classmethod
    def from_rope_parameters(cls, params, *, max_position_embeddings=None,
                             where="rope_parameters"):
        """The spec of one transformers `rope_parameters` dict (or an older `rope_scaling`
        with `rope_theta` added), with transformers' defaults and truthiness.

        Every key must be one its `rope_type` reads: any other, and a required one
        missing, is refused with a `ValueError` naming `where[key]`.
        `max_position_embeddings` is the config's (yarn's defaults use it, and
        longrope's `factor` when not given).
        """
        def refuse(key, value, why):  # the converters' wording (`_transformers_config`)
            field = where if key is None else f"{where}[{key!r}]"
            raise ValueError(f"config field `{field}` is not supported ({why}). Received: "
                             f"{field}={value!r}")

        if not isinstance(params, Mapping):
            refuse(None, params, "a dict of RoPE parameters is expected")
        params = dict(params)
        rope_type = params.pop("rope_type", params.pop("type", "default"))
        params.pop("type", None)
        if rope_type not in ROPE_TYPES:
            refuse("rope_type", rope_type,
                   f"keras_attn reproduces the RoPE types {', '.join(map(repr, ROPE_TYPES))}")
        theta = params.pop("rope_theta", None)
        if theta is None:
            refuse("rope_theta", None, "the RoPE base is required")
        if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not (
                theta > 0 and math.isfinite(theta)):
            refuse("rope_theta", theta, "the RoPE base must be a positive, finite number")
        kind = ROPE_TYPES[rope_type]
        for key in params:
            if key not in kind.parameters:
                refuse(key, params[key],
                       f"not a parameter keras_attn reads for rope_type {rope_type!r}")
        if rope_type == "yarn":
            # transformers' defaults and truthiness (`beta_fast or 32`, `if mscale and
            # mscale_all_dim`); the attention factor is resolved here, as there.
            original = params.get("original_max_position_embeddings") or max_position_embeddings
            factor = params.get("factor")
            if factor is None and original:
                factor = max_position_embeddings / original
            params["factor"], params["original_max_position_embeddings"] = factor, original
            params["beta_fast"] = params.get("beta_fast") or 32.0
            params["beta_slow"] = params.get("beta_slow") or 1.0
            mscale, mscale_all_dim = params.pop("mscale", None), params.pop("mscale_all_dim", None)
            if params.get("attention_factor") is None and factor is not None:
                params["attention_factor"] = (
                    _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
                    if mscale and mscale_all_dim else _yarn_mscale(factor))
        if rope_type == "longrope" and params.get("factor") is None:
            # transformers' Phi-3 divergence: the factor is the context's growth
            original = params.get("original_max_position_embeddings")
            if original and max_position_embeddings:
                params["factor"] = max_position_embeddings / original
            else:
                params.pop("factor", None)
        for key in kind.required:
            if params.get(key) is None:
                refuse(key, params.get(key), f"rope_type {rope_type!r} needs it")
        for key, value in params.items():
            if value is None:
                refuse(key, value, f"rope_type {rope_type!r} needs it")
        try:
            return cls(max_wavelength=theta, rope_type=rope_type,
                       **{kind.parameters[key]: value for key, value in params.items()})
        except ValueError as error:  # a value out of range: named by keras_attn's field
            raise ValueError(
                f"config field `{where}` is not supported: {error} (keras_attn's "
                "`scaling_factor` is its 'factor', the others have their names)") from None


FIELDS = tuple(field.name for field in dataclasses.fields(RopeSpec))
