"""Key/value caches for incremental decoding (keras.ops only).

A cache holds the keys and values of the positions seen so far, so that each
decoding step projects only its new tokens. Keys are stored after qk-norm and
RoPE, so that a stored key never needs its position again. Dimension letters:
B batch, S_max the cache length (the longest sequence it can hold), H_kv
key/value heads, d_k and d_v the key and value head widths.

`KVCache` is the object: keys `(B, S_max, H_kv, d_k)` and values
`(B, S_max, H_kv, d_v)` held apart, and one `update(...)` that a layer calls
once per step (the checks, the write at `cache_update_index`, the keys and
values to attend, the positional mask and the query positions, and NaN for a
traced index out of range). keras-hub's `(B, 2, S_max, H_kv, d)` tensor
(`empty_cache`'s default, keys at index 0 of axis 1, values at 1) is still
accepted wherever a cache is: it travels as the `KerasHubKVCache` subclass
inside the layer and comes back as a tensor; `KVCache.from_keras_hub` and
`to_keras_hub` convert between the two.

How a cache crosses `jax.jit`, `tf.function`, `keras.ops.while_loop`,
`keras.tree` and PyTorch's tracers: `KVCache` is a named tuple (a subclass of
`collections.namedtuple`, with methods and no other state). Every one of
those tree utilities knows named tuples and rebuilds them as `type(x)(*leaves)`,
so the object is a pytree on every backend without a registration (which
would need a backend import) and comes back as the same class.

The rules of a call over a cache (checks, positions, the positional mask)
live in `keras_attn._cache_rules`, and stay public here under their old
names: `check_cache`, `check_cache_call`, `fold_positions`, `write`, `read`,
`poison`, `positions`, ... (the protocol that layers ran before the object).
The capacity of a generation is checked by `keras_attn.generation.generate`
itself, once; `generation_slots` (the context variable it used) is deprecated
and no layer reads it.
"""

import collections
import contextlib
import contextvars
from typing import NamedTuple

import keras
from keras import ops

from keras_attn._cache_rules import (
    _cast,
    cached_positional_mask,
    check_cache,
    check_cache_call,
    check_cache_masks,
    check_cache_update_index,
    check_index_has_cache,
    fold_positions,
    index_in_range,
    poison,
    positions,
    read,
    slice_update,
    write,
)
from keras_attn._shapes import static_shape
from keras_attn._typing import Tensor
from keras_attn._validation import check_positive_int, dtype_of

__all__ = [
    "CacheUpdate",
    "KVCache",
    "KerasHubKVCache",
    "cache_length",
    "cache_shape",
    "cache_spec",
    "cached_positional_mask",
    "check_cache",
    "check_cache_call",
    "check_cache_masks",
    "check_cache_update_index",
    "check_generation_slots",
    "empty_cache",
    "fold_positions",
    "generation_slots",
    "check_index_has_cache",
    "index_in_range",
    "poison",
    "positions",
    "read",
    "write",
]


class CacheUpdate(NamedTuple):
    """What `KVCache.update` returns: everything a layer needs from its cache for one step.

    Attributes:
        keys: `(B, S_max, H_kv, d_k)`, the keys to attend (the new ones written), in the
            dtype asked for.
        values: `(B, S_max, H_kv, d_v)`, likewise.
        mask: bool `(T, S_max)`, the positional rules over the slots (causal, window,
            written slots), or None when every slot may be attended.
        query_positions: int32 `(T,)`, the queries' absolute positions (for RoPE).
        cache: the new cache, as the layer hands it back (a `KVCache`, or the
            keras-hub tensor for a `KerasHubKVCache`).
        in_range: None, or (for a traced index) a bool scalar tensor: the write fitted.
        unattended_finite: the cache's `unattended_finite`: the slots no query may
            attend hold finite values, so the kernels need not zero them.
    """

    keys: Tensor
    values: Tensor
    mask: Tensor | None
    query_positions: Tensor
    cache: object
    in_range: Tensor | None
    unattended_finite: bool = False

    def poison(self, x: Tensor) -> Tensor:
        """`x` where the write fitted, NaN where a traced index was out of range."""
        return x if self.in_range is None else poison(x, self.in_range)


