"""The `auto` policy as data, the one function that reads it, and the execution-mode probe.

Dimension letters: B batch, H heads, T query length, S key length.

`POLICY` holds one `Row` per (backend, device kind): the measured rules and
thresholds of `implementation="auto"`. `select_implementation` evaluates the
row of the backend it is given (the layers pass `keras.backend.backend()`),
so every backend's row can be tested under any backend; `block_size_for`
reads `BLOCKS`, the blockwise block rule. The settings of `keras_attn.config`
override both.

`observe_paths()` (from `keras_attn._observe`, kept importable from here)
lets a caller (a test, a benchmark) see which path ran.
"""

import dataclasses
import functools
import math

import keras

from keras_attn import _hooks
from keras_attn._observe import observe_paths, record_path
from keras_attn._validation import check_positive_int

# 512 x 512 float32 scores = 1 MiB per (batch, head) pair: large enough for
# efficient matmuls on CPU, small enough to stay in cache-sized tiles.
DEFAULT_BLOCK_SIZE = 512
# 2**26 scores = 256 MiB in float32. The explicit and non-flash fused paths
# hold a few tensors of that size (logits, weights, and their gradients).
DEFAULT_BLOCKWISE_THRESHOLD = 2**26

# What the user set with `keras_attn.config` (None: not set, the policy decides).
_SETTINGS = {"block_size": None, "threshold": None}


def set_setting(name, value, argument):
    """`keras_attn.config`'s setters: a positive int or None, under `argument`'s name."""
    _SETTINGS[name] = check_positive_int(argument, value, allow_none=True)


def block_size_override():
    """The block size set by the user, or None (the policy chooses)."""
    return _SETTINGS["block_size"]


def threshold_override():
    """The threshold set by the user, or None (the measured policy decides)."""
    return _SETTINGS["threshold"]

__all__ = [
    "BLOCKS",
    "IMPLEMENTATIONS",
    "POLICY",
    "BlockRule",
    "Row",
    "block_rule",
    "block_size_for",
    "check_implementation",
    "device_kind",
    "execution_mode",
    "observe_paths",
    "policy_row",
    "record_path",
    "select_implementation",
    "set_execution_probe",
]

IMPLEMENTATIONS = ("auto", "fused", "blockwise", "explicit")


@dataclasses.dataclass(frozen=True)
class Row:
    """The rules of `auto` on one backend and device kind (see `select_implementation`).

    Attributes:
        max_scores: the memory bound: above this many scores in one call,
            `prod(lead) * T * S`, blockwise (`config.set_blockwise_threshold`
            replaces it).
        flash_unmasked: above the memory bound, calls without mask, bias,
            window or soft-cap (causal only when T == S) stay fused: the
            backend's fused kernel is linear in memory there already.
        blockwise_min_scores: `(banded, full)`: by speed, blockwise once one
            head's scores `T * S` reach these (banded = causal or windowed);
            None: never by speed.
        blockwise_min_call_scores: `(banded, full)`: by speed, blockwise once the
            scores of the whole call `prod(lead) * T * S` reach these; None
            (either or both): no such rule.
        blockwise_min_queries: ... and with at least this many queries.
        decode_explicit_below: a call over a key/value cache with fewer
            queries than this runs explicit; None: no such rule.
    """

    max_scores: int = DEFAULT_BLOCKWISE_THRESHOLD
    flash_unmasked: bool = False
    blockwise_min_scores: tuple | None = None
    blockwise_min_call_scores: tuple | None = None
    blockwise_min_queries: int = 16
    decode_explicit_below: int | None = None


