"""Argument checks shared by the layers and the functional core.

Each check raises a `ValueError` that names the argument and ends with
"Received: name=value", before any computation happens.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._shapes import static_shape

__all__ = [
    "as_bool_mask",
    "check_broadcastable",
    "check_dropout",
    "check_floating",
    "check_positive_float",
    "check_positive_int",
    "check_rank",
    "concrete_value",
    "dtype_of",
]


def check_positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}"
        )
    return int(value)


def check_positive_float(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not (
            value > 0 and np.isfinite(value)):
        raise ValueError(
            f"`{name}` must be a positive, finite number. Received: {name}={value!r}"
        )
    return float(value)


def check_dropout(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        0.0 <= value < 1.0
    ):
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )
    return float(value)


def check_rank(name, x, rank, layout):
    """`x` (a tensor or a shape) has exactly `rank` axes, laid out as `layout`."""
    shape = static_shape(x)
    if len(shape) != rank:
        raise ValueError(
            f"`{name}` must have rank {rank}, with shape {layout}. "
            f"Received: {name}.shape={shape}"
        )
    return shape


def check_broadcastable(name, shape, target, layout):
    """`shape` broadcasts (NumPy rules) to `target`; None dims are unknown."""
    shape = static_shape(shape)
    if len(shape) > len(target):
        ok = False
    else:
        ok = all(
            a is None or b is None or a == 1 or a == b
            for a, b in zip(reversed(shape), reversed(target), strict=False)
        )
    if not ok:
        raise ValueError(
            f"`{name}` must be broadcastable to {layout} = {tuple(target)}. "
            f"Received: {name}.shape={shape}"
        )


def concrete_value(x):
    """The value of `x` as a NumPy array when it is known now; None when traced.

    Python and NumPy values and eager tensors of every backend have a value;
    a `KerasTensor`, a JAX tracer (under `jax.jit` or a loop) and a symbolic
    TensorFlow tensor (under `tf.function`) do not, and each backend refuses
    to convert those to NumPy. No backend is imported: the refusal is the
    test.
    """
    if isinstance(x, (numbers.Number, np.ndarray, np.generic)):
        return np.asarray(x)
    if isinstance(x, keras.KerasTensor):
        return None
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # JAX's TracerArrayConversionError, TF's NotImplementedError, ...
        return None


def dtype_of(x):
    """The standardized dtype name of a tensor, array or Python value."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    return keras.backend.standardize_dtype(dtype)


def check_floating(name, x):
    """Attention inputs must be floating: integer logits would be silently wrong."""
    dtype = dtype_of(x)
    if "float" not in dtype:
        raise ValueError(
            f"`{name}` must be a floating tensor (float16, bfloat16, float32 or "
            f"float64); cast it first, for example with `keras.ops.cast(x, "
            f"'float32')`. Received: {name}.dtype={dtype}"
        )
    return dtype


def as_bool_mask(name, mask):
    """A bool or integer mask as bool (nonzero = may attend); a float mask is refused.

    A floating mask is ambiguous: a 0/1 "keep" mask and an additive
    0/-inf mask look alike, and reading the second as "nonzero = may attend"
    would silently invert it. Additive masks belong in `bias=`.
    """
    if mask is None:
        return None
    dtype = dtype_of(mask)
    if "float" in dtype:
        raise ValueError(
            f"`{name}` must be a bool or integer tensor (True / nonzero = may "
            f"attend). A floating mask is ambiguous (a 0/1 keep-mask and an "
            f"additive 0/-inf mask look alike): pass an additive mask as `bias=` "
            f"to `keras_attn.scaled_dot_product_attention`, or cast a 0/1 mask "
            f"with `keras.ops.cast(mask, 'bool')`. Received: {name}.dtype={dtype}"
        )
    if dtype == "bool":
        return mask if not isinstance(mask, (list, tuple)) else np.asarray(mask, bool)
    return ops.not_equal(mask, 0)