class KVCache(collections.namedtuple("KVCache", ("keys", "values"))):
    """A key/value cache: keys and values held apart, and one `update` per step.

    Like flax nnx's and equinox's caches, a small immutable object: `update`
    returns a new cache rather than writing in place, so that it passes
    through `call` as an input and comes back as an output of the step, inside
    `jax.jit`, `tf.function`, `keras.ops.while_loop` or a PyTorch trace. It is
    a named tuple, the one container that every backend's tree utilities
    flatten and rebuild without a registration (see the module docstring).

    Args:
        keys: `(B, S_max, H_kv, d_k)`, after qk-norm and RoPE.
        values: `(B, S_max, H_kv, d_v)`; d_v may differ from d_k.

    Another layout (a latent cache for multi-head latent attention, a paged
    one) is a subclass, not a fork. It declares its tensors with a named tuple
    in front of `KVCache` in its bases, and overrides the layout methods;
    `update`, the rules of positions, masks and out-of-range indices, is
    inherited:

    - `max_length` (property): S_max.
    - `check(batch_size, num_key_value_heads, key_dim, value_dim)`: refuse a
      cache that does not fit the layer (a `ValueError`); return S_max.
    - `write(keys, values, cache_update_index, in_range=None)`: the new cache
      with `(B, S_new, H_kv, d)` keys and values at the index (NaN where
      `in_range` is false).
    - `read(dtype)`: what the layer attends, `(keys, values)`.
    - `describe()`: the shapes, for messages; `carried()`: what the layer
      returns (the object itself by default).

    `KerasHubKVCache` below is such a subclass: one `(B, 2, S_max, H_kv, d)`
    tensor; `keras_attn.latent_cache.LatentCache` (multi-head latent attention's
    latent and shared RoPE key) is another.

    Example:

    >>> import keras_attn
    >>> layer = keras_attn.MultiHeadAttention(4, 8, value_dim=16, num_key_value_heads=2)
    >>> cache = KVCache.empty(batch_size=1, max_length=32, num_key_value_heads=2,
    ...                       key_dim=8, value_dim=16)
    >>> x = keras.ops.ones((1, 3, 24))
    >>> y, cache = layer(x, cache=cache, cache_update_index=0, use_causal_mask=True)
    >>> tuple(cache.keys.shape), tuple(cache.values.shape)
    ((1, 32, 2, 8), (1, 32, 2, 16))
    """

    __slots__ = ()

    # Whether every slot holds a finite value, unwritten ones included (zeros), so that
    # the kernels need not zero the slots no query attends (`KernelSpec.unattended_finite`).
    # Not for a cache in general: a caller may fill one with anything, and a traced
    # index out of range writes NaN (`poison`). True for the cache `generate` owns on
    # PyTorch (`keras_attn._device.owned_cache`), which nothing else writes.
    unattended_finite = False

    @classmethod
    def empty(cls, batch_size: int, max_length: int, num_key_value_heads: int, key_dim: int,
              value_dim: int | None = None, dtype: str = "float32") -> "KVCache":
        """Zeros: keys `(B, S_max, H_kv, d_k)`, values `(B, S_max, H_kv, d_v)`."""
        batch_size = check_positive_int("batch_size", batch_size)
        max_length = check_positive_int("max_length", max_length)
        heads = check_positive_int("num_key_value_heads", num_key_value_heads)
        key_dim = check_positive_int("key_dim", key_dim)
        value_dim = check_positive_int("value_dim", value_dim, allow_none=True) or key_dim
        return KVCache(ops.zeros((batch_size, max_length, heads, key_dim), dtype=dtype),
                       ops.zeros((batch_size, max_length, heads, value_dim), dtype=dtype))

    @classmethod
    def from_keras_hub(cls, cache: Tensor) -> "KVCache":
        """A `KVCache` from keras-hub's `(B, 2, S_max, H_kv, d)` tensor (keys, then values)."""
        shape = static_shape(cache)
        check_cache(cache, shape[0] if shape else None, *(shape[3:5] if len(shape) == 5
                                                          else (None, None)))
        return KVCache(cache[:, 0], cache[:, 1])

    @classmethod
    def of(cls, cache, cache_update_index=None) -> "KVCache | None":
        """The object for a layer's `cache` argument: a `KVCache` as it is, keras-hub's
        tensor as a `KerasHubKVCache` (handed back as a tensor), None as None (then an
        index is refused: it says where to write into a cache that is not there)."""
        if cache is None:
            check_index_has_cache(cache, cache_update_index)
            return None
        return cache if isinstance(cache, KVCache) else KerasHubKVCache(cache)

    def to_keras_hub(self) -> Tensor:
        """keras-hub's `(B, 2, S_max, H_kv, d)` tensor; keys and values must share d."""
        keys, values = self.read(self.dtype)
        if static_shape(keys)[-1] != static_shape(values)[-1]:
            raise ValueError(
                "keras-hub's cache (B, 2, S_max, H_kv, d) holds keys and values in one "
                "tensor: their head widths must be equal. Received: "
                f"{self.describe()}")
        return ops.stack([keys, values], axis=1)

    # The layout: what a subclass overrides.

    @property
    def max_length(self) -> int:
        """S_max, the slots of the cache (static)."""
        return static_shape(self.keys)[1]

    @property
    def dtype(self) -> str:
        """The dtype the cache stores."""
        return dtype_of(self[0])

    def describe(self) -> str:
        """The shapes, for messages: `cache.keys.shape=..., cache.values.shape=...`."""
        return (f"cache.keys.shape={static_shape(self.keys)}, "
                f"cache.values.shape={static_shape(self.values)}")

    def check(self, batch_size, num_key_value_heads, key_dim, value_dim) -> int:
        """Refuse a cache that does not fit a layer of these sizes (None: not known); S_max."""
        for name, x, width in (("keys", self.keys, key_dim), ("values", self.values, value_dim)):
            shape = static_shape(x)
            expected = (batch_size, None, num_key_value_heads, width)
            if len(shape) != 4 or shape[1] is None or any(
                    e is not None and s is not None and s != e for s, e in zip(shape, expected)):
                raise ValueError(
                    f"`cache.{name}` must have shape (B, S_max, H_kv, d) = ({batch_size}, "
                    f"S_max, {num_key_value_heads}, {width}) with a static S_max (see "
                    f"`KVCache.empty`). Received: {self.describe()}")
            if "float" not in dtype_of(x):
                raise ValueError(f"`cache.{name}` must be floating. Received: "
                                 f"cache.{name}.dtype={dtype_of(x)}")
        if static_shape(self.keys)[:2] != static_shape(self.values)[:2]:
            raise ValueError("`cache.keys` and `cache.values` must have the same B and "
                             f"S_max. Received: {self.describe()}")
        return self.max_length

    def write(self, keys, values, cache_update_index, in_range=None) -> "KVCache":
        """The new cache, with `(B, S_new, H_kv, d)` keys and values at the index."""
        def put(old, new):
            new = _cast(new, old.dtype)
            new = new if in_range is None else poison(new, in_range)
            return slice_update(old, [0, cache_update_index, 0, 0], new)
        return type(self)(put(self.keys, keys), put(self.values, values))

    def read(self, dtype) -> tuple[Tensor, Tensor]:
        """`(keys, values)` `(B, S_max, H_kv, d)` in `dtype`."""
        return _cast(self.keys, dtype), _cast(self.values, dtype)

    def carried(self):
        """What the layer returns as the new cache: the object itself."""
        return self

    # The one call.

    def update(self, keys, values, cache_update_index=None, *, query_length, batch_size=None,
               num_key_value_heads=None, key_dim=None, value_dim=None, is_causal=False,
               window=None, rope=None, dtype=None, masks=None,
               attention_chunk_size=None) -> CacheUpdate:
        """One step over the cache: check, position, write, read, mask.

        Args:
            keys: the new keys `(B, S_new, H_kv, d_k)` after qk-norm, before RoPE;
                None with `values` for a read-only call: with `cache_update_index`
                None, over every slot; with an index, the cache as another layer
                left it at that step (a KV-shared layer, `is_kv_shared_layer`: its
                T queries at the index's positions, nothing written).
            values: the new values `(B, S_new, H_kv, d_v)`, or None.
            cache_update_index: where they are written, an int or a scalar int
                tensor in `[0, S_max - S_new]` (a `ValueError` when its value is
                known, NaN output when traced); None: read-only, every slot
                counts as written and the queries end at S_max.
            query_length: T.
            batch_size, num_key_value_heads, key_dim, value_dim: the layer's
                sizes, checked against the cache (None: not checked).
            is_causal, window, attention_chunk_size: the positional rules folded
                into the mask (the chunks at absolute positions).
            rope: `fn(x, positions)` applied to the new keys at their absolute
                positions before they are written, or None.
            dtype: of the keys and values returned (the queries' dtype).
            masks: the caller's masks by argument name; each one's key axis
                must be the S_max slots.

        Returns:
            A `CacheUpdate`.
        """
        S_max = self.check(batch_size, num_key_value_heads, key_dim, value_dim)
        check_cache_masks(S_max, **(masks or {}))
        read_only = cache_update_index is None
        shared = keys is None and not read_only  # another layer's keys, read at the index
        new_length = None if read_only else (query_length if shared else static_shape(keys)[1])
        if new_length is not None and new_length > S_max:
            raise ValueError(
                f"The {new_length} new keys (`key`/`value` length, the query's for "
                f"self-attention) do not fit in a cache of length S_max={S_max}. "
                f"Received: S_new={new_length}, {self.describe()}")
        if read_only:
            query_positions, _ = positions(query_length, S_max)
            new = self
        else:
            index = check_cache_update_index(cache_update_index, new_length, S_max)
            length = query_length if shared else ops.shape(keys)[1]
            query_positions, key_positions = positions(query_length, length, index)
            if rope is not None and not shared:
                keys = rope(keys, key_positions)
        mask, in_range = fold_positions(None, query_length, S_max, None if read_only else index,
                                        None if read_only else length, is_causal=is_causal,
                                        window=window, attention_chunk_size=attention_chunk_size)
        if shared:
            new = self
        elif not read_only:
            new = self.write(keys, values, index, in_range)
        keys, values = new.read(dtype or new.dtype)
        return CacheUpdate(keys, values, mask, query_positions, new.carried(), in_range,
                           self.unattended_finite)


