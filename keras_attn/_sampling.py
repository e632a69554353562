"""Sampling maths for `keras_attn.generation`: temperature, top-k, top-p and Gumbel noise.

Every setting may be a tensor (a compiled loop's input, not a constant it was traced
with), so nothing here branches in Python on a value:

- `filter_logits(logits, temperature, top_k, top_p_cut)`: transformers'
  `TemperatureLogitsWarper`, `TopKLogitsWarper` and `TopPLogitsWarper`, in that order
  (transformers' order), over `(B, V)` logits. `top_k` 0 means none; `top_p_cut` is
  `1 - top_p` (`top_p_cut(top_p)`), 0 meaning none. One ascending sort serves both:
  the k-th largest logit is `sorted[V - k]` (no static k), and the top-p cut removes the
  tokens whose cumulative probability, in ascending order, is `<= 1 - top_p`, keeping
  the most likely token always (`min_tokens_to_keep=1`).
- `gumbel_noise(seed, shape)`: Gumbel noise from a `(2,)` int32 seed by a counter-based
  integer hash in `keras.ops`, the same bits on every backend, compiled or not (Keras's
  `keras.random` takes no tensor seed on TensorFlow, and its TensorFlow kernels differ
  with and without XLA). `argmax(filtered_logits + noise)` is an exact sample of
  `softmax(filtered_logits)` (Gumbel-max).

Ties: where several tokens share the logit at the top-k or top-p boundary, all of them
are kept; transformers keeps a subset, chosen by its sort's order among equal values.
"""

import numbers

import keras
import numpy as np
from keras import ops

__all__ = ["check_temperature", "check_top_p", "filter_logits", "gumbel_noise", "make_chooser",
           "sampling_settings", "seed_pair", "top_p_cut"]


def check_temperature(temperature):
    """A finite number >= 0 (Python or NumPy, not a bool), as a Python float."""
    if (isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real)
            or not (np.isfinite(temperature) and temperature >= 0)):
        raise ValueError(
            "`temperature` must be a finite number >= 0 (0 for greedy decoding). "
            f"Received: temperature={temperature!r}")
    return float(temperature)


def check_top_p(top_p):
    """None, or a number with 0 < top_p <= 1 (Python or NumPy, not a bool), as a float."""
    if top_p is None:
        return None
    if (isinstance(top_p, (bool, np.bool_)) or not isinstance(top_p, numbers.Real)
            or not 0 < top_p <= 1):
        raise ValueError("`top_p` must be None or a number with 0 < top_p <= 1 (the "
                         f"probability mass kept). Received: top_p={top_p!r}")
    return float(top_p)


def top_p_cut(top_p):
    """`1 - top_p` as a float32 NumPy scalar (0.0 for None or 1: no cut).

    Computed in float64 and then rounded to float32, as transformers compares its float32
    cumulative probabilities with the Python float `1 - top_p`.
    """
    return np.float32(0.0 if top_p is None else 1.0 - float(top_p))


def seed_pair(seed):
    """An int seed (any: taken modulo 2**32) as the `(2,)` int32 array `gumbel_noise` takes."""
    bits = int(seed) % 2**32
    return np.array([bits - 2**32 if bits >= 2**31 else bits, 0], "int32")


def filter_logits(logits, temperature, top_k, top_p_cut):
    """`(B, V)` float32 logits divided by `temperature`, with the tokens outside the top
    `top_k` (0: none) and outside the top-p nucleus (`top_p_cut` = 1 - top_p, 0: none) set
    to -inf. Scalars may be Python numbers or tensors."""
    vocabulary = logits.shape[-1]
    logits = logits / ops.cast(temperature, "float32")
    ascending = ops.sort(logits, axis=-1)  # (B, V)
    top_k = ops.cast(top_k, "int32")
    k = ops.where(ops.greater(top_k, 0), ops.minimum(top_k, vocabulary), vocabulary)
    kth = _column(ascending, vocabulary - k)  # (B, 1): the k-th largest
    logits = ops.where(logits < kth, float("-inf"), logits)
    ascending = ops.where(ascending < kth, float("-inf"), ascending)  # still sorted
    cumulative = ops.cumsum(ops.softmax(ascending, axis=-1), axis=-1)
    cut = ops.cast(top_p_cut, "float32")
    removed = ops.sum(ops.cast(cumulative <= cut, "int32"), axis=-1, keepdims=True)
    removed = ops.minimum(removed, vocabulary - 1)  # the most likely token stays
    threshold = _column(ascending, removed)  # (B, 1): the least likely token kept
    nucleus = ops.where(logits < threshold, float("-inf"), logits)
    return ops.where(ops.greater(cut, 0.0), nucleus, logits)


