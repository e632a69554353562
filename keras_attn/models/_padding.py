"""Padded batches in `CausalLM`: the padding mask checked, rows rolled to right padding
(each row's real tokens at their natural positions `0 .. len_i - 1`), and the generated
rows brought back to the caller's layout with their stops and lengths.

keras-hub's design: a right-padded prompt is decoded with one cache index for all rows
from the shortest length, every row fed its own prompt tokens until its prompt ends
(`keras_attn.generation.generate`'s `prompt_lengths`); causal attention means no row
attends a slot past its own position, so no attention mask is needed, and positions
(RoPE, learned ones), sliding windows and recurrent states see each row as if alone.
Dimension letters: B batch, P prompt length, L `max_length`.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._validation import concrete_value

__all__ = ["check_pad_token_id", "finish_rows", "layout_of", "padding_argument",
           "roll_rows", "shifts_of"]


def padding_argument(padding_mask, attention_mask):
    """The one mask given (keras-hub's `padding_mask` or transformers' `attention_mask`),
    or None; both given is a `ValueError`."""
    if padding_mask is not None and attention_mask is not None:
        raise ValueError(
            "Pass the padding as `padding_mask` (keras-hub's name) or `attention_mask` "
            "(transformers'), not both. Received: padding_mask and attention_mask")
    return attention_mask if padding_mask is None else padding_mask


def _as_bool(mask, shape, name):
    """`mask` as a bool tensor of `shape` (bool or int, nonzero = a real token)."""
    if not (hasattr(mask, "shape") and hasattr(mask, "dtype")):
        mask = ops.convert_to_tensor(np.asarray(mask))
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if tuple(mask.shape) != tuple(shape) or not (dtype == "bool" or "int" in dtype):
        raise ValueError(
            f"`{name}` must be bool or int of the token ids' shape {tuple(shape)} (True or 1 "
            f"= a real token). Received: {name}.shape={tuple(mask.shape)}, "
            f"{name}.dtype={dtype}")
    return mask if dtype == "bool" else ops.not_equal(mask, 0)


def layout_of(mask, shape, name="padding_mask"):
    """Check a concrete padding mask `(B, P)`: `(layout, lengths)`.

    `layout` is "left" (every row's last position real, the pads before), "right"
    (every row's first position real) or None (no pad at all); `lengths` the real tokens
    per row, NumPy int32 `(B,)`. Holes, a row without a real token, or any other layout
    are a `ValueError` naming `name`.
    """
    values = concrete_value(_as_bool(mask, shape, name))
    if values is None:
        raise ValueError(f"`{name}` must have a value known when `generate` is called (not "
                         f"a tensor traced by jax.jit or tf.function). Received: a traced "
                         f"{name}")
    values = values.astype(bool)
    lengths = values.sum(axis=1).astype("int32")
    positions = np.arange(values.shape[1])
    right = (values == (positions[None] < lengths[:, None])).all()
    left = (values == (positions[None] >= values.shape[1] - lengths[:, None])).all()
    if (lengths == 0).any() or not (left or right):
        rows = np.flatnonzero((lengths == 0) | ~(
            (values == (positions[None] < lengths[:, None])).all(1)
            | (values == (positions[None] >= values.shape[1] - lengths[:, None])).all(1)))
        raise ValueError(
            f"`{name}` must pad every row on the same side: left (each row's last position "
            "real) or right (each row's first position real), with at least one real token "
            f"and no holes. Received: {name} with row {int(rows[0]) if rows.size else 0} "
            f"= {values[rows[0] if rows.size else 0].astype(int).tolist()}")
    if (lengths == values.shape[1]).all():
        return None, lengths
    return ("right" if right else "left"), lengths


def shifts_of(mask):
    """Per row, the first real position `(B,)` int32 of a bool mask `(B, T)` (traced too)."""
    return ops.cast(ops.argmax(ops.cast(mask, "int32"), axis=1), "int32")


def roll_rows(x, shifts):
    """`out[i, j] = x[i, (j + shifts[i]) mod T]` for `x` `(B, T, ...)`: row i rolled left
    by `shifts[i]` (right, for negative shifts)."""
    length = ops.shape(x)[1]
    index = ops.mod(ops.arange(length, dtype="int32")[None, :]
                    + ops.cast(shifts, "int32")[:, None], length)  # (B, T)
    index = ops.reshape(index, tuple(ops.shape(index)) + (1,) * (len(x.shape) - 2))
    if len(x.shape) > 2:
        index = ops.broadcast_to(index, ops.shape(x))
    return ops.take_along_axis(x, index, axis=1)


def check_pad_token_id(pad_token_id, vocabulary_size):
    """None, or an int id in `[0, V)`, as a Python int."""
    if pad_token_id is None:
        return None
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, numbers.Integral) \
            or not 0 <= pad_token_id < vocabulary_size:
        raise ValueError(f"`pad_token_id` must be None or an int id in [0, vocabulary_size) = "
                         f"[0, {vocabulary_size}). Received: pad_token_id={pad_token_id!r}")
    return int(pad_token_id)


def finish_rows(tokens, lengths, stops, pad_token_id):
    """Right-layout `tokens` `(B, L)` (row i's prompt at `0 .. lengths[i] - 1`, then its
    generated tokens): `(tokens, totals)`, each row's positions after its first generated
    stop token set to `pad_token_id` (unchanged where None: the first stop id already),
    and `totals` `(B,)` int32 its real tokens (prompt and generated, the stop included)."""
    length = tokens.shape[1]
    positions = ops.arange(length, dtype="int32")[None, :]
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    generated = ops.greater_equal(positions, lengths[:, None])
    hit = ops.zeros_like(generated)
    for stop in stops:
        hit = ops.logical_or(hit, ops.equal(tokens, stop))
    hit = ops.logical_and(hit, generated)
    # The first hit's position + 1, or L: the argmax of a bool row finds the first True.
    first = ops.cast(ops.argmax(ops.cast(hit, "int32"), axis=1), "int32")
    totals = ops.where(ops.any(hit, axis=1), first + 1, length)
    if pad_token_id is not None and stops:
        tokens = ops.where(ops.greater_equal(positions, totals[:, None]),
                           ops.cast(pad_token_id, tokens.dtype), tokens)
    return tokens, ops.cast(totals, "int32")


def to_left(prompt_ids, tokens, lengths, totals):
    """transformers' layout from the right-layout `tokens` `(B, L)`: the caller's
    left-padded `prompt_ids` `(B, P)` (its pads kept), then each row's first `L - P`
    generated tokens: `(tokens, totals)` with the totals of that layout."""
    prompt_length, length = prompt_ids.shape[1], tokens.shape[1]
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    # Position P + k of the result is position lengths[i] + k of row i.
    new = roll_rows(tokens, lengths - prompt_length)[:, prompt_length:]
    tokens = ops.concatenate([ops.cast(prompt_ids, tokens.dtype), new], axis=1)
    totals = ops.minimum(totals, lengths + (length - prompt_length))
    return tokens, totals


def unpack_inputs(token_ids, padding_mask, attention_mask):
    """`CausalLM.call`'s inputs: `(token_ids, mask or None)`, from the arguments or from
    keras-hub's dict `{"token_ids": ..., "padding_mask": ...}` (what `fit` and `predict`
    pass a model given a dict; `"attention_mask"` is accepted there too)."""
    if isinstance(token_ids, dict):
        inputs = dict(token_ids)
        unknown = set(inputs) - {"token_ids", "padding_mask", "attention_mask"}
        if "token_ids" not in inputs or unknown:
            raise ValueError(
                "A dict input must hold 'token_ids' and, optionally, 'padding_mask' or "
                f"'attention_mask'. Received: keys {sorted(inputs)}")
        token_ids = inputs["token_ids"]
        padding_mask = padding_argument(inputs.get("padding_mask", padding_mask),
                                        inputs.get("attention_mask", attention_mask))
        return token_ids, padding_mask
    return token_ids, padding_argument(padding_mask, attention_mask)


def padded_call(forward, token_ids, mask):
    """`forward(token_ids)` `(B, T, V)` of a padded batch: each row rolled so that its real
    tokens start at position 0 (right padding: rolled by 0), the causal forward, the logits
    rolled back. Real positions get the logits of the row alone; padded positions 0.

    A concrete mask is checked (`layout_of`: left or right padding); a traced one (inside
    `fit`) is taken as one of them (its first real position is each row's shift)."""
    mask = _as_bool(mask, tuple(token_ids.shape), "padding_mask")
    if concrete_value(mask) is not None:
        layout_of(mask, tuple(token_ids.shape))
    shifts = shifts_of(mask)
    logits = roll_rows(forward(roll_rows(token_ids, shifts)), -shifts)
    return ops.where(mask[:, :, None], logits, ops.zeros_like(logits))
