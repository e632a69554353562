"""Hypothesis strategies for attention problems (issue 12).

A strategy draws only the *structure* of a problem (shapes, dtypes, flags,
densities) and one integer seed; `build` turns a `Problem` into NumPy arrays
with `np.random.default_rng(seed)`. Shrinking therefore works on a handful of
small integers and booleans, never on array contents.

Inputs are rounded to the problem's dtype in NumPy (ml_dtypes for bfloat16),
so the float64 reference sees exactly the numbers the backend computes with.
"""

import dataclasses

import keras
import ml_dtypes
import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from . import shapes

PATHS = ("explicit", "fused", "blockwise")
# bfloat16 matmuls are not implemented by NumPy (Keras's numpy backend).
HALF_DTYPES = ("float16",) if keras.backend.backend() == "numpy" else ("float16", "bfloat16")
DTYPES = ("float32",) + HALF_DTYPES
INT_MASK_DTYPES = ("int32", "int64", "uint8", "int8")

MAX_LEN = 24
# JAX compiles every op once per shape (seconds each on 2 cores), so the `ci`
# profile draws from a few shapes; every other profile draws the full ranges.
# Lengths around the test block size of 4: one partial block, a full and a
# partial block, several blocks.
SMALL_VARIETY = settings.get_current_profile_name() == "ci"
CI_LENGTHS = shapes.LENGTHS
CI_LEADS = shapes.LEADS
CI_DIMS = shapes.HEAD_DIMS


def _length(lo, hi):
    if SMALL_VARIETY:
        return st.sampled_from([n for n in CI_LENGTHS if lo <= n <= hi] or [lo])
    return st.integers(lo, hi)


def _dim(hi):
    return st.sampled_from(CI_DIMS) if SMALL_VARIETY else st.integers(1, hi)


