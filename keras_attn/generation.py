"""Autoregressive generation over a key/value cache (keras.ops only).

`generate` runs a prefill over the prompt and then one decoding step per new
token inside `keras.ops.while_loop`, over buffers whose shapes never change,
so that a compiler traces the step once. Dimension letters: B batch, P
prompt length, L `max_length`, V vocabulary size.
"""

import numbers

import keras
from keras import ops

from keras_attn._shapes import static_shape
from keras_attn._validation import check_positive_int

__all__ = ["generate"]


def generate(next_token_fn, prompt, max_length, cache, *, end_token_id=None, temperature=0.0,
             top_k=None, seed=None):
    """Extend `prompt` token by token up to `max_length`, greedy or sampled.

    Args:
        next_token_fn: `fn(token_ids, cache, cache_update_index) ->
            (logits, new_cache)`. `token_ids` is int32 `(B, T)`: the prompt
            (T = P, `cache_update_index` 0) once, then one token (T = 1) at a
            time, at position `cache_update_index` (a scalar int32 tensor:
            traced inside the loop, so it must not drive Python control
            flow). `logits` is `(B, T, V)`, floating; only the last row is
            used. `cache` is whatever the function keeps between calls
            (a tensor or a list/tuple/dict of tensors, such as one
            `keras_attn.empty_cache(layer, B, L)` per decoder layer); its
            structure and shapes must not change.
        prompt: int `(B, P)`, every row a full P tokens long (padding, if
            any, is `next_token_fn`'s to mask), `0 < P < L`.
        max_length: L, the length of the returned sequences (prompt
            included). Caches must hold at least L - 1 positions.
        cache: the initial cache passed to the first call.
        end_token_id: a row stops at this token: everything after it is
            `end_token_id`, and the loop ends once every row has emitted
            it. None: always generate to `max_length`.
        temperature: 0 (default) for greedy decoding (argmax); > 0 to
            sample from `softmax(logits / temperature)`.
        top_k: with sampling, draw only among the k most likely tokens.
        seed: an int or a `keras.random.SeedGenerator` for sampling. The
            noise of every step is drawn once before the loop (Gumbel-max:
            `argmax(logits / temperature + Gumbel noise)` is an exact
            sample), which keeps random state out of the compiled loop; it
            costs `(L - P) * B * V` floats.

    Returns:
        int32 `(B, L)`: the prompt, then the generated tokens.
    """
    prompt = ops.convert_to_tensor(prompt)
    shape = static_shape(prompt)
    if len(shape) != 2 or "int" not in keras.backend.standardize_dtype(prompt.dtype):
        raise ValueError("`prompt` must be an integer tensor (B, P). Received: "
                         f"prompt.shape={shape}, prompt.dtype={prompt.dtype}")
    batch, prompt_length = shape
    max_length = check_positive_int("max_length", max_length)
    if batch is None or prompt_length is None or not 0 < prompt_length < max_length:
        raise ValueError(
            "`prompt` needs a static shape (B, P) with 0 < P < max_length. "
            f"Received: prompt.shape={shape}, max_length={max_length}")
    if not isinstance(temperature, numbers.Real) or temperature < 0:
        raise ValueError(
            f"`temperature` must be a float >= 0. Received: temperature={temperature!r}")
    top_k = check_positive_int("top_k", top_k, allow_none=True)
    prompt = ops.cast(prompt, "int32")

    logits, cache = next_token_fn(prompt, cache, ops.convert_to_tensor(0, "int32"))
    vocabulary = static_shape(logits)[-1]
    noise = None
    if temperature > 0:
        # One (B, V) slab of Gumbel noise per generated token: (L - P, B, V).
        uniform = keras.random.uniform((max_length - prompt_length, batch, vocabulary),
                                       minval=1e-7, maxval=1.0, seed=seed)
        noise = -ops.log(-ops.log(uniform))

    def choose(logits, step):
        """The next token `(B,)` from the last logits `(B, V)`; `step` counts from 0."""
        logits = ops.cast(logits, "float32")
        if noise is None:
            return ops.cast(ops.argmax(logits, axis=-1), "int32")
        logits = logits / temperature
        if top_k is not None:
            kth = ops.top_k(logits, min(top_k, vocabulary))[0][:, -1:]  # (B, 1)
            logits = ops.where(logits < kth, float("-inf"), logits)
        return ops.cast(ops.argmax(logits + ops.take(noise, step, axis=0), axis=-1), "int32")

    fill = 0 if end_token_id is None else int(end_token_id)
    tokens = ops.full((batch, max_length), fill, dtype="int32")
    tokens = ops.slice_update(tokens, [0, 0], prompt)
    first = choose(logits[:, -1], 0)
    done = ops.zeros((batch,), dtype="bool")
    first, done = _finish(first, done, end_token_id)
    tokens = ops.slice_update(tokens, [0, prompt_length], ops.expand_dims(first, 1))

    def cond(index, tokens, cache, done):
        return ops.logical_and(ops.less(index, max_length - 1),
                               ops.logical_not(ops.all(done)))

    def body(index, tokens, cache, done):
        token = ops.slice(tokens, [0, index], [batch, 1])  # (B, 1)
        logits, cache = next_token_fn(token, cache, index)
        chosen = choose(logits[:, -1], index - prompt_length + 1)
        chosen, done = _finish(chosen, done, end_token_id)
        tokens = ops.slice_update(tokens, [0, index + 1], ops.expand_dims(chosen, 1))
        return index + 1, tokens, cache, done

    start = ops.convert_to_tensor(prompt_length, "int32")
    _, tokens, _, _ = ops.while_loop(cond, body, (start, tokens, cache, done))
    return tokens


def _finish(chosen, done, end_token_id):
    """Rows already done emit `end_token_id`; a row that emits it is done."""
    if end_token_id is None:
        return chosen, done
    chosen = ops.where(done, end_token_id, chosen)
    return chosen, ops.logical_or(done, ops.equal(chosen, end_token_id))
