"""Rotary position embeddings (RoPE, Su et al. 2021), functional and as a layer.

For a head width d, frequency `theta_i = max_wavelength ** (-2 i / d) /
scaling_factor` for `i < d / 2`, and position p is rotated by the angles
`p * theta_i`. The angles are computed in float32 at least, whatever the
compute dtype, then the rotation is applied in the input's dtype.

`rope_type` chooses how the frequencies are scaled, with Hugging Face
transformers' formulas (`modeling_rope_utils.py`; `scaling_factor` is their
`factor`, `max_wavelength` their `rope_theta`):
- `"default"`, `"linear"`: `theta_i / scaling_factor` (the same: a
  `scaling_factor` other than 1 was linear scaling before `rope_type`);
- `"llama3"` (Llama 3.1-3.3): wavelengths `2 pi / theta_i` longer than
  `original_max_position_embeddings / low_freq_factor` are divided by
  `scaling_factor`, those shorter than `.. / high_freq_factor` kept, and
  those between interpolated smoothly;
- `"yarn"` (YaRN, arXiv 2309.00071): per frequency a ramp between the
  original and the interpolated `theta_i / scaling_factor`, bounded by
  `beta_fast` and `beta_slow` rotations over
  `original_max_position_embeddings` (`truncate`: bounds rounded to whole
  frequencies), and cos and sin multiplied by `attention_factor` (default
  `0.1 ln(scaling_factor) + 1`, or the ratio of that with `mscale` and with
  `mscale_all_dim` when both are set, as DeepSeek's configs give).
- `"longrope"` (Phi-3.5, Phi-4-mini): `theta_i / short_factor[i]`, or
  `theta_i / long_factor[i]` for all the positions of a call whose largest
  position reaches past `original_max_position_embeddings` (`max(p) + 1 >
  original`, transformers' `longrope_frequency_update`: a traced switch), cos
  and sin times `attention_factor` (default `sqrt(1 + ln(scaling_factor) /
  ln(original))`).
`"dynamic"` is refused. The arguments make a
`keras_attn.rope.RopeSpec`, whose registry `ROPE_TYPES` holds each type's
frequency function. The frequencies depend only on constants: they are computed
once in float64 NumPy and enter as a constant.

Two pairings of the features, both in use:
- half-split (default; Hugging Face Llama, keras-hub `RotaryEmbedding`):
  feature `i` pairs with `i + d/2`, `x * cos + rotate_half(x) * sin`,
  `rotate_half(x) = concat(-x[d/2:], x[:d/2])`;
- interleaved (the paper, GPT-J): feature `2i` pairs with `2i + 1`.

Dimension letters: B batch, L sequence length, d the rotated axis
(`feature_axis`, the last by default).
"""

import dataclasses
import numbers
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attn._shapes import softmax_dtype, static_shape
from keras_attn._typing import Tensor
from keras_attn.rope import FIELDS, RopeSpec

__all__ = ["RotaryEmbedding", "apply_rope", "rotary_embedding"]

