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
    "check_rope_scaling",
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


ROPE_TYPES = ("default", "linear", "llama3", "yarn")
REFUSED_ROPE_TYPES = ("dynamic", "longrope")


def _check_non_negative_float(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not (
            value >= 0 and np.isfinite(value)):
        raise ValueError(
            f"`{name}` must be None or a non-negative, finite number. Received: {name}={value!r}")
    return float(value)


def check_rope_scaling(rope_type, scaling_factor, *, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=None, beta_fast=32.0, beta_slow=1.0,
                       attention_factor=None, mscale=None, mscale_all_dim=None, truncate=True,
                       prefix=""):
    """The RoPE type and its parameters, checked and normalised (a dict by the unprefixed names).

    Error messages name each argument as `prefix + name` (`rope_beta_fast` in
    `AttentionOptions`, `beta_fast` in `RotaryEmbedding`); `rope_type` keeps
    its name. `dynamic` and `longrope` (their frequencies depend on the
    sequence length, or on per-frequency lists) are refused.
    """
    if rope_type in REFUSED_ROPE_TYPES:
        raise ValueError(
            f"`rope_type` {rope_type!r} is not supported (its frequencies depend on the sequence "
            f"length or on per-frequency factors); supported: {', '.join(map(repr, ROPE_TYPES))}. "
            f"Received: rope_type={rope_type!r}")
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"`rope_type` must be one of {', '.join(map(repr, ROPE_TYPES))}. "
            f"Received: rope_type={rope_type!r}")
    values = {
        "scaling_factor": check_positive_float(prefix + "scaling_factor", scaling_factor),
        "low_freq_factor": check_positive_float(prefix + "low_freq_factor", low_freq_factor),
        "high_freq_factor": check_positive_float(prefix + "high_freq_factor", high_freq_factor),
        "original_max_position_embeddings": check_positive_float(
            prefix + "original_max_position_embeddings", original_max_position_embeddings,
            allow_none=True),
        "beta_fast": check_positive_float(prefix + "beta_fast", beta_fast),
        "beta_slow": check_positive_float(prefix + "beta_slow", beta_slow),
        "attention_factor": check_positive_float(
            prefix + "attention_factor", attention_factor, allow_none=True),
        "mscale": _check_non_negative_float(prefix + "mscale", mscale),
        "mscale_all_dim": _check_non_negative_float(prefix + "mscale_all_dim", mscale_all_dim),
        "truncate": bool(truncate),
    }
    name = prefix + "original_max_position_embeddings"
    if rope_type in ("llama3", "yarn") and values["original_max_position_embeddings"] is None:
        raise ValueError(
            f"`rope_type={rope_type!r}` needs `{name}` (the context length of pretraining). "
            f"Received: {name}=None")
    if rope_type == "llama3" and not values["high_freq_factor"] > values["low_freq_factor"]:
        raise ValueError(
            f"`rope_type='llama3'` needs `{prefix}high_freq_factor` > `{prefix}low_freq_factor`. "
            f"Received: {prefix}low_freq_factor={low_freq_factor!r}, "
            f"{prefix}high_freq_factor={high_freq_factor!r}")
    if values["original_max_position_embeddings"] is not None and float(
            original_max_position_embeddings).is_integer():
        values["original_max_position_embeddings"] = int(original_max_position_embeddings)
    return values


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
