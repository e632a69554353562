"""Multi-head latent attention's cache: a `KVCache` of the compressed latent and the shared
RoPE key (keras.ops only).

A subclass of `keras_attn.cache.KVCache`, so that `KVCache.update` (the checks, the
write at `cache_update_index`, the positional mask) and every tree utility treat it as
any cache (see `keras_attn.cache` on named tuples as pytrees).
"""

import collections

from keras import ops

from keras_attn._cache_rules import _cast, poison, slice_update
from keras_attn._shapes import static_shape
from keras_attn._typing import Tensor
from keras_attn._validation import check_positive_int, dtype_of
from keras_attn.cache import KVCache

__all__ = ["LatentCache"]


# mypy refuses two tuple bases (see KerasHubKVCache).
class LatentCache(collections.namedtuple("LatentCache", ("latent", "rope_keys")),  # type: ignore[misc]
                  KVCache):
    """Multi-head latent attention's cache (DeepSeek-V2, arXiv 2405.04434): the compressed
    latent and the one shared RoPE key per position, instead of every head's keys and values.

    What `keras_attn.layers.MultiHeadLatentAttention` caches (transformers' DeepSeek V3
    caches the same two tensors): per token `kv_lora_rank + qk_rope_head_dim` numbers
    rather than `H * (d_qk + d_v)`. In `KVCache.update`'s terms the latent cache holds
    one key/value head: its "keys" are the RoPE keys `(B, S_new, 1, d_rope)` (rotated
    before they are written, as any cache's keys) and its "values" the latents
    `(B, S_new, 1, r)`; `read` gives them back with that head axis, and the layer
    expands them (`kv_b_proj`) or attends them directly (the absorbed form).

    Args:
        latent: `(B, S_max, r)`, r = `kv_lora_rank`: `kv_a_layernorm` of the latent part
            of `kv_a_proj_with_mqa`.
        rope_keys: `(B, S_max, d_rope)`, d_rope = `qk_rope_head_dim`: the shared key's
            rotary part, after RoPE.

    Example:

    >>> cache = LatentCache.empty(batch_size=2, max_length=16, kv_lora_rank=8,
    ...                           qk_rope_head_dim=4)
    >>> tuple(cache.latent.shape), tuple(cache.rope_keys.shape), cache.max_length
    ((2, 16, 8), (2, 16, 4), 16)
    """

    __slots__ = ()

    @classmethod
    def empty(cls, batch_size: int, max_length: int, kv_lora_rank: int,  # type: ignore[override]
              qk_rope_head_dim: int, dtype: str = "float32") -> "LatentCache":
        """Zeros: latent `(B, S_max, kv_lora_rank)`, RoPE keys `(B, S_max, qk_rope_head_dim)`
        (a latent cache has its own sizes, not `KVCache.empty`'s heads and widths)."""
        batch_size = check_positive_int("batch_size", batch_size)
        max_length = check_positive_int("max_length", max_length)
        rank = check_positive_int("kv_lora_rank", kv_lora_rank)
        rope = check_positive_int("qk_rope_head_dim", qk_rope_head_dim)
        return LatentCache(ops.zeros((batch_size, max_length, rank), dtype=dtype),
                           ops.zeros((batch_size, max_length, rope), dtype=dtype))

    @property
    def max_length(self) -> int:
        return static_shape(self.latent)[1]

    def describe(self) -> str:
        return (f"cache.latent.shape={static_shape(self.latent)}, "
                f"cache.rope_keys.shape={static_shape(self.rope_keys)}")

    def check(self, batch_size, num_key_value_heads, key_dim, value_dim) -> int:
        """`key_dim` is the RoPE keys' width, `value_dim` the latent's, the heads 1."""
        if num_key_value_heads not in (None, 1):
            raise ValueError(
                "A `LatentCache` holds one shared latent per position, for multi-head latent "
                "attention (`MultiHeadLatentAttention`); a layer with key/value heads needs a "
                f"`KVCache`. Received: num_key_value_heads={num_key_value_heads}, "
                f"{self.describe()}")
        for name, x, width in (("latent", self.latent, value_dim),
                               ("rope_keys", self.rope_keys, key_dim)):
            shape = static_shape(x)
            expected = (batch_size, None, width)
            if len(shape) != 3 or shape[1] is None or any(
                    e is not None and s is not None and s != e for s, e in zip(shape, expected)):
                raise ValueError(
                    f"`cache.{name}` must have shape (B, S_max, width) = ({batch_size}, S_max, "
                    f"{width}) with a static S_max (see `LatentCache.empty`). Received: "
                    f"{self.describe()}")
            if "float" not in dtype_of(x):
                raise ValueError(f"`cache.{name}` must be floating. Received: "
                                 f"cache.{name}.dtype={dtype_of(x)}")
        if static_shape(self.latent)[:2] != static_shape(self.rope_keys)[:2]:
            raise ValueError("`cache.latent` and `cache.rope_keys` must have the same B and "
                             f"S_max. Received: {self.describe()}")
        return self.max_length

    def write(self, keys, values, cache_update_index, in_range=None) -> "LatentCache":
        """The new cache with RoPE keys `(B, S_new, 1, d_rope)` and latents `(B, S_new, 1, r)`
        at the index."""
        def put(old, new):
            new = _cast(new[:, :, 0], old.dtype)  # the one head
            new = new if in_range is None else poison(new, in_range)
            return slice_update(old, [0, cache_update_index, 0], new)
        return LatentCache(put(self.latent, values), put(self.rope_keys, keys))

    def read(self, dtype) -> tuple[Tensor, Tensor]:
        """`(rope_keys (B, S_max, 1, d_rope), latent (B, S_max, 1, r))` in `dtype`."""
        return (ops.expand_dims(_cast(self.rope_keys, dtype), 2),
                ops.expand_dims(_cast(self.latent, dtype), 2))

    def to_keras_hub(self) -> Tensor:
        raise ValueError(
            "A `LatentCache` holds latents and shared RoPE keys, not keys and values: it has "
            f"no keras-hub (B, 2, S_max, H_kv, d) form. Received: {self.describe()}")
