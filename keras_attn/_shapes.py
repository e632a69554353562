"""Static shapes, rank padding, leading-dim broadcast and the softmax dtype rule.

The one home of the shape helpers that the attention paths and the layers
share. Dimension letters as everywhere in the package: B batch, H heads,
T query length, S key length, d head width.

A dimension is *static* only when it is a Python (or NumPy) integer. Symbolic
dims (`None` in a Keras or TensorFlow shape, a JAX shape-polymorphic dim, a
`torch.SymInt` under `torch.export`) are reported as `None` and never turned
into an `int`: doing so would specialise an exported model to one size.
"""

import numbers

import keras
from keras import ops

__all__ = [
    "broadcast_lead",
    "pad_axis",
    "score_lead",
    "softmax_dtype",
    "static_shape",
    "sum_to",
    "to_rank",
]


def _static_dim(d):
    if isinstance(d, numbers.Integral) and not isinstance(d, bool):
        return int(d)
    return None


def static_shape(x):
    """The shape of a tensor (or a shape tuple) as a tuple of int-or-None."""
    shape = getattr(x, "shape", x)
    return tuple(_static_dim(d) for d in shape)


def to_rank(x, rank):
    """Prepend size-1 axes until `x` has `rank` axes."""
    while len(x.shape) < rank:
        x = ops.expand_dims(x, 0)
    return x


def pad_axis(x, axis, amount, value=0):
    """Pad `amount` entries of `value` at the end of `axis`."""
    if amount == 0:
        return x
    widths = [[0, 0] for _ in range(len(x.shape))]
    widths[axis][1] = amount
    return ops.pad(x, widths, constant_values=value)


def sum_to(x, shape):
    """Sum `x` over the axes where the static `shape` has size 1 (a broadcast's gradient)."""
    for axis, size in enumerate(shape):
        if size == 1 and x.shape[axis] != 1:
            x = ops.sum(x, axis=axis, keepdims=True)
    return x


def score_lead(query, key):
    """Static leading dims of the scores `(..., T, S)`: the broadcast of query's and key's."""
    lead_q, lead_k = static_shape(query)[:-2], static_shape(key)[:-2]
    width = max(len(lead_q), len(lead_k))
    lead_q = (1,) * (width - len(lead_q)) + lead_q
    lead_k = (1,) * (width - len(lead_k)) + lead_k
    return tuple(b if a == 1 else a for a, b in zip(lead_q, lead_k, strict=True))


def broadcast_lead(tensors):
    """Broadcast the leading dims (all but the last two) of tensors to one shape.

    Returns the broadcast tensors and the leading dims (ints where static,
    scalar tensors where not).
    """
    shapes = [static_shape(t)[:-2] for t in tensors]
    if all(s == shapes[0] for s in shapes) and None not in shapes[0]:
        return tensors, list(shapes[0])
    rank = max(len(s) for s in shapes)
    dyn = [ops.shape(to_rank(t, rank + 2))[:-2] for t in tensors]
    lead = []
    for axis in range(rank):
        sizes = [d[axis] for d in dyn]
        static = [s for s in sizes if _static_dim(s) is not None]
        big = [s for s in static if s != 1]
        lead.append(big[0] if big else (static[0] if len(static) == len(sizes) else sizes[0]))
    return [ops.broadcast_to(to_rank(t, rank + 2), tuple(lead) + tuple(t.shape[-2:]))
            for t in tensors], lead


def softmax_dtype(dtype):
    """Softmax runs in float32 at least: half precision overflows in exp()."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"
