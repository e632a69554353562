"""The one place where numerical tolerances live.

A result `actual` matches `expected` when
`|actual - expected| <= atol + rtol * |expected|` elementwise (numpy.allclose).
Keyed by the compute dtype of the layer under test; the expected values come
from the float64 NumPy reference (keras_attn.testing.reference).
"""

__all__ = ["TOLERANCES", "tolerance"]

TOLERANCES = {
    # float32 against the float64 reference: forward outputs and gradients.
    "float32": {"atol": 1e-5, "rtol": 1e-5},
    # Mixed precision: ~3 significant digits (float16), ~2 (bfloat16).
    "float16": {"atol": 1e-2, "rtol": 1e-2},
    "bfloat16": {"atol": 5e-2, "rtol": 5e-2},
}


def tolerance(dtype="float32"):
    """`{"atol": ..., "rtol": ...}` for a compute dtype name."""
    try:
        return dict(TOLERANCES[dtype])
    except KeyError:
        raise ValueError(
            f"No tolerance is defined for dtype {dtype!r}; known: "
            f"{sorted(TOLERANCES)}. Received: dtype={dtype!r}"
        ) from None