# mypy refuses two tuple bases; at runtime both are `tuple` with empty slots (one layout).
class KerasHubKVCache(collections.namedtuple("KerasHubKVCache", ("cache",)), KVCache):  # type: ignore[misc]
    """keras-hub's layout as a `KVCache`: one `(B, 2, S_max, H_kv, d)` tensor.

    What a layer makes of a cache tensor: the same operations as before the
    object (one `slice_update` of the stacked new keys and values per step,
    two slices to read), and it hands the tensor back (`carried`), so a
    tensor given is a tensor returned. Keys and values share d here.
    """

    __slots__ = ()

    @property
    def max_length(self):
        return static_shape(self.cache)[2]

    @property
    def keys(self):
        return self.cache[:, 0]

    @property
    def values(self):
        return self.cache[:, 1]

    def describe(self):
        return f"cache.shape={static_shape(self.cache)}"

    def check(self, batch_size, num_key_value_heads, key_dim, value_dim):
        if value_dim is not None and key_dim is not None and value_dim != key_dim:
            raise ValueError(
                "keras-hub's cache tensor (B, 2, S_max, H_kv, d) stores keys and values "
                "in one tensor: `value_dim` must equal `key_dim` (pass a "
                "`keras_attn.KVCache` to hold them apart). "
                f"Received: key_dim={key_dim}, value_dim={value_dim}")
        return check_cache(self.cache, batch_size, num_key_value_heads, key_dim)[2]

    def write(self, keys, values, cache_update_index, in_range=None):
        return KerasHubKVCache(write(self.cache, keys, values, cache_update_index, in_range))

    def read(self, dtype):
        return read(self.cache, dtype)

    def carried(self):
        return self.cache

    def to_keras_hub(self):
        return self.cache