# The measured part of the policy (benchmarks/crossover.py, benchmarks/README.md):
# on a CPU the blockwise loop beats the fused kernel once one head's scores reach
# these many elements, (causal or windowed, full), with at least 16 queries (with
# fewer, as when decoding one or a few tokens over a long cache, the loop costs
# more than it saves).
# - JAX: from 32 x 32. Its CPU `dot_product_attention` materialises the logits and
#   weights of every head and runs the softmax through memory; blockwise tiles stay
#   in cache and causal attention skips the blocks above the diagonal (1.1-1.5x
#   faster at T = 32-128, 2-5x from T = 256 up).
# - TensorFlow under XLA (`tf.function(jit_compile=True)`): from 512 x 512 causal,
#   1024 x 1024 full. Its XLA-compiled einsum-softmax is as fast as the loop on
#   shorter sequences; the loop's edge comes mostly from the causal blocks it skips.
#   In a plain `tf.function` (Keras's fit and predict on a CPU-only machine) the loop
#   pays per block: causal from 2**24 scores in the call, B*H*T*S (B=8, H=8 from
#   T = 512: 0.79 of fused forward, 0.92 train; B=1, H=4 from T = 2048: 0.82 and 1.02;
#   below, fused is faster, blockwise 1.1-1.4x at B=1, H=4, T = 256-1024); full
#   attention never by speed (fused up to T = 2048). Eager: never by speed (the loop
#   runs op by op: 1.2-3.2x fused at T = 32-4096). `execution_mode()` picks the row.
# - PyTorch: never by speed: its CPU SDPA kernel is faster than a loop of ops. Above
#   the memory bound, unmasked calls stay on SDPA's own flash kernel (linear in
#   memory already, and faster than a loop), on every device.
# - NumPy (inference): the fused kernel.
# - Any GPU or TPU: the fused kernels are cuDNN/flash and no measurement here says
#   otherwise (no GPU was available to measure the crossover).
# Decoding: a call over a key/value cache with fewer than 16 queries runs explicit
# on a CPU (every backend). Its mask is the cache's written-slots mask, built per
# step; measured on the cached step of `benchmarks/decode.py` (one or a few queries
# over 768 slots), the two matrix products beat the fused kernel's mask handling by
# 10-30% on JAX, TensorFlow and PyTorch alike.
DECODE_EXPLICIT_BELOW = 16
_GPU_TPU = Row()  # any GPU or TPU: the fused kernel below the memory bound
POLICY = {
    "jax": {
        "cpu": Row(blockwise_min_scores=(32 * 32, 32 * 32),
                   decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "default": _GPU_TPU,
    },
    "tensorflow": {  # "cpu": XLA, or a mode unknown; the decoding rule as measured under XLA
        "cpu": Row(blockwise_min_scores=(512 * 512, 1024 * 1024),
                   decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "cpu/graph": Row(blockwise_min_call_scores=(2**24, None),
                         decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "cpu/eager": Row(decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "default": _GPU_TPU,
    },
    "torch": {  # devices are the tensor's: "cpu", "cuda", "mps", ...
        "cpu": Row(flash_unmasked=True, decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "default": Row(flash_unmasked=True),
    },
    "numpy": {
        "cpu": Row(decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "default": _GPU_TPU,
    },
    # Any other backend: the rules that every backend shares.
    "default": {
        "cpu": Row(decode_explicit_below=DECODE_EXPLICIT_BELOW),
        "default": _GPU_TPU,
    },
}


@dataclasses.dataclass(frozen=True)
class BlockRule:
    """How the blockwise path picks its block length (see `block_size_for`)."""

    sizes: tuple = (512, 256, 128, 64)
    tile_scores: int = 2**20
    one_block: int = 128
    max_small_blocks: int = 4
    long_causal_blocks: int | None = None


# The block length the blockwise path picks when none is set: the largest of
# these whose tile of scores over the leading dims, `prod(lead) * block**2`,
# stays within `tile_scores` (4 MiB of float32, cache-sized), or half of it when
# causal or windowed: there a loop wastes about half a block per row on the
# diagonal, so smaller blocks pay off. Measured: B=1, H=4 runs best with 512
# (256 causal), B=8, H=8 with 128, and 64 when causal over at most
# `max_small_blocks` of them: MultiHeadAttention's JAX train step at T=256,
# D=256 took 0.58-0.63x Keras's time with 64, 0.75-0.89x with 128; from
# T=512 the loop over more, smaller blocks costs more than their smaller
# triangle saves (forward 0.48 vs 0.37 of fused at T=512, 0.38 vs 0.28 at
# T=1024), so blocks below 128 are used only on sequences of at most 4 of
# them. A sequence that fits in `one_block` runs as a single block whatever
# the budget: with no loop left, the compiler fuses the step (at T=128 the
# train step took 0.83x Keras with one block, 0.94x with blocks of 64).
# One rule on every backend (measured on JAX's CPU, where blockwise runs most), but
# JAX's `long_causal_blocks`: causal (no window) over at least 8 full-tile blocks keeps
# the full tile, the diagonal then wasting at most 1/16 of the work. B=1, H=4, 512 over
# 256 (interleaved): MHA forward 0.69 / 0.60 of the time at T=4096 / 16384, train
# 0.94 / 1.00; TensorFlow's XLA went the other way (kernel 1.07-1.26): half tile there.
BLOCKS = BlockRule()
BLOCKS_BY_BACKEND = {"jax": BlockRule(long_causal_blocks=8)}


def block_rule(backend):
    """The `BlockRule` of a backend (`BLOCKS` unless it has one of its own)."""
    return BLOCKS_BY_BACKEND.get(backend, BLOCKS)


def policy_row(backend, device, mode=None):
    """The `Row` of `POLICY` for a backend name, a device kind ("cpu", "gpu", ...)
    and an execution mode ("eager", "graph", "xla" or None): the row
    `"device/mode"` where the backend has one, else the device's row."""
    rows = POLICY.get(backend, POLICY["default"])
    if mode is not None and f"{device}/{mode}" in rows:
        return rows[f"{device}/{mode}"]
    return rows.get(device, rows["default"])


# How the backend runs the code being traced: the "execution_mode" hook, which
# `keras_attn._device` provides at the backend boundary (`keras_attn._hooks`), so
# that this module stays free of backend code. Without one, None.
def set_execution_probe(probe):
    """Use `probe()` ("eager", "graph", "xla" or None) as `execution_mode`."""
    _hooks.set("execution_mode", probe)


def execution_mode():
    """"eager", "graph" or "xla" on TensorFlow (see `_device.execution_mode`), else None."""
    probe = _hooks.get("execution_mode")
    return None if probe is None else probe()


# ----------------------------------------------------------------------------
# Evaluating the policy.


def check_implementation(implementation, allow_callable=False):
    """`implementation` is one of `IMPLEMENTATIONS` (or, for a layer, a callable), else a
    `ValueError`."""
    if allow_callable and callable(implementation):
        return implementation
    if not isinstance(implementation, str) or implementation not in IMPLEMENTATIONS:
        extra = " or a callable with the signature of scaled_dot_product_attention" * bool(
            allow_callable)
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}{extra}. "
            f"Received: implementation={implementation!r}"
        )
    return implementation


def _known_scores(lead, T, S):
    """`prod(lead) * T * S` over the dims known statically (an unknown dim counts as 1)."""
    return math.prod(d for d in (*lead, T, S) if d is not None)


@functools.cache
def _default_device_kind():
    """"cpu", "gpu" or "tpu": where Keras runs by default (JAX and TensorFlow)."""
    try:
        devices = keras.distribution.list_devices()
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        return "cpu"  # NumPy; PyTorch reads the tensor's device instead
    return devices[0].split(":")[0].lower() if devices else "cpu"


def device_kind(tensor=None):
    """"cpu", "gpu", "tpu" (or PyTorch's "cuda", "mps", ...) of a call.

    PyTorch tensors carry their device (`tensor.device.type`); under JAX and
    TensorFlow traced tensors don't, so the default device Keras places work
    on decides (`keras.distribution.list_devices()`).
    """
    if keras.backend.backend() == "torch":
        kind = getattr(getattr(tensor, "device", None), "type", None)
        return "cpu" if kind is None else str(kind)
    if keras.backend.backend() == "numpy":
        return "cpu"
    return _default_device_kind()


def block_size_for(lead, T, S, banded=False, blocks=BLOCKS, sliding_window=None):
    """The blockwise block length for a call (a set size overrides the choice).

    Args:
        lead: the static leading dims of the scores (None where unknown,
            counted as 1).
        T, S: query and key lengths (the blockwise path clamps a block to
            its sequence).
        banded: causal or windowed attention, where blocks off the band are
            skipped.
        blocks: the `BlockRule` (defaults to `BLOCKS`; `block_rule(backend)`
            gives a backend's).
        sliding_window: the window when banded by one (None: causal).
    """
    size = block_size_override()
    if size is None:
        per_block = _known_scores(lead, 1, 1)

        def largest(budget):
            return next((b for b in blocks.sizes if per_block * b * b <= budget), blocks.sizes[-1])

        size = largest(blocks.tile_scores)
        longest = max(T or 1, S or 1)
        long_causal = (sliding_window is None and blocks.long_causal_blocks is not None
                       and longest >= blocks.long_causal_blocks * size)
        if banded and not long_causal:
            size = largest(blocks.tile_scores // 2)
        if longest <= blocks.one_block:
            size = blocks.one_block  # one block: clamped to the sequence by the blockwise path
        elif size < blocks.one_block and longest > blocks.max_small_blocks * size:
            size = blocks.one_block
    return size


def select_implementation(implementation, *, backend, lead, T, S, has_mask, has_bias,
                          is_causal, needs_weights, symbolic, has_window=False,
                          has_soft_cap=False, device=None, cached=False, mode=None,
                          unfusable=()):
    """The path a call takes; the one place where `"auto"` is decided.

    The policy of `"auto"`, in order (the numbers are the row of `POLICY`
    for `backend` and `device`):

    1. Scores requested, attention dropout active, or symbolic inputs: explicit
       (the only path that materialises the weights).
    2. Unknown T or S: fused (explicit with a soft-cap): blockwise needs static
       lengths.
    3. Memory: when the scores of one call, `prod(lead) * T * S` (unknown dims
       count as 1), exceed `Row.max_scores` (2**26 elements, 256 MiB of
       float32; `config.blockwise_threshold()`), blockwise; except where
       `Row.flash_unmasked` (PyTorch) without mask, bias, window or soft-cap
       (and causal only when T == S), where SDPA's own flash kernel is
       linear in memory already.
    4. Speed, measured (benchmarks/crossover.py): blockwise once one head's
       scores `T * S` reach `Row.blockwise_min_scores` (on a CPU: 32 x 32 on
       JAX; 512 x 512 causal and 1024 x 1024 full on TensorFlow under XLA;
       never on PyTorch, NumPy, GPUs and TPUs), or the call's scores reach
       `Row.blockwise_min_call_scores` (TensorFlow in a plain `tf.function`:
       2**24 causal or windowed), with at least `Row.blockwise_min_queries`
       (16) queries, the block from `block_size_for`. TensorFlow's row
       follows `mode`: eagerly, never by speed.
    5. Decoding: a call over a key/value cache with fewer than
       `Row.decode_explicit_below` (16, every backend's CPU) queries runs
       explicit.
    6. Everywhere else fused, or explicit with a soft-cap (the fused kernel
       cannot cap).

    A threshold set with `config.set_blockwise_threshold` replaces 3, 4 and 5
    by its one rule (blockwise above it, fused at or below) on every backend.

    Args:
        implementation: the requested one (`"auto"` resolves here).
        backend: the Keras backend's name (`keras.backend.backend()`).
        lead: static leading dims of the scores (batch, heads, ...), None where unknown.
        T, S: static query and key lengths (None if unknown).
        has_mask, has_bias, is_causal: what the call carries.
        needs_weights: scores are requested, or attention dropout is active;
            only the explicit path materialises the weights.
        symbolic: the inputs are `KerasTensor`s (shape inference only).
        has_window, has_soft_cap: a sliding window or a logit soft-cap is set.
        unfusable: the names of the set options that the fused kernel cannot
            apply (`KernelSpec.unfusable`; `has_soft_cap` adds
            `logit_soft_cap`): such a call goes to the explicit or blockwise
            path, and `"fused"` is a ValueError naming them.
            The fused kernel cannot soft-cap, so `auto` routes around it.
        device: `device_kind()` of the call; read when None.
        cached: the call attends over a key/value cache (a decode step).
        mode: `execution_mode()` of the call ("eager", "graph", "xla"), which
            picks the row `"device/mode"` where the backend has one;
            None: the device's row.
    """
    check_implementation(implementation)
    unfusable = tuple(dict.fromkeys((*unfusable, *(("logit_soft_cap",) if has_soft_cap else ()))))
    has_soft_cap = bool(unfusable)  # below: "the logits are transformed"
    if needs_weights or symbolic:
        return record_path("explicit")
    if implementation == "fused" and unfusable:
        what = ("cannot soft-cap the logits" if "logit_soft_cap" in unfusable else
                "cannot transform the logits")
        raise ValueError(
            f"The fused kernel (`keras.ops.dot_product_attention`) {what}; use "
            "implementation='auto', 'blockwise' or 'explicit'. "
            f"Received: implementation={implementation!r} with {', '.join(unfusable)}")
    if implementation == "blockwise" and (T is None or S is None):
        raise ValueError(
            "`implementation='blockwise'` needs static query and key lengths. "
            f"Received: implementation={implementation!r} with T={T}, S={S}"
        )
    if implementation != "auto":
        return record_path(implementation)
    not_blockwise = "explicit" if has_soft_cap else "fused"
    if T is None or S is None:
        return record_path(not_blockwise)
    row = policy_row(backend, device_kind() if device is None else device, mode)
    # An unknown batch dim (a `None` input signature, an export) counts as 1:
    # the per-example score count alone decides, so a long sequence never
    # falls back to the full score matrix just because the batch is symbolic.
    override = threshold_override()
    if _known_scores(lead, T, S) > (row.max_scores if override is None else override):
        if (row.flash_unmasked and not has_mask and not has_bias and not has_window
                and not has_soft_cap and (not is_causal or T == S)):
            return record_path("fused")
        return record_path("blockwise")
    if override is not None:
        return record_path(not_blockwise)
    banded = is_causal or has_window
    for minimum, scores in ((row.blockwise_min_scores, T * S),
                            (row.blockwise_min_call_scores, _known_scores(lead, T, S))):
        minimum = None if minimum is None else minimum[0 if banded else 1]
        if minimum is not None and scores >= minimum and T >= row.blockwise_min_queries:
            return record_path("blockwise")
    if cached and row.decode_explicit_below is not None and T < row.decode_explicit_below:
        return record_path("explicit")
    return record_path(not_blockwise)
