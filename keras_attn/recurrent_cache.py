"""A linear-attention layer's cache: the short convolution's last inputs and the recurrent
state (keras.ops only).

A softmax layer's `KVCache` grows with the sequence (`S_max` slots of keys and values); a
Gated DeltaNet layer carries two tensors of a fixed size instead, whatever the length.
It is a named tuple, like `KVCache`, so that it crosses `jax.jit`, `tf.function`,
`keras.ops.while_loop` and `keras.tree` as a pytree without a registration; it is not a
`KVCache` subclass, because it has no slots, no write index and no positional mask
(`KVCache.update`'s rules do not apply: a state has no positions).
"""

import collections

import keras
from keras import ops

from keras_attn._shapes import static_shape
from keras_attn._validation import check_positive_int, dtype_of

__all__ = ["RecurrentCache"]

_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


class RecurrentCache(collections.namedtuple("RecurrentCache",
                                            ("conv_state", "recurrent_state"))):
    """What `keras_attn.layers.GatedDeltaNet` carries from one call to the next.

    transformers 5.24's `Qwen3_5DynamicCache` holds the same two tensors per linear layer
    (`conv_states`, `recurrent_states`; it keeps K convolution inputs where K - 1 suffice).

    Args:
        conv_state: `(B, C, K - 1)`, C = `conv_dim` (2 H_k d_k + H d_v), K the
            convolution's kernel size: the last K - 1 inputs of the causal convolution,
            channels first as transformers holds them.
        recurrent_state: `(B, H, d_k, d_v)`, the delta rule's state.

    Example:

    >>> cache = RecurrentCache.empty(batch_size=2, conv_dim=20, conv_kernel_size=4,
    ...                              num_heads=2, key_dim=4, value_dim=2)
    >>> tuple(cache.conv_state.shape), tuple(cache.recurrent_state.shape)
    ((2, 20, 3), (2, 2, 4, 2))
    """

    __slots__ = ()

    @classmethod
    def empty(cls, batch_size: int, conv_dim: int, conv_kernel_size: int, num_heads: int,
              key_dim: int, value_dim: int, *, dtype: str = "float32") -> "RecurrentCache":
        """Zeros: conv state `(B, conv_dim, K - 1)`, recurrent state `(B, H, d_k, d_v)`."""
        batch_size = check_positive_int("batch_size", batch_size)
        conv_dim = check_positive_int("conv_dim", conv_dim)
        taps = check_positive_int("conv_kernel_size", conv_kernel_size)
        shape = tuple(check_positive_int(n, x) for n, x in (
            ("num_heads", num_heads), ("key_dim", key_dim), ("value_dim", value_dim)))
        return RecurrentCache(ops.zeros((batch_size, conv_dim, taps - 1), dtype=dtype),
                              ops.zeros((batch_size, *shape), dtype=dtype))

    def describe(self) -> str:
        return (f"cache.conv_state.shape={static_shape(self.conv_state)}, "
                f"cache.recurrent_state.shape={static_shape(self.recurrent_state)}")

    def check(self, batch_size, conv_dim, conv_kernel_size, state_shape) -> None:
        """Refuse (a ValueError) a cache that does not fit the layer; `state_shape` is
        `(H, d_k, d_v)`, `batch_size` may be None."""
        expected = ((batch_size, conv_dim, conv_kernel_size - 1), (batch_size, *state_shape))
        for name, x, want in zip(self._fields, self, expected):
            shape = static_shape(x)
            if len(shape) != len(want) or any(
                    w is not None and s is not None and s != w for s, w in zip(shape, want)):
                raise ValueError(f"`cache.{name}` must have shape {want} (see "
                                 f"`GatedDeltaNet.empty_cache`). Received: {self.describe()}")
            if "float" not in dtype_of(x):
                raise ValueError(f"`cache.{name}` must be floating. Received: "
                                 f"cache.{name}.dtype={dtype_of(x)}")

    def nbytes_per_sequence(self) -> int:
        """Bytes of one sequence's state (both tensors); independent of its length."""
        total = 0
        for x in self:
            shape = static_shape(x)[1:]
            count = 1
            for d in shape:
                count *= d
            total += count * _BYTES[keras.backend.standardize_dtype(dtype_of(x))]
        return total
