"""Greedy autoregressive decoding, uncached and cached, and exact-sequence accuracy."""

import numpy as np
from keras import ops

from keras_attn import _device
from keras_attn.demo.data import END, PAD, START
from keras_attn.demo.model import _numbered
from keras_attn.generation import generate

__all__ = ["cached_decode", "exact_match", "greedy_decode"]


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


def cached_decode(model, sources, target_length, batch_size=1024):
    """Greedy decoding with key/value caches through `keras_attn.generation.generate`.

    The encoder runs once per batch; each decoder layer keeps a
    self-attention cache (filled one token per step) and a cross-attention
    cache (the memory's keys and values, projected once). The position of
    each new decoder token comes from `cache_update_index`. As in
    `greedy_decode`, padding and the start token are never predicted, and a
    row stops at its end token.

    Args and returns: as `greedy_decode` (the same tokens, end token
    included, then end tokens; compare with `exact_match`).
    """

    def decode_batch(src):
        memory, source_mask, caches = _encode_and_fill(model, src, target_length)
        fn = _next_token_fn(model, source_mask)
        prompt = ops.full((ops.shape(src)[0], 1), START, dtype="int32")
        return generate(fn, prompt, target_length + 1, caches, end_token_id=END)

    # One compiled program per batch shape (jax.jit / tf.function): the encoder,
    # the cache fill, the prefill and the decoding loop.
    decode_batch = _device.compile_inference(decode_batch)
    outputs = []
    for begin in range(0, len(sources), batch_size):
        src = np.asarray(sources[begin:begin + batch_size], "int32")
        tokens = decode_batch(ops.convert_to_tensor(src))
        outputs.append(np.asarray(ops.convert_to_numpy(tokens))[:, 1:])
    return np.concatenate(outputs)


def _encode_and_fill(model, src, target_length):
    """Memory `(B, S, D)`, the source mask, and `[(self, cross)]` caches per decoder layer."""
    source_mask = ops.not_equal(src, PAD)
    embedding = model.get_layer("source_embedding")
    x = _embed(embedding, src, 0)
    for layer in _numbered(model, "encoder"):
        x = layer(x, padding_mask=source_mask)
    caches = []
    batch = src.shape[0]
    for layer in _numbered(model, "decoder"):
        attention = layer.cross_attention
        cross = attention.empty_cache(batch, src.shape[1])
        # Project the memory's keys and values once (the query is a placeholder).
        query = ops.zeros((batch, 1, ops.shape(x)[-1]), dtype=x.dtype)
        _, cross = attention(query, x, cache=cross, cache_update_index=0)
        caches.append((layer.self_attention.empty_cache(batch, target_length), cross))
    return x, source_mask, caches


def _embed(embedding, token_ids, start):
    """`TokenAndPositionEmbedding` at positions `start + i`, without a Keras mask."""
    positions = ops.arange(ops.shape(token_ids)[1], dtype="int32") + start
    return (embedding.token_embedding(token_ids)
            + ops.expand_dims(embedding.position_embedding(positions), 0))


def _next_token_fn(model, source_mask):
    embedding = model.get_layer("target_embedding")
    decoders = _numbered(model, "decoder")
    head = model.get_layer("logits")
    vocab = head.units
    # Padding and the start token are never predicted.
    forbid = np.zeros((vocab,), "float32")
    forbid[[PAD, START]] = -1e9
    forbid = ops.convert_to_tensor(forbid)

    def next_token(token_ids, caches, index):
        y = _embed(embedding, token_ids, index)
        new_caches = []
        for layer, (self_cache, cross_cache) in zip(decoders, caches, strict=True):
            y, self_cache, cross_cache = layer(
                y, memory_padding_mask=source_mask, self_attention_cache=self_cache,
                self_attention_cache_update_index=index, cross_attention_cache=cross_cache)
            new_caches.append((self_cache, cross_cache))
        logits = ops.cast(head(y), "float32") + forbid
        return logits, new_caches

    return next_token


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