@dataclasses.dataclass(frozen=True)
class Problem:
    seed: int
    lead: tuple  # (B, H) or (B, H, E)
    T: int
    S: int
    d_k: int
    d_v: int
    dtype: str
    mask_shape: tuple | None  # broadcastable to lead + (T, S)
    mask_kind: str  # "bool" or an integer dtype
    mask_true: int  # the nonzero value of an integer mask
    mask_density: float  # fraction of allowed entries
    mask_dead_row: bool  # one row (or broadcast row) entirely masked
    bias_shape: tuple | None
    bias_scale: float
    bias_neg_inf: float  # fraction of -inf entries
    bias_dead_row: bool  # one row entirely -inf
    is_causal: bool
    scale: float | None
    implementation: str
    input_scale: float = 1.0
    integer_inputs: bool = False  # exact (integer) q and k, for huge logits
    kv_group: int = 1  # G: key/value have lead[-1] // G heads (grouped-query attention)
    window: int | None = None  # sliding window W
    soft_cap: float | None = None  # logit soft-cap c

    @property
    def kv_lead(self):
        """The leading dims of key and value: the heads axis (lead[-1]) divided by G."""
        return self.lead[:-1] + (self.lead[-1] // self.kv_group,)

    @property
    def options(self):
        """The modern keyword arguments of `scaled_dot_product_attention` and the reference."""
        return {"sliding_window": self.window, "logit_soft_cap": self.soft_cap}


def round_to(x, dtype):
    """`x` (float) rounded to `dtype`, back as float32 NumPy."""
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x


@st.composite
def broadcast_shapes(draw, full):
    """A shape broadcastable to `full`: a suffix of it, some dims set to 1.

    Covers `(S,)`, `(T, S)`, `(1, 1, T, S)`, `(B, 1, 1, S)`, `(B, H, T, S)`...
    """
    rank = draw(st.integers(1, len(full)))
    return tuple(d if draw(st.booleans()) else 1 for d in full[-rank:])


@st.composite
def problems(draw, *, paths=PATHS, dtypes=DTYPES, T=(1, MAX_LEN), S=(1, MAX_LEN), masks=True,
             biases=True, causal=None, max_lead=3, max_dim=6, modern=False):
    """An attention problem; see `Problem` and `build`.

    `modern=True` also draws grouped key/value heads, a sliding window and a
    soft-cap (paths that cannot soft-cap, the fused one, get none).
    """
    if SMALL_VARIETY:
        lead = draw(st.sampled_from(CI_LEADS))
    else:
        lead_rank = draw(st.sampled_from([2, 2, 3]))
        lead = tuple(draw(st.integers(1, max_lead)) for _ in range(lead_rank))
    T = draw(_length(*T))
    S = draw(_length(*S))
    d_k = draw(_dim(max_dim))
    d_v = draw(_dim(max_dim))
    full = lead + (T, S)

    mask_shape = draw(st.none() | broadcast_shapes(full)) if masks else None
    mask_kind = draw(st.sampled_from(("bool",) + INT_MASK_DTYPES))
    true_values = [1, 2, 7] + ([-1] if mask_kind in ("int32", "int64", "int8") else [])
    true_values += [256] if mask_kind in ("int32", "int64") else []
    mask_true = draw(st.sampled_from(true_values))
    mask_density = draw(st.sampled_from([1.0, 0.8, 0.5, 0.0]))
    mask_dead_row = draw(st.booleans())

    bias_shape = draw(st.none() | broadcast_shapes(full)) if biases else None
    bias_scale = draw(st.sampled_from([1.0, 0.1, 5.0]))
    bias_neg_inf = draw(st.sampled_from([0.0, 0.0, 0.2, 1.0]))
    bias_dead_row = draw(st.booleans())
    implementation = draw(st.sampled_from(paths))
    kv_group, window, soft_cap = 1, None, None
    if modern:
        heads = lead[-1]
        kv_group = draw(st.sampled_from([g for g in range(1, heads + 1) if heads % g == 0]))
        window = draw(st.none() | st.sampled_from([1, 2, 3, 5, 30]))
        if implementation != "fused":
            soft_cap = draw(st.none() | st.sampled_from([0.5, 2.0, 50.0]))

    return Problem(
        seed=draw(st.integers(0, 2**32 - 1)),
        lead=lead, T=T, S=S, d_k=d_k, d_v=d_v,
        dtype=draw(st.sampled_from(dtypes)),
        mask_shape=mask_shape, mask_kind=mask_kind, mask_true=mask_true,
        mask_density=mask_density, mask_dead_row=mask_dead_row,
        bias_shape=bias_shape, bias_scale=bias_scale, bias_neg_inf=bias_neg_inf,
        bias_dead_row=bias_dead_row,
        is_causal=draw(st.booleans()) if causal is None else causal,
        scale=draw(st.none() | st.sampled_from([0.05, 0.5, 1.0, 2.5])),
        implementation=implementation,
        kv_group=kv_group, window=window, soft_cap=soft_cap,
    )


def large_logit_problems(dtypes=HALF_DTYPES, paths=PATHS):
    """Half-precision problems whose logits reach ~1e5 (float16 overflows at 65504).

    q and k hold integers up to 200 (exact in float16 and bfloat16) and the
    scale is a power of two, so a path that forms the logits in float32 gets
    them exactly: only a half-precision softmax (or logit) could go wrong.
    """
    return problems(dtypes=dtypes, paths=paths, biases=False, max_dim=8).map(
        lambda p: dataclasses.replace(p, integer_inputs=True, scale=0.25))


def _dead_row(rng, array, value):
    """Set one row `[..., t, :]` (all keys of one query) of `array` to `value`."""
    if array.size == 0:
        return
    index = tuple(rng.integers(0, n) for n in array.shape[:-1])
    array[index] = value


def build(p):
    """NumPy arrays of a `Problem`: q, k, v, mask, bias (float32 values, already
    rounded to `p.dtype`; mask bool or integer; None where absent)."""
    rng = np.random.default_rng(p.seed)
    if p.integer_inputs:
        q = rng.integers(-200, 201, p.lead + (p.T, p.d_k)).astype(np.float32)
        k = rng.integers(-200, 201, p.kv_lead + (p.S, p.d_k)).astype(np.float32)
    else:
        q = rng.standard_normal(p.lead + (p.T, p.d_k)).astype(np.float32) * p.input_scale
        k = rng.standard_normal(p.kv_lead + (p.S, p.d_k)).astype(np.float32) * p.input_scale
    v = rng.standard_normal(p.kv_lead + (p.S, p.d_v)).astype(np.float32)
    q, k, v = (round_to(x, p.dtype) for x in (q, k, v))

    mask = None
    if p.mask_shape is not None:
        mask = rng.random(p.mask_shape) < p.mask_density
        if p.mask_dead_row:
            _dead_row(rng, mask, False)
        if p.mask_kind != "bool":
            mask = (mask.astype(np.int64) * p.mask_true).astype(p.mask_kind)
    bias = None
    if p.bias_shape is not None:
        bias = rng.standard_normal(p.bias_shape).astype(np.float32) * p.bias_scale
        bias[rng.random(p.bias_shape) < p.bias_neg_inf] = -np.inf
        if p.bias_dead_row:
            _dead_row(rng, bias, -np.inf)
        bias = round_to(bias, p.dtype)
    return q, k, v, mask, bias


def to_backend(x, dtype):
    """A float32 NumPy array as a backend tensor of `dtype` (None stays None)."""
    return None if x is None else keras.ops.cast(x, dtype)


# ----------------------------------------------------------------------------
# Small layer configurations.


@st.composite
def mha_configs(draw):
    return dict(
        num_heads=draw(st.integers(1, 3)),
        key_dim=draw(st.integers(1, 4)),
        value_dim=draw(st.none() | st.integers(1, 4)),
        output_dim=draw(st.none() | st.integers(1, 5)),
        use_bias=draw(st.booleans()),
        implementation=draw(st.sampled_from(("auto",) + PATHS)),
    )


@st.composite
def transformer_configs(draw):
    """(num_heads, keyword arguments, model width D) of an encoder/decoder layer."""
    num_heads = draw(st.integers(1, 3))
    explicit_key_dim = draw(st.booleans())
    key_dim = draw(st.integers(1, 4)) if explicit_key_dim else None
    D = draw(st.integers(1, 4)) * num_heads if key_dim is None else draw(st.integers(1, 8))
    kwargs = dict(
        intermediate_dim=draw(st.integers(1, 8)),
        key_dim=key_dim,
        activation=draw(st.sampled_from(["relu", "gelu", "tanh"])),
        normalize_first=draw(st.booleans()),
    )
    return num_heads, kwargs, D
