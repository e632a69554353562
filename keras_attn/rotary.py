"""Rotary position embeddings (RoPE, Su et al. 2021), functional and as a layer.

For a head width d, frequency `theta_i = max_wavelength ** (-2 i / d) /
scaling_factor` for `i < d / 2`, and position p is rotated by the angles
`p * theta_i`. The angles are computed in float32 at least, whatever the
compute dtype, then the rotation is applied in the input's dtype.

Two pairings of the features, both in use:
- half-split (default; Hugging Face Llama, keras-hub `RotaryEmbedding`):
  feature `i` pairs with `i + d/2`, `x * cos + rotate_half(x) * sin`,
  `rotate_half(x) = concat(-x[d/2:], x[:d/2])`;
- interleaved (the paper, GPT-J): feature `2i` pairs with `2i + 1`.

Dimension letters: B batch, L sequence length, d the rotated (last) axis.
"""

import keras
from keras import ops

from keras_attn._shapes import softmax_dtype, static_shape
from keras_attn._typing import Tensor
from keras_attn._validation import check_positive_float

__all__ = ["RotaryEmbedding", "rotary_embedding"]


def _angles(positions, dim, max_wavelength, scaling_factor, dtype):
    """`(..., L, d/2)` angles `p * theta_i` in `dtype` (float32 at least)."""
    exponents = ops.arange(0, dim // 2, dtype=dtype) * (-2.0 / dim)
    theta = ops.power(ops.cast(max_wavelength, dtype), exponents) / scaling_factor  # (d/2,)
    return ops.expand_dims(ops.cast(positions, dtype), -1) * theta  # (..., L, d/2)


def rotary_embedding(x: Tensor, positions: Tensor | None = None, start_index: int | Tensor = 0,
                     max_wavelength: float = 10000.0, scaling_factor: float = 1.0,
                     interleaved: bool = False, sequence_axis: int = 1) -> Tensor:
    """Rotate the last axis of `x` by its positions.

    Args:
        x: `(B, L, ..., d)` (for example `(B, L, H, d)` or `(B, L, d)`), with
            the sequence on `sequence_axis` and an even last axis d.
        positions: int positions `(L,)` or `(B, L)`; defaults to
            `start_index + arange(L)`.
        start_index: offset of the first position when `positions` is None
            (an int or a scalar tensor: decoding over a cache).
        max_wavelength: the base of the frequencies (10000 in the paper).
        scaling_factor: linear position scaling, `theta_i / scaling_factor`.
        interleaved: pair features (2i, 2i + 1) instead of (i, i + d/2).
        sequence_axis: the axis of `x` that positions index.

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
    dim = shape[-1]
    if dim is None or dim % 2:
        raise ValueError(
            "Rotary embeddings rotate pairs of features: the last axis must be even. "
            f"Received: x.shape={shape}"
        )
    sequence_axis = sequence_axis % len(shape)
    compute = softmax_dtype(x.dtype)  # float32 at least
    if positions is None:
        length = ops.shape(x)[sequence_axis]
        positions = ops.arange(length, dtype="int32") + start_index  # (L,)
    angles = _angles(positions, dim, max_wavelength, scaling_factor, compute)  # (..., L, d/2)
    # Put L on the sequence axis and 1s on the axes between it and d.
    for _ in range(len(shape) - sequence_axis - 2):
        angles = ops.expand_dims(angles, -2)
    if interleaved:
        angles = ops.repeat(angles, 2, axis=-1)  # (..., d): theta_0, theta_0, theta_1, ...
    else:
        angles = ops.concatenate([angles, angles], axis=-1)  # (..., d)
    cos, sin = ops.cast(ops.cos(angles), x.dtype), ops.cast(ops.sin(angles), x.dtype)
    return x * cos + _rotate(x, interleaved) * sin


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

    The same arguments and call as keras-hub's `RotaryEmbedding`, plus
    `interleaved`; see `keras_attn.rotary_embedding` for the maths.

    Args:
        max_wavelength: the base of the frequencies. Defaults to 10000.
        scaling_factor: linear position scaling (`theta_i / scaling_factor`).
        interleaved: pair features (2i, 2i + 1) (the paper, GPT-J) instead of
            (i, i + d/2) (Llama, the default).
        sequence_axis: the axis of the input that positions index.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(B, L, ..., d)`, d even.
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
    """

    def __init__(self, max_wavelength: float = 10000, scaling_factor: float = 1.0,
                 interleaved: bool = False, sequence_axis: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_float("max_wavelength", max_wavelength)
        self.scaling_factor = check_positive_float("scaling_factor", scaling_factor)
        self.interleaved = bool(interleaved)
        self.sequence_axis = int(sequence_axis)
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        return rotary_embedding(inputs, positions, start_index, self.max_wavelength,
                                self.scaling_factor, self.interleaved, self.sequence_axis)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "max_wavelength": self.max_wavelength,
            "scaling_factor": self.scaling_factor,
            "interleaved": self.interleaved,
            "sequence_axis": self.sequence_axis,
        })
        return config
