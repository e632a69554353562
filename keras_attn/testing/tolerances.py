"""The one place where numerical tolerances live.

A result `actual` matches `expected` when
`|actual - expected| <= atol + rtol * |expected|` elementwise (numpy.allclose).
Keyed by the compute dtype of the layer under test; the expected values come
from the float64 NumPy reference (keras_attn.testing.reference), or, in the
parity matrix (`keras-attn parity`), from another backend or device.

`TOLERANCES` is the base, per dtype. `OVERRIDES` refines it per quantity
("output" or "gradient") and device ("cpu" or "gpu") where a measurement
showed it is needed; every override says why.
"""

__all__ = ["OVERRIDES", "QUANTITIES", "TOLERANCES", "tolerance"]

TOLERANCES = {
    # float32 against the float64 reference: forward outputs and gradients.
    "float32": {"atol": 1e-5, "rtol": 1e-5},
    # Mixed precision: ~3 significant digits (float16), ~2 (bfloat16).
    "float16": {"atol": 1e-2, "rtol": 1e-2},
    # bfloat16 keeps 8 significant bits (unit roundoff 2^-8 = 3.9e-3); the
    # parity cases' outputs reach ~20, so a few roundings cost ~0.1. Measured
    # worst output error: 8.9e-2 (TensorFlow with TF_ENABLE_ONEDNN_OPTS=0,
    # pre-LN decoder with cross-attention, against the float64 reference),
    # which failed the earlier atol of 5e-2; with oneDNN on it passed that.
    "bfloat16": {"atol": 1.5e-1, "rtol": 5e-2},
}

QUANTITIES = ("output", "gradient")
DEVICES = ("cpu", "gpu")

# (dtype, quantity, device) -> tolerance that replaces the base entry.
# Gradients are sums over every position of the batch (entries up to ~30 in
# the parity cases), so their float32 rounding error scales with the largest
# entry, not with each entry: an element that is a near-cancelling sum can be
# ~1e-6 of the largest entry off while its own value is ~0. Measured worst on
# CPU: 2.5e-05 (tensorflow vs torch, pre-LN decoder, key kernel gradient).
# The same holds in mixed precision, where the backward pass runs in the
# compute dtype: measured worst gradient errors against the float64 reference
# on CPU were 0.62 (bfloat16) and 0.056 (float16), on gradients whose largest
# entries are ~30, i.e. ~2% and ~0.2% of the largest entry.
_GRADIENTS = {
    "float32": {"atol": 1e-4, "rtol": 1e-5},
    "float16": {"atol": 1e-1, "rtol": 1e-2},
    "bfloat16": {"atol": 1.0, "rtol": 5e-2},
}
OVERRIDES = {(dtype, "gradient", device): tol
             for dtype, tol in _GRADIENTS.items() for device in ("cpu", "gpu")}


def tolerance(dtype="float32", quantity="output", device="cpu"):
    """`{"atol": ..., "rtol": ...}` for a compute dtype, quantity and device."""
    if dtype not in TOLERANCES:
        raise ValueError(
            f"No tolerance is defined for dtype {dtype!r}; known: "
            f"{sorted(TOLERANCES)}. Received: dtype={dtype!r}"
        )
    if quantity not in QUANTITIES:
        raise ValueError(f"`quantity` must be one of {QUANTITIES}. Received: "
                         f"quantity={quantity!r}")
    if device not in DEVICES:
        raise ValueError(f"`device` must be one of {DEVICES}. Received: device={device!r}")
    return dict(OVERRIDES.get((dtype, quantity, device), TOLERANCES[dtype]))
