"""`CausalLM`'s argument checks: token ids (shape, dtype and, where their values are known,
the vocabulary's range), the blocks (and their built width), the `kv_sharing` map, the
learned positions' range and `source_config`."""

import numbers
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from keras_attn._validation import concrete_value

__all__ = ["_built_width", "_check_blocks", "_check_kv_sharing", "_check_kv_sharing_blocks",
           "_check_positions", "_check_source_config", "_check_token_ids"]


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


def _check_kv_sharing_blocks(blocks, kv_sharing):
    """Refuse a `kv_sharing` that the blocks' attention cannot keep (once they are built):
    a source whose attention is linear, or a reader without `is_kv_shared_layer`."""
    for i, source in enumerate(kv_sharing or [None] * len(blocks)):
        attention = getattr(blocks[i], "self_attention", None)
        if source is not None and getattr(getattr(blocks[source], "self_attention", None),
                                          "has_recurrent_state", False):
            raise ValueError(
                f"`blocks[{i}]` cannot reuse the keys and values of `blocks[{source}]`, "
                "whose attention is linear (a recurrent state, no keys and values). "
                f"Received: kv_sharing[{i}]={source}")
        if bool(getattr(attention, "is_kv_shared_layer", False)) != (source is not None):
            raise ValueError(
                f"`blocks[{i}]` ('{blocks[i].name}') reuses another block's keys and "
                "values exactly when its self-attention has `is_kv_shared_layer=True`. "
                f"Received: kv_sharing[{i}]={source!r}, is_kv_shared_layer="
                f"{getattr(attention, 'is_kv_shared_layer', False)}")


def _check_blocks(blocks):
    """`CausalLM`'s `blocks` as a list of layers (configs deserialized); a `ValueError`
    for anything else, or for a block built with memory (cross-attention)."""
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence) or not blocks:
        raise ValueError("`blocks` must be a non-empty list of "
                         f"keras_attn.TransformerDecoderLayer. Received: blocks={blocks!r}")
    blocks = [keras.saving.deserialize_keras_object(b) if isinstance(b, dict) else b
              for b in blocks]
    for i, block in enumerate(blocks):
        if not isinstance(block, keras.layers.Layer):
            raise ValueError(
                "`blocks` must hold keras layers (keras_attn.TransformerDecoderLayer, or a "
                "layer keeping its decoder-block contract). "
                f"Received: blocks[{i}] of type {type(block).__name__}")
        if block.built and getattr(block, "has_memory", False):
            raise ValueError(
                f"`blocks[{i}]` ('{block.name}') was built with memory (cross-attention); "
                "a causal LM's blocks are decoder-only. Received: a block with memory")
    return blocks


def _check_source_config(source_config):
    """None, or a copy of the `config.json` dict a model was converted from."""
    if source_config is not None and not isinstance(source_config, dict):
        raise ValueError("`source_config` must be None or a dict (a config.json). "
                         f"Received: source_config of type {type(source_config).__name__}")
    return None if source_config is None else dict(source_config)


def _check_positions(token_ids, start, max_position_embeddings):
    """Refuse positions `start .. start + T - 1` past the learned table's N rows (out of
    the table, a gather errors on one backend and clamps on another). An int `start` is
    checked; a tensor one (generate's loop) is not read back at each step: `generate`
    checks `max_length` against N before it starts."""
    T, N = tuple(token_ids.shape)[1], max_position_embeddings
    first = int(start) if isinstance(start, (numbers.Integral, np.integer)) else 0
    if T is not None and first + T > N:
        raise ValueError(
            f"The position embedding has max_position_embeddings={N} rows: positions "
            f"{first} .. {first + T - 1} do not fit. Received: token_ids.shape="
            f"{tuple(token_ids.shape)}, cache_update_index={first}")
