"""`CausalLM`'s argument checks: token ids (shape, dtype and, where their values are known,
the vocabulary's range), the blocks' built width, and the `kv_sharing` map."""

import numbers
from collections.abc import Sequence

import keras
from keras import ops

from keras_attn._validation import concrete_value

__all__ = ["_built_width", "_check_kv_sharing", "_check_token_ids"]


def _check_token_ids(name, token_ids, vocabulary_size=None):
    """`token_ids` as an int tensor `(B, T)`; a `ValueError` naming `name` otherwise.

    With `vocabulary_size` V, ids whose values are known now (eager, or a concrete
    array; not traced) must lie in `[0, V)`: an embedding gather outside the table reads
    row V - 1 for id -1 on every backend, and for id V errors, clamps or gives NaN
    depending on the backend, so a pad id of -1 would silently decode something else.
    """
    if not (hasattr(token_ids, "shape") and hasattr(token_ids, "dtype")):
        token_ids = ops.convert_to_tensor(token_ids)
    dtype = keras.backend.standardize_dtype(token_ids.dtype)
    shape = tuple(token_ids.shape)
    if "int" not in dtype or len(shape) != 2:
        raise ValueError(
            f"`{name}` must be integer token ids of shape (B, T). Received: "
            f"{name}.shape={shape}, {name}.dtype={dtype}")
    if vocabulary_size is not None and 0 not in shape:
        values = concrete_value(token_ids)
        if values is not None:
            low, high = int(values.min()), int(values.max())
            if low < 0 or high >= vocabulary_size:
                bad = low if low < 0 else high
                raise ValueError(
                    f"`{name}` must hold token ids in [0, vocabulary_size) = "
                    f"[0, {vocabulary_size}). Received: an id of {bad} in {name} "
                    f"(min {low}, max {high})")
    return token_ids


def _built_width(block):
    """The width D a built block takes, or None where it cannot be read.

    The default self-attention's query kernel `(D, H d)`; else the shape the
    block was built with (Keras records it), whatever its sublayers.
    """
    dense = getattr(getattr(block, "self_attention", None), "query_dense", None)
    if getattr(dense, "kernel", None) is not None:
        return tuple(dense.kernel.shape)[0]
    config = block.get_build_config() or {}
    shape = config.get("input_shape") or next(iter(config.get("shapes_dict", {}).values()), None)
    return shape[-1] if shape else None


def _check_kv_sharing(kv_sharing, num_blocks):
    """`kv_sharing` as a list (None: no sharing): per block None, or the index of an
    earlier block that shares no other block's keys and values itself."""
    if kv_sharing is None:
        return None
    sources = list(kv_sharing) if isinstance(kv_sharing, Sequence) else None
    if sources is None or len(sources) != num_blocks:
        raise ValueError(f"`kv_sharing` must be a list of one entry per block ({num_blocks}). "
                         f"Received: kv_sharing={kv_sharing!r}")
    for i, j in enumerate(sources):
        if j is None:
            continue
        if isinstance(j, bool) or not isinstance(j, numbers.Integral) or not (
                0 <= j < i) or sources[j] is not None:
            raise ValueError(
                f"`kv_sharing[{i}]` must be None or the index of an earlier block that "
                f"computes its own keys and values. Received: kv_sharing={sources!r}")
        sources[i] = int(j)
    return sources