def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _angles(positions, dim, rope, dtype):
    """`(..., L, d/2)` angles `p * theta_i` in `dtype` (float32 at least), and the
    cos/sin multiplier, for a `RopeSpec` or a `_TensorRope`."""
    if isinstance(rope, _TensorRope):
        # Tensor-valued base or factor (allowed before `rope_type`): computed in `dtype`.
        exponents = ops.arange(0, dim // 2, dtype=dtype) * (-2.0 / dim)
        theta = ops.power(ops.cast(rope.max_wavelength, dtype), exponents) / rope.scaling_factor
        factor = 1.0
    else:
        theta, factor = rope.frequencies(dim)  # constants: float64 NumPy, once per trace
        theta = ops.convert_to_tensor(np.asarray(theta, dtype), dtype=dtype)  # (d/2,)
        long = rope.long_frequencies(dim)
        if long is not None:  # longrope: the long factors for a call past the context
            beyond = ops.greater(ops.max(ops.cast(positions, "int32")) + 1,
                                 rope.original_max_position_embeddings)  # a scalar bool
            theta = ops.where(beyond, ops.convert_to_tensor(np.asarray(long[0], dtype),
                                                            dtype=dtype), theta)
    return ops.expand_dims(ops.cast(positions, dtype), -1) * theta, factor  # (..., L, d/2)


class _TensorRope(NamedTuple):
    """Default RoPE with a tensor-valued base or factor (accepted before `RopeSpec`)."""

    max_wavelength: Tensor
    scaling_factor: Tensor
    interleaved: bool


def rotary_embedding(x: Tensor, positions: Tensor | None = None, start_index: int | Tensor = 0,
                     max_wavelength: float = 10000.0, scaling_factor: float = 1.0,
                     interleaved: bool = False, sequence_axis: int = 1,
                     rope_type: str = "default", low_freq_factor: float = 1.0,
                     high_freq_factor: float = 4.0,
                     original_max_position_embeddings: int | None = None,
                     beta_fast: float = 32.0, beta_slow: float = 1.0,
                     attention_factor: float | None = None, mscale: float | None = None,
                     mscale_all_dim: float | None = None, truncate: bool = True,
                     feature_axis: int = -1, partial_rotary_factor: float = 1.0,
                     short_factor=None, long_factor=None) -> Tensor:
    """Rotate the features of `x` (its last axis by default) by their positions.

    Args:
        x: `(B, L, ..., d)` (for example `(B, L, H, d)` or `(B, L, d)`), with
            the sequence on `sequence_axis` and the even axis d on
            `feature_axis` (the last by default: `(B, L, d, H)` with
            `feature_axis=2` is rotated as its transpose `(B, L, H, d)`).
        positions: int positions `(L,)` or `(B, L)` (B on axis 0); defaults
            to `start_index + arange(L)`.
        start_index: offset of the first position when `positions` is None
            (an int or a scalar tensor: decoding over a cache).
        max_wavelength: the base of the frequencies (10000 in the paper).
        scaling_factor: linear position scaling, `theta_i / scaling_factor`.
        interleaved: pair features (2i, 2i + 1) instead of (i, i + d/2).
        sequence_axis: the axis of `x` that positions index.
        rope_type: `"default"`, `"linear"` (both: `theta_i / scaling_factor`),
            `"llama3"` or `"yarn"` (see the module docstring; Hugging Face's
            formulas, `scaling_factor` being their `factor`).
        low_freq_factor: llama3: wavelengths above
            `original_max_position_embeddings / low_freq_factor` are scaled.
        high_freq_factor: llama3: wavelengths below
            `original_max_position_embeddings / high_freq_factor` are kept
            (> `low_freq_factor`).
        original_max_position_embeddings: llama3 and yarn: the context length
            of pretraining (required for those).
        beta_fast: yarn: the rotations bounding the kept (extrapolated) part.
        beta_slow: yarn: the rotations bounding the interpolated part.
        attention_factor: yarn: the multiplier of cos and sin, or None for
            `0.1 ln(scaling_factor) + 1` (with `mscale` / `mscale_all_dim`).
        mscale: yarn, with `mscale_all_dim`: the attention factor is
            `(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)`.
        mscale_all_dim: yarn: see `mscale`.
        truncate: yarn: round the ramp's bounds to whole frequencies
            (Hugging Face's `truncate`, default True).
        feature_axis: the axis of `x` that holds the d rotated features
            (any axis other than `sequence_axis`; negative counts from the
            end).
        partial_rotary_factor: rotate the leading `int(d * factor)` features
            only (even), with the frequencies of that width; the rest pass
            unchanged (transformers' `partial_rotary_factor`; 1: all).
        short_factor: longrope: the d/2 divisors of the frequencies.
        long_factor: longrope: the d/2 divisors used instead when
            `max(positions) + 1 > original_max_position_embeddings`.

    Returns:
        A tensor of the shape and dtype of `x`.

    Example: position 0 is not rotated, and rotations keep every pair's norm.

    >>> import numpy as np
    >>> from keras import ops
    >>> x = np.ones((1, 3, 2, 4), "float32")  # (B, L, H, d)
    >>> y = ops.convert_to_numpy(rotary_embedding(x))
    >>> bool(np.allclose(y[0, 0], x[0, 0])), bool(np.allclose(np.linalg.norm(y, axis=-1), 2.0))
    (True, True)
    """
    # Every RopeSpec field is an argument of the same name.
    arguments: dict[str, Any] = {"max_wavelength": max_wavelength, "scaling_factor": scaling_factor,
                 "interleaved": interleaved, "rope_type": rope_type,
                 "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
                 "original_max_position_embeddings": original_max_position_embeddings,
                 "beta_fast": beta_fast, "beta_slow": beta_slow,
                 "attention_factor": attention_factor, "mscale": mscale,
                 "mscale_all_dim": mscale_all_dim, "truncate": truncate,
                 "partial_rotary_factor": partial_rotary_factor,
                 "short_factor": short_factor, "long_factor": long_factor}
    rope: RopeSpec | _TensorRope
    if rope_type in ("default", "linear") and not (
            _is_number(max_wavelength) and _is_number(scaling_factor)):
        rope = _TensorRope(max_wavelength, scaling_factor, bool(interleaved))
    else:
        rope = RopeSpec(**arguments)
    return apply_rope(x, rope, positions, start_index, sequence_axis=sequence_axis,
                      feature_axis=feature_axis)


def apply_rope(x, rope, positions=None, start_index=0, *, sequence_axis=1, feature_axis=-1):
    """`rotary_embedding` of `x` with the RoPE of `rope` (a `keras_attn.rope.RopeSpec`).

    What the layers call (`AttentionOptions.rope`, `RotaryEmbedding.rope`);
    the axes and positions as in `rotary_embedding`.
    """
    x = ops.convert_to_tensor(x)
    shape = static_shape(x)
    sequence_axis, feature_axis = _check_axes(sequence_axis, feature_axis, shape)
    dim = shape[feature_axis]
    if dim is None or dim % 2:
        raise ValueError(
            "Rotary embeddings rotate pairs of features: the feature axis "
            f"(feature_axis={feature_axis}) must be even. Received: x.shape={shape}"
        )
    last = len(shape) - 1
    if feature_axis != last:  # rotate the features on the last axis, then put them back
        rotated = apply_rope(
            ops.moveaxis(x, feature_axis, -1), rope, positions, start_index,
            sequence_axis=sequence_axis - 1 if sequence_axis > feature_axis else sequence_axis)
        return ops.moveaxis(rotated, -1, feature_axis)
    interleaved = rope.interleaved
    if isinstance(rope, RopeSpec) and rope.partial_rotary_factor != 1.0:
        rotated = rope.rotary_dim(dim)
        if rotated < dim:  # the leading slice rotates as a head that wide; the rest passes
            head, tail = x[..., :rotated], x[..., rotated:]  # (..., r), (..., d - r)
            return ops.concatenate([apply_rope(head, rope.whole_head, positions, start_index,
                                               sequence_axis=sequence_axis), tail], axis=-1)
    compute = softmax_dtype(x.dtype)  # float32 at least
    if positions is None:
        length = ops.shape(x)[sequence_axis]
        positions = ops.arange(length, dtype="int32") + start_index  # (L,)
    angles, factor = _angles(positions, dim, rope, compute)
    # Put L on the sequence axis and 1s on the axes between it and d, and (B, L)
    # positions' B on axis 0 (keras-hub's meaning) with 1s between it and L.
    if len(angles.shape) == 3:
        for _ in range(sequence_axis - 1):
            angles = ops.expand_dims(angles, 1)
    for _ in range(len(shape) - sequence_axis - 2):
        angles = ops.expand_dims(angles, -2)
    if interleaved:
        angles = ops.repeat(angles, 2, axis=-1)  # (..., d): theta_0, theta_0, theta_1, ...
    else:
        angles = ops.concatenate([angles, angles], axis=-1)  # (..., d)
    cos, sin = ops.cos(angles), ops.sin(angles)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor  # in float32 at least, as Hugging Face
    cos, sin = ops.cast(cos, x.dtype), ops.cast(sin, x.dtype)
    return x * cos + _rotate(x, interleaved) * sin


def _check_axes(sequence_axis, feature_axis, shape):
    """`(sequence_axis, feature_axis)` as non-negative axes of an input of `shape`."""
    rank = len(shape)
    axes = []
    for name, axis in (("sequence_axis", sequence_axis), ("feature_axis", feature_axis)):
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or not (
                -rank <= axis < rank):
            raise ValueError(
                f"`{name}` must be an axis of the input (an int in [{-rank}, {rank - 1}] for "
                f"rank {rank}). Received: {name}={axis!r} for x.shape={shape}")
        axes.append(int(axis) % rank)
    if axes[0] == axes[1]:
        raise ValueError(
            "`feature_axis` and `sequence_axis` must be different axes. Received: "
            f"feature_axis={feature_axis}, sequence_axis={sequence_axis} for x.shape={shape}")
    return axes[0], axes[1]


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"`{name}` must be an int (an axis). Received: {name}={value!r}")
    return int(value)