def cache_length(cache) -> int | None:
    """S_max of a cache argument: a `KVCache`, or keras-hub's `(B, 2, S_max, ...)` tensor."""
    if isinstance(cache, KVCache):
        return cache.max_length
    shape = static_shape(cache)
    return shape[2] if len(shape) > 2 else None


def cache_shape(cache):
    """The static shape of a cache argument, for messages: a tuple, or for a `KVCache`
    the keys' and values' shapes as a dict."""
    if isinstance(cache, KVCache) and not isinstance(cache, KerasHubKVCache):
        return {name: static_shape(x) for name, x in cache._asdict().items()}  # its fields
    return static_shape(cache.cache if isinstance(cache, KerasHubKVCache) else cache)


def cache_spec(cache):
    """`KerasTensor`s with the structure, shapes and dtypes of a cache (symbolic calls)."""
    return keras.tree.map_structure(
        lambda x: keras.KerasTensor(x.shape, dtype=x.dtype), cache)


def empty_cache(layer: keras.layers.Layer, batch_size: int, max_length: int,
                dtype: str | None = None, *, as_kv_cache: bool = False) -> Tensor:
    """A zero key/value cache for `layer`, to be filled by calls with an update index.

    Args:
        layer: a `keras_attn.MultiHeadAttention`, or a built
            `keras_attn.TransformerDecoderLayer` (its self-attention's cache), or a
            `keras_attn.MultiHeadLatentAttention` (its `LatentCache`, whatever
            `as_kv_cache` says), or a `keras_attn.layers.GatedDeltaNet` (or a block
            whose self-attention is one: a hybrid model's linear-attention block): its
            `RecurrentCache`, fixed-size whatever `max_length` and `as_kv_cache` say,
            float32 unless `dtype` is given.
        batch_size: B.
        max_length: S_max, the number of positions the cache holds (prompt
            and generated tokens together).
        dtype: the cache's dtype. Defaults to the layer's compute dtype
            (`bfloat16` under `mixed_bfloat16`).
        as_kv_cache: return a `KVCache` (keys and values apart, so `value_dim`
            may differ from `key_dim`) rather than keras-hub's tensor.

    Returns:
        Zeros `(B, 2, S_max, H_kv, d)`: H_kv the layer's
        `num_key_value_heads`, d its `key_dim`; with `as_kv_cache`, a
        `KVCache` of keys `(B, S_max, H_kv, d_k)` and values `(B, S_max, H_kv, d_v)`.

    Example:

    >>> import keras_attn
    >>> layer = keras_attn.MultiHeadAttention(8, 16, num_key_value_heads=2)
    >>> tuple(empty_cache(layer, batch_size=1, max_length=128).shape)
    (1, 2, 128, 2, 16)
    """
    attention = getattr(layer, "self_attention", layer)
    if getattr(attention, "has_recurrent_state", False):  # linear attention: a RecurrentCache
        batch_size = check_positive_int("batch_size", batch_size)
        check_positive_int("max_length", max_length)  # a fixed-size state: no slots
        return attention.empty_cache(batch_size, dtype or "float32")
    if getattr(attention, "kv_lora_rank", None) is not None:  # latent attention: its LatentCache
        return attention.empty_cache(batch_size, max_length, dtype, as_kv_cache=True)
    heads = getattr(attention, "num_key_value_heads", None)
    width = getattr(attention, "key_dim", None)
    if not isinstance(heads, int) or not isinstance(width, int):
        raise ValueError(
            "`layer` must be a keras_attn MultiHeadAttention or a built "
            "TransformerDecoderLayer (its head width is known once built). "
            f"Received: layer={layer!r}")
    batch_size = check_positive_int("batch_size", batch_size)
    max_length = check_positive_int("max_length", max_length)
    dtype = dtype or attention.compute_dtype
    if as_kv_cache:
        value_width = getattr(attention, "head_value_dim", None) or width
        return KVCache.empty(batch_size, max_length, heads, width, value_width, dtype)
    return ops.zeros((batch_size, 2, max_length, heads, width), dtype=dtype)


@contextlib.contextmanager
def generation_slots(required, max_length):
    """Deprecated, and read by no layer: `generate` checks the capacity of its caches itself.

    Inside it, `check_generation_slots` refuses a cache shorter than `required`
    slots (what `keras_attn.generation.generate` used to open around its loop).
    """
    token = _GENERATION.set((required, max_length))
    try:
        yield
    finally:
        _GENERATION.reset(token)


def check_generation_slots(max_length, new_length, layer_name):
    """Deprecated: raise if a `generation_slots` block needs more slots than this cache has."""
    need = _GENERATION.get()
    if need is None or new_length is None or new_length >= max_length:
        return
    required, generated = need
    if max_length < required:
        raise ValueError(
            f"`generate(max_length={generated})` writes cache positions 0 to "
            f"{required - 1}: its caches need S_max >= max_length - 1 = {required} slots, "
            f"but layer '{layer_name}' was given a cache of S_max={max_length} slots. Make "
            f"them with `keras_attn.empty_cache(layer, B, max_length)`. Received: "
            f"max_length={generated}, S_max={max_length}")


_GENERATION = contextvars.ContextVar("keras_attn_generation_slots", default=None)
