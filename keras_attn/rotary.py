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
`"dynamic"` and `"longrope"` are refused. The frequencies depend only on
constants: they are computed once in float64 NumPy and enter as a constant.

Two pairings of the features, both in use:
- half-split (default; Hugging Face Llama, keras-hub `RotaryEmbedding`):
  feature `i` pairs with `i + d/2`, `x * cos + rotate_half(x) * sin`,
  `rotate_half(x) = concat(-x[d/2:], x[:d/2])`;
- interleaved (the paper, GPT-J): feature `2i` pairs with `2i + 1`.

Dimension letters: B batch, L sequence length, d the rotated axis
(`feature_axis`, the last by default).
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._shapes import softmax_dtype, static_shape
from keras_attn._typing import Tensor
from keras_attn._validation import check_positive_float, check_rope_scaling

__all__ = ["RotaryEmbedding", "rotary_embedding"]

# The RoPE parameters beyond `max_wavelength` and `scaling_factor`, with their defaults
# (Hugging Face's where it has one: beta_fast 32, beta_slow 1, truncate True; Llama 3.1's
# low_freq_factor 1 and high_freq_factor 4).
ROPE_DEFAULTS = {
    "rope_type": "default",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": None,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "attention_factor": None,
    "mscale": None,
    "mscale_all_dim": None,
    "truncate": True,
}