def _rotate(x, interleaved):
    """The partner of each feature, with the sign of the rotation."""
    if interleaved:
        pairs = ops.reshape(x, tuple(ops.shape(x)[:-1]) + (-1, 2))  # (..., d/2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        return ops.reshape(ops.stack([-odd, even], axis=-1), ops.shape(x))
    first, second = ops.split(x, 2, axis=-1)
    return ops.concatenate([-second, first], axis=-1)


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding as a layer (no weights).

    The same arguments and call as keras-hub's `RotaryEmbedding` (its
    `max_wavelength`, `scaling_factor`, `rope_type`, `beta_fast`, `beta_slow`,
    `original_max_position_embeddings`, `truncate`, `sequence_axis`,
    `feature_axis`; called as `(inputs, start_index=0, positions=None)`),
    plus `interleaved` and Hugging Face's llama3 and YaRN parameters; see
    `keras_attn.rotary_embedding` for the maths. Pass them by keyword: after
    the first two, the order of the arguments is not keras-hub's.
    Deliberate differences from keras-hub: the default `rope_type` is
    `"default"` (keras-hub's `"linear"`, the same frequencies); `"dynamic"`
    is refused; `original_max_position_embeddings` has no default
    (keras-hub's 4096) and is required for llama3 and yarn; yarn follows
    Hugging Face's formulas: `truncate` rounds the ramp's bounds (default
    True, keras-hub's False) and never clamps positions (keras-hub's
    `truncate=True` also clamps them to `original_max_position_embeddings`);
    keras-hub's newer `denominator_dim` is not taken.

    Args:
        max_wavelength: the base of the frequencies. Defaults to 10000.
        scaling_factor: linear position scaling (`theta_i / scaling_factor`);
            for llama3 and yarn, Hugging Face's `factor`.
        interleaved: pair features (2i, 2i + 1) (the paper, GPT-J) instead of
            (i, i + d/2) (Llama, the default).
        sequence_axis: the axis of the input that positions index.
        rope_type: `"default"`, `"linear"`, `"llama3"` or `"yarn"`.
        low_freq_factor: llama3's (Llama 3.1: 1).
        high_freq_factor: llama3's (Llama 3.1: 4).
        original_max_position_embeddings: llama3 and yarn: the context length
            of pretraining.
        beta_fast: yarn's (default 32).
        beta_slow: yarn's (default 1).
        attention_factor: yarn's multiplier of cos and sin, or None for
            `0.1 ln(scaling_factor) + 1`.
        mscale: yarn's, with `mscale_all_dim` (DeepSeek).
        mscale_all_dim: yarn's, with `mscale`.
        truncate: yarn's: round the ramp's bounds to whole frequencies.
        feature_axis: the axis of the input that holds the d rotated
            features (keras-hub's; default -1, the last). Any axis other than
            `sequence_axis`: the features are rotated as if moved last.
        partial_rotary_factor: rotate the leading `int(d * factor)` features
            only (transformers' name; 1: all).
        short_factor: longrope's d/2 frequency divisors.
        long_factor: longrope's d/2 divisors past
            `original_max_position_embeddings`.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, L, ..., d)` (d even, on `feature_axis`; the sequence L
            on `sequence_axis`).
        start_index: the position of the first element (an int or a scalar
            tensor), used when `positions` is None.
        positions: optional int positions `(L,)` or `(B, L)`.

    Returns:
        The rotated inputs, same shape and dtype.

    Example:

    >>> import numpy as np
    >>> rope = RotaryEmbedding(max_wavelength=10000)
    >>> tuple(rope(np.zeros((2, 7, 4, 16), "float32"), start_index=3).shape)
    (2, 7, 4, 16)

    Features on another axis, `(B, L, d, H)`: the same as rotating the
    transposed `(B, L, H, d)`.

    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8, 3)).astype("float32")
    >>> y = RotaryEmbedding(feature_axis=2)(x)
    >>> y_last = rope(np.swapaxes(x, 2, 3))
    >>> bool(np.allclose(np.swapaxes(np.asarray(y_last), 2, 3), np.asarray(y), atol=1e-6))
    True
    """

    def __init__(self, max_wavelength: float = 10000, scaling_factor: float = 1.0,
                 interleaved: bool = False, sequence_axis: int = 1, rope_type: str = "default",
                 low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                 original_max_position_embeddings: int | None = None,
                 beta_fast: float = 32.0, beta_slow: float = 1.0,
                 attention_factor: float | None = None, mscale: float | None = None,
                 mscale_all_dim: float | None = None, truncate: bool = True,
                 feature_axis: int = -1, partial_rotary_factor: float = 1.0,
                 short_factor=None, long_factor=None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sequence_axis = _check_int("sequence_axis", sequence_axis)
        self.feature_axis = _check_int("feature_axis", feature_axis)
        if self.feature_axis == self.sequence_axis:
            raise ValueError(
                "`feature_axis` and `sequence_axis` must be different axes. Received: "
                f"feature_axis={feature_axis}, sequence_axis={sequence_axis}")
        self.rope = RopeSpec.named(  # the RoPE this layer applies; its fields are attributes
            "", max_wavelength=max_wavelength, scaling_factor=scaling_factor,
            interleaved=interleaved, rope_type=rope_type, low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
            original_max_position_embeddings=original_max_position_embeddings,
            beta_fast=beta_fast, beta_slow=beta_slow, attention_factor=attention_factor,
            mscale=mscale, mscale_all_dim=mscale_all_dim, truncate=truncate,
            partial_rotary_factor=partial_rotary_factor, short_factor=short_factor,
            long_factor=long_factor)
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        return apply_rope(inputs, self.rope, positions, start_index,
                          sequence_axis=self.sequence_axis, feature_axis=self.feature_axis)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"sequence_axis": self.sequence_axis, "feature_axis": self.feature_axis,
                       **dataclasses.asdict(self.rope)})
        return config


def _rope_field(name):
    return property(lambda self: getattr(self.rope, name),
                    doc=f"`self.rope.{name}` (`keras_attn.rope.RopeSpec`).")


for _name in FIELDS:  # `layer.max_wavelength` & co., read-only: the spec is the one copy
    setattr(RotaryEmbedding, _name, _rope_field(_name))
del _name
