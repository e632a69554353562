"""Greedy autoregressive decoding and exact-sequence accuracy."""

import numpy as np

from keras_attn.demo.data import END, PAD, START

__all__ = ["exact_match", "greedy_decode"]


def greedy_decode(model, sources, target_length, batch_size=1024):
    """Decode every source greedily, one token per step, in batches.

    Step `t` runs the full model on the tokens decoded so far (later
    positions are padding, which the causal, padding-masked decoder
    never sees) and takes the most likely token at position `t`. The
    padding and start tokens are never predicted. Every step has the
    same input shape, so a compiled predict function is reused.

    Args:
        model: the model of `build_model`.
        sources: int32 `(N, S)` padded sources.
        target_length: decoder length T.
        batch_size: sources decoded together.

    Returns:
        int32 `(N, T)`: the decoded tokens, each row ending with the end
        token (then anything: cut with `exact_match` or `decode_tokens`).
    """
    outputs = []
    for begin in range(0, len(sources), batch_size):
        src = np.asarray(sources[begin:begin + batch_size], "int32")
        tokens = np.zeros((len(src), target_length), "int32")
        tokens[:, 0] = START
        predicted = np.zeros((len(src), target_length), "int32")
        done = np.zeros(len(src), bool)
        for t in range(target_length):
            logits = np.asarray(model.predict_on_batch([src, tokens])[:, t], "float32")
            logits[:, [PAD, START]] = -np.inf
            step = logits.argmax(-1).astype("int32")
            predicted[:, t] = step
            done |= step == END
            if t + 1 < target_length:
                tokens[:, t + 1] = step
            if done.all():
                break
        outputs.append(predicted)
    return np.concatenate(outputs)


def _cut(row):
    row = list(np.asarray(row).tolist())
    return row[:row.index(END) + 1] if END in row else row


def exact_match(predicted, targets):
    """Per example: does the prediction equal the target up to its end token?

    Args:
        predicted: int `(N, T)` from `greedy_decode`.
        targets: int `(N, T)` targets (digits, end, padding).

    Returns:
        bool `(N,)`.
    """
    return np.array([_cut(p) == _cut(t) for p, t in zip(predicted, targets, strict=True)])