def _column(values, index):
    """`values[b, index[b]]` as `(B, 1)`; `index` a scalar or `(B, 1)` int tensor."""
    index = ops.cast(index, "int32")
    index = ops.broadcast_to(ops.reshape(index, (-1, 1)), (values.shape[0], 1))
    return ops.take_along_axis(values, index, axis=-1)


# lowbias32 (C. Wellons' integer hash), on int32 bits: multiplications wrap modulo 2**32
# on every backend, and a logical right shift is an arithmetic one masked.
_M1, _M2 = 0x7FEB352D, 0x846CA68B - 2**32
_K0, _K1 = 0x9E3779B9 - 2**32, 0x85EBCA6B - 2**32


def _shift(x, n):
    return ops.bitwise_and(ops.right_shift(x, n), (1 << (32 - n)) - 1)


def _mix(x):
    x = ops.bitwise_xor(x, _shift(x, 16))
    x = ops.multiply(x, ops.convert_to_tensor(_M1, "int32"))
    x = ops.bitwise_xor(x, _shift(x, 15))
    x = ops.multiply(x, ops.convert_to_tensor(_M2, "int32"))
    return ops.bitwise_xor(x, _shift(x, 16))


def gumbel_noise(seed, shape):
    """Standard Gumbel noise of `shape` (float32) from `seed`, a `(2,)` int32 tensor.

    Element i's uniform is 23 bits of `hash(hash(i ^ k0) ^ k1)`, keys from the seed,
    plus one half: strictly inside (0, 1), so the noise is finite.
    """
    seed = ops.cast(seed, "int32")
    k0 = _mix(ops.bitwise_xor(seed[0], ops.convert_to_tensor(_K0, "int32")))
    k1 = _mix(ops.bitwise_xor(ops.bitwise_xor(seed[1], k0),
                              ops.convert_to_tensor(_K1, "int32")))
    size = int(np.prod(shape))
    bits = _mix(ops.bitwise_xor(_mix(ops.bitwise_xor(ops.arange(size, dtype="int32"), k0)), k1))
    uniform = (ops.cast(_shift(bits, 9), "float32") + 0.5) * (2.0 ** -23)
    return ops.reshape(-ops.log(-ops.log(uniform)), shape)


def sampling_settings(temperature, top_k, top_p, seed):
    """`generate`'s checked sampling arguments (temperature > 0) as the values the loop
    takes: temperature float32, top_k int32 (0: none), `top_p_cut` float32 (0: none), and
    the seed as `seed_pair`'s array (an int) or as given (a `keras.random.SeedGenerator`,
    or None)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_)):
        seed = seed_pair(seed)
    return {"temperature": np.float32(temperature), "top_k": np.int32(top_k or 0),
            "top_p_cut": top_p_cut(top_p), "seed": seed}


def make_chooser(sampling, steps, batch, vocabulary):
    """`choose(logits, step) -> (B,)` int32 for `steps` generated tokens of `batch` rows:
    greedy (argmax) when `sampling` is None, else filtered Gumbel-max with every step's
    noise drawn here, once: `(steps, B, V)` floats. A row whose logits are not all finite
    gets -1 (no id, visibly: `generate` then raises)."""
    noise = None
    if sampling is not None:
        seed = sampling["seed"]
        shape = (steps, batch, vocabulary)
        if seed is None or isinstance(seed, keras.random.SeedGenerator):
            uniform = keras.random.uniform(shape, minval=1e-7, maxval=1.0, seed=seed)
            noise = -ops.log(-ops.log(uniform))
        else:
            noise = gumbel_noise(seed, shape)

    def choose(logits, step):
        logits = ops.cast(logits, "float32")
        finite = ops.all(ops.isfinite(logits), axis=-1)  # (B,)
        if noise is None:
            chosen = ops.argmax(logits, axis=-1)
        else:
            logits = filter_logits(logits, sampling["temperature"], sampling["top_k"],
                                   sampling["top_p_cut"])
            chosen = ops.argmax(logits + ops.take(noise, step, axis=0), axis=-1)
        return ops.where(finite, ops.cast(chosen, "int32"), -1)

    return choose
