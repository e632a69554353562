"""Argument checks shared by the layers and the functional core.

Each check raises a `ValueError` that names the argument and ends with
"Received: name=value", before any computation happens.
"""

__all__ = [
    "check_broadcastable",
    "check_dropout",
    "check_positive_int",
    "check_rank",
    "static_shape",
]


def check_positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}"
        )
    return value


def check_dropout(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        0.0 <= value < 1.0
    ):
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )
    return float(value)


def _static_dim(d):
    if d is None:
        return None
    try:
        return int(d)
    except Exception:  # a symbolic dimension (JAX shape polymorphism): unknown
        return None


def static_shape(x):
    """The shape of a tensor or shape tuple as a tuple of int-or-None.

    Dims that are not known while tracing (JAX's symbolic batch dim when
    Keras infers a Functional model's output spec) become None.
    """
    shape = getattr(x, "shape", x)
    return tuple(_static_dim(d) for d in shape)


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