def _yarn_mscale(factor, mscale=1.0):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(dim, max_wavelength, scaling_factor=1.0, rope_type="default", *,
                     low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=None, beta_fast=32.0, beta_slow=1.0,
                     attention_factor=None, mscale=None, mscale_all_dim=None, truncate=True):
    """`(theta, attention_factor)`: the d/2 inverse frequencies (float64 NumPy) and the
    multiplier of cos and sin, for a checked `rope_type` and its parameters."""
    base = float(max_wavelength)
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # (d/2,)
    if rope_type in ("default", "linear"):
        return inv / scaling_factor, 1.0
    old = float(original_max_position_embeddings)
    if rope_type == "llama3":
        low_wavelength, high_wavelength = old / low_freq_factor, old / high_freq_factor
        wavelength = 2 * math.pi / inv
        scaled = np.where(wavelength > low_wavelength, inv / scaling_factor, inv)
        smooth = (old / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling_factor + smooth * scaled
        medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
        return np.where(medium, smoothed, scaled), 1.0
    # yarn
    def correction_dim(rotations):  # the frequency index that turns `rotations` times
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no zero division
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    theta = (inv / scaling_factor) * ramp + inv * (1 - ramp)
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = (_yarn_mscale(scaling_factor, mscale)
                                / _yarn_mscale(scaling_factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(scaling_factor)
    return theta, float(attention_factor)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _angles(positions, dim, max_wavelength, scaling_factor, dtype, rope):
    """`(..., L, d/2)` angles `p * theta_i` in `dtype` (float32 at least), and the
    cos/sin multiplier."""
    if rope["rope_type"] in ("default", "linear") and not (
            _is_number(max_wavelength) and _is_number(scaling_factor)):
        # Tensor-valued base or factor (allowed before `rope_type`): computed in `dtype`.
        exponents = ops.arange(0, dim // 2, dtype=dtype) * (-2.0 / dim)
        theta = ops.power(ops.cast(max_wavelength, dtype), exponents) / scaling_factor
        factor = 1.0
    else:
        theta, factor = rope_frequencies(dim, max_wavelength, scaling_factor, **rope)
        theta = ops.convert_to_tensor(np.asarray(theta, dtype), dtype=dtype)  # (d/2,)
    return ops.expand_dims(ops.cast(positions, dtype), -1) * theta, factor  # (..., L, d/2)


def rotary_embedding(x: Tensor, positions: Tensor | None = None, start_index: int | Tensor = 0,
                     max_wavelength: float = 10000.0, scaling_factor: float = 1.0,
                     interleaved: bool = False, sequence_axis: int = 1,
                     rope_type: str = "default", low_freq_factor: float = 1.0,
                     high_freq_factor: float = 4.0,
                     original_max_position_embeddings: int | None = None,
                     beta_fast: float = 32.0, beta_slow: float = 1.0,
                     attention_factor: float | None = None, mscale: float | None = None,
                     mscale_all_dim: float | None = None, truncate: bool = True,
                     feature_axis: int = -1) -> Tensor:
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
    x = ops.convert_to_tensor(x)
    shape = static_shape(x)
    sequence_axis, feature_axis = _check_axes(sequence_axis, feature_axis, shape)
    dim = shape[feature_axis]
    if dim is None or dim % 2:
        raise ValueError(
            "Rotary embeddings rotate pairs of features: the feature axis "
            f"(feature_axis={feature_axis}) must be even. Received: x.shape={shape}"
        )
    rope = _rope_arguments(
        rope_type, scaling_factor, low_freq_factor, high_freq_factor,
        original_max_position_embeddings, beta_fast, beta_slow, attention_factor, mscale,
        mscale_all_dim, truncate)
    last = len(shape) - 1
    if feature_axis != last:  # rotate the features on the last axis, then put them back
        rotated = rotary_embedding(
            ops.moveaxis(x, feature_axis, -1), positions, start_index, max_wavelength,
            scaling_factor, interleaved,
            sequence_axis - 1 if sequence_axis > feature_axis else sequence_axis, **rope)
        return ops.moveaxis(rotated, -1, feature_axis)
    compute = softmax_dtype(x.dtype)  # float32 at least
    if positions is None:
        length = ops.shape(x)[sequence_axis]
        positions = ops.arange(length, dtype="int32") + start_index  # (L,)
    angles, factor = _angles(positions, dim, max_wavelength, scaling_factor, compute, rope)
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


def _rope_arguments(rope_type, scaling_factor, *parameters, prefix=""):
    """The RoPE type's parameters (checked unless the type is default/linear)."""
    if rope_type in ("default", "linear"):  # scaling_factor may be a tensor, as before
        return {"rope_type": rope_type}
    names = [name for name in ROPE_DEFAULTS if name != "rope_type"]
    checked = check_rope_scaling(rope_type, scaling_factor, prefix=prefix,
                                 **dict(zip(names, parameters, strict=True)))
    return {"rope_type": rope_type, **{name: checked[name] for name in names}}


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
                 feature_axis: int = -1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_float("max_wavelength", max_wavelength)
        self.interleaved = bool(interleaved)
        self.sequence_axis = _check_int("sequence_axis", sequence_axis)
        self.feature_axis = _check_int("feature_axis", feature_axis)
        if self.feature_axis == self.sequence_axis:
            raise ValueError(
                "`feature_axis` and `sequence_axis` must be different axes. Received: "
                f"feature_axis={feature_axis}, sequence_axis={sequence_axis}")
        checked = check_rope_scaling(
            rope_type, scaling_factor, low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
            original_max_position_embeddings=original_max_position_embeddings,
            beta_fast=beta_fast, beta_slow=beta_slow, attention_factor=attention_factor,
            mscale=mscale, mscale_all_dim=mscale_all_dim, truncate=truncate)
        self.rope_type = rope_type
        for name, value in checked.items():
            setattr(self, name, value)
        self.supports_masking = True
        self.built = True

    def _rope(self):
        return {name: getattr(self, name) for name in ROPE_DEFAULTS}

    def call(self, inputs, start_index=0, positions=None):
        return rotary_embedding(inputs, positions, start_index, self.max_wavelength,
                                self.scaling_factor, self.interleaved, self.sequence_axis,
                                feature_axis=self.feature_axis, **self._rope())

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "max_wavelength": self.max_wavelength,
            "scaling_factor": self.scaling_factor,
            "interleaved": self.interleaved,
            "sequence_axis": self.sequence_axis,
            "feature_axis": self.feature_axis,
            **self._rope(),
        })
        return config
