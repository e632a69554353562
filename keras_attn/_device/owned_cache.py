"""The key/value cache `CausalLM.generate` owns on PyTorch: heads-first, written in place.

A `keras_attn.KVCache` is a value: each step returns a new cache, and its keys and
values are `(B, S_max, H_kv, d)`. On PyTorch both cost a pass over the whole cache per
layer and per decoding step, which transformers' static cache (written in place,
`(B, H_kv, S_max, d)`) does not pay:

- Keras's `ops.slice_update` clones the cache before it writes one slot;
- the attention reads the keys and values heads-first, and for B > 1 a
  `(B, S_max, H_kv, d)` cache seen heads-first cannot fold (B, H_kv) into one batch
  axis of a `bmm` without a copy;
- the kernels zero the keys that no query may attend (`zero_unattended_keys`), in case
  a caller's cache holds NaN there.

Measured on benchmarks/scale.py's Llama (D=512, 4 layers, 8/2 heads), one thread,
per decoding step, keras_attn against transformers' static cache: B=32 over 552 slots
85.8 against 35.4 ms (2.42x); B=1 over 32k slots 116.7 against 29.9 ms (3.91x). The
profile: `where` (the zeroing) and `copy_` (the clone, the batch fold) took most of it.
Without the three passes: 1.19x and 1.09x in the same runs' setting.

`OwnedKVCache` is what `generate` makes (through the "owned_cache" hook) for each
block's `KVCache`: it stores `(B, H_kv, S_max, d)` and writes in place
(`index_copy_`, traceable with a tensor index, so the traced decoding step replays
it), reads as the `(B, S_max, H_kv, d)` view every layer expects, and declares its
unattended slots finite (`KVCache.unattended_finite`): `generate` made it zeros and
only the model writes it, at indices `generate` checked. Nothing else may hold it:
an earlier step's cache is the same tensors, changed.
"""

import collections

import keras

from keras_attn._cache_rules import _cast, poison
from keras_attn._shapes import static_shape
from keras_attn.cache import KVCache

__all__ = ["OwnedKVCache", "owned_cache"]


def owned_cache(cache):
    """`generate`'s own cache of `cache`'s sizes (an `OwnedKVCache` of zeros) on PyTorch
    for a plain `KVCache`; None otherwise (another layout, another backend)."""
    if keras.backend.backend() != "torch" or type(cache) is not KVCache:
        return None
    return OwnedKVCache.zeros_like(cache)


# mypy refuses two tuple bases; at runtime both are `tuple` with empty slots (one layout).
class OwnedKVCache(collections.namedtuple("OwnedKVCache", ("key_heads", "value_heads")),  # type: ignore[misc]
                   KVCache):
    """Keys `(B, H_kv, S_max, d_k)` and values `(B, H_kv, S_max, d_v)`, written in place.

    A `KVCache` layout (see its docstring): `keys` and `values` are the
    `(B, S_max, H_kv, d)` views of the stored tensors.
    """

    __slots__ = ()
    unattended_finite = True

    @classmethod
    def zeros_like(cls, cache: KVCache) -> "OwnedKVCache":
        import torch

        def heads_first(x):
            B, S, H, d = static_shape(x)
            return torch.zeros((B, H, S, d), dtype=x.dtype, device=x.device)
        return cls(heads_first(cache.keys), heads_first(cache.values))

    @property
    def keys(self):
        return self.key_heads.transpose(1, 2)  # (B, S_max, H_kv, d_k), a view

    @property
    def values(self):
        return self.value_heads.transpose(1, 2)

    @property
    def max_length(self):
        return static_shape(self.key_heads)[2]

    def describe(self):
        return (f"cache.key_heads.shape={static_shape(self.key_heads)}, "
                f"cache.value_heads.shape={static_shape(self.value_heads)} (B, H_kv, S_max, d)")

    def write(self, keys, values, cache_update_index, in_range=None):
        """Writes `(B, S_new, H_kv, d)` keys and values at the index, in place; returns
        the same tensors."""
        import torch

        def put(stored, new):  # stored (B, H_kv, S_max, d)
            new = _cast(new, stored.dtype)
            new = new if in_range is None else poison(new, in_range)
            start = torch.as_tensor(cache_update_index, device=stored.device)
            slots = torch.arange(new.shape[1], device=stored.device) + start  # (S_new,)
            return stored.index_copy_(2, slots, new.transpose(1, 2))
        return type(self)(put(self.key_heads, keys), put(self.value_heads, values))

    def read(self, dtype):
        return _cast(self.keys, dtype), _cast(self.values, dtype)
